"""MkDocs hook: every shell block in a page says how its commands are checked.

A fenced ``bash`` block follows a comment that says which of three it is:

- ``<!-- commands: run by tests/FILE.py::TEST -->``: that test reads the block from the page
  (``blocks``) and runs its commands as written; the build fails when the test is missing;
- ``<!-- commands: synopsis -->``: a usage summary with placeholders (``conf/X.yaml``,
  ``[--flag]``), not commands to paste; its flags and fields are checked by ``cli_reference.py`` and
  ``reference.py``;
- ``<!-- commands: not run: REASON -->``: what the commands need that a test does not have
  in under a minute (a cluster, a long run, your own data, a running deployment).

A block without one, or with another kind, fails the strict build, naming the page and line.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
SHELLS = ("bash", "sh", "shell", "console")
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!--\s*commands:\s*(.+?)\s*-->\s*$")
_RUN_BY = re.compile(r"^run by (tests/[\w/]+\.py)::(test_\w+)$")


def blocks(markdown: str) -> list[tuple[int, str, str]]:
    """The page's shell blocks: ``(line, mark, text)`` each, ``line`` the fence's (1-based),
    ``mark`` the text of the comment above it ('' when there is none)."""
    lines = markdown.splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
        if fence.group(1) in SHELLS:
            above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            mark = _MARK.match(above)
            found.append((i + 1, mark.group(1) if mark else "", "\n".join(lines[i + 1 : end])))
        i = end + 1
    return found


def marked(markdown: str, test: str) -> list[str]:
    """The texts of the page's blocks run by ``test`` (``tests/FILE.py::TEST``)."""
    return [text for _, mark, text in blocks(markdown) if mark == f"run by {test}"]


def check(markdown: str, page: str) -> None:
    """Every shell block of ``page`` is marked, and a test named by a mark exists.

    Raises:
        PluginError: names the page, the block's line and what is wrong.
    """
    for line, mark, _ in blocks(markdown):
        where = f"{page}:{line}"
        if not mark:
            raise PluginError(
                f"{where}: a shell block without '<!-- commands: run by TEST | synopsis | "
                "not run: REASON -->' above it"
            )
        run_by = _RUN_BY.match(mark)
        if run_by:
            path, test = run_by.groups()
            source = ROOT / path
            if not source.is_file() or not re.search(rf"^def {test}\(", source.read_text(), re.M):
                raise PluginError(f"{where}: its commands are 'run by' {path}::{test}, which does not exist")
        elif mark != "synopsis" and not (mark.startswith("not run: ") and len(mark) > len("not run: ")):
            raise PluginError(f"{where}: '{mark}' is not 'run by TEST', 'synopsis' or 'not run: REASON'")


def on_page_markdown(markdown, page, config, files):
    check(markdown, page.file.src_path)
    return markdown
