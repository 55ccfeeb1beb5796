"""Optimizers whose update of an embedding table touches only the rows in the batch.

A table's gradient from ``tf.gather`` is a ``tf.IndexedSlices`` over the looked-up rows;
tf-keras's ``apply_gradients`` first sums duplicate ids (``_deduplicate_sparse_grad``; not
for a gradient whose rows are already distinct, ``trainer.embedding_tables.gather_unique``), so
each ``update_step`` below sees unique row ids. Dense gradients (MLP weights) take the
parent class's dense path unchanged. Slots are the parent's (``m``/``v``; ``accumulator``/
``linear``), so checkpoints look the same as with the dense optimizer.

With ``fused_kernels`` (the default) the row-wise updates of a table's float32 variable run in
one of ``trainer.kernels``' C++ kernels, which compute the same formulas in the same order;
otherwise, and for distributed variables, in the stock ops below.

Tf-keras's ``Adam`` decays both moments of every row and rewrites every weight of a table on
each step, although a batch touches a few thousand rows; for 26 x 12,800 x 16 tables that is
5.3M parameters a step. ``Adagrad`` is already row-wise in tf-keras.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from trainer import kernels
from trainer.embedding_tables import plain_variable, rows_of, sums_duplicates


def _set_rows(slot: tf.Variable, indices: tf.Tensor, rows: tf.Tensor) -> None:
    slot.scatter_update(tf.IndexedSlices(rows, indices))


class _StepMemo:
    # a plain holder, so that Keras does not track the traced tensors
    def __init__(self):
        self.graph = None
        self.values: dict = {}


class GrowableSlots:
    """Optimizer slots for variables of unknown length (the online tables, which grow): a slot
    of such a variable is made with the same unknown first dimension, so that the table can
    extend it (``trainer.online.EmbeddingVariable._grow_weights``). Other variables' slots are tf-keras's
    own. Mixed into every optimizer ``trainer.optimizers.build_optimizer`` makes.

    Attributes:
        fused_kernels: row-wise updates in ``trainer.kernels`` where ``_fused`` allows.
    """

    fused_kernels = True

    def _fused(self, gradient, variable) -> bool:
        """Whether this sparse update runs in a ``trainer.kernels`` kernel: a row gradient of
        a float32 variable of this process."""
        return (
            self.fused_kernels
            and isinstance(gradient, tf.IndexedSlices)
            and plain_variable(variable)
            and variable.dtype == tf.float32
            and variable.shape.rank == 2
        )

    def add_variable_from_reference(self, model_variable, variable_name, shape=None, initial_value=None):
        if shape is not None or model_variable.shape.is_fully_defined():
            return super().add_variable_from_reference(model_variable, variable_name, shape, initial_value)
        if initial_value is None:
            initial_value = tf.zeros_like(model_variable)
        variable = tf.Variable(
            initial_value=initial_value,
            name=f"{variable_name}/{model_variable._shared_name}",
            dtype=model_variable.dtype,
            trainable=False,
            shape=model_variable.shape,
        )
        self._variables.append(variable)
        return variable

    def _deduplicate_sparse_grad(self, grads):
        # an online table's gradient already has one entry per row (gather_unique)
        kept = {
            i: g for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices) and not sums_duplicates(g)
        }
        summed = super()._deduplicate_sparse_grad([None if i in kept else g for i, g in enumerate(grads)])
        return [kept.get(i, g) for i, g in enumerate(summed)]

    def _filled(self, var: tf.Variable, value: float) -> tf.Tensor:
        """A slot's initial value ``value`` in the shape of ``var``, known or not."""
        dims = var.shape if var.shape.is_fully_defined() else tf.shape(var)
        return tf.cast(tf.fill(dims, value), var.dtype)


class Adam(GrowableSlots, keras.optimizers.Adam):
    """tf-keras ``Adam`` (every row moves each step), with ``GrowableSlots``.

    The update is TensorFlow's fused ``ResourceApplyAdam`` kernel (the same formula as
    tf-keras': ``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2``, ``w <- w - lr
    sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps)``), in place: tf-keras' update makes about
    four temporaries the size of the variable, which for a table of 2.6M x 16 rows is most of
    the job's memory. A sparse gradient is summed into one dense tensor first, as
    tf-keras' dense Adam applies it to every row anyway. ``amsgrad``, ``adaptive_epsilon`` and
    distributed variables take tf-keras' own update.
    """

    def update_step(self, gradient, variable):
        fused = not (self.amsgrad or getattr(self, "adaptive_epsilon", False)) and plain_variable(variable)
        if not fused:
            return super().update_step(gradient, variable)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        key = self._index_dict[self._var_key(variable)]
        if isinstance(gradient, tf.IndexedSlices):
            # rows summed, the rest zero. Not unsorted_segment_sum: its CPU kernel scans every
            # index once per block of output rows; scatter_nd writes each row once (an epoch of
            # DeepFM on MovieLens: 9.1 -> 8.5 CPU-s)
            indices = tf.cast(gradient.indices, tf.int64)[:, None]
            shape = tf.stack([rows_of(variable), tf.constant(variable.shape[1], tf.int64)])
            gradient = tf.scatter_nd(indices, gradient.values, shape)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=self._momentums[key].handle,
            v=self._velocities[key].handle,
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(self.learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=gradient,
            use_locking=False,
        )


class AdamW(GrowableSlots, keras.optimizers.AdamW):
    """tf-keras ``AdamW``, with ``GrowableSlots``."""


class SGD(GrowableSlots, keras.optimizers.SGD):
    """tf-keras ``SGD`` (with or without momentum), with ``GrowableSlots``."""


class Adagrad(GrowableSlots, keras.optimizers.Adagrad):
    """tf-keras ``Adagrad`` (already row-wise on sparse gradients), with ``GrowableSlots``."""

    def build(self, var_list):
        # tf-keras's build sizes the accumulator from var.shape, unknown for an online table
        keras.optimizers.Optimizer.build(self, var_list)
        if getattr(self, "_built", False):
            return
        self._built = True
        self._accumulators = [
            self.add_variable_from_reference(
                var, "accumulator", initial_value=self._filled(var, self.initial_accumulator_value)
            )
            for var in var_list
        ]

    def update_step(self, gradient, variable):
        if not self._fused(gradient, variable):
            return super().update_step(gradient, variable)
        accumulator = self._accumulators[self._index_dict[self._var_key(variable)]]
        lr = tf.cast(self.learning_rate, variable.dtype)
        idx, g = gradient.indices, gradient.values
        kernels.sparse_apply_adagrad(variable, accumulator, idx, g, lr, self.epsilon)


class LazyAdam(Adam):
    """Adam with row-wise ("lazy") updates of sparse gradients.

    For a table row ``i`` in the batch, with gradient row ``g_i`` (float32 ``[dim]``) and
    global step ``t`` (the optimizer's ``iterations`` + 1)::

        m_i <- beta_1 m_i + (1 - beta_1) g_i
        v_i <- beta_2 v_i + (1 - beta_2) g_i^2
        w_i <- w_i - lr sqrt(1 - beta_2^t) / (1 - beta_1^t) * m_i / (sqrt(v_i) + epsilon)

    Rows not in the batch keep their weights and moments (dense Adam would decay the
    moments and move the weights of every row). Source: TF Addons ``LazyAdam``; EasyRec's
    ``lazy_adam_optimizer``. Arguments are tf-keras ``Adam``'s; ``amsgrad`` is not supported.

    Raises:
        ValueError: ``amsgrad=True``.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.amsgrad:
            raise ValueError("LazyAdam does not support amsgrad")
        self._memo = _StepMemo()

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        try:
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        finally:  # the step size is this call's; keep no traced graph alive after it
            self._memo.graph, self._memo.values = None, {}

    def _step_size(self, dtype) -> tf.Tensor:
        """``lr sqrt(1 - beta_2^t) / (1 - beta_1^t)``: traced once per ``apply_gradients``
        (and dtype) and shared by every sparse variable's update, for fewer graph ops."""
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        memo = self._memo
        if graph is not None and memo.graph is graph and dtype in memo.values:
            return memo.values[dtype]
        lr = tf.cast(self.learning_rate, dtype)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        alpha = lr * tf.sqrt(1 - tf.pow(beta_2, step)) / (1 - tf.pow(beta_1, step))
        if graph is not None:
            if memo.graph is not graph:
                memo.graph, memo.values = graph, {}
            memo.values[dtype] = alpha
        return alpha

    def update_step(self, gradient, variable):
        if not isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable)
        dtype = variable.dtype
        alpha = self._step_size(dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        key = self._index_dict[self._var_key(variable)]
        m, v = self._momentums[key], self._velocities[key]
        idx, g = gradient.indices, gradient.values
        if self._fused(gradient, variable):
            kernels.sparse_apply_adam(variable, m, v, idx, g, alpha, beta_1, beta_2, self.epsilon)
            return
        m_rows = beta_1 * tf.gather(m, idx) + (1 - beta_1) * g
        v_rows = beta_2 * tf.gather(v, idx) + (1 - beta_2) * tf.square(g)
        _set_rows(m, idx, m_rows)
        _set_rows(v, idx, v_rows)
        variable.scatter_sub(tf.IndexedSlices(alpha * m_rows / (tf.sqrt(v_rows) + self.epsilon), idx))


class SparseFtrl(GrowableSlots, keras.optimizers.Ftrl):
    """FTRL-Proximal with row-wise updates of sparse gradients.

    On the rows in the batch the update equals tf-keras ``Ftrl``'s (McMahan et al., 2013,
    "Ad Click Prediction: a View from the Trenches", algorithm 1, with ``learning_rate_power``
    in place of -1/2); tf-keras applies that formula to every row, which also recomputes each
    untouched row from its accumulators (resetting a never-updated row's initial value to
    zero). Here untouched rows and their ``accumulator`` / ``linear`` slots are left alone.
    Arguments are tf-keras ``Ftrl``'s.
    """

    def build(self, var_list):
        # tf-keras's build sizes the accumulator from var.shape, unknown for an online table
        keras.optimizers.Optimizer.build(self, var_list)
        if getattr(self, "_built", False):
            return
        self._accumulators, self._linears = [], []
        for var in var_list:
            start = self._filled(var, self.initial_accumulator_value)
            self._accumulators.append(
                self.add_variable_from_reference(var, "accumulator", initial_value=start)
            )
            self._linears.append(self.add_variable_from_reference(var, "linear"))
        self._built = True

    def update_step(self, gradient, variable):
        if not isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable)
        dtype = variable.dtype
        lr = tf.cast(self.learning_rate, dtype)
        key = self._index_dict[self._var_key(variable)]
        accum, linear = self._accumulators[key], self._linears[key]
        power = self.learning_rate_power
        l2 = self.l2_regularization_strength + self.beta / (2.0 * lr)
        l1 = self.l1_regularization_strength
        idx, g = gradient.indices, gradient.values
        if self._fused(gradient, variable):
            shrink = self.l2_shrinkage_regularization_strength
            kernels.sparse_apply_ftrl(variable, accum, linear, idx, g, lr, l1, l2, shrink, power)
            return
        w = tf.gather(variable, idx)
        a = tf.gather(accum, idx)
        new_a = a + tf.square(g)
        lin = tf.gather(linear, idx) + (
            g
            + 2 * self.l2_shrinkage_regularization_strength * w
            - (tf.pow(new_a, -power) - tf.pow(a, -power)) / lr * w
        )
        quadratic = tf.pow(new_a, -power) / lr + 2 * l2
        _set_rows(linear, idx, lin)
        _set_rows(accum, idx, new_a)
        _set_rows(variable, idx, (tf.clip_by_value(lin, -l1, l1) - lin) / quadratic)
