"""A part of docs/hooks/render.py: a page quotes a benchmark's figure from the results file
the bench wrote, so a figure has one source, and the page holds the figure itself (readable
where it is read, on GitHub too).

``<span data-fig="NAME PATH [FORMAT]">VALUE</span>`` holds the value at ``PATH`` (dotted keys,
or a list's index) of ``bench/results/NAME.json``, formatted by ``FORMAT`` (a ``format()`` spec
such as ``.2f`` or ``,.0f``, or ``met`` for a goal's true / false; default: as it is; a null
value is ``-``). ``<span data-source="NAME">...</span>`` holds the file's command, commit,
machine and date. ``python docs/hooks/render.py`` writes the values; the (strict) build fails
on a page whose values differ from the files', and on a missing file or key, naming the page.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
_SPAN = re.compile(r'<span data-(fig|source)="([^"]*)">(.*?)</span>')
_ARGS = re.compile(r"([\w-]+)(?:\s+([\w.-]+))?(?:\s+([\w.,%+-]+))?")


def _load(name: str, page: str) -> dict:
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        raise PluginError(f"{page}: no results file {path.relative_to(RESULTS.parents[1])}: run its bench")
    return json.loads(path.read_text())


def _value(doc: dict, dotted: str, name: str, page: str):
    value = doc
    for key in dotted.split("."):
        if isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]  # a list's item by its index
        elif isinstance(value, dict) and key in value:
            value = value[key]
        else:
            raise PluginError(f"{page}: bench/results/{name}.json has no {dotted!r}")
    return value


def value(kind: str, args: str, page: str) -> str:
    """The text of a ``data-fig`` / ``data-source`` span with arguments ``args``.

    Raises:
        PluginError: malformed arguments, a results file or key that does not exist (names
            ``page``).
    """
    parsed = _ARGS.fullmatch(args.strip())
    if parsed is None:
        raise PluginError(f"{page}: data-{kind}={args!r}: give NAME [PATH [FORMAT]]")
    name, dotted, spec = parsed.groups()
    doc = _load(name, page)
    if kind == "source":
        machine = ", ".join(filter(None, [doc["machine"], doc.get("cpu_model")]))
        return f"`{doc['command']}`, commit {doc['commit']}, {machine}, {doc['date']}"
    if dotted is None:
        raise PluginError(f"{page}: data-fig={args!r} names no figure")
    found = _value(doc, dotted, name, page)
    if found is None:  # a figure the bench could not take (a quiet pass's AUC)
        return "-"
    if spec == "met":
        return "met" if found else "**not met**"
    return format(found, spec) if spec else str(found)


def span(kind: str, args: str, page: str) -> str:
    """A whole span, value included."""
    return f'<span data-{kind}="{args}">{value(kind, args, page)}</span>'


def render(markdown: str, page: str) -> str:
    """``markdown`` with every figure span's value written anew.

    Raises:
        PluginError: as ``value``.
    """
    return _SPAN.sub(lambda m: span(m.group(1), m.group(2), page), markdown)

