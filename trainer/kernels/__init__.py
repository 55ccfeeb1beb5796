"""recpipe's own TensorFlow kernels (C++, ``trainer/kernels/*.cc``), built by ``make setup``
(``scripts/build_kernels.sh``: CMake with ``tf.sysconfig``'s flags) into
``build/kernels/librecpipe_kernels.so``, or the library ``$RECPIPE_KERNELS`` names.

The row-wise optimizer updates of embedding tables (``trainer.sparse_optimizers``) run in one
kernel each, in place, over TensorFlow's intra-op threads: LazyAdam, tf-keras' Adagrad and
FTRL-Proximal; an online table's admission in one (``admit``); its
training lookup and its gradient in one kernel each (``gather_rows``); its growth in one
(``grow_rows``). ``train_config.fused_kernels: false``
keeps the stock TensorFlow ops, the reference the kernels are tested against, op by op
(``tests/trainer/test_kernels.py``) and through a model's steps, saves and restores
(``tests/trainer/test_fused_against_stock.py``).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import tensorflow as tf
from tensorflow.python.framework import auto_control_deps_utils
from tensorflow.python.ops import resource_variable_ops

LIBRARY = Path(__file__).resolve().parents[2] / "build" / "kernels" / "librecpipe_kernels.so"


class KernelsMissingError(RuntimeError):
    """The kernels' library is not built or does not load (another TensorFlow than it was
    built for)."""


@functools.cache
def ops():
    """The loaded library's ops (``tf.load_op_library``), loaded once a process.

    Raises:
        KernelsMissingError: no library at ``$RECPIPE_KERNELS`` / ``build/kernels/``, or it
            does not load.
    """
    path = Path(os.environ.get("RECPIPE_KERNELS") or LIBRARY)
    if not path.is_file():
        raise KernelsMissingError(
            f"recpipe's kernels are not built ({path} is missing): run `make setup` or "
            "scripts/build_kernels.sh, or set train_config.fused_kernels: false"
        )
    try:
        return tf.load_op_library(str(path))
    except tf.errors.NotFoundError as err:
        raise KernelsMissingError(
            f"{path} does not load with TensorFlow {tf.__version__} ({err.message.strip()}): "
            "rebuild it with scripts/build_kernels.sh"
        ) from err


def _f32(value) -> tf.Tensor:
    return tf.cast(value, tf.float32)


def sparse_apply_adam(var, m, v, indices, grad, alpha, beta_1, beta_2, epsilon) -> tf.Operation:
    """LazyAdam on rows ``indices`` (``int64 [n]``, distinct) of ``var`` and its slots ``m``,
    ``v`` (float32 ``[rows, dim]`` resource variables), in place, with ``grad`` (float32
    ``[n, dim]``) and ``alpha = lr sqrt(1 - beta_2^t) / (1 - beta_1^t)``. Source: TF Addons
    ``LazyAdam``.

    Raises:
        tf.errors.InvalidArgumentError: an index outside ``[0, rows)`` or mismatched shapes.
    """
    return ops().recpipe_sparse_apply_adam(
        var.handle, m.handle, v.handle, tf.cast(indices, tf.int64), grad,
        _f32(alpha), _f32(beta_1), _f32(beta_2), _f32(epsilon),
    )  # fmt: skip


def sparse_apply_adagrad(var, accumulator, indices, grad, lr, epsilon) -> tf.Operation:
    """tf-keras' Adagrad on rows ``indices`` (distinct) of ``var`` and ``accumulator``:
    ``a += g^2; w -= lr g / sqrt(a + epsilon)``, in place (shapes as ``sparse_apply_adam``)."""
    return ops().recpipe_sparse_apply_adagrad(
        var.handle, accumulator.handle, tf.cast(indices, tf.int64), grad, _f32(lr), _f32(epsilon)
    )


def sparse_apply_ftrl(var, accumulator, linear, indices, grad, lr, l1, l2, l2_shrinkage, lr_power):
    """FTRL-Proximal (McMahan et al., 2013, "Ad Click Prediction: a View from the Trenches",
    algorithm 1; ``lr_power`` in place of -1/2) on rows ``indices`` (distinct) of ``var`` and
    its ``accumulator`` and ``linear`` slots, in place; ``l2`` includes ``beta / (2 lr)``
    (shapes as ``sparse_apply_adam``)."""
    return ops().recpipe_sparse_apply_ftrl(
        var.handle, accumulator.handle, linear.handle, tf.cast(indices, tf.int64), grad,
        _f32(lr), _f32(l1), _f32(l2), _f32(l2_shrinkage), _f32(lr_power),
    )  # fmt: skip


def grow_rows(variables: list, fills: list, rows) -> tf.Operation:
    """An online table's growth: each of ``variables`` (resource variables with one entry a
    row: float32, int64 or int32 ``[rows_now, ...]``) extended in place to ``rows`` (``int64
    []``) rows, the new rows at its entry of ``fills``; a variable already that long is left
    as it is. One variable at a time: the transient is one variable's old and new buffer.

    Raises:
        tf.errors.InvalidArgumentError: another dtype, a scalar variable, or ``fills`` of
            another length.
    """
    handles = [v.handle for v in variables]
    return ops().recpipe_grow_rows(handles, tf.cast(rows, tf.int64), fills=[float(f) for f in fills])


def admit(table, keys, occurrences, members, step, day) -> tuple[tf.Tensor, ...]:
    """An online table's training admission for one step, in one kernel
    (``trainer.online.admit.StepAdmission.admit`` has the stock ops): the rows of ``keys``
    (``int64 [U]``, distinct; ``members`` ``int64 [U]``, each key's table in a group, None for a
    table alone) in ``table``'s id -> row map; the rows found get their sightings
    (``occurrences``, ``int64 [U]``) added and ``step``, ``day`` (``int64 []``) as version and
    day; with ``steps_to_live`` the stale rows are evicted every ``steps_to_live // 8`` steps;
    the others are counted (their sightings plus the count-min sketch's estimate: DeepRec's
    ``CounterFilter``), and those reaching ``filter_freq`` take free rows, the table's state
    growing up to its ``max_capacity`` or its least recently used rows evicted first; the ids
    left out raise their sketch counters (conservative update), the sketch widens when half
    full, and the step's ``STATS`` are added per table. Returns ``(rows int64 [U]`` (-1 for ids
    left without one), ``targets int64 [A]`` (the rows given), ``new_keys int64 [A]`` (their
    ids), ``cleared int64 [C]`` (the rows evicted)): the weights and optimizer slots of
    ``targets`` and ``cleared`` are the caller's to write.

    Raises:
        tf.errors.InvalidArgumentError: mismatched lengths, a member outside the group, or
            state variables of other dtypes or lengths.
    """
    tags = [table.row_tags.handle] if table.grouped else []
    if members is None:
        members = tf.zeros([0], tf.int64)
    return ops().recpipe_admit(
        table.map.resource_handle, table.keys.handle, table.freqs.handle, table.versions.handle,
        table.days.handle, table.free.handle, table.free_top.handle, table.sketch.handle,
        table.sketch_used.handle, table.stats.handle, tags, keys, occurrences, members,
        tf.cast(step, tf.int64), tf.cast(day, tf.int64),
        filter_freq=int(table.params.filter_freq), tags=list(table.tags),
        steps_to_live=int(table.params.steps_to_live or 0), max_rows=int(table.max_rows),
        sketch_most=int(table.sketch_most) if table.sketch_follows else 0,
    )  # fmt: skip


def gather_rows(weights, slots, index) -> tf.Tensor:
    """An online table's training lookup: ``float32 [N, dim]``, row ``slots[index[i]]`` of
    ``weights`` (a float32 ``[rows, dim]`` resource variable) for each key ``i``, zeros where
    the slot is -1; ``slots`` (``int64 [U]``) are the step's distinct ids' rows, ``index``
    (``int64 [N]``) each key's place among them. Its gradient is the rows' ``tf.IndexedSlices``,
    one entry a row (``gather_rows_grad``), as the stock ops' (``trainer.online.table.EVView``).

    Raises:
        tf.errors.InvalidArgumentError: an index outside ``[0, U)`` or a slot past the rows.
    """
    # as the variable's own reads do: a tape (and a tf.function) then watches it
    resource_variable_ops.variable_accessed(weights)
    return ops().recpipe_gather_rows(weights.handle, slots, index)


def gather_rows_grad(grad, slots, index) -> tuple[tf.Tensor, tf.Tensor]:
    """``gather_rows``' gradient: ``(values float32 [H, dim], rows int64 [H])``, one entry for
    each slot that is not -1 in the slots' order, its value the sum of ``grad`` (``float32
    [N, dim]``) over that slot's keys, added in key order (as the stock segment sum)."""
    return ops().recpipe_gather_rows_grad(grad, slots, index)


def _gather_rows_gradient(op, grad):
    values, rows = gather_rows_grad(grad, op.inputs[1], op.inputs[2])
    shape = tf.raw_ops.VariableShape(input=op.inputs[0], out_type=tf.int32)
    return tf.IndexedSlices(values, rows, shape), None, None


tf.RegisterGradient("RecpipeGatherRows")(_gather_rows_gradient)
# a read of the weights only: TensorFlow's automatic control dependencies order it after the
# step's writes to them and let reads run side by side, as for ResourceGather
auto_control_deps_utils.register_read_only_resource_op("RecpipeGatherRows")
