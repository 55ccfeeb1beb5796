"""trainer.kernels: the C++ row-wise optimizer updates give the stock ops' weights and slots,
step for step (to the last bits of rounding), on tables that grow between steps; the online
tables' fused lookup gives the stock ops' rows and gradient, bit for bit, and their growth
the stock pad's rows; bad indices and a missing library are refused with the reason."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from recpipe.config.train import OptimizerConfig
from tests.support import ROOT
from trainer import kernels
from trainer.optimizers import build_optimizer

OPTIMIZERS = {
    "lazy_adam_optimizer": {},
    "adagrad_optimizer": {"initial_accumulator_value": 0.1},
    "ftrl_optimizer": {"l1_reg": 0.01, "l2_reg": 0.1},
}


def _config(which: str) -> OptimizerConfig:
    lr = {"learning_rate": {"constant_learning_rate": {"learning_rate": 0.05}}}
    return OptimizerConfig(**{which: {**lr, **OPTIMIZERS[which]}})


def _table(start: np.ndarray) -> tf.Variable:
    # an online table's variable: unknown first dimension, so that it can grow
    return tf.Variable(start, shape=tf.TensorShape([None, start.shape[1]]))


def _grow(opt, table: tf.Variable, rows: int) -> None:
    """The table and its slots extended to ``rows`` (as EmbeddingVariable grows them)."""
    for var in [table, *opt.variables[1:]]:
        if var.shape.rank == 2:
            old = var.numpy()
            var.assign(np.concatenate([old, np.full((rows - len(old), old.shape[1]), 0.5, np.float32)]))


steps = st.lists(
    st.tuples(st.integers(0, 2**31), st.integers(0, 6)),  # (the step's seed, rows to grow by)
    min_size=1,
    max_size=5,
)


@pytest.mark.parametrize("which", sorted(OPTIMIZERS))
@settings(max_examples=25)
@given(rows=st.integers(1, 40), dim=st.integers(1, 9), steps=steps, traced=st.booleans())
def test_fused_updates_equal_the_stock_ops_step_for_step(which, rows, dim, steps, traced):
    start = np.random.default_rng(rows * dim).normal(size=(rows, dim)).astype(np.float32)
    runs = {}
    for fused in (True, False):
        table, opt = _table(start), build_optimizer(_config(which), "optimizer_0", fused)
        opt.build([table])
        apply = tf.function(opt.apply_gradients) if traced else opt.apply_gradients
        trace = []
        size = rows
        for seed, grow in steps:
            if grow:
                size += grow
                _grow(opt, table, size)
            rng = np.random.default_rng(seed)
            touched = rng.choice(size, rng.integers(1, size + 1), replace=False)  # distinct rows
            values = rng.normal(size=(len(touched), dim)).astype(np.float32)
            grad = tf.IndexedSlices(tf.constant(values), tf.constant(touched, tf.int64))
            apply([(grad, table)])
            trace.append([v.numpy() for v in [table, *opt.variables[1:]] if v.shape.rank == 2])
        runs[fused] = trace
    for fused_step, stock_step in zip(runs[True], runs[False], strict=True):
        for a, b in zip(fused_step, stock_step, strict=True):
            # the same formulas in the same order; a traced stock step may differ in the
            # last bit (Grappler rewrites x / sqrt(y) as x * rsqrt(y); libm's pow and Eigen's)
            # (FTRL's linear slot sums terms that cancel: a few ulps of its largest value)
            scale = np.abs(b).max(initial=1.0) if which == "ftrl_optimizer" else 0.1
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=4 * np.spacing(np.float32(scale)))


def _lookups(table, slots: list[int], keys: list[int], upstream, traced: bool) -> dict:
    """Both paths' ``(rows, grad values, grad rows, grad shape, sums_duplicates)`` of an online
    table's training lookup of ``keys`` (places among ``slots``, the step's distinct ids' rows)."""
    from trainer.embedding_tables import sums_duplicates
    from trainer.online.table import _found, gather_found

    slots_t, index = tf.constant(slots, tf.int64), tf.constant(keys, tf.int64)
    summed = []

    def lookup(fused: bool):
        with tf.GradientTape() as tape:
            if fused:
                out = kernels.gather_rows(table, slots_t, index)
            else:
                out = gather_found(table, _found(slots_t, index))
            loss = tf.reduce_sum(out * upstream)
        grad = tape.gradient(loss, table)
        summed.append(sums_duplicates(grad))
        return out, grad.values, grad.indices, grad.dense_shape

    run = tf.function(lookup, autograph=False) if traced else lookup
    return {fused: [np.asarray(x) for x in run(fused)] + [summed[-1]] for fused in (True, False)}


@settings(max_examples=60)
@given(
    rows=st.integers(1, 30),
    dim=st.integers(1, 9),
    slots=st.lists(st.integers(-1, 29), min_size=1, max_size=12),
    keys=st.lists(st.integers(0, 11), min_size=0, max_size=40),
    seed=st.integers(0, 2**31),
)
def test_the_fused_lookup_and_its_gradient_equal_the_stock_ops(rows, dim, slots, keys, seed):
    seen: set[int] = set()  # the rows distinct, as admission gives them
    slots = [s if s < rows and s not in seen and not seen.add(s) else -1 for s in slots]
    keys = [k % len(slots) for k in keys]
    rng = np.random.default_rng(seed)
    table = _table(rng.normal(size=(rows, dim)).astype(np.float32))
    upstream = tf.constant(rng.normal(size=(len(keys), dim)).astype(np.float32))
    runs = _lookups(table, slots, keys, upstream, traced=False)
    names = ("rows", "grad values", "grad rows", "shape")
    for name, a, b in zip(names, runs[True], runs[False], strict=False):
        np.testing.assert_array_equal(a, b, err_msg=name)
    expect = table.numpy()[[max(slots[k], 0) for k in keys]].reshape(-1, dim)
    expect[[slots[k] < 0 for k in keys]] = 0.0
    np.testing.assert_array_equal(runs[True][0], expect)


def test_the_fused_lookup_traced_gives_one_gradient_entry_a_row():
    # as training traces it: the optimizers see a gradient without duplicates, and sum nothing
    table = _table(np.arange(12, dtype=np.float32).reshape(6, 2))
    slots, keys = [4, -1, 0, 5], [0, 1, 2, 2, 3, 0, 1]
    runs = _lookups(table, slots, keys, tf.ones((len(keys), 2)), traced=True)
    for a, b in zip(runs[True][:4], runs[False][:4], strict=True):
        np.testing.assert_array_equal(a, b)
    assert runs[True][4] is runs[False][4] is False
    np.testing.assert_array_equal(runs[True][2], [4, 0, 5])
    np.testing.assert_array_equal(runs[True][1], [[2.0, 2.0], [2.0, 2.0], [1.0, 1.0]])


def test_a_lookup_outside_the_slots_or_the_rows_is_refused():
    table = _table(np.ones((4, 2), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"index\[1\] = 3 is not in \[0, 2\)"):
        kernels.gather_rows(table, tf.constant([0, 1], tf.int64), tf.constant([0, 3], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"slots\[1\] = 4 is not below 4"):
        kernels.gather_rows(table, tf.constant([0, 4], tf.int64), tf.constant([1], tf.int64))


def test_an_index_outside_the_table_is_refused_and_nothing_moves():
    table = _table(np.ones((4, 2), np.float32))
    slots = [_table(np.zeros((4, 2), np.float32)) for _ in range(2)]
    grad = tf.ones((2, 2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[1\] = 4 is not in \[0, 4\)"):
        kernels.sparse_apply_adam(table, *slots, tf.constant([0, 4], tf.int64), grad, 0.1, 0.9, 0.999, 1e-7)
    np.testing.assert_array_equal(table.numpy(), np.ones((4, 2)))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"must be \[n\] and \[n, 2\]"):
        kernels.sparse_apply_adagrad(table, slots[0], tf.constant([0], tf.int64), tf.ones((1, 3)), 0.1, 1e-7)


def test_a_value_read_before_the_update_keeps_what_it_read():
    table, m, v = (_table(np.full((3, 2), x, np.float32)) for x in (1.0, 0.0, 0.0))
    before = table.read_value()
    kernels.sparse_apply_adam(table, m, v, tf.constant([1], tf.int64), tf.ones((1, 2)), 0.1, 0.9, 0.999, 1e-7)
    np.testing.assert_array_equal(before.numpy(), np.ones((3, 2)))
    assert table.numpy()[1, 0] < 1.0 and table.numpy()[0, 0] == 1.0


@settings(max_examples=30)
@given(
    rows=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    dim=st.integers(1, 5),
    target=st.integers(0, 20),
    traced=st.booleans(),
)
def test_growth_extends_every_variable_at_its_fill_as_the_stock_pad_does(rows, dim, target, traced):
    # an online table's row variables: float32 weights [rows, dim], int64 state [rows]
    rng = np.random.default_rng(target)
    variables, expect = [], []
    for i, n in enumerate(rows):
        fill = [-1, 0.5, 0, 3][i % 4]
        start = rng.normal(size=(n, dim)).astype(np.float32) if i % 2 else rng.integers(0, 9, n)
        variables.append(tf.Variable(start, shape=tf.TensorShape([None, *start.shape[1:]])))
        extra = max(0, target - n)
        pad = np.full((extra, *start.shape[1:]), fill, start.dtype)
        expect.append((np.concatenate([start, pad]), fill))
    fills = [f for _, f in expect]

    def grow() -> None:
        kernels.grow_rows(variables, fills, tf.constant(target, tf.int64))

    before = variables[0].read_value()
    (tf.function(grow, autograph=False) if traced else grow)()
    for var, (want, _) in zip(variables, expect, strict=True):
        assert var.dtype == tf.as_dtype(want.dtype)
        np.testing.assert_array_equal(var.numpy(), want)  # a longer variable is left as it is
    assert before.shape[0] == rows[0]  # a value read before keeps its rows


def test_growth_refuses_an_unsupported_dtype_or_fills_of_another_length():
    strings = tf.Variable(["a"], shape=tf.TensorShape([None]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="string rows are not supported"):
        kernels.grow_rows([strings], [0], 3)
    table = _table(np.ones((2, 2), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="1 variables but 2 fill values"):
        kernels.ops().recpipe_grow_rows([table.handle], tf.constant(3, tf.int64), fills=[0.0, 1.0])
    np.testing.assert_array_equal(table.numpy(), np.ones((2, 2)))


def test_a_missing_library_is_one_clear_error(tmp_path):
    code = (
        "from trainer import kernels\n"
        "try:\n    kernels.ops()\nexcept kernels.KernelsMissingError as e:\n    print('refused:', e)\n"
    )
    env = {**os.environ, "RECPIPE_KERNELS": str(tmp_path / "none.so"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert f"refused: recpipe's kernels are not built ({tmp_path / 'none.so'} is missing)" in out.stdout
    assert "make setup" in out.stdout


def test_a_job_on_the_kernels_trains_as_on_the_stock_ops(ml_early, tmp_path):
    # three online tables (evicted by steps, full, admitting at the second sighting) and lazy
    # Adam: the same losses, rows, counts and weights after 23 steps, to the optimizers' rounding
    from tests.trainer.test_admit_ahead import DAYS, _assert_same, _config, _state_of
    from trainer.loop import Trainer, TrainJob

    runs = {}
    for fused in (True, False):
        config = _config(ml_early, fused_kernels=fused, num_steps=23)
        trainer = Trainer(TrainJob(config=config, model_dir=tmp_path / str(fused), train_days=DAYS))
        result = trainer.train()
        runs[fused] = (result.global_step, result.loss, _state_of(trainer))
    assert runs[True][0] == runs[False][0] == 23
    np.testing.assert_allclose(runs[True][1], runs[False][1], rtol=1e-5)
    _assert_same(runs[False][2], runs[True][2])
