"""EasyRec loss types for binary ranking (shared/reference/easyrec_train_config_and_losses.txt).

All take labels ``float32 [B]`` in [0, 1] and logits ``float32 [B]`` and return a scalar mean;
an empty batch (B = 0, a distributed worker padding its last steps) has loss 0, not NaN. The
per-row ones (all but the pairwise and F1-reweighted losses) take ``weights`` ``float32 [B]``
(``data_config.sample_weight``): the mean of ``weights * loss``.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from recpipe.config.model import BATCH_LOSSES, Loss, LossType, ModelConfig


def _mean(values: tf.Tensor, weights: tf.Tensor | None = None) -> tf.Tensor:
    """Mean of ``values`` (each times its weight), 0 for an empty tensor (and a zero, not
    NaN, gradient)."""
    total = tf.reduce_sum(values if weights is None else values * weights)
    return tf.math.divide_no_nan(total, tf.cast(tf.size(values), values.dtype))


def classification(labels, logits, _: Loss, weights=None):
    """Sigmoid cross entropy."""
    return _mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits), weights)


def l2(labels, logits, _: Loss, weights=None):
    """Squared error of the raw output (regression)."""
    return _mean(tf.square(logits - labels), weights)


def sigmoid_l2(labels, logits, _: Loss, weights=None):
    """Squared error of sigmoid(output)."""
    return _mean(tf.square(tf.sigmoid(logits) - labels), weights)


def cross_entropy(labels, logits, _: Loss, weights=None):
    """Log loss with soft labels: -y log p - (1 - y) log(1 - p), p = sigmoid(logit)."""
    return _mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits), weights)


def pair_wise(labels, logits, _: Loss):
    """Pairwise logistic loss over every (positive, negative) pair in the batch:
    mean log(1 + exp(-(s_i - s_j))) for y_i > y_j, a surrogate of AUC (RankNet, Burges 2005).
    Zero for a batch without such pairs."""
    diff = logits[:, None] - logits[None, :]
    mask = tf.cast(labels[:, None] > labels[None, :], logits.dtype)
    pairs = tf.reduce_sum(mask)
    loss = tf.reduce_sum(tf.nn.softplus(-diff) * mask)
    return tf.math.divide_no_nan(loss, pairs)


def f1_reweighted(labels, logits, config: Loss):
    """Sigmoid cross entropy with negatives re-weighted towards F-beta (EasyRec's
    ``F1_REWEIGHTED_LOSS``): positives weigh 1, negatives
    w = TP / (beta^2 * N_pos + N_neg - TN), with soft TP = sum p and TN = B - TP.
    beta^2 (``f1_beta_square``) > 1 favours recall, < 1 precision. w is not differentiated."""
    p = tf.sigmoid(logits)
    batch = tf.cast(tf.size(labels), logits.dtype)
    n_pos = tf.reduce_sum(labels)
    tp = tf.reduce_sum(p)
    tn = batch - tp
    w_neg = tf.stop_gradient(tp / (config.f1_beta_square * n_pos + (batch - n_pos) - tn + 1e-8))
    weights = tf.where(labels > 0.5, tf.ones_like(labels), w_neg * tf.ones_like(labels))
    ce = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.math.divide_no_nan(tf.reduce_sum(weights * ce), batch)


LOSSES: dict[LossType, Callable] = {
    LossType.CLASSIFICATION: classification,
    LossType.L2_LOSS: l2,
    LossType.SIGMOID_L2_LOSS: sigmoid_l2,
    LossType.CROSS_ENTROPY_LOSS: cross_entropy,
    LossType.PAIR_WISE_LOSS: pair_wise,
    LossType.F1_REWEIGHTED_LOSS: f1_reweighted,
}


def task_targets(labels: tf.Tensor, task_labels: list[tuple[int, float | None]]) -> tf.Tensor:
    """Each task's target ``float32 [B, T]`` from the label fields ``float32 [B, L]``: the
    task's field, or 1.0 where it is at least the task's ``label_threshold``, else 0.0
    (``PipelineConfig.task_labels``)."""
    columns = []
    for index, threshold in task_labels:
        column = labels[:, index]
        columns.append(column if threshold is None else tf.cast(column >= threshold, column.dtype))
    return tf.stack(columns, axis=1)


def build_loss(
    model_config: ModelConfig, task_labels: list[tuple[int, float | None]] | None = None
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """``losses`` (weighted sum) if given, else the single ``loss_type``: labels and logits
    ``float32 [B]``, and the rows' sample weights ``float32 [B]`` or None. A multi-task model
    (``task_labels``, from ``PipelineConfig.task_labels``) gets the sum of each task tower's
    ``weight`` x its ``losses`` (or its ``loss_type``) on its target: labels
    ``float32 [B, L]`` (the label fields), logits ``float32 [B, T]``."""
    if task_labels:
        tasks = model_config.tasks
        terms_of = [list(t.losses) or [Loss(loss_type=t.loss_type)] for t in tasks]

        def multi(labels, logits, weights=None):
            targets = task_targets(labels, task_labels)
            return tf.add_n(
                [
                    t.weight * term.weight * _term(term, targets[:, i], logits[:, i], weights)
                    for i, t in enumerate(tasks)
                    for term in terms_of[i]
                ]
            )

        return multi
    terms = list(model_config.losses) or [Loss(loss_type=model_config.loss_type)]

    def loss(labels, logits, weights=None):
        return tf.add_n([t.weight * _term(t, labels, logits, weights) for t in terms])

    return loss


def _term(term: Loss, labels, logits, weights):
    if weights is None or term.loss_type in BATCH_LOSSES:
        return LOSSES[term.loss_type](labels, logits, term)
    return LOSSES[term.loss_type](labels, logits, term, weights)
