"""A part of docs/hooks/render.py: the config reference from the code, and no page naming a
field the code lacks.

A block between ``<!-- config_reference KIND -->`` and ``<!-- /config_reference -->`` (``KIND``:
``pipeline``, ``retrain``, ``cluster``) holds that config's tables
(``recpipe.config.reference.markdown``), written by ``python docs/hooks/render.py``; the
(strict) build fails on a page whose tables differ from the code's. Every inline-code dotted name that
starts with a config section (`` `train_config.num_steps` ``, `` `gate.window_days=3` ``;
list selectors such as ``[0]`` ignored) must be a field: a misspelt or removed one fails the
(strict) build, naming the page.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from recpipe.config.reference import ROOTS, field_paths, markdown  # noqa: E402

_BLOCK = re.compile(r"<!-- config_reference (\w+) -->\n.*?<!-- /config_reference -->", re.S)
_CODE = re.compile(r"`([A-Za-z_]\w*(?:\[[^\]`]*\])?(?:\.\w+(?:\[[^\]`]*\])?)+)(?:[:=][^`]*)?`")
_FILE = re.compile(r"\.(py|md|ya?ml|json|txt|sh|jsonl|csv)$")
# the gate's and the scoring's figures as the parent run's metrics (operators/register.py,
# operators/predict.py), not fields
_NOT_FIELDS = re.compile(
    r"^(gate\.(diff|ci_low|ci_high|p_value|positives|negatives|auc\w*)|batch_predict\.rows)$"
)


def _known(path: str, paths: set[str], open_ended: set[str]) -> bool:
    return path in paths or any(path.startswith(p + ".") for p in open_ended)


def check_fields(markdown_text: str, page: str) -> None:
    """Raise when ``markdown_text`` names a config field that does not exist.

    Raises:
        PluginError: the page and the unknown names.
    """
    paths = field_paths()
    sections = {p.split(".")[0] for p in paths if "." in p}
    # dict fields: the keys below them are the user's (timeouts.tasks.train)
    open_ended = {p for p in paths if p.endswith(("tasks", "edit_config_json"))}
    unknown = []
    for match in _CODE.finditer(markdown_text):
        name = match.group(1)
        if name.split(".")[0].split("[")[0] not in sections or _FILE.search(name) or _NOT_FIELDS.match(name):
            continue
        if not _known(re.sub(r"\[[^\]]*\]", "", name), paths, open_ended):
            unknown.append(name)
    if unknown:
        raise PluginError(f"{page}: no such config field: {', '.join(sorted(set(unknown)))}")


def render(markdown_text: str, page: str) -> str:
    """``markdown_text`` with each config reference block written anew, once its field
    names are checked.

    Raises:
        PluginError: an unknown kind or field (names ``page``).
    """
    check_fields(markdown_text, page)

    def one(match: re.Match) -> str:
        kind = match.group(1)
        if kind not in ROOTS:
            raise PluginError(f"{page}: config_reference {kind!r}: one of {sorted(ROOTS)}")
        return f"<!-- config_reference {kind} -->\n\n{markdown(kind).strip()}\n\n<!-- /config_reference -->"

    return _BLOCK.sub(one, markdown_text)

