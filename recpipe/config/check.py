"""``recpipe config``: validate any of the project's configs, recognising which by its fields.

A pipeline config (EasyRec's sections), a retrain config (``conf/retrain/*.yaml``: checked with
the pipeline config it names, its ``edit_config_json`` applied, and its cluster config) or a
cluster config (``conf/cluster/*.yaml``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recpipe.config.errors import ConfigError
from recpipe.config.loader import load_cluster_config, load_pipeline_config, read_yaml

KINDS = ("pipeline", "retrain", "cluster")
# fields only one kind has
_PIPELINE_MARKS = {"data_config", "feature_config", "model_config", "train_config", "model_dir"}
_RETRAIN_MARKS = {"pipeline_config_path", "model_name", "start_date"}
_CLUSTER_MARKS = {"launcher", "ps", "worker", "evaluator", "shared_volume", "kubernetes_conn_id"}


def config_kind(raw: dict[str, Any], source: str) -> str:
    """Which kind of config ``raw`` (a file's mapping) is, by the fields only that kind has.

    Raises:
        ConfigError: fields of none or of several kinds (names ``source`` and asks for
            ``--kind``).
    """
    keys = set(raw)
    found = [
        kind
        for kind, marks in (
            ("pipeline", _PIPELINE_MARKS),
            ("retrain", _RETRAIN_MARKS),
            ("cluster", _CLUSTER_MARKS),
        )
        if keys & marks
    ]
    if len(found) != 1:
        seen = " and ".join(found) or "none"
        raise ConfigError(
            f"{source}: cannot tell which config this is (fields of {seen} of pipeline, retrain, cluster);"
            " give --kind"
        )
    return found[0]


def check_config(
    path: str | Path, kind: str | None = None, edits: dict[str, Any] | None = None, home: Path | None = None
) -> dict[str, Any]:
    """Validate the config at ``path``; returns what it resolves to, by kind: ``{"pipeline":
    PipelineConfig}``, ``{"cluster": ClusterConfig}``, or for a retrain config ``{"retrain":
    RetrainConfig, "pipeline": ..., "cluster": ...}`` (its paths relative to ``home``, default
    the working directory; ``edits`` on top of its ``edit_config_json``).

    Raises:
        ConfigError: an unreadable file, an unknown kind, or an invalid value; the message
            names the file and the field.
    """
    from recpipe.config.retrain import load_retrain_config

    home = Path(home or Path.cwd())
    kind = kind or config_kind(read_yaml(path), str(path))
    if kind == "pipeline":
        return {"pipeline": load_pipeline_config(path, edits)}
    if kind == "cluster":
        return {"cluster": load_cluster_config(path)}
    if kind != "retrain":
        raise ConfigError(f"--kind={kind!r}: expected one of {', '.join(KINDS)}")
    retrain = load_retrain_config(path)
    pipeline = load_pipeline_config(home / retrain.pipeline_config_path, retrain.with_run_edits(edits))
    return {
        "retrain": retrain,
        "pipeline": pipeline,
        "cluster": load_cluster_config(home / retrain.cluster_config_path),
    }
