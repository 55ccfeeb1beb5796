"""Load a pipeline or cluster config from YAML, apply overrides, validate.

Validation errors become one ``ConfigError`` whose message names the file and, for each
problem, the dotted field path (``train_config.optimizer_config[0].adam_optimizer.beta1``).
"""

from __future__ import annotations

import copy
import datetime as dt
import re
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
    if path.is_dir():
        raise ConfigError(f"{path}: a folder; give one config file (a .yaml in it)")
    try:
        text = path.read_text()
        data = yaml.safe_load(text)
    except FileNotFoundError as err:
        raise ConfigError(f"{path}: no such config file") from err
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot be read ({getattr(err, 'strerror', None) or err})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: {yaml_error_line(err)}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from None
    except ValueError as err:  # a timestamp YAML parsed but no calendar has (1997-02-30)
        raise ConfigError(f"{path}:{_impossible_day(text)}: {err}: write a day that exists") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config sections at the top level")
    return data


def yaml_error_line(err: Exception) -> str:
    """A YAML parser's error in one line: ``line L, column C: not valid YAML: <problem>``."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{where}not valid YAML: {problem}"


def _impossible_day(text: str) -> str:
    """``line N`` of the first date in ``text`` that does not exist, for the message."""
    for number, line in enumerate(text.splitlines(), 1):
        for y, m, d in re.findall(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b", line.split("#")[0]):
            try:
                dt.date(int(y), int(m), int(d))
            except ValueError:
                return f"line {number} ({y}-{m}-{d})"
    return "a date"


def message(error: dict[str, Any]) -> str:
    """A pydantic error as a user reads it: an enum's choices (not its regex), a day YAML read
    as a date (quote it)."""
    kind, given = error["type"], error.get("input")
    if kind == "string_pattern_mismatch":
        choices = re.fullmatch(r"\^\(([\w|]+)\)\$", error["ctx"]["pattern"])
        if choices:
            return f"one of {', '.join(choices.group(1).split('|'))} (got {given!r})"
        return f"{given!r} does not match {error['ctx']['pattern']}"
    if kind == "string_type" and isinstance(given, dt.date):
        return f"quote the day: YAML reads an unquoted {given} as a date; write '{given}'"
    return error["msg"].removeprefix("Value error, ")


def validate(model: type[M], raw: dict[str, Any], source: str) -> M:
    """Validate ``raw`` as ``model``; one line naming ``source`` and each field's dotted path
    (``FILE: field: what is allowed``; several errors joined by ``; ``)."""
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        problems = "; ".join(f"{dotted(e['loc'])}: {message(e)}" for e in err.errors())
        count = "" if err.error_count() == 1 else f"{err.error_count()} errors: "
        raise ConfigError(f"{source}: {count}{problems}") from None


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
