"""Load a pipeline or cluster config from YAML, apply overrides, validate.

Validation errors become one ``ConfigError`` whose message names the file and, for each
problem, the dotted field path (``train_config.optimizer_config[0].adam_optimizer.beta1``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from recpipe.config.cluster import ClusterConfig
from recpipe.config.errors import ConfigError
from recpipe.config.overrides import apply_edits
from recpipe.config.pipeline import PipelineConfig

M = TypeVar("M", bound=BaseModel)


def dotted(loc: tuple[Any, ...]) -> str:
    """Render a pydantic error location as a dotted path with [i] list indices."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part.startswith("function-") and part not in ("str-enum", "str"):
            out += ("." if out else "") + part
    return out or "(top level)"


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping.

    Raises:
        ConfigError: the file is missing, not YAML, or not a mapping.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as err:
        raise ConfigError(f"{path}: no such config file") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config sections at the top level")
    return data


def validate(model: type[M], raw: dict[str, Any], source: str) -> M:
    """Validate ``raw`` as ``model``; errors name ``source`` and each field's dotted path."""
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        lines = [f"{source}: invalid config ({err.error_count()} error(s))"]
        for e in err.errors():
            lines.append(f"  {dotted(e['loc'])}: {e['msg'].removeprefix('Value error, ')}")
        raise ConfigError("\n".join(lines)) from None


def load_pipeline_config(path: str | Path, edits: dict[str, Any] | None = None) -> PipelineConfig:
    """Load ``conf/*.yaml`` as a ``PipelineConfig`` with EasyRec-style ``edits`` applied.

    Args:
        path: the YAML file.
        edits: dotted path -> value (from ``--edit_config_json`` and ``--section.field=v``).

    Raises:
        ConfigError: unreadable file, bad override path, or invalid value (file + field named).
    """
    raw = read_yaml(path)
    source = str(path)
    if edits:
        raw = apply_edits(copy.deepcopy(raw), edits)
        source += f" (with overrides {sorted(edits)})"
    return validate(PipelineConfig, raw, source)


def load_cluster_config(path: str | Path) -> ClusterConfig:
    """Load ``conf/cluster/*.yaml``.

    Raises:
        ConfigError: unreadable file or invalid value (file + field named).
    """
    return validate(ClusterConfig, read_yaml(path), str(path))
