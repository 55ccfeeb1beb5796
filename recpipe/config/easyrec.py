"""``recpipe config import``: an EasyRec pipeline config (``*.config`` in protobuf's text format,
or its JSON form) turned into recpipe's pipeline YAML, field by field.

The walk follows recpipe's own schema (``PipelineConfig``, whose sections and fields carry
EasyRec's names): a field recpipe has is copied, a singular one from its one value, a list from
all of them; a field EasyRec has and recpipe spells differently is translated (``RENAMES``,
``_translate``); every other field is refused with its dotted path and the reason, never
dropped. EasyRec's field names and meanings: its documentation's "配置文件" / proto pages
(``easy_rec/python/protos/*.proto``); no EasyRec code or proto file is used here.
"""

from __future__ import annotations

import json
import re
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from recpipe.config.errors import ConfigError
from recpipe.config.textformat import Identifier, Message, parse

# EasyRec's data_config.input_type -> recpipe's data_config.input_format
INPUT_TYPES = {"CSVInput": "csv", "CSVInputV2": "csv", "ParquetInput": "parquet"}
# fields whose value recpipe takes as EasyRec's default, and refuses otherwise
ACCEPTED_DEFAULTS = {
    "train_config.optimizer_config.use_moving_average": False,
}


class Refused(ConfigError):
    """An EasyRec field recpipe cannot honour; the message names its dotted path and why."""


def _inner(annotation: Any) -> Any:
    """``X`` of ``X | None``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(_inner(annotation)) is list


def _item(annotation: Any) -> Any:
    inner = _inner(annotation)
    return typing.get_args(inner)[0] if typing.get_origin(inner) is list else inner


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    """The model's fields by the name a file spells them (the alias where there is one)."""
    return {(info.alias or name): info.annotation for name, info in model.model_fields.items()}


def _scalar(value: Any, annotation: Any, where: str) -> Any:
    if isinstance(value, dict):
        raise Refused(f"{where}: a message where recpipe takes a value")
    if isinstance(value, Identifier):
        if value.name in ("true", "false"):
            return value.name == "true"
        return value.name
    target = _inner(annotation)
    if isinstance(target, type) and issubclass(target, Enum):
        return str(value)
    return value


def _message(values: Message, model: type[BaseModel], where: str) -> dict[str, Any]:
    fields = _fields(model)
    out: dict[str, Any] = {}
    for name, items in values.items():
        path = f"{where}.{name}" if where else name
        items = items if isinstance(items, list) else [items]
        key = re.sub(r"\[\d+\]", "", path)
        if key in ACCEPTED_DEFAULTS:
            wanted = ACCEPTED_DEFAULTS[key]
            got = [_scalar(v, type(wanted), path) for v in items]
            if got != [wanted]:
                raise Refused(f"{path}: recpipe supports only {json.dumps(wanted)} (got {got})")
            continue
        if name not in fields:
            raise Refused(f"{path}: recpipe has no such field (not imported)")
        annotation = fields[name]
        item_type = _item(annotation)
        nested = isinstance(item_type, type) and issubclass(item_type, BaseModel)
        if _is_list(annotation):
            out[name] = [
                _message(v, item_type, f"{path}[{i}]") if nested else _scalar(v, item_type, f"{path}[{i}]")
                for i, v in enumerate(items)
            ]
            continue
        value = _one(items, path)
        if nested:
            if not isinstance(value, dict):
                raise Refused(f"{path}: a value where recpipe takes a message")
            out[name] = _message(value, item_type, path)
        else:
            out[name] = _scalar(value, annotation, path)
    return out


def _translate(config: Message, notes: list[str]) -> Message:
    """EasyRec's spellings that differ from recpipe's, in place on a copy: the legacy
    top-level ``feature_configs`` list, ``data_config.input_type``, the input paths. What the
    file said that recpipe's config cannot hold is appended to ``notes`` (the output's header)."""
    config = dict(config)
    data = dict(_one(config.get("data_config"), "data_config") or {})
    if "input_type" in data:
        kind = str(_one(data.pop("input_type"), "data_config.input_type"))
        if kind not in INPUT_TYPES:
            raise Refused(
                f"data_config.input_type: {kind} is not read by recpipe (it reads "
                f"{', '.join(sorted(INPUT_TYPES))}: delimited text or Parquet)"
            )
        data["input_format"] = [INPUT_TYPES[kind]]
    if data:
        config["data_config"] = [data]
    legacy = config.pop("feature_configs", None)
    if legacy is not None:
        if "feature_config" in config:
            raise Refused("feature_configs: given beside feature_config; keep one of them")
        config["feature_config"] = [{"features": legacy}]
    # EasyRec reads its examples from train_input_path; recpipe's feature job reads raw day
    # partitions under raw_input_path and writes the features training reads
    train = config.pop("train_input_path", None)
    if train is not None:
        config["raw_input_path"] = train
        stem = Path(str(_one(train, "train_input_path"))).stem or "features"
        config["train_input_path"] = [f"data/features/{stem}"]
    if "eval_input_path" in config:
        evaluated = _one(config.pop("eval_input_path"), "eval_input_path")
        if evaluated != _one(train, "train_input_path"):
            notes.append(
                f"EasyRec evaluated on {evaluated}: recpipe evaluates on the eval_ds days of "
                "raw_input_path; put those rows in their own ds= partitions and name them in eval_ds."
            )
    return config


def _one(values: Any, where: str) -> Any:
    if values is None:
        return None
    if not isinstance(values, list):
        return values
    if len(values) != 1:
        raise Refused(f"{where}: given {len(values)} times, recpipe takes one value")
    return values[0]


def _json_message(data: Any) -> Any:
    """EasyRec's JSON form as the text format's shape: every field a list of its values."""
    if isinstance(data, dict):
        return {k: [_json_message(x) for x in (v if isinstance(v, list) else [v])] for k, v in data.items()}
    return data


def import_config(text: str, source: str = "<config>", notes: list[str] | None = None) -> dict[str, Any]:
    """Turn one EasyRec pipeline config into recpipe's pipeline config (a mapping to write as
    YAML), validated by ``PipelineConfig``.

    Args:
        text: the file's text: protobuf text format, or JSON (a text starting with ``{``).
        source: the file's name, for messages.
        notes: gets a line for each thing the file said that the mapping cannot hold (where
            EasyRec's evaluation rows were), for the written file's header.

    Raises:
        ConfigError: the text does not parse (file:line:column), an EasyRec field recpipe
            cannot honour (``Refused``: its dotted path and why), or the result fails
            recpipe's checks (its dotted path).
    """
    from recpipe.config.loader import validate
    from recpipe.config.pipeline import PipelineConfig

    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            message = _json_message(json.loads(text))
        except json.JSONDecodeError as err:
            raise ConfigError(f"{source}:{err.lineno}:{err.colno}: {err.msg}") from None
    else:
        message = parse(text, source)
    try:
        raw = _message(_translate(message, notes if notes is not None else []), PipelineConfig, "")
    except Refused as err:
        raise Refused(f"{source}: {err}") from None
    validate(PipelineConfig, raw, source)
    return raw


HEADER = """\
# Imported from {source} by `recpipe config import`. EasyRec read its examples from
# train_input_path; recpipe's feature job reads day partitions (ds=YYYY-MM-DD/) below
# raw_input_path and writes the features training reads to train_input_path: move the raw
# files into day partitions, and select days with train_ds / eval_ds.
"""


def main(argv: list[str]) -> int:
    """``recpipe config import PATH [--output FILE]``: print (or write, atomically) the recpipe
    pipeline config of an EasyRec one. Exit 2 with one line naming the field on a refusal."""
    import yaml

    from recpipe import atomic
    from recpipe.arguments import ArgumentParser

    parser = ArgumentParser(
        prog="recpipe config import",
        description="Turn an EasyRec pipeline config (*.config text format, or JSON) into recpipe's "
        "pipeline YAML; a field recpipe cannot honour is refused with its dotted path.",
    )
    parser.add_argument("path", help="the EasyRec config (.config or .json)")
    parser.add_argument("--output", default=None, help="write the YAML here (default: print it)")
    args = parser.parse_args(argv)
    try:
        text = Path(args.path).read_text()
    except OSError as err:
        raise ConfigError(f"{args.path}: {err.strerror}") from None
    notes: list[str] = []
    raw = import_config(text, args.path, notes)
    order = ["model_dir", "raw_input_path", "train_input_path"]
    raw = {k: raw[k] for k in order if k in raw} | {k: v for k, v in raw.items() if k not in order}
    header = HEADER.format(source=args.path) + "".join(f"# {line}\n" for line in notes)
    out = header + yaml.safe_dump(raw, sort_keys=False)
    if args.output:
        atomic.write_text(args.output, out)
    else:
        print(out, end="")
    return 0
