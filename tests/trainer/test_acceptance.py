"""Real-data acceptance: every model class, out of time on MovieLens, against two baselines.

Train on 1997-09-20..1998-02-28 (78k ratings), evaluate on 1998-03-01..1998-04-22 (22k
ratings, 83 % of them by users absent from training). Baselines on the same split and the
same Spark features: the item's (smoothed) positive rate in the training window, and
logistic regression on the same features (one-hot ids and genres, the dense values; C tuned
on the eval days, which favours the baseline). DeepFM must beat both on AUC. Each test writes its figures to
``var/acceptance/<name>.json`` and prints them; ``bench/acceptance.py`` runs them all and
gathers the figures into ``bench/results/acceptance.json``.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pytest
from scipy import sparse
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import MultiLabelBinarizer, OneHotEncoder

from recpipe.layout import parse_ds_range
from recpipe.stats import auc
from tests.support import ROOT, with_edits
from trainer.loop import Trainer, TrainJob
from trainer.metrics import logloss
from trainer.scoring import evaluate

IDS = ["user_id", "item_id", "gender", "occupation", "zip_code"]

# the session's 213 prepared days (``ml_all``) run in the first test's time: 20-27 min of Spark
# on a loaded 2-core machine, past pytest's 1200 s default
pytestmark = pytest.mark.timeout(2400)


def _frame(config, first, last):
    data = pads.dataset(config.train_input_path, partitioning="hive")
    table = data.to_table(filter=(pc.field("ds") >= first) & (pc.field("ds") <= last))
    return table.to_pandas()


def _baselines(config) -> dict[str, dict[str, float]]:
    train_first, train_last = config.train_ds.split(":")
    eval_first, eval_last = config.eval_ds.split(":")
    train, test = _frame(config, train_first, train_last), _frame(config, eval_first, eval_last)
    prior = train.label.mean()
    counts = train.groupby("item_id").label.agg(["sum", "count"])
    rate = ((counts["sum"] + 10 * prior) / (counts["count"] + 10)).to_dict()
    item_rate = test.item_id.map(rate).fillna(prior).to_numpy()
    enc = OneHotEncoder(handle_unknown="ignore").fit(train[IDS])
    genres = MultiLabelBinarizer().fit(train.genres.map(list))

    def design(df):
        dense = sparse.csr_matrix(df[["age", "release_year"]].to_numpy())
        return sparse.hstack(
            [enc.transform(df[IDS]), sparse.csr_matrix(genres.transform(df.genres.map(list))), dense]
        ).tocsr()

    best = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unknown genres in the eval days
        for c in (0.3, 1.0, 3.0):
            probs = (
                LogisticRegression(C=c, max_iter=3000)
                .fit(design(train), train.label)
                .predict_proba(design(test))[:, 1]
            )
            if best is None or auc(test.label, probs) > best[0]:
                best = (auc(test.label, probs), probs, c)
    y = test.label.to_numpy()
    return {
        "item_positive_rate": {"auc": auc(y, item_rate), "logloss": logloss(y, item_rate)},
        f"logistic_regression_C{best[2]}": {"auc": best[0], "logloss": logloss(y, best[1])},
    }


# (config, eval days) -> (TrainResult, metrics): DeepFM with the config's own Adam is the
# reference of two tests on ml_all; one training serves both (op determinism: a second would
# match)
_TRAINED: dict[str, tuple] = {}


def _train_and_evaluate(config, model_dir):
    """``Trainer(...).train()`` on ``config.train_ds`` into ``model_dir``, then ``evaluate`` on
    ``config.eval_ds``: ``(TrainResult, metrics)``, once per config in the session."""
    key = json.dumps(config.to_dict(), sort_keys=True, default=str)
    if key not in _TRAINED:
        days = parse_ds_range(config.train_ds)
        trained = Trainer(TrainJob(config=config, model_dir=model_dir, train_days=days)).train()
        _TRAINED[key] = trained, evaluate(config, model_dir, parse_ds_range(config.eval_ds))
    return _TRAINED[key]


def _record(name: str, figures: dict) -> None:
    """A test's figures to ``var/acceptance/<name>.json`` (``bench/acceptance.py`` gathers
    them into a results file the docs render)."""
    out = ROOT / "var" / "acceptance" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))


@pytest.mark.slow
def test_models_beat_baselines_out_of_time(ml_all, tmp_path):
    config = ml_all
    results = _baselines(config)
    for model_class in ("DeepFM", "DNN", "WideAndDeep", "DLRM", "DCN"):
        edits = {"model_config.model_class": model_class}
        if model_class == "DLRM":
            edits["model_config.dlrm"] = {"bot_dnn": {"hidden_units": [32, 16]}}
        trained, metrics = _train_and_evaluate(with_edits(config, edits), tmp_path / model_class)
        results[model_class] = {
            "auc": metrics["auc"],
            "gauc": metrics["gauc"],
            "logloss": metrics["logloss"],
            "steps": trained.global_step,
            "examples_per_sec": round(trained.examples_per_sec),
        }
    _record("movielens", results)
    print(
        "\n"
        + "\n".join(
            f"{name:32s} "
            + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())
            for name, r in results.items()
        )
    )
    baselines = [r["auc"] for name, r in results.items() if name.startswith(("item_", "logistic"))]
    assert results["DeepFM"]["auc"] > max(baselines)
    for name in ("DNN", "WideAndDeep", "DLRM", "DCN"):
        assert results[name]["auc"] > results["item_positive_rate"]["auc"] - 0.01
        assert np.isfinite(results[name]["logloss"])


def _lr(rate: float, decay: bool) -> dict:
    if not decay:
        return {"constant_learning_rate": {"learning_rate": rate}}
    schedule = {"initial_learning_rate": rate, "decay_steps": 300, "decay_factor": 0.5}
    return {"exponential_decay_learning_rate": {**schedule, "min_learning_rate": rate / 40}}


@pytest.mark.slow
def test_sparse_optimizers_match_dense_adam_out_of_time(ml_all, tmp_path):
    """Row-wise embedding optimizers (with Adam for the dense weights) reach dense Adam's AUC
    within 0.005 on the acceptance split. Adagrad and FTRL get their own (larger) rates."""
    adam = {"adam_optimizer": {"learning_rate": _lr(0.002, True)}}
    variants = {
        "adam": [adam],
        "lazy_adam+adam": [{"lazy_adam_optimizer": {"learning_rate": _lr(0.002, True)}}, adam],
        "adagrad+adam": [{"adagrad_optimizer": {"learning_rate": _lr(1.0, False)}}, adam],
        "ftrl+adam": [{"ftrl_optimizer": {"learning_rate": _lr(0.5, False)}}, adam],
    }
    results = {}
    for name, optimizers in variants.items():
        config = with_edits(ml_all, {"train_config.optimizer_config": optimizers})
        trained, metrics = _train_and_evaluate(config, tmp_path / name)
        results[name] = {"auc": metrics["auc"], "examples_per_sec": round(trained.examples_per_sec)}
    _record("sparse_optimizers", results)
    print("\n" + "\n".join(f"{n:16s} {r}" for n, r in results.items()))
    for name in ("lazy_adam+adam", "adagrad+adam", "ftrl+adam"):
        assert abs(results[name]["auc"] - results["adam"]["auc"]) < 0.005, (name, results)


@pytest.mark.slow
def test_strategies_match_no_strategy_out_of_time(ml_all, tmp_path):
    """One acceptance-size job per strategy family, started by the local launcher as real
    processes: MultiWorkerMirrored (collective all-reduce), EmbeddingParallel (Horovod with
    rows sharded by all-to-all; tests/trainer/test_distribute.py shows it trains as Horovod
    does), asynchronous PS (2 workers, 2 ps) and GEO PS (2 workers, 1 ps: the mode whose
    stale rows cost AUC), with the same global batch (256; GEO: each worker's batch is 256) and
    the same number of steps (NoStrategy's two epochs): each within 0.01 of NoStrategy's AUC,
    GEO within 0.02 with every batch applied once. GEO's gap depends on how far behind the ps
    each worker's copy runs, which the machine's load decides: 0.003-0.010 over ten runs on
    the 2-core machine (half of them beside 3-6 busy processes), 0.014 once in CI. Mirrored,
    Horovod, synchronous and half-async PS are checked at a few steps against their family
    (test_distribute.py, test_ps_modes.py)."""
    import yaml

    from recpipe.config import ClusterConfig
    from recpipe.config.train import TrainDistribute
    from recpipe.launch import LocalLauncher, job_result, training_job

    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(ml_all.to_dict()))
    split = [
        {"lazy_adam_optimizer": {"learning_rate": _lr(0.002, True)}},
        {"adam_optimizer": {"learning_rate": _lr(0.002, True)}},
    ]

    ledgers = {}  # each job's distribution figures (GEO: its batches' ledger)

    def run(strategy: str, workers: int, ps: int = 0, name: str | None = None, **edits) -> dict:
        model_dir = tmp_path / (name or strategy)
        edits = {"train_config.train_distribute": strategy, "train_config.optimizer_config": split, **edits}
        args = ["--pipeline_config_path", str(path), "--model_dir", str(model_dir)]
        args += ["--skip_eval", "--edit_config_json", json.dumps(edits)]
        cluster = ClusterConfig()
        job = training_job(
            "train", TrainDistribute(strategy), cluster, args, cwd=ROOT, workers=workers, ps=ps
        )
        result = job_result(LocalLauncher(model_dir / "logs", grace_s=3).run(job)[0])
        config = with_edits(ml_all, {"train_config.optimizer_config": split})
        ledgers[model_dir.name] = result.get("distribution")
        return {
            "steps": result["global_step"],
            "auc": evaluate(config, model_dir, parse_ds_range(ml_all.eval_ds))["auc"],
        }

    # two epochs (610 steps of 256), not the config's three. (After one epoch the models are
    # further from converged and GEO's stale rows cost it up to 0.009.)
    results = {"NoStrategy": run("NoStrategy", 1, **{"data_config.num_epochs": 2})}
    same = {"train_config.num_steps": results["NoStrategy"]["steps"], "data_config.num_epochs": 10}
    half = {**same, "data_config.batch_size": ml_all.data_config.batch_size // 2}
    results["MultiWorkerMirroredStrategy"] = run("MultiWorkerMirroredStrategy", 2, **half)
    results["EmbeddingParallelStrategy"] = run("EmbeddingParallelStrategy", 2, **half)
    # asynchronous: each step is one whole batch on one worker
    results["PSStrategy"] = run("PSStrategy", 2, ps=2, **same)
    # PaddleRec's GEO: local copies pushing every 10 steps (2 workers, 1 ps)
    geo = {**same, "train_config.sync_mode": "geo", "train_config.geo_step": 10}
    results["NoStrategy+geo"] = run("NoStrategy", 2, ps=1, name="geo", **geo)
    _record("strategies", results)
    print("\n" + "\n".join(f"{n:28s} {r}" for n, r in results.items()))
    steps, ledger = results["NoStrategy"]["steps"], ledgers["geo"]
    assert ledger["batches_trained"] == ledger["batches_applied_on_ps"] == steps, ledger
    assert ledger["batches_lost"] == 0, ledger
    for name, r in results.items():
        assert r["steps"] == steps
        bound = 0.02 if name == "NoStrategy+geo" else 0.01
        assert abs(r["auc"] - results["NoStrategy"]["auc"]) < bound, (name, results)


@pytest.mark.slow
def test_online_tables_keep_the_fixed_tables_auc_out_of_time(ml_all, tmp_path):
    """DeepFM with online tables on user and item ids (``filter_freq: 2``: an id seen once
    gets no row) reaches 0.7125 AUC on the acceptance split (fixed hashed tables: ~0.7155),
    with every admitted id in its own row."""
    ev = {"filter_freq": 2, "init_capacity": 128, "max_capacity": 4096}  # grown as ids arrive
    config = with_edits(
        ml_all,
        {f"feature_config.features[input_names={f}].ev_params": ev for f in ("user_id", "item_id")},
    )
    model_dir = tmp_path / "online"
    job = TrainJob(config=config, model_dir=model_dir, train_days=parse_ds_range(config.train_ds))
    trained = Trainer(job).train()
    metrics = evaluate(config, model_dir, parse_ds_range(config.eval_ds))
    tables = trained.online_tables
    result = {"auc": metrics["auc"], "gauc": metrics["gauc"], "steps": trained.global_step, **tables}
    _record("online_tables", result)
    print("\n" + json.dumps(result, indent=2))
    assert metrics["auc"] >= 0.7125
    for table in ("user_id", "item_id"):
        prefix = f"ev/deepfm/input_layer/{table}/"
        assert 100 < tables[prefix + "rows_used"] <= 4096
        assert 0.0 < tables[prefix + "filtered_share"] < 0.2  # ids seen once were filtered


@pytest.mark.slow
def test_mmoe_tasks_match_each_task_alone_out_of_time(ml_all, tmp_path):
    """conf/movielens_mmoe.yaml's two tasks from one rating (``like``: >= 4, ``rated_high``:
    = 5) on the same features: each task's AUC within 0.003 of the same MMoE trained on that
    task alone, or better."""
    from recpipe.config import load_pipeline_config

    paths = {k: getattr(ml_all, k) for k in ("raw_input_path", "train_input_path")}
    mmoe = load_pipeline_config(ROOT / "conf/movielens_mmoe.yaml", paths)
    towers = [t.model_dump(exclude_none=True) for t in mmoe.model.mmoe.task_towers]
    variants = {
        "both": {},
        "like": {"model_config.mmoe.task_towers": towers[:1]},
        "rated_high": {"model_config.mmoe.task_towers": towers[1:]},
    }
    results = {}
    for name, edits in variants.items():
        config = with_edits(mmoe, edits)
        model_dir = tmp_path / name
        Trainer(
            TrainJob(config=config, model_dir=model_dir, train_days=parse_ds_range(config.train_ds))
        ).train()
        got = evaluate(config, model_dir, parse_ds_range(config.eval_ds))
        results[name] = {k: v for k, v in got.items() if "/" in k}
    _record("mmoe", results)
    print("\n" + "\n".join(f"{name:12s} {r}" for name, r in results.items()))
    for task in ("like", "rated_high"):
        assert results["both"][f"{task}/auc"] >= results[task][f"{task}/auc"] - 0.003, task
        assert results["both"][f"{task}/auc"] > 0.65, task


@pytest.mark.slow
def test_din_over_rated_histories_beats_deepfm_out_of_time(ml_all_din, tmp_path):
    """conf/movielens_din.yaml (DIN's attention over each user's last 20 films, their genres,
    and, pooled with the same weights, the ratings the user gave them) against DeepFM on the
    same rows: at least 0.005 AUC above DeepFM, and above DeepFM's 0.7155 by as much. Most eval
    users are new: their history is all the model knows of them."""
    from recpipe.config import load_pipeline_config

    paths = {k: getattr(ml_all_din, k) for k in ("raw_input_path", "train_input_path")}
    din = load_pipeline_config(ROOT / "conf/movielens_din.yaml", paths)
    results = {}
    for name, config in (("DeepFM", ml_all_din), ("MultiTowerDIN", din)):
        results[name] = _train_and_evaluate(config, tmp_path / name)[1]["auc"]
    _record("din", {name: {"auc": auc} for name, auc in results.items()})
    print(f"\nAUC {results}")
    assert results["MultiTowerDIN"] >= results["DeepFM"] + 0.005
    assert results["MultiTowerDIN"] >= 0.7155 + 0.005
