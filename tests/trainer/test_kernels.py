"""trainer.kernels: the C++ row-wise optimizer updates give the stock ops' weights and slots,
step for step (to the last bits of rounding), on tables that grow between steps; bad indices
and a missing library are refused with the reason."""

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


def test_a_missing_library_is_one_clear_error(tmp_path):
    code = (
        "from trainer import kernels\n"
        "try:\n    kernels.ops()\nexcept kernels.KernelsMissingError as e:\n    print('refused:', e)\n"
    )
    env = {**os.environ, "RECPIPE_KERNELS": str(tmp_path / "none.so"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert f"refused: recpipe's kernels are not built ({tmp_path / 'none.so'} is missing)" in out.stdout
    assert "make setup" in out.stdout
