"""The config reference, rendered from the pydantic models themselves: every field of the
pipeline, retrain and cluster configs with its type, default, allowed values and meaning (the
string under each field, read from the class's source: ``description``). ``docs/hooks/reference.py``
puts it in the docs, so a page cannot describe a field the code does not have."""

from __future__ import annotations

import ast
import enum
import functools
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import BaseModel
from pydantic.fields import FieldInfo, PydanticUndefined

from recpipe.config.cluster import ClusterConfig
from recpipe.config.pipeline import PipelineConfig
from recpipe.config.retrain import RetrainConfig

ROOTS: dict[str, type[BaseModel]] = {
    "pipeline": PipelineConfig,
    "retrain": RetrainConfig,
    "cluster": ClusterConfig,
}


@dataclass(frozen=True)
class Row:
    """One field of a config: its dotted ``path`` (``[]`` marks a list's entries), the class
    that declares it, its description, and the section classes it holds (none: a plain
    field)."""

    path: str
    owner: str
    description: str
    sections: tuple[type[BaseModel], ...]


def _sections(annotation) -> list[type[BaseModel]]:
    """The model classes inside ``annotation`` (``X``, ``X | None``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _sections(arg)]


def _is_list(annotation) -> bool:
    if typing.get_origin(annotation) is list:
        return True
    return any(_is_list(a) for a in typing.get_args(annotation))


def _type(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(annotation))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type(a) for a in typing.get_args(annotation))}]"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(m.value for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default is PydanticUndefined else info.default
    if isinstance(value, BaseModel):
        return "(its defaults)"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return "(see the page)"
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "min_length": "at least", "max_length": "at most"}


def _allowed(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        for attr, word in _BOUNDS.items():
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{word} {value}" + (" entries" if "length" in attr else ""))
        pattern = getattr(meta, "pattern", None)
        if pattern:
            parts.append(f"matches `{pattern}`")
    return "; ".join(parts)


@functools.cache
def _docstrings(cls: type) -> dict[str, str]:
    """The string literal under each annotated field in ``cls``'s own body (PEP 257's
    attribute docstrings), by field name."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    out = {}
    for field, doc in itertools.pairwise(body):
        if (
            isinstance(field, ast.AnnAssign)
            and isinstance(field.target, ast.Name)
            and isinstance(doc, ast.Expr)
            and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)
        ):
            out[field.target.id] = inspect.cleandoc(doc.value.value)
    return out


def description(model: type[BaseModel], name: str) -> str:
    """Field ``name``'s description on one line: ``Field(description=...)``, else the string
    under it in the class that declares it (``model`` or a base); "" when it has none."""
    info = model.model_fields[name]
    text = info.description
    if text is None:
        owner = next(c for c in model.__mro__ if name in c.__dict__.get("__annotations__", {}))
        text = _docstrings(owner).get(name, "")
    return " ".join(text.split())


def _annotations(model: type[BaseModel]) -> dict[str, object]:
    """Each field's type, forward references resolved (a field typed with a class defined
    further down its module keeps the string in ``FieldInfo.annotation``)."""
    return typing.get_type_hints(model)


def rows(model: type[BaseModel], prefix: str = "") -> Iterator[Row]:
    """Every field of ``model`` and of the sections below it, depth first, in declaration
    order. A section used in several places is listed under each path."""
    hints = _annotations(model)
    for name, info in model.model_fields.items():
        path = f"{prefix}{info.alias or name}"
        sections = tuple(_sections(hints[name]))
        yield Row(path, model.__name__, description(model, name), sections)
        for section in sections:
            yield from rows(section, f"{path}{'[]' if _is_list(hints[name]) else ''}.")


def missing_descriptions() -> list[str]:
    """``Class.field`` of every field of the three configs without a description."""
    seen = set()
    for model in ROOTS.values():
        for row in rows(model):
            if not row.description:
                seen.add(f"{row.owner}.{row.path.rsplit('.', 1)[-1]}")
    return sorted(seen)


def _classes(kind: str) -> dict[type[BaseModel], list[str]]:
    """The sections of a config, in the order the tree first reaches them, each with the
    paths it is found at."""
    found: dict[type[BaseModel], list[str]] = {ROOTS[kind]: []}
    for row in rows(ROOTS[kind]):
        for section in row.sections:
            found.setdefault(section, []).append(row.path)
    return found


def markdown(kind: str) -> str:
    """The reference of one config (``pipeline``, ``retrain`` or ``cluster``): a table per
    section (its fields: type, default, what is allowed, meaning), each headed by the paths
    where the section appears.

    Raises:
        KeyError: another ``kind``.
    """
    out = []
    for model, paths in _classes(kind).items():
        doc = (model.__doc__ or "").strip().split("\n\n")[0]
        where = ", ".join(f"`{p}`" for p in paths[:6]) + (
            f" and {len(paths) - 6} more" if len(paths) > 6 else ""
        )
        where = f"At {where}." if paths else "The file's top level."
        out += [f"### {model.__name__}", "", f"{where} {' '.join(doc.split())}", ""]
        out += ["| field | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        hints = _annotations(model)
        for name, info in model.model_fields.items():
            inner = _sections(hints[name])
            kind_text = _type(hints[name])
            if inner:
                links = ", ".join(f"[{m.__name__}](#{m.__name__.lower()})" for m in inner)
                kind_text = kind_text.replace("section", links, 1) if "section" in kind_text else links
            default = _default(info)
            default = default if default.startswith("(") else f"`{default}`"
            meaning = description(model, name)
            cells = [f"`{info.alias or name}`", kind_text, default, _allowed(info), meaning]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)


@functools.cache
def field_paths() -> frozenset[str]:
    """Every dotted path of every config (``[]`` removed), for checks of what pages name."""
    return frozenset(row.path.replace("[]", "") for model in ROOTS.values() for row in rows(model))
