"""``python docs/hooks/render.py [--check]``: write into docs/*.md the parts generated from one
source each: benchmark figures (``figures.py``, from bench/results/), the config reference
(``reference.py``, from the code) and the command reference (``cli_reference.py``, from the parsers),
so that a page reads the same on GitHub as on the site. ``--check`` writes nothing and exits 1
naming each page that differs.

As an MkDocs hook it fails the (strict) build on a page whose generated parts differ from
their sources, naming the part, and on an unknown config field or flag.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

HOOKS = Path(__file__).resolve().parent
DOCS = HOOKS.parent
sys.path.insert(0, str(HOOKS))

import cli_reference  # noqa: E402
import figures  # noqa: E402
import reference  # noqa: E402

# each generated part: its renderer, and what the build says of a page it would change
PARTS = (
    (figures, "its figures differ from bench/results"),
    (reference, "its config reference differs from the code's"),
    (cli_reference, "its command reference differs from the parsers' help"),
)


def rendered(text: str, page: str) -> str:
    """``text`` (the page ``page``) with every generated part written anew.

    Raises:
        mkdocs.exceptions.PluginError: a missing results file or key, an unknown config field
            or flag (names ``page``).
    """
    for part, _ in PARTS:
        text = part.render(text, page)
    return text


def on_page_markdown(markdown, page, config, files):
    for part, differs in PARTS:
        if part.render(markdown, page.file.src_path) != markdown:
            raise PluginError(f"{page.file.src_path}: {differs}: run python docs/hooks/render.py")
    return markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python docs/hooks/render.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs")
    args = parser.parse_args(argv)
    stale = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        fresh = rendered(text, path.name)
        if fresh != text:
            stale.append(path.name)
            if not args.check:
                tmp = path.with_suffix(".md.tmp")
                tmp.write_text(fresh)
                tmp.replace(path)
    if stale:
        verb = "differ from their sources: run python docs/hooks/render.py" if args.check else "written"
        print(f"docs/{', docs/'.join(stale)}: {verb}", file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
