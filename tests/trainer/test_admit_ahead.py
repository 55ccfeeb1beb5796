"""Admission one batch ahead (``train_config.admit_ahead``) against each batch admitted in its own
step, on the MovieLens model with three online tables: one evicted by steps, one full (evicted
least recently used first) and one that admits at the second sighting. The same rows, counts,
versions, days and weights after any interleaving of steps and drains (a Hypothesis stateful
test), and the same checkpoints, at the same steps, through a resumed job."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.support import with_edits
from trainer import online
from trainer.loop import Trainer, TrainJob

LAZY_ADAM = [{"lazy_adam_optimizer": {}}, {"adam_optimizer": {}}]
EDITS = {
    "feature_config.features[input_names=user_id].ev_params": {"steps_to_live": 4},
    "feature_config.features[input_names=item_id].ev_params": {"max_capacity": 48},
    "feature_config.features[input_names=zip_code].ev_params": {"filter_freq": 2},
    "train_config.optimizer_config": LAZY_ADAM,
    "data_config.batch_size": 64,
    "data_config.num_epochs": 1,
}
DAYS = ["1997-09-20", "1997-09-21", "1997-09-22", "1997-09-23"]
BATCHES = 10  # the first batches of DAYS, which the stateful test draws from


def _config(ml_early, **edits):
    return with_edits(ml_early, {**EDITS, **{f"train_config.{k}": v for k, v in edits.items()}})


def _state_of(trainer: Trainer) -> dict[str, np.ndarray]:
    """Every online table's rows and state, and every model and optimizer variable, by name."""
    out = {}
    for ev in trainer.state.evs:
        for var in ev.row_variables + [ev.stats, ev.free_top]:
            out[var.name] = var.numpy()
    for var in trainer.state.all_variables():
        out.setdefault(var.name, var.numpy())
    return out


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name, value in a.items():
        if value.dtype.kind == "f":
            np.testing.assert_allclose(b[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(b[name], value, err_msg=name)


def test_a_job_admitting_ahead_saves_and_resumes_as_one_admitting_each_batch_in_its_step(ml_early, tmp_path):
    runs = {}
    for ahead in (False, True):
        config = _config(ml_early, admit_ahead=ahead, num_steps=23, save_checkpoints_steps=10)
        job = TrainJob(config=config, model_dir=tmp_path / str(ahead), train_days=DAYS)
        trainer = Trainer(job)
        first = trainer.train()
        # resumed from its last checkpoint, to a later step
        job = dataclasses.replace(
            job, config=_config(ml_early, admit_ahead=ahead, num_steps=41), continue_train=True
        )
        resumed = Trainer(job)
        second = resumed.train()
        runs[ahead] = (
            first,
            second,
            _state_of(resumed),
            sorted(p.name for p in job.model_dir.glob("ckpt-*.index")),
        )
    (f0, s0, state0, ckpts0), (f1, s1, state1, ckpts1) = runs[False], runs[True]
    assert (f1.global_step, s1.global_step) == (f0.global_step, s0.global_step) == (23, 41)
    assert ckpts1 == ckpts0  # the same steps saved (a save never holds a batch admitted ahead)
    assert f1.online_tables == f0.online_tables and s1.online_tables == s0.online_tables
    assert f1.loss == pytest.approx(f0.loss, rel=1e-5) and s1.loss == pytest.approx(s0.loss, rel=1e-5)
    _assert_same(state0, state1)
    assert any(v > 0 for k, v in s1.online_tables.items() if k.endswith("/evicted"))


@pytest.fixture(scope="module")
def pair(ml_early, tmp_path_factory):
    """Two trainers of one config, one admitting each batch in its step, one ahead; the batches."""
    root = tmp_path_factory.mktemp("ahead")
    trainers = []
    for ahead in (False, True):
        job = TrainJob(
            config=_config(ml_early, admit_ahead=ahead), model_dir=root / str(ahead), train_days=DAYS
        )
        trainer = Trainer(job)
        online.refresh(trainer.model)
        online.start_day(trainer.model, DAYS[-1])
        trainers.append(trainer)
    batches = []
    for flat in trainers[0].reader.batches():
        batches.append(tuple(tf.convert_to_tensor(x) for x in flat))
        if len(batches) == BATCHES:
            break
    plain, ahead = trainers
    signature = plain.reader.signature()
    return plain, plain._train_step_fn(signature), ahead, ahead._ahead_steps(signature), batches


class AheadAgainstPlain(RuleBasedStateMachine):
    """Steps and drains in any order: after a drain both trainers hold the same state."""

    pair: tuple = ()  # the ``pair`` fixture's

    @initialize()
    def start(self):
        self.plain, self.plain_step, self.ahead, self.steps, self.batches = self.pair
        if self.steps.pending is not None:  # an earlier example's pending batch
            self.trained(self.steps.drain())

    def trained(self, result):
        element, loss = result
        assert float(loss) == pytest.approx(float(self.plain_step(*element)), rel=1e-5)

    @rule(i=st.integers(0, BATCHES - 1))
    def step(self, i):
        if self.steps.pending is None:
            self.steps.admit(self.batches[i])
        else:
            self.trained(self.steps.step(self.batches[i]))

    @precondition(lambda self: self.steps.pending is not None)
    @rule()
    def drain(self):
        self.trained(self.steps.drain())
        _assert_same(_state_of(self.plain), _state_of(self.ahead))

    @invariant()
    def steps_agree(self):
        # the plain trainer has trained every batch the ahead one has
        assert int(self.plain.global_step.numpy()) == int(self.ahead.global_step.numpy())


def test_any_interleaving_of_steps_and_drains_gives_the_same_tables(pair):
    AheadAgainstPlain.pair = pair
    machine = AheadAgainstPlain.TestCase
    machine.settings = settings(max_examples=6, stateful_step_count=12, deadline=None)
    machine().runTest()
