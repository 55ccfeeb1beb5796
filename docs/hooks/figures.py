"""MkDocs hook: a page quotes a benchmark's figure from the results file the bench wrote, so a
figure has one source.

``{{ fig NAME PATH [FORMAT] }}`` in a page is replaced by the value at ``PATH`` (dotted keys,
or a list's index) of ``bench/results/NAME.json``, formatted by ``FORMAT`` (a ``format()`` spec
such as ``.2f`` or ``,.0f``, or ``met`` for a goal's true / false; default: as it is; a null
value is ``-``). ``{{ source NAME }}`` gives the file's command, commit, machine and date. A
missing file or key fails the (strict) build, naming the page.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
_TAG = re.compile(r"\{\{\s*(fig|source)\s+([\w-]+)(?:\s+([\w.-]+))?(?:\s+([\w.,%+-]+))?\s*\}\}")


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


def render(markdown: str, page: str) -> str:
    """``markdown`` with every ``{{ fig ... }}`` / ``{{ source ... }}`` replaced.

    Raises:
        PluginError: a results file or key that does not exist (names ``page``).
    """

    def one(match: re.Match) -> str:
        kind, name, dotted, spec = match.groups()
        doc = _load(name, page)
        if kind == "source":
            return f"`{doc['command']}`, commit {doc['commit']}, {doc['machine']}, {doc['date']}"
        if dotted is None:
            raise PluginError(f"{page}: {{{{ fig {name} }}}} names no figure")
        value = _value(doc, dotted, name, page)
        if value is None:  # a figure the bench could not take (a quiet pass's AUC)
            return "-"
        if spec == "met":
            return "met" if value else "**not met**"
        return format(value, spec) if spec else str(value)

    return _TAG.sub(one, markdown)


def on_page_markdown(markdown, page, config, files):
    return render(markdown, page.file.src_path)
