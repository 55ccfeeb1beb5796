"""Day ranges for the benches that train day after day: the ``ds`` values, a shipped config
copied under the bench's folder with its paths pointed there, the ``recpipe features`` range
job run once, and one ``recpipe train`` process a day.

Used by ``bench/online_tables.py``, ``bench/incremental_vs_full.py``, ``bench/freshness.py``,
``bench/pass_latency.py`` and ``bench/production_dag.py``.
"""

from __future__ import annotations

import shutil
from datetime import date, timedelta
from pathlib import Path

from bench.process_tree import Measured, checked, recpipe
from bench.results import ROOT


def day_range(first: str | date, n: int) -> list[str]:
    """``n`` consecutive ``ds`` values (``YYYY-MM-DD``) from ``first``."""
    start = date.fromisoformat(first) if isinstance(first, str) else first
    return [(start + timedelta(days=k)).isoformat() for k in range(n)]


def config_copy(shipped: str, path: Path, changes: dict) -> Path:
    """``shipped`` (a YAML file under the repository, ``conf/...``) written to ``path`` with
    ``changes`` merged in, dict by dict (``harness.merged``). Returns ``path``."""
    import yaml

    from bench.harness import merged

    doc = merged(yaml.safe_load((ROOT / shipped).read_text()), changes)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def features_once(
    config: Path, days: list[str], log: Path, edits: dict | None = None, each_day: bool = False
) -> None:
    """One ``recpipe features`` job over ``days``, unless every day's partition is already
    finished (``_SUCCESS``) under the config's ``train_input_path`` (``edits`` applied): the
    range ``first:last``, or with ``each_day`` the days named one by one (days missing from the
    raw data left out). A failed job ends the bench (``process_tree.checked``)."""
    from recpipe.config.loader import load_pipeline_config
    from recpipe.layout import ds_partition

    features = load_pipeline_config(config, edits or {}).resolved(ROOT).train_input_path
    if all((ds_partition(features, d) / "_SUCCESS").exists() for d in days):
        return
    ds = [f"--ds={d}" for d in days] if each_day else [f"--ds={days[0]}:{days[-1]}"]
    checked(recpipe("features", *ds, config=config, edits=edits), log, "recpipe features", cwd=ROOT)


def train_day(
    config: Path, model_dir: Path, train_ds: str, eval_ds: str, edits: dict, previous: Path | None = None
) -> Measured:
    """One ``recpipe train`` process into a fresh ``model_dir``: ``train_ds`` (a day or a
    range), evaluated on ``eval_ds``, fine-tuning from ``previous`` (a model dir) when given;
    its log beside ``model_dir``. A failed process ends the bench."""
    if previous is not None:
        edits = {**edits, "train_config.fine_tune_checkpoint": str(previous)}
    shutil.rmtree(model_dir, ignore_errors=True)
    argv = recpipe("train", "--model_dir", str(model_dir), f"--train_ds={train_ds}", f"--eval_ds={eval_ds}",
                   config=config, edits=edits)  # fmt: skip
    return checked(argv, model_dir.parent / f"{model_dir.name}.log", f"recpipe train {train_ds}", cwd=ROOT)
