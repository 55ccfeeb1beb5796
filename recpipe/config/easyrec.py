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
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from recpipe.config.errors import ConfigError
from recpipe.config.textformat import Identifier, Message, parse

# EasyRec's data_config.input_type -> recpipe's data_config.input_format
INPUT_TYPES = {"CSVInput": "csv", "CSVInputV2": "csv", "ParquetInput": "parquet", "ParquetInputV2": "parquet"}
# fields whose value recpipe takes as EasyRec's default, and refuses otherwise
ACCEPTED_DEFAULTS = {
    "train_config.optimizer_config.use_moving_average": False,
    "model_config.num_class": 1,
    # TensorBoard histograms of the sequence embeddings
    "model_config.feature_groups.sequence_features.tf_summary": False,
    "model_config.seq_att_groups.tf_summary": False,
}


# data_config fields of EasyRec's readers on PAI that recpipe's reader has no use for: the
# file's value goes into the output's header with the reason
DATA_NOTES = {
    "chief_redundant": "recpipe's chief reads its own share of the row groups, as every worker does.",
    "file_shard": "recpipe shards a day's Parquet row groups over the workers, whatever the files.",
}


# export_config fields that shape EasyRec's serving placeholders, which recpipe's signature
# fixes: dropped, the reason in the output's header
EXPORT_NOTES = {
    "filter_inputs": "recpipe's serving_default takes the columns its features read.",
    "placeholder_named_by_input": "recpipe names each serving input by its column.",
    "multi_value_fields": (
        "recpipe's serving input for a tag or sequence column is its delimited string "
        "(the feature's separator)."
    ),
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
    if not model.__pydantic_complete__:  # a field's type defined below it: resolve it now
        model.model_rebuild()
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
    for field in data.get("input_fields", []):
        # EasyRec reads an empty default of a number as the type's own (0), as recpipe's unset one
        kind = str(_one(field.get("input_type"), "data_config.input_fields.input_type") or "STRING")
        if kind != "STRING" and field.get("default_val") in ([""], ""):
            del field["default_val"]
    for name, why in DATA_NOTES.items():
        if name in data:
            value = _one(data.pop(name), f"data_config.{name}")
            notes.append(f"data_config.{name}: {value} dropped: {why}")
    _expand_names(config, data)
    model = _one(config.get("model_config"), "model_config")
    if isinstance(model, dict):
        config["model_config"] = [_translate_model(model, notes)]
    _set_everywhere(config, "gauc", "reduction", Identifier("mean"))  # EasyRec's default
    if _drop_everywhere(config, "auc", "num_thresholds"):
        notes.append(
            "auc.num_thresholds dropped: recpipe computes the exact AUC from the ranks of the scores."
        )
    evaluation = _one(config.get("eval_config"), "eval_config")
    if isinstance(evaluation, dict) and "eval_online" in evaluation:
        evaluation = dict(evaluation)
        if _true(_one(evaluation.pop("eval_online"), "eval_config.eval_online")):
            notes.append(
                "eval_config.eval_online dropped: recpipe evaluates on the eval_ds days "
                "(eval_config.eval_method: separate for an evaluator beside training)."
            )
        config["eval_config"] = [evaluation]
    _translate_export(config, notes)
    for _ in _messages(config, "momentumw_optimizer"):
        notes.append(
            "momentumw_optimizer.weight_decay: recpipe decays by weight_decay times the learning "
            "rate (Keras); EasyRec's MomentumW decays by weight_decay alone."
        )
        break
    legacy = config.pop("feature_configs", None)
    if legacy is not None:
        if "feature_config" in config:
            raise Refused("feature_configs: given beside feature_config; keep one of them")
        config["feature_config"] = [{"features": legacy}]
    _expand_shared_names(config)
    # EasyRec's Parquet readers may take their files from parquet_train_input and
    # parquet_eval_input instead
    pairs = (("parquet_train_input", "train_input_path"), ("parquet_eval_input", "eval_input_path"))
    for parquet, plain in pairs:
        if parquet in config:
            if plain in config:
                raise Refused(f"{parquet}: given beside {plain}; keep one of them")
            config[plain] = config.pop(parquet)
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


def _translate_export(config: Message, notes: list[str]) -> None:
    """``export_config``: the placeholder options of ``EXPORT_NOTES`` dropped with a note;
    the ``latest`` exporter is recpipe's ``final`` (the model training ended with); the
    ``best`` exporter and early stopping evaluate while training (``eval_method: separate``)."""
    export = _one(config.get("export_config"), "export_config")
    if not isinstance(export, dict):
        return
    export = dict(export)
    for name, why in EXPORT_NOTES.items():
        if name in export:
            export.pop(name)
            notes.append(f"export_config.{name} dropped: {why}")
    kind = str(_one(export.get("exporter_type"), "export_config.exporter_type"))
    early = _true(_one(export.get("enable_early_stop"), "export_config.enable_early_stop"))
    evaluation = _one(config.get("eval_config"), "eval_config") or {}
    if (kind == "best" or early) and "eval_method" not in evaluation:
        # EasyRec's train_and_evaluate evaluates while training, which both need
        config["eval_config"] = [{**evaluation, "eval_method": [Identifier("separate")]}]
        notes.append(
            "eval_config.eval_method: separate, for the best exporter or early stopping: an "
            "evaluator beside training scores each checkpoint, as EasyRec's train_and_evaluate does."
        )
    if kind == "latest":
        export["exporter_type"] = ["final"]
        notes.append(
            "export_config.exporter_type: latest is recpipe's final: the run exports the model its "
            "training ended with, its latest checkpoint (EasyRec also exports after each evaluation)."
        )
    config["export_config"] = [export]


def _expand_shared_names(config: Message) -> None:
    """A feature's ``shared_names``: one more feature per name, reading that column, alike
    in all else and sharing the feature's table (``embedding_name``), as EasyRec builds them."""
    features_config = _one(config.get("feature_config"), "feature_config")
    if not isinstance(features_config, dict) or "features" not in features_config:
        return
    out = []
    for feature in features_config["features"]:
        shared = feature.get("shared_names")
        if not shared:
            out.append(feature)
            continue
        feature = {k: v for k, v in feature.items() if k != "shared_names"}
        name = _one(feature.get("feature_name"), "feature_config.features.feature_name")
        name = name or _one(feature.get("input_names"), "feature_config.features.input_names")
        feature.setdefault("embedding_name", [name])
        out.append(feature)
        out += [{**feature, "input_names": [n], "feature_name": [n]} for n in shared]
    config["feature_config"] = [{**features_config, "features": out}]


def _true(value: Any) -> bool:
    """A boolean field's value, from the text format or JSON."""
    return value is True or value == Identifier("true")


_RANGE = re.compile(r"^(.*)\[(\d+)-(\d+)\]$")


def _expanded(name: Any) -> list[Any]:
    """EasyRec's ``field[1-3]``: ``field1``, ``field2``, ``field3``; another name as it is."""
    match = _RANGE.match(str(name)) if isinstance(name, str) else None
    if not match:
        return [name]
    stem, first, last = match.group(1), int(match.group(2)), int(match.group(3))
    return [f"{stem}{i}" for i in range(first, last + 1)]


def _expand_names(config: Message, data: dict) -> None:
    """``data_config.auto_expand_input_fields``: each ``input_fields`` entry named
    ``field[a-b]`` becomes one per number (same type); feature groups' ``feature_names``
    expand alike (EasyRec expands them whatever the flag)."""
    if "auto_expand_input_fields" in data:
        if _true(_one(data.pop("auto_expand_input_fields"), "data_config.auto_expand_input_fields")):
            fields = []
            for field in data.get("input_fields", []):
                names = _expanded(_one(field.get("input_name"), "data_config.input_fields.input_name"))
                fields += [dict(field, input_name=[n]) for n in names]
            data["input_fields"] = fields
    model = _one(config.get("model_config"), "model_config")
    for group in (model or {}).get("feature_groups", []) if isinstance(model, dict) else []:
        if "feature_names" in group:
            group["feature_names"] = [n for name in group["feature_names"] for n in _expanded(name)]


def _translate_model(model: Message, notes: list[str]) -> Message:
    """EasyRec's model blocks spelled as recpipe's: DCN's ``deep_tower {input, dnn}`` and
    ``cross_tower {input, cross_num}``, MMoE's older ``experts`` list (one ``dnn`` each), a
    loss's ``f1_reweighted_loss {f1_beta_square}``."""
    model = dict(model)
    dcn = _one(model.get("dcn"), "model_config.dcn")
    deep = _one(dcn.get("deep_tower"), "model_config.dcn.deep_tower") if isinstance(dcn, dict) else None
    if isinstance(dcn, dict) and ("cross_tower" in dcn or isinstance(deep, dict)):
        dcn = dict(dcn)
        deep = deep or {}
        cross = _one(dcn.pop("cross_tower", None), "model_config.dcn.cross_tower") or {}
        inputs = {str(_one(t.get("input"), "input")) for t in (deep, cross) if "input" in t}
        if len(inputs) > 1:
            raise Refused(
                f"model_config.dcn: the cross and deep towers read {sorted(inputs)}; recpipe's DCN "
                "crosses and deepens the same input (the DEEP groups)"
            )
        if "dnn" in deep:
            dcn["deep_tower"] = deep["dnn"]
        elif "deep_tower" in dcn:
            del dcn["deep_tower"]
        if "cross_num" in cross:
            dcn["cross_num"] = cross["cross_num"]
        model["dcn"] = [dcn]
        notes.append(
            "model_config.dcn: EasyRec's DCN crosses with vector weights (DCN v1); recpipe's "
            "cross layers are DCN-v2's full-rank ones (Wang et al., 2021)."
        )
    mmoe = _one(model.get("mmoe"), "model_config.mmoe")
    if isinstance(mmoe, dict) and "experts" in mmoe:  # EasyRec's older form: an entry per expert
        mmoe = dict(mmoe)
        experts = mmoe.pop("experts")
        dnns = [_one(e.get("dnn"), "model_config.mmoe.experts.dnn") for e in experts]
        if any(d != dnns[0] for d in dnns) or "expert_dnn" in mmoe or "num_expert" in mmoe:
            raise Refused(
                "model_config.mmoe.experts: recpipe's experts share one expert_dnn; give num_expert "
                "and expert_dnn instead"
            )
        mmoe["num_expert"], mmoe["expert_dnn"] = [len(experts)], [dnns[0]]
        model["mmoe"] = [mmoe]
    losses = []
    for loss in model.get("losses", []):
        f1 = _one(loss.get("f1_reweighted_loss"), "model_config.losses.f1_reweighted_loss")
        if isinstance(f1, dict):
            loss = {k: v for k, v in loss.items() if k != "f1_reweighted_loss"} | f1
        losses.append(loss)
    if losses:
        model["losses"] = losses
    return model


def _messages(tree: Any, parent: str) -> Iterator[dict]:
    """Every message held by a field named ``parent``, anywhere in the tree."""
    if isinstance(tree, list):
        for item in tree:
            yield from _messages(item, parent)
    elif isinstance(tree, dict):
        for key, child in tree.items():
            if key == parent:
                yield from (m for m in (child if isinstance(child, list) else [child]) if isinstance(m, dict))
            yield from _messages(child, parent)


def _set_everywhere(tree: Any, parent: str, name: str, value: Any) -> None:
    """Give field ``name`` of every ``parent`` message in the tree ``value`` where unset."""
    for message in _messages(tree, parent):
        message.setdefault(name, [value])


def _drop_everywhere(tree: Any, parent: str, name: str) -> bool:
    """Remove field ``name`` of every ``parent`` message in the tree; whether any was there."""
    found = False
    for message in _messages(tree, parent):
        found |= message.pop(name, None) is not None
    return found


def _one(values: Any, where: str) -> Any:
    if values is None:
        return None
    if not isinstance(values, list):
        return values
    if len(values) > 1 and not any(isinstance(v, dict) for v in values):
        return values[-1]  # protobuf's text_format.Merge, EasyRec's reader: the last one counts
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
    try:
        if stripped.startswith("{"):
            try:
                loaded = json.loads(text)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{source}:{err.lineno}:{err.colno}: {err.msg}") from None
            if not isinstance(loaded, dict):
                raise ConfigError(
                    f"{source}: a JSON object (EasyRec's pipeline config), not {type(loaded).__name__}"
                )
            message = _json_message(loaded)
        else:
            message = parse(text, source)
        raw = _message(_translate(message, notes if notes is not None else []), PipelineConfig, "")
    except Refused as err:
        raise Refused(f"{source}: {err}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply to be an EasyRec pipeline config") from None
    except (TypeError, AttributeError, KeyError, IndexError) as err:
        # a scalar where a message belongs (or the reverse): the text is no pipeline config
        raise ConfigError(
            f"{source}: a value of the wrong kind where EasyRec expects a message or a scalar ({err})"
        ) from None
    validate(PipelineConfig, raw, source)
    return raw


HEADER = """\
# Imported from {source} by `recpipe config import`. EasyRec read its examples from
# train_input_path; recpipe's feature job reads day partitions (ds=YYYY-MM-DD/) below
# raw_input_path and writes the features training reads to train_input_path: move the raw
# files into day partitions, and select days with train_ds / eval_ds.
"""


def check_output(output: str, source: str) -> None:
    """Refuse an ``--output`` that ``config import`` does not own: its input, a directory, a path
    whose directory does not exist, or an existing file that is not this command's earlier
    import of the same ``source`` (its first line, ``HEADER``'s).

    Raises:
        recpipe.outputs.OutputNotOwnedError: naming ``--output`` and why.
    """
    from recpipe.outputs import OutputNotOwnedError

    path, given = Path(output), Path(source)
    if not path.parent.resolve().is_dir():
        raise OutputNotOwnedError(f"--output={output}: its directory {path.parent} does not exist")
    if path.exists() and given.exists() and path.resolve() == given.resolve():
        raise OutputNotOwnedError(f"--output={output}: the file being imported; name a new file")
    if path.is_dir() or path.is_symlink():
        raise OutputNotOwnedError(f"--output={output}: not a file; name a new file")
    if path.exists():
        try:
            with open(path, encoding="utf-8") as f:
                first = f.readline()
        except (OSError, UnicodeDecodeError):
            first = ""
        if first != HEADER.format(source=source).splitlines(keepends=True)[0]:
            raise OutputNotOwnedError(
                f"--output={output}: exists and is not this command's import of {source}; name a new file"
            )


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
    parser.add_argument(
        "--output", default=None,
        help="write the YAML here: a new file in an existing directory, or this command's earlier output "
        "(default: print it)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.output:
        check_output(args.output, args.path)
    try:
        text = Path(args.path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{args.path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{args.path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
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
