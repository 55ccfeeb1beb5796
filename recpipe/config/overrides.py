"""EasyRec-style config overrides on the raw config mapping.

Two forms, as EasyRec's ``train_eval`` takes them:

* ``--edit_config_json='{"train_config.num_steps": 500}'``
* ``--train_config.num_steps=500`` (any section; the value is read as a YAML scalar, so
  ``500`` is an int, ``true`` a bool and ``[64, 32]`` a list).

A path is dotted; a list element is selected by index, ``features[0]``, or by a field's
value, ``features[input_names=user_id]`` (a list-valued field matches on its first element,
like EasyRec's ``features[input_names[0]=user_id]``, which is accepted too).
"""

from __future__ import annotations

import json
import re
from datetime import date, datetime
from typing import Any

import yaml

from recpipe.config.errors import ConfigError

_STEP = re.compile(r"([^.\[\]]+)((?:\[(?:[^\[\]]|\[\d+\])*\])*)")
_INDEX = re.compile(r"\[((?:[^\[\]]|\[\d+\])*)\]")
SECTIONS = (
    "model_dir",
    "raw_input_path",
    "train_input_path",
    "eval_input_path",
    "quarantine_path",
    "train_ds",
    "eval_ds",
    "data_config",
    "feature_config",
    "model_config",
    "train_config",
    "eval_config",
    "export_config",
)


def parse_edit_config_json(text: str) -> dict[str, Any]:
    """Parse ``--edit_config_json``: a JSON object of dotted path -> value.

    Raises:
        ConfigError: the text is not a JSON object.
    """
    try:
        edits = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--edit_config_json: not valid JSON ({err})") from err
    if not isinstance(edits, dict):
        raise ConfigError("--edit_config_json: expected a JSON object of path -> value")
    return edits


def parse_extend_args(args: list[str]) -> dict[str, Any]:
    """Parse ``--section.field=value`` arguments into dotted path -> value.

    Raises:
        ConfigError: an argument is not of that form or names no config section.
    """
    edits: dict[str, Any] = {}
    for arg in args:
        match = re.fullmatch(r"--([A-Za-z_][\w.\[\]=]*?)=(.*)", arg, flags=re.S)
        if not match:
            raise ConfigError(f"unrecognised argument {arg!r}: expected --section.field=value")
        path, raw = match.groups()
        if path.split(".")[0].split("[")[0] not in SECTIONS:
            raise ConfigError(f"{arg!r}: {path.split('.')[0]!r} is not a config section")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except (yaml.YAMLError, ValueError):  # 1997-02-30 looks like a YAML date: the field's check says why
            value = raw
        # YAML reads 2024-01-01 as a date; every config field holding a day is a string
        edits[path] = raw if isinstance(value, date | datetime) else value
    return edits


def _split(path: str) -> list[str | int | tuple[str, str]]:
    steps: list[str | int | tuple[str, str]] = []
    for part in path.split("."):
        match = _STEP.fullmatch(part)
        if not match:
            raise ConfigError(f"override path {path!r}: cannot parse {part!r}")
        steps.append(match.group(1))
        for selector in _INDEX.findall(match.group(2)):
            if selector.isdigit():
                steps.append(int(selector))
            elif "=" in selector:
                key, value = selector.split("=", 1)
                steps.append((re.sub(r"\[\d+\]$", "", key), value))
            else:
                raise ConfigError(f"override path {path!r}: bad selector [{selector}]")
    return steps


def _select(items: list, key: str, value: str, path: str) -> list[int]:
    hits = []
    for i, item in enumerate(items):
        got = item.get(key) if isinstance(item, dict) else None
        if isinstance(got, list):
            got = got[0] if got else None
        if got is not None and str(got) == value:
            hits.append(i)
    if not hits:
        raise ConfigError(f"override path {path!r}: no element with {key}={value}")
    return hits


def apply_edits(raw: dict[str, Any], edits: dict[str, Any]) -> dict[str, Any]:
    """Set each dotted path of ``edits`` in ``raw`` (in place) and return it.

    Intermediate mappings are created when missing; list indices must exist.

    Raises:
        ConfigError: a path cannot be followed (names the path and the failing step).
    """
    for path, value in edits.items():
        steps = _split(path)
        targets: list[Any] = [raw]
        for n, step in enumerate(steps):
            last = n == len(steps) - 1
            next_targets: list[Any] = []
            for node in targets:
                if isinstance(step, tuple):
                    if not isinstance(node, list):
                        raise ConfigError(f"override path {path!r}: {step[0]} selector on non-list")
                    keys: list[Any] = _select(node, step[0], step[1], path)
                elif isinstance(step, int):
                    if not isinstance(node, list) or step >= len(node):
                        raise ConfigError(f"override path {path!r}: index [{step}] out of range")
                    keys = [step]
                else:
                    if not isinstance(node, dict):
                        raise ConfigError(f"override path {path!r}: {step!r} is not a section")
                    keys = [step]
                for key in keys:
                    if last:
                        node[key] = value
                    else:
                        if isinstance(node, dict) and node.get(key) is None:
                            node[key] = {}
                        next_targets.append(node[key])
            targets = next_targets
    return raw
