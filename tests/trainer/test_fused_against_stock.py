"""The online tables on recpipe's kernels (``train_config.fused_kernels``, the default) against
the stock TensorFlow ops, the reference: on the MovieLens model with four online tables (one
evicted by steps, one full and evicted least recently used first, two of the same params
admitting at the second sighting, and so grouped), each starting at 8 rows so that it grows,
any sequence of steps (over the day's batches, or over random ids from small or large pools),
day boundaries, checkpoints and restores leaves both with the same rows, admitted ids, counts,
weights and optimizer slots, the same losses and the same delta rows, step for step (a
Hypothesis stateful test)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.support import with_edits
from tests.trainer.test_admit_ahead import BATCHES, DAYS, EDITS, _assert_same, _state_of
from trainer import online
from trainer.loop import Trainer, TrainJob

# test_admit_ahead's tables, starting at 8 rows: they grow (one kernel, or the stock pads)
TABLES = {
    "user_id": {"steps_to_live": 4, "init_capacity": 8},
    "item_id": {"max_capacity": 48, "init_capacity": 8},
    "zip_code": {"filter_freq": 2, "init_capacity": 8},
    # zip_code's params: the two form a group (keys tagged by table, one admission for both)
    "occupation": {"filter_freq": 2, "init_capacity": 8},
}


@pytest.fixture(scope="module")
def paths(ml_early, tmp_path_factory):
    """Two trainers of one config, on the kernels and on the stock ops; each one's step; the
    batches; a folder for checkpoints."""
    root = tmp_path_factory.mktemp("fused")
    trainers, steps = [], []
    for fused in (True, False):
        edits = {f"feature_config.features[input_names={k}].ev_params": v for k, v in TABLES.items()}
        config = with_edits(ml_early, {**EDITS, **edits, "train_config.fused_kernels": fused})
        job = TrainJob(config=config, model_dir=root / str(fused), train_days=DAYS)
        trainer = Trainer(job)
        online.refresh(trainer.model)
        online.start_day(trainer.model, DAYS[0])
        trainers.append(trainer)
        steps.append(trainer._train_step_fn(trainer.reader.signature()))
    batches = []
    for flat in trainers[0].reader.batches():
        batches.append(tuple(tf.convert_to_tensor(x) for x in flat))
        if len(batches) == BATCHES:
            break
    # every example starts from these: its own sequence alone decides what it finds
    start = [t.checkpoint.save(str(root / "start" / name)) for t, name in zip(trainers, "fs", strict=True)]
    return trainers, steps, batches, root, start


def _deltas(trainer: Trainer, since: int) -> dict:
    """The rows a delta export since step ``since`` would hold: ids, tombstones and views."""
    rows, _ = online.snapshot(trainer.model, since)
    out = {}
    for table, part in rows.items():
        out[f"{table}/ids"] = part.ids
        out[f"{table}/tombstones"] = part.tombstones
        out.update({f"{table}/{name}": value for name, value in part.views.items()})
    return out


def _with_random_ids(trainer: Trainer, batch: tuple, seed: int, pool: int) -> tuple:
    """``batch`` with the online tables' ids drawn from ``pool`` values."""
    reader, flat = trainer.reader, list(batch)
    at = len(reader.labels)  # the ids' place in a flat batch (FeatureReader.signature)
    ids = flat[at].numpy()
    id_features = [f.name for f in reader.features if f.kind == "id"]  # the ids' rows, in order
    rows = [id_features.index(name) for name in TABLES]
    ids[rows] = np.random.default_rng(seed).integers(1, pool + 1, (len(rows), ids.shape[1])) * 1_000_003
    flat[at] = tf.constant(ids, tf.int64)
    return tuple(flat)


class FusedAgainstStock(RuleBasedStateMachine):
    """Steps, day boundaries, saves and restores in any order, on both paths at once."""

    paths: tuple = ()  # the ``paths`` fixture's
    seen: dict = {}  # over every example: restores, and the most rows evicted and ids filtered

    @initialize()
    def start(self):
        (self.fused, self.stock), self.steps, self.batches, self.root, start = self.paths
        self.saved: list[tuple[str, str, int]] = []  # (fused checkpoint, stock checkpoint, step)
        self.load(*start)

    @rule(i=st.integers(0, BATCHES - 1))
    def step(self, i):
        self.train(self.batches[i])

    @rule(i=st.integers(0, BATCHES - 1), seed=st.integers(0, 2**32 - 1), pool=st.sampled_from([16, 64, 512]))
    def step_on_random_ids(self, i, seed, pool):
        # batch i's rows with the online tables' ids drawn from ``pool`` values: admissions,
        # refusals and evictions the day's own ids would not reach
        self.train(_with_random_ids(self.fused, self.batches[i], seed, pool))

    def train(self, flat: tuple) -> None:
        losses = [float(step(*flat)) for step in self.steps]
        assert losses[0] == pytest.approx(losses[1], rel=1e-5)
        for ev in online.tables(self.fused.model):
            for key in ("evicted", "filtered", "capacity"):
                self.seen[key] = max(self.seen.get(key, 0), ev.summary()[key])

    @rule()
    def next_day(self):
        # the day boundary: eviction by unseen days, the sketch's decay
        self.day += 1
        ds = str(np.datetime64("1970-01-01") + np.timedelta64(self.day, "D"))
        evicted = [online.start_day(t.model, ds) for t in (self.fused, self.stock)]
        assert evicted[0] == evicted[1]

    @rule()
    def save(self):
        step = int(self.fused.global_step.numpy())
        prefix = self.root / f"ckpt-{len(self.saved)}"
        paths = [t.checkpoint.save(str(prefix / name)) for t, name in ((self.fused, "f"), (self.stock, "s"))]
        self.saved.append((*paths, step))

    @precondition(lambda self: self.saved)
    @rule(data=st.data())
    def restore(self, data):
        fused, stock, _ = data.draw(st.sampled_from(self.saved))
        self.load(fused, stock)
        self.seen["restores"] = self.seen.get("restores", 0) + 1

    def load(self, fused: str, stock: str) -> None:
        for trainer, path in ((self.fused, fused), (self.stock, stock)):
            trainer.dist.restore(trainer.state, path)
            online.refresh(trainer.model)
        self.day = int(online.clock(self.fused.model).day.numpy())

    @invariant()
    def same_tables(self):
        _assert_same(_state_of(self.stock), _state_of(self.fused))

    @invariant()
    def same_deltas(self):
        since = self.saved[-1][2] if self.saved else 0
        _assert_same(_deltas(self.stock, since), _deltas(self.fused, since))


def test_any_sequence_of_steps_days_saves_and_restores_gives_the_same_tables(paths):
    FusedAgainstStock.paths = paths
    machine = FusedAgainstStock.TestCase
    machine.settings = settings(max_examples=6, stateful_step_count=14, deadline=None)
    machine().runTest()
    # the sequences reached what the paths could differ on
    assert FusedAgainstStock.seen["restores"] > 0, FusedAgainstStock.seen
    assert FusedAgainstStock.seen["evicted"] > 0 and FusedAgainstStock.seen["filtered"] > 0, (
        FusedAgainstStock.seen
    )


def test_the_admission_sketch_widens_on_both_paths_alike(paths):
    # new ids every step until the group's sketch (4,096 counters a hash at least) is half full
    (fused, stock), steps, batches, _, start = paths
    for trainer, path in zip((fused, stock), start, strict=True):
        trainer.dist.restore(trainer.state, path)
        online.refresh(trainer.model)
    group = next(ev for ev in online.tables(fused.model) if ev.grouped)
    width = int(group.counter.width())
    for seed in range(40):
        flat = _with_random_ids(fused, batches[seed % BATCHES], seed, 10**9)
        losses = [float(step(*flat)) for step in steps]
        assert losses[0] == pytest.approx(losses[1], rel=1e-5)
        _assert_same(_state_of(stock), _state_of(fused))
        if int(group.counter.width()) > width:
            break
    assert int(group.counter.width()) > width, "the sketch never widened"
