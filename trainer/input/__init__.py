"""Feature Parquet (the Spark job's output) -> ``tf.data`` batches, one module a job:

- ``days``: which partitions a job reads and the held-out split of shared days;
- ``sharding``: row groups dealt over the workers;
- ``columns``: a block of rows as numpy arrays;
- ``reader``: ``FeatureReader``, the shuffled, resumable, padded batches;
- ``specs``: the features dict's type specs and a sample to build models with.
"""

from trainer.input.columns import Columns
from trainer.input.days import InputError, holdout_split
from trainer.input.reader import FeatureReader
from trainer.input.sharding import RowGroup, row_groups, shard
from trainer.input.specs import feature_spec, sample_inputs

__all__ = [
    "Columns",
    "FeatureReader",
    "InputError",
    "RowGroup",
    "feature_spec",
    "holdout_split",
    "row_groups",
    "sample_inputs",
    "shard",
]
