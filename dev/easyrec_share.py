"""How many of a folder's EasyRec configs ``recpipe config import`` takes, and why the rest
are refused: ``python -m dev.easyrec_share DIR [--model_class NAME ...]``.

Counts the ``*.config`` files that name one of the model classes (default: those recpipe
has) and read CSV or Parquet (``input_type``); prints ``N of M import`` (the import and
``recpipe config``'s checks pass), ``K of M build`` (their model is built and scores a
sample batch), then each first refusal's field path with its count, most common first.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

from recpipe.config.errors import ConfigError
from recpipe.config.model import ModelClass

READABLE = ("CSVInput", "CSVInputV2", "ParquetInput", "ParquetInputV2")
_CLASS = re.compile(r"model_class:\s*['\"]?(\w+)")
_INDEX = re.compile(r"\[\d+\]")
_INPUT = re.compile(r"input_type:\s*(\w*Input\w*)")


def share(folder: Path, classes: set[str]) -> tuple[int, int, list[Path], Counter]:
    """(configs imported, configs whose model builds, the configs in scope, first refusals
    by field path; a model that does not build counts under ``model: <its error>``).

    Raises:
        FileNotFoundError: ``folder`` is not a directory.
    """
    from recpipe.config.easyrec import import_config

    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: not a directory")
    imported, built, scope, refusals = 0, 0, [], Counter()
    for path in sorted(folder.glob("*.config")):
        text = path.read_text()
        model, source = _CLASS.search(text), _INPUT.search(text)
        if not (model and source and model.group(1) in classes and source.group(1) in READABLE):
            continue
        scope.append(path)
        try:
            raw = import_config(text, path.name)
            imported += 1
        except ConfigError as e:
            reason = str(e).splitlines()[0].split(": ", 1)[-1]
            refusals[re.sub(r"\[\d+\]", "[]", reason.split(":")[0])] += 1
            continue
        error = _builds(raw)
        if error is None:
            built += 1
        else:
            refusals["model: " + _INDEX.sub("[]", error)[:90]] += 1
    return imported, built, scope, refusals


def _builds(raw: dict) -> str | None:
    """None when the imported config's model is built and scores a sample batch, else the
    first line of why not."""
    from recpipe.config.pipeline import PipelineConfig
    from trainer.input import sample_inputs
    from trainer.models.builders import build_model

    config = PipelineConfig.model_validate(raw)
    try:
        build_model(config)(sample_inputs(config))
    except Exception as e:  # noqa: BLE001 - counted by its reason
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.easyrec_share", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--model_class", action="append", help="count these classes (repeatable)")
    args = parser.parse_args(argv)
    classes = set(args.model_class or [m.value for m in ModelClass])
    try:
        imported, built, scope, refusals = share(args.folder, classes)
    except FileNotFoundError as e:
        print(f"python -m dev.easyrec_share: {e}", file=sys.stderr)
        return 2
    print(f"{imported} of {len(scope)} import")
    print(f"{built} of {len(scope)} build")
    for path, n in refusals.most_common():
        print(f"{n:5d}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
