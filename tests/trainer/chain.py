"""Online tables over two stages with a base and a delta export, and the Redis push: shared by
the tests of the models beyond DeepFM (DIN's histories, MMoE's tasks), which check that
deltas and the store carry their tables as they do DeepFM's (tests/trainer/test_delta.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import tensorflow as tf

from tests.support import with_edits

DAY = "1997-09-26"
# online tables everywhere; lazy Adam moves only the rows in the batch (what a delta needs)
ONLINE = {
    "model_config.ev_params": {"filter_freq": 0, "max_capacity": 8192},
    "train_config.optimizer_config": [
        {"lazy_adam_optimizer": {"learning_rate": {"constant_learning_rate": {"learning_rate": 0.01}}}},
        {"adam_optimizer": {"learning_rate": {"constant_learning_rate": {"learning_rate": 0.001}}}},
    ],
    "data_config.batch_size": 64,
    "data_config.num_epochs": 1,
}


def base_and_delta(config, first: list[str], second: list[str], root: Path) -> dict:
    """Train ``first`` -> a base; fine-tune on ``second`` -> a delta; a full export at the
    second stage's step. Returns the config, the exports' directory, the full export, the
    second stage's model and its global step."""
    from trainer.delta import export_base, export_delta
    from trainer.loop import Trainer, TrainJob
    from trainer.scoring import load_model
    from trainer.serving import read_normalization

    config = with_edits(config, ONLINE)
    exports, previous = root / "exports" / DAY, None
    for stage, days in enumerate((first, second)):
        model_dir = root / f"stage{stage}"
        staged = with_edits(config, {"train_config.fine_tune_checkpoint": previous})
        previous = Trainer(TrainJob(staged, model_dir, days)).train().checkpoint
        model, step = load_model(staged, model_dir)
        norm = read_normalization(model_dir)
        if stage == 0:
            export_base(staged, model, norm, exports, DAY, step)
        else:
            export_delta(staged, model, norm, exports, "01", step)
    full = export_base(staged, model, norm, root / "full" / DAY, DAY, step)
    return {"config": staged, "exports": exports, "full": full, "model": model, "step": step}


def assert_base_plus_delta_serves_as_the_full_export(
    chain: dict, request: dict, outputs: list[str], out: Path
):
    """The SavedModel rebuilt from the base and its delta scores ``request`` as the full
    export does, on each of ``outputs`` (serving outputs: each task's probability, say)."""
    from trainer.delta import build_saved_model

    exports = chain["exports"]
    rebuilt = build_saved_model(exports / "base", [exports / "delta-01"], out)
    inputs = {k: tf.constant(v) for k, v in request.items()}
    got = tf.saved_model.load(str(rebuilt)).signatures["serving_default"](**inputs)
    want = tf.saved_model.load(str(chain["full"])).signatures["serving_default"](**inputs)
    for output in outputs:
        np.testing.assert_allclose(got[output].numpy(), want[output].numpy(), atol=1e-6, err_msg=output)
        assert got[output].numpy().std() > 0.005, output  # not a constant model: the comparison could fail


def assert_the_push_carries_every_table(chain: dict) -> dict:
    """Push the base and the delta to the Redis on 127.0.0.1; every table's rows in the store
    equal base + delta. Returns the applied params."""
    import redis

    from recpipe.exports.files import apply, read_params
    from recpipe.exports.store import EmbeddingStore

    client = redis.Redis(host="127.0.0.1", port=6379, db=0)
    model = f"test-{uuid.uuid4().hex[:8]}"
    online = EmbeddingStore(client, model)
    exports = chain["exports"]
    try:
        online.push(exports / "base")
        assert online.push(exports / "delta-01")["rows"] > 0
        params = apply(read_params(exports / "base"), read_params(exports / "delta-01"))
        assert all(len(rows.ids) for rows in params.tables.values())
        assert_store_holds(client, model, params)
    finally:
        for key in client.scan_iter(match=f"recpipe:{model}:*"):
            client.delete(key)
    return params


def assert_store_holds(client, model: str, params) -> None:
    """The store holds exactly ``params``' rows (``recpipe.exports.files.Params``), table by
    table, each view's values as written."""
    from recpipe.exports.store import EmbeddingStore

    for table, rows in params.tables.items():
        stored = EmbeddingStore(client, model).read_rows(table)
        assert set(stored) == set(rows.ids.tolist()), table
        for i, key in enumerate(rows.ids.tolist()):
            for view, values in rows.views.items():
                np.testing.assert_array_equal(stored[key][view], values[i])
