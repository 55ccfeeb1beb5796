"""The training side of recpipe: TensorFlow models, the training loop, strategies, online tables."""

import os

# Set before TensorFlow is first imported (issue 40: memory the day does not need).
# The trainer is tf-keras (Keras 2) throughout. Without this, `import tensorflow` imports Keras 3,
# which imports scikit-learn, matplotlib and SciPy's submodules: 86 MiB and 1.6 s more in every
# trainer process.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# With oneDNN's ops on, TensorFlow's CPU tensors come from oneDNN's pooling allocator, which keeps
# every buffer it ever held: a growing online table's transient copies stayed resident for the
# rest of the job (1M-row day: 1.93 GB after the last doubling, 1.55 GB without), at the same speed.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
