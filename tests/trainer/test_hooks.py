"""The training loop's hooks, each alone: when they act, what they record, what stops training."""

from __future__ import annotations

import logging

import pytest
import tensorflow as tf

from trainer.hooks import (
    TRIM_STEPS,
    CheckpointSaver,
    DivergedError,
    EarlyStopping,
    PhaseTimer,
    StepEnd,
    StepLog,
    Summaries,
)


def _end(step, loss=0.5, examples=32, first=False, drained=True) -> StepEnd:
    return StepEnd(step, tf.constant(loss), examples, first, drained)


def _fetch(t) -> float:
    return float(t.numpy())


def _saver(saved: list, every: int = 3, start: int = 0, takes_part=True, had=False) -> CheckpointSaver:
    return CheckpointSaver(
        saved.append, _fetch, lambda step, last, _t: step - last >= every, start, takes_part, had
    )


def test_the_saver_saves_every_interval_only_between_drained_steps_and_once_at_the_end():
    saved: list = []
    saver = _saver(saved)
    for step in range(1, 8):
        saver.after_step(_end(step, drained=step != 3))  # a batch admitted ahead at step 3
    assert saved == [4, 7]
    assert saver.due(10) and not saver.due(9)
    saver.end(7)  # saved already
    saver.end(8)
    assert saved == [4, 7, 8]


def test_the_saver_of_a_job_that_ran_no_step_saves_only_into_an_empty_model_dir():
    saved: list = []
    _saver(saved, start=5, had=True).end(5)
    assert saved == []
    _saver(saved, start=5, had=False).end(5)
    assert saved == [5]
    _saver(saved, takes_part=False).end(9)  # a process that takes no part in saves
    assert saved == [5]


def test_a_nan_loss_stops_before_the_save_and_names_the_last_checkpoint():
    saved: list = []
    saver = _saver(saved)
    saver.after_step(_end(3))
    with pytest.raises(DivergedError, match="the loss is nan at step 6: .* nothing after step 3 was saved"):
        saver.after_step(_end(6, loss=float("nan")))
    assert saved == [3]


def test_the_log_reports_every_n_steps_with_the_window_rate_and_the_tables_figures(caplog):
    logged = []
    saver = _saver([])
    hook = StepLog(
        2, 10, _fetch, lambda: 0.01, lambda: {"ev/x/rows_used": 7}, lambda s, f: logged.append((s, f)), saver
    )
    with caplog.at_level(logging.INFO, logger="trainer.hooks"):
        for step in range(1, 6):
            assert hook.after_step(_end(step, loss=0.25)) is False
    assert [s for s, _ in logged] == [2, 4]
    figures = logged[0][1]
    assert figures["loss"] == 0.25 and figures["learning_rate"] == 0.01 and figures["ev/x/rows_used"] == 7
    assert figures["examples_per_sec"] > 0
    assert "step 4/10 loss 0.25000 lr 0.01" in caplog.text
    with pytest.raises(DivergedError, match="at step 6"):
        hook.after_step(_end(6, loss=float("inf")))


def test_summaries_write_the_loss_every_n_steps(tmp_path):
    hook = Summaries(str(tmp_path), 2, _fetch, lambda: 0.1)
    for step in range(1, 5):
        hook.after_step(_end(step, loss=float(step)))
    hook.end(4)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0}).Reload()
    loss = [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events.Tensors("loss")]
    assert loss == [(2, 2.0), (4, 4.0)]


def test_early_stopping_asks_every_interval_between_drained_steps():
    asked = []

    def stop(step):
        asked.append(step)
        return step >= 6

    hook = EarlyStopping(3, stop)
    results = [hook.after_step(_end(s, drained=s != 3)) for s in range(1, 7)]
    assert asked == [6] and results == [False] * 5 + [True]


def test_the_phase_timer_times_the_first_step_then_the_steady_ones_and_trims_memory():
    marks, released = [], []

    class Memory:
        def mark(self, name):
            marks.append(name)

    timer = PhaseTimer(_fetch, Memory(), lambda: released.append(1), {"wall": 0.0, "cpu": 0.0})
    timer.after_step(_end(1, first=True))
    for step in range(2, TRIM_STEPS + 2):
        timer.after_step(_end(step))
    timer.end(TRIM_STEPS + 1)
    assert marks == ["first_step"] and len(released) == 2  # after tracing, at TRIM_STEPS
    assert timer.phases["first_step_s"] > 0 and timer.phases["step_ms"] >= 0
    assert set(timer.phases) == {"first_step_s", "first_step_cpu_s", "step_ms", "step_cpu_ms"}
