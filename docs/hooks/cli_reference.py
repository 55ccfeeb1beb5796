"""A part of docs/hooks/render.py: the ``recpipe`` command's reference from its own parsers,
and no page naming a flag the command lacks.

The block between ``<!-- cli_help -->`` and ``<!-- /cli_help -->`` holds every command's and
subcommand's ``--help`` output (the parsers' own text), written by ``python
docs/hooks/render.py``; the (strict) build fails on a page whose block differs from it. A
``recpipe <command> [<subcommand>] ... --flag`` written in a page (a code block's line or
inline code) must name a flag that command's help lists; ``--section.field=value`` overrides
are config fields (``docs/hooks/reference.py``).
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from recpipe.config.overrides import SECTIONS  # noqa: E402  (what --name=value may name)

_BLOCK = re.compile(r"<!-- cli_help -->\n.*?<!-- /cli_help -->", re.S)
_CHOICES = re.compile(r"^positional arguments:\n\s+\{([\w,-]+)\}", re.M)
_FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)(?![\w.])")
_OPTION = re.compile(r"^\s{2,}(?:-\w, )?(--[a-z][\w-]*)", re.M)
_OVERRIDE = re.compile(r"(?<![\w-])--([a-z]\w*)=")  # a top-level field: --train_ds=...
_USE = re.compile(r"\brecpipe((?:\s+[a-z][\w-]*)+)([^\n`]*)")


@functools.cache
def help_text(command: tuple[str, ...]) -> str:
    """``recpipe <command> --help``, as the user sees it.

    Raises:
        PluginError: the command exits with an error.
    """
    done = subprocess.run(
        [sys.executable, "-m", "cli", *command, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "100", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )
    if done.returncode != 0:
        raise PluginError(
            f"recpipe {' '.join(command)} --help exited {done.returncode}: {done.stderr[-500:]}"
        )
    return done.stdout


def _subcommands(command: tuple[str, ...]) -> list[str]:
    found = _CHOICES.search(help_text(command))
    return found.group(1).split(",") if found else []


@functools.cache
def commands() -> list[tuple[str, ...]]:
    """Every command and subcommand (two levels: ``serve push``), in the parsers' order."""
    out = []
    for name in _subcommands(()):
        out.append((name,))
        out += [(name, sub) for sub in _subcommands((name,))]
    # dispatched before `recpipe config`'s own parser, whose help lists a PATH instead
    out.insert(out.index(("config",)) + 1, ("config", "import"))
    return out


def _flags(command: tuple[str, ...]) -> set[str]:
    """The options the parser declares (its option lines), not flags its prose mentions."""
    return set(_OPTION.findall(help_text(command)))


def check_flags(markdown_text: str, page: str) -> None:
    """Raise when a ``recpipe ...`` command in ``markdown_text`` uses a flag its parser lacks.

    Raises:
        PluginError: the page, the command and the unknown flags.
    """
    known = set(commands())
    unknown = []
    for match in _USE.finditer(markdown_text):
        words = tuple(match.group(1).split())
        command = next((words[:n] for n in (2, 1) if words[:n] in known), None)
        if command is None:
            continue
        rest = " ".join(words[len(command) :]) + match.group(2)
        allowed = _flags(command) | {"--help"}
        if "--section.field=value" in help_text(command):
            allowed |= {f"--{name}" for name in _OVERRIDE.findall(rest) if name in SECTIONS}
        bad = sorted(set(_FLAG.findall(rest)) - allowed)
        if bad:
            unknown.append(f"recpipe {' '.join(command)} {' '.join(bad)}")
    if unknown:
        raise PluginError(f"{page}: no such flag: {'; '.join(sorted(set(unknown)))}")


def render(markdown_text: str, page: str) -> str:
    """``markdown_text`` with its ``cli_help`` block written anew, once its commands' flags
    are checked.

    Raises:
        PluginError: as ``check_flags``.
    """
    check_flags(markdown_text, page)
    if not _BLOCK.search(markdown_text):
        return markdown_text
    parts = [f"### recpipe\n\n```text\n{help_text(()).rstrip()}\n```\n"]
    for command in commands():
        parts.append(f"### recpipe {' '.join(command)}\n\n```text\n{help_text(command).rstrip()}\n```\n")
    block = "<!-- cli_help -->\n\n" + "\n".join(parts) + "\n<!-- /cli_help -->"
    return _BLOCK.sub(lambda _: block, markdown_text)

