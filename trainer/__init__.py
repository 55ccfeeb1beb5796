"""The training side of recpipe: TensorFlow models, the training loop, strategies, online tables."""

import os

# Set before TensorFlow is first imported. The trainer is tf-keras (Keras 2) throughout; without
# this, `import tensorflow` imports Keras 3, and with it scikit-learn, matplotlib and SciPy's
# submodules, in every trainer process.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# With oneDNN's ops on, TensorFlow's CPU tensors come from oneDNN's pooling allocator, which keeps
# every buffer it ever held: a growing online table's transient copies would stay resident for
# the rest of the job, for no speed in return (docs/benchmarks.md, "Production-size days").
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
