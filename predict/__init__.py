"""Batch prediction: a SavedModel export scores partitions of rows (``recpipe predict``).

Layers: ``columns`` (EasyRec's ``--reserved_cols`` / ``--output_cols`` and output names),
``model`` (find, load and call a SavedModel on Arrow batches), ``local`` (one process, streamed),
``spark`` (the same scoring in Spark's Python workers), ``cli`` (EasyRec's flags).
"""
