"""Losses and metrics against independent numpy / scikit-learn computations."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import log_loss, roc_auc_score

from recpipe.config.model import Loss, Metric, ModelConfig
from recpipe.stats import auc
from trainer.losses import build_loss
from trainer.metrics import compute_metrics, gauc

Y = np.array([1, 0, 1, 1, 0, 0, 1, 0], np.float32)
S = np.array([2.0, -1.0, 0.5, -0.3, 0.2, -2.0, 1.2, 0.9], np.float32)
P = 1 / (1 + np.exp(-S))


def _loss(**kw) -> float:
    config = ModelConfig(feature_groups=[{"group_name": "g", "feature_names": ["x"]}], **kw)
    return float(build_loss(config)(tf.constant(Y), tf.constant(S)))


def test_single_losses():
    bce = -np.mean(Y * np.log(P) + (1 - Y) * np.log(1 - P))
    assert _loss() == pytest.approx(bce, rel=1e-5)
    assert _loss(loss_type="CROSS_ENTROPY_LOSS") == pytest.approx(bce, rel=1e-5)
    assert _loss(loss_type="L2_LOSS") == pytest.approx(np.mean((S - Y) ** 2), rel=1e-5)
    assert _loss(loss_type="SIGMOID_L2_LOSS") == pytest.approx(np.mean((P - Y) ** 2), rel=1e-5)
    pairs = [np.log1p(np.exp(-(S[i] - S[j]))) for i in range(8) for j in range(8) if Y[i] > Y[j]]
    assert _loss(loss_type="PAIR_WISE_LOSS") == pytest.approx(np.mean(pairs), rel=1e-5)


def test_f1_reweighted_and_weighted_sum():
    beta2 = 0.5625
    n_pos, tp = Y.sum(), P.sum()
    w_neg = tp / (beta2 * n_pos + (8 - n_pos) - (8 - tp) + 1e-8)
    ce = -(Y * np.log(P) + (1 - Y) * np.log(1 - P))
    f1 = np.sum(np.where(Y > 0.5, 1.0, w_neg) * ce) / 8
    losses = [{"loss_type": "F1_REWEIGHTED_LOSS", "f1_beta_square": beta2}]
    assert _loss(losses=losses) == pytest.approx(f1, rel=1e-5)
    both = losses + [{"loss_type": "L2_LOSS", "weight": 0.5}]
    assert _loss(losses=both) == pytest.approx(f1 + 0.5 * np.mean((S - Y) ** 2), rel=1e-5)
    assert Loss(loss_type="L2_LOSS").weight == 1.0


def test_auc_matches_sklearn_with_ties():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 5000)
    s = np.round(rng.normal(size=5000) + y, 1)  # many ties
    assert auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert np.isnan(auc(np.ones(3), np.arange(3)))


def test_gauc_weights_groups_by_size_and_skips_one_class_groups():
    y = np.array([1, 0, 1, 0, 0, 1, 1, 1])
    s = np.array([0.9, 0.1, 0.2, 0.8, 0.3, 0.5, 0.4, 0.6])
    g = np.array(["a", "a", "b", "b", "b", "c", "c", "c"])
    a, b = roc_auc_score(y[:2], s[:2]), roc_auc_score(y[2:5], s[2:5])
    assert gauc(y, s, g) == pytest.approx((2 * a + 3 * b) / 5)


def test_compute_metrics_exact_over_the_whole_set():
    metrics = [
        Metric(auc={}),
        Metric(gauc={"uid_field": "u"}),
        Metric(logloss={}),
        Metric(accuracy={}),
        Metric(precision={"threshold": 0.6}),
        Metric(recall={"threshold": 0.6}),
    ]
    out = compute_metrics(metrics, Y, P, {"u": np.array(list("aabbaabb"))})
    assert out["auc"] == pytest.approx(roc_auc_score(Y, P))
    assert out["logloss"] == pytest.approx(log_loss(Y, P), rel=1e-6)
    pred = P >= 0.6
    assert out["precision"] == pytest.approx((pred & (Y == 1)).sum() / pred.sum())
    assert out["recall"] == pytest.approx((pred & (Y == 1)).sum() / (Y == 1).sum())
    assert out["accuracy"] == pytest.approx(((P >= 0.5) == (Y == 1)).mean())
    with pytest.raises(KeyError, match="uid_field 'u'"):
        compute_metrics([Metric(gauc={"uid_field": "u"})], Y, P, {})


def test_easyrecs_other_metrics_are_exact_over_the_eval_set():
    """max_f1 over every threshold, the errors of the probabilities, session_auc and gauc's
    reductions (EasyRec's ``eval.proto`` names)."""
    from recpipe.config.model import Metric
    from trainer.metrics import compute_metrics, gauc

    labels = np.array([1, 0, 1, 1, 0, 0, 1, 0], np.float32)
    probs = np.array([0.9, 0.8, 0.7, 0.3, 0.2, 0.6, 0.65, 0.1], np.float32)
    sessions = np.array([1, 1, 1, 2, 2, 2, 2, 3])  # session 3 holds one class: left out
    metrics = [
        Metric(max_f1={}),
        Metric(mean_absolute_error={}),
        Metric(mean_squared_error={}),
        Metric(root_mean_squared_error={}),
        Metric(session_auc={"session_id_field": "s"}),
        Metric(gauc={"uid_field": "s", "reduction": "mean_by_positive_num"}),
    ]
    got = compute_metrics(metrics, labels, probs, {"s": sessions})
    # by hand (F1 = 2 tp / (taken + positives)): down to 0.65, 3 of 4 rows taken are
    # positive: 6 / 8; down to 0.3, all 4 positives in 6 rows: 8 / 10, the largest
    assert got["max_f1"] == pytest.approx(0.8)
    error = labels - probs
    assert got["mean_absolute_error"] == pytest.approx(np.abs(error).mean())
    assert got["root_mean_squared_error"] == pytest.approx(np.sqrt(got["mean_squared_error"]))
    # session 1: positives 0.9, 0.7 against 0.8: 1 of 2 pairs right; session 2: positives
    # 0.3, 0.65 against 0.2, 0.6: 3 of 4. Each has 2 positives; 3 and 4 rows.
    assert got["session_auc"] == pytest.approx((0.5 + 0.75) / 2)
    assert got["gauc"] == pytest.approx((0.5 * 2 + 0.75 * 2) / 4)
    assert gauc(labels, probs, sessions, "mean_by_sample_num") == pytest.approx((0.5 * 3 + 0.75 * 4) / 7)
    with pytest.raises(KeyError, match="session_auc session_id_field 'u'"):
        compute_metrics([Metric(session_auc={"session_id_field": "u"})], labels, probs, {})


def test_a_task_towers_losses_are_summed_with_their_weights():
    """A task tower's ``losses`` (EasyRec's multi-loss task): the task's weight times each
    term's weight times its loss, summed; a tower without them takes its ``loss_type``."""
    mc = ModelConfig(
        model_class="MMoE",
        feature_groups=[{"group_name": "all", "feature_names": ["x"]}],
        mmoe={
            "task_towers": [
                {"tower_name": "a", "weight": 2.0, "losses": [
                    {"loss_type": "CLASSIFICATION", "weight": 1.0},
                    {"loss_type": "PAIR_WISE_LOSS", "weight": 0.5},
                ]},
                {"tower_name": "b", "loss_type": "L2_LOSS"},
            ]
        },
    )  # fmt: skip
    labels = tf.constant([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    logits = tf.constant([[0.3, -0.2], [-1.0, 0.5], [2.0, 0.1], [0.1, -0.4]])
    got = build_loss(mc, [(0, None), (1, None)])(labels, logits)
    one = build_loss(ModelConfig(model_class="DeepFM", feature_groups=mc.feature_groups, losses=[
        {"loss_type": "CLASSIFICATION", "weight": 1.0}, {"loss_type": "PAIR_WISE_LOSS", "weight": 0.5},
    ]))(labels[:, 0], logits[:, 0])  # fmt: skip
    l2 = build_loss(ModelConfig(model_class="DeepFM", feature_groups=mc.feature_groups, loss_type="L2_LOSS"))
    want = 2.0 * one + l2(labels[:, 1], logits[:, 1])
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


def test_a_sample_weight_weighs_each_rows_loss_from_the_feature_job_to_the_step(
    spark, movielens_raw, ml_early, tmp_path
):
    """EasyRec's ``data_config.sample_weight``: the feature job writes the column beside the
    labels, the reader hands it over, the loss is the mean of weight x row loss."""
    from recpipe.config.errors import ConfigError
    from recpipe.layout import finished_partitions, parse_ds_range
    from tests.support import EARLY, with_edits
    from tests.trainer.conftest import _days, _prepare
    from trainer.input import FeatureReader
    from trainer.loop import Trainer, TrainJob

    edits = {
        "data_config.label_fields": ["label"],
        "data_config.sample_weight": "rating",
        "train_input_path": str(tmp_path / "features"),
        "train_config.num_steps": 20,
    }
    config = with_edits(ml_early, edits)
    _prepare(spark, config, _days(movielens_raw / "events", *EARLY))
    reader = FeatureReader(
        config, finished_partitions(config.train_input_path, [EARLY[1]]), shuffle=False, batch_size=10**6
    )
    flat = next(reader.batches())
    features, labels = reader.structure(flat)
    weights = np.asarray(reader.sample_weights(flat))
    assert weights.dtype == np.float32 and set(np.unique(weights)) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    assert len(np.unique(weights)) > 2 and set(np.unique(np.asarray(labels))) == {0.0, 1.0}
    logits = tf.random.stateless_normal([len(weights)], seed=[5, 6])
    ce = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits).numpy()
    got = build_loss(config.model)(labels, logits, tf.constant(weights)).numpy()
    np.testing.assert_allclose(got, (weights * ce).mean(), rtol=1e-5)
    assert FeatureReader(ml_early, []).sample_weights(flat) is None  # none named
    result = Trainer(TrainJob(config, tmp_path / "m", parse_ds_range(":".join(EARLY)))).train()
    assert result.global_step == 20 and np.isfinite(result.loss)
    with pytest.raises(ConfigError, match="PAIR_WISE_LOSS is a loss of the batch as a whole"):
        with_edits(ml_early, {**edits, "model_config.loss_type": "PAIR_WISE_LOSS"})
    with pytest.raises(ConfigError, match="sample_weight: 'gender' is not a numeric input field"):
        with_edits(ml_early, {**edits, "data_config.sample_weight": "gender"})


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 1), st.integers(0, 4), st.sampled_from([b"u1", b"u2", b"u3", b"u10"])),
        max_size=40,
    ),
    reduction=st.sampled_from(["mean", "mean_by_sample_num", "mean_by_positive_num"]),
)
def test_gauc_of_all_groups_at_once_is_each_groups_auc_reduced(rows, reduction):
    """gAUC ranks every group in one sort (``recpipe.stats.group_aucs``): the same as ranking
    each group's rows alone with ``auc`` (ties in scores, one-class groups, raw-id groups)."""
    y = np.array([r[0] for r in rows], np.float32)
    s = np.array([r[1] / 4 for r in rows], np.float32)
    g = np.array([r[2] for r in rows], dtype=object)
    total = weight = 0.0
    for group in set(g.tolist()):
        mine = g == group
        value = auc(y[mine], s[mine])
        if not np.isnan(value):
            weights = {"mean": 1.0, "mean_by_sample_num": mine.sum(), "mean_by_positive_num": y[mine].sum()}
            w = weights[reduction]
            total, weight = total + value * w, weight + w
    got = gauc(y, s, g, reduction)
    if weight:
        assert got == pytest.approx(total / weight, abs=1e-12)
    else:
        assert np.isnan(got)
