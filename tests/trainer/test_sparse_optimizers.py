"""Row-wise optimizers: equal to the dense ones on the rows in the batch, nothing else moves."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from recpipe.config.train import OptimizerConfig
from trainer.checkpoints import fine_tune_restore
from trainer.embedding_tables import name_map
from trainer.optimizers import build_optimizer
from trainer.sparse_optimizers import Adam, LazyAdam, SparseFtrl

ROWS, DIM = 8, 3
IDS = tf.constant([1, 5, 5, 2])  # a repeated id: its gradients are summed
TOUCHED, UNTOUCHED = [1, 2, 5], [0, 3, 4, 6, 7]


def _table(name="t/embedding_weights"):
    rng = np.random.default_rng(0)
    return tf.Variable(rng.normal(size=(ROWS, DIM)).astype("float32"), name=name)


def _sparse_grad(table, seed=1):
    weights = tf.constant(np.random.default_rng(seed).normal(size=(4, DIM)).astype("float32"))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, IDS) * weights)
    grad = tape.gradient(loss, table)
    assert isinstance(grad, tf.IndexedSlices)
    return grad


def _prime(opt, table):
    """Non-zero slots everywhere, as after many steps, and a step count > 0."""
    rng = np.random.default_rng(2)
    opt.build([table])
    for slot in opt.variables[1:]:
        slot.assign(np.abs(rng.normal(size=slot.shape)).astype("float32") + 0.1)
    opt.iterations.assign(7)


def _step(opt_cls, kwargs, dense_cls=None):
    """One step of the row-wise optimizer on a sparse gradient and of the dense one on the
    same gradient densified; returns (table, slots) of each."""
    out = []
    for cls, densify in ((opt_cls, False), (dense_cls or opt_cls, True)):
        table, opt = _table(), cls(**kwargs)
        _prime(opt, table)
        grad = _sparse_grad(table)
        opt.apply_gradients([(tf.convert_to_tensor(grad) if densify else grad, table)])
        out.append((table.numpy(), [s.numpy() for s in opt.variables[1:]]))
    return out


@pytest.mark.parametrize(
    ("cls", "kwargs", "dense_cls"),
    [
        (LazyAdam, {"learning_rate": 0.05}, keras.optimizers.Adam),
        (keras.optimizers.Adagrad, {"learning_rate": 0.05}, None),
        (
            SparseFtrl,
            {"learning_rate": 0.05, "l1_regularization_strength": 0.01, "l2_regularization_strength": 0.1},
            keras.optimizers.Ftrl,
        ),
    ],
    ids=["lazy_adam", "adagrad", "ftrl"],
)
def test_row_wise_step_equals_dense_step_on_touched_rows(cls, kwargs, dense_cls):
    (sparse_w, sparse_slots), (dense_w, dense_slots) = _step(cls, kwargs, dense_cls)
    start = _table().numpy()
    np.testing.assert_allclose(sparse_w[TOUCHED], dense_w[TOUCHED], rtol=1e-5, atol=1e-6)
    assert not np.allclose(sparse_w[TOUCHED], start[TOUCHED])
    np.testing.assert_array_equal(sparse_w[UNTOUCHED], start[UNTOUCHED])
    fresh_opt = cls(**kwargs)
    _prime(fresh_opt, _table())
    for got, dense, before in zip(sparse_slots, dense_slots, fresh_opt.variables[1:], strict=True):
        np.testing.assert_allclose(got[TOUCHED], dense[TOUCHED], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got[UNTOUCHED], before.numpy()[UNTOUCHED])


def test_dense_adam_moves_untouched_rows_which_lazy_adam_leaves():
    # the difference that makes LazyAdam cheap: Adam decays every row's moments and moves it
    (_, _), (dense_w, dense_slots) = _step(LazyAdam, {"learning_rate": 0.05}, keras.optimizers.Adam)
    start = _table().numpy()
    assert not np.allclose(dense_w[UNTOUCHED], start[UNTOUCHED])


def test_lazy_adam_dense_gradients_take_adam():
    w_lazy, w_adam = tf.Variable([[1.0, -2.0]]), tf.Variable([[1.0, -2.0]])
    for var, opt in ((w_lazy, LazyAdam(0.1)), (w_adam, Adam(0.1))):
        for _ in range(3):
            opt.apply_gradients([(tf.constant([[0.5, -1.0]]), var)])
    np.testing.assert_allclose(w_lazy.numpy(), w_adam.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="amsgrad"):
        LazyAdam(0.1, amsgrad=True)


def test_config_names_build_the_row_wise_optimizers():
    assert isinstance(build_optimizer(OptimizerConfig(lazy_adam_optimizer={}), "o"), LazyAdam)
    assert isinstance(build_optimizer(OptimizerConfig(ftrl_optimizer={}), "o"), SparseFtrl)
    assert isinstance(build_optimizer(OptimizerConfig(adagrad_optimizer={}), "o"), keras.optimizers.Adagrad)


@pytest.mark.parametrize("which", ["lazy_adam_optimizer", "adagrad_optimizer", "ftrl_optimizer"])
def test_slots_round_trip_through_checkpoint_and_fine_tune(tmp_path, which):
    table = _table("deepfm/input_layer/C1/embedding_weights")
    opt = build_optimizer(OptimizerConfig(**{which: {}}), "optimizer_0")
    opt.build([table])
    for _ in range(3):
        opt.apply_gradients([(_sparse_grad(table), table)])
    ckpt = tf.train.Checkpoint(variables=name_map([table]), optimizer_0=opt)
    path = ckpt.save(str(tmp_path / "model.ckpt"))

    # continue_train: tf.train.Checkpoint restores the slots and the step count
    table2 = _table("deepfm/input_layer/C1/embedding_weights")
    opt2 = build_optimizer(OptimizerConfig(**{which: {}}), "optimizer_0")
    opt2.build([table2])
    tf.train.Checkpoint(variables=name_map([table2]), optimizer_0=opt2).restore(path).assert_consumed()
    for a, b in zip(opt.variables, opt2.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())

    # fine-tune: the slots by name, into an optimizer at another position in the split
    table3 = _table("deepfm/input_layer/C1/embedding_weights")
    dense = tf.Variable(tf.zeros([2]), name="deepfm/dnn/kernel")
    first = build_optimizer(OptimizerConfig(adam_optimizer={}), "optimizer_0")
    first.build([dense])
    second = build_optimizer(OptimizerConfig(**{which: {}}), "optimizer_1")
    second.build([table3])
    report = fine_tune_restore(
        name_map([table3, dense]),
        path,
        optimizers=[first, second],
    )
    assert report.missing == ["deepfm/dnn/kernel"]
    assert len(report.slots_restored) == len(opt.variables) - 1
    assert report.optimizer_iterations == {"optimizer_1": 3}
    np.testing.assert_array_equal(table3.numpy(), table.numpy())
    for a, b in zip(opt.variables, second.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert int(first.iterations) == 0


@pytest.mark.parametrize("sparse", [False, True])
def test_the_fused_adam_kernel_equals_tf_keras_adam(sparse):
    """``adam_optimizer`` runs TensorFlow's fused kernel in place; its numbers are tf-keras'
    (up to float rounding), for dense gradients and for sparse ones (repeated rows summed)."""
    rng = np.random.default_rng(0)
    start = rng.normal(size=(50, 4)).astype(np.float32)
    fused, reference = tf.Variable(start), tf.Variable(start)
    ours, theirs = Adam(0.01), keras.optimizers.Adam(0.01)
    for _ in range(5):
        grad = rng.normal(size=(50, 4)).astype(np.float32)
        if sparse:
            rows = rng.choice(50, 12, replace=True)
            grad = tf.IndexedSlices(tf.constant(grad[rows]), tf.constant(rows), tf.constant([50, 4]))
        ours.apply_gradients([(grad, fused)])
        theirs.apply_gradients([(grad, reference)])
    np.testing.assert_allclose(fused.numpy(), reference.numpy(), atol=2e-6)
    for a, b in zip(ours.variables, theirs.variables, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-6)
