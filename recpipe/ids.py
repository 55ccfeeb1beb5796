"""The id contract shared by the Spark job and the TensorFlow graphs (training and serving).

1. Clean (Spark, in ``features/transform.py``; TensorFlow, in ``trainer/hashing.py``):
   integer columns are written in decimal; strings lose leading and trailing
   ``WHITESPACE_CHARS``; a missing value becomes ``""``. Tag values are split on the feature's
   ``separator`` first, each token cleaned, empty tokens dropped.
2. Hash (TensorFlow only, for training and serving alike): the 64-bit id is FarmHash
   ``Fingerprint64`` of the cleaned value's UTF-8 bytes (``tf.fingerprint``, as an int64
   bit pattern); with ``hash_bucket_size`` N the id is that fingerprint, unsigned, modulo N
   (``tf.strings.to_hash_bucket_fast``, as EasyRec's ``hash_bucket_size``).

Spark therefore emits clean string ids and never hashes: one hash implementation, so the
exported serving graph reproduces the training ids exactly from raw values.
"""

# The characters stripped from both ends of a value. Spark strips them with btrim(col, chars);
# TensorFlow with the RE2 pattern below (same set).
# Boolean column the Spark job adds when data_config.holdout_percent > 0: the day's held-out rows.
HOLDOUT = "_holdout"
WHITESPACE_CHARS = " \t\r\n\f"
STRIP_PATTERN = "^[ \\t\\r\\n\\f]+|[ \\t\\r\\n\\f]+$"
