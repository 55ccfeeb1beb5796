"""A client of a stream model's two halves: the embedding rows in the online store (Redis,
``recpipe.exports.store``) and the dense part in the SavedModel, scored through the export's
``ids`` and ``serving_rows`` signatures (``trainer.online.served``).

    model = StoreScorer(export_dir, redis.Redis(), "movielens_stream")
    scores = model.score({"user_id": ..., "item_id": ..., ...})  # serving_default's outputs

An id the store does not hold is left out of the rows sent, and gets the zero row, as the
training's tables give an id they lack.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from predict.stderr import native_stderr_held
from recpipe.errors import UsageError
from recpipe.exports.store import EmbeddingStore
from recpipe.layout import SERVING_ROWS

with native_stderr_held():
    import tensorflow as tf


class StoreScorer:
    """Score requests with rows read from the store ``model`` of ``client``.

    Args:
        export_dir: a SavedModel version written by ``trainer.serving`` for a model with
            online tables.
        client: a ``redis.Redis`` of the online store.
        model: the store's model name (the retrain config's ``model_name``).

    Raises:
        UsageError: the export has no ``serving_rows`` signature (no online tables).
    """

    def __init__(self, export_dir: str | Path, client, model: str):
        layout = Path(export_dir) / "assets.extra" / SERVING_ROWS
        if not layout.exists():
            raise UsageError(f"{export_dir}: no serving_rows signature (a model without online tables)")
        self.layout = json.loads(layout.read_text())
        self.client, self.model = client, model
        self.store = EmbeddingStore(client, model)
        with native_stderr_held():
            loaded = tf.saved_model.load(str(export_dir))
        self._loaded = loaded  # the signatures hold on to it
        self._ids, self._serve = loaded.signatures["ids"], loaded.signatures["serving_rows"]
        inputs = self._serve.structured_input_signature[1]
        self.dims = {name: int(spec.shape[1]) for name, spec in inputs.items() if spec.shape.rank == 2}

    def ids(self, request: dict) -> dict[str, np.ndarray]:
        """The distinct ids ``request`` looks up in each table of the store (``int64 [K]``)."""
        return {table: ids.numpy() for table, ids in self._ids(**request).items()}

    def rows(self, request: dict) -> dict[str, np.ndarray]:
        """``serving_rows``' inputs besides the request: per table, the ids the store holds
        (``int64 [K]``) and each view's rows (``float32 [K, dim]``), read with ``lookup``."""
        wanted = self.ids(request)
        out = {}
        for table, entry in self.layout.items():
            ids = wanted[table]
            found = self.store.lookup(table, ids) if len(ids) else {}
            held = [i for i in ids.tolist() if i in found]
            out[entry["ids"]] = np.asarray(held, np.int64)
            for field, name in entry["views"].items():
                rows = [found[i][field] for i in held]
                out[name] = (
                    np.stack(rows).astype(np.float32) if rows else np.zeros((0, self.dims[name]), np.float32)
                )
        return out

    def score(self, request: dict) -> dict[str, np.ndarray]:
        """The outputs ``serving_default`` gives (``probability``, ``logit``, ...) for
        ``request`` (the raw columns, as ``serving_default`` takes them), with the store's rows."""
        out = self._serve(**request, **{k: tf.constant(v) for k, v in self.rows(request).items()})
        return {k: v.numpy() for k, v in out.items()}
