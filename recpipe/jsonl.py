"""JSON-lines files that outlive killed writers (``train_metrics.jsonl``, ``eval_history.jsonl``):
a reader skips a torn line with a warning, a writer ends a torn last line before appending."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def read(path: str | os.PathLike) -> list[dict]:
    """The JSON objects of ``path``, one per line, in order ([] if it does not exist). Lines
    that are not whole JSON objects (torn by a SIGKILL mid-write) are skipped with a warning."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as err:
            log.warning("%s line %d skipped: not a whole JSON line (%s)", path, number, err)
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def append(path: str | os.PathLike, record: dict) -> None:
    """Append ``record`` as one line (parents created). If the file ends without a newline
    (a writer was killed mid-line), that line is ended first so this one stays whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record) + "\n").encode()
    with path.open("a+b") as out:
        out.seek(0, os.SEEK_END)
        if out.tell():
            out.seek(-1, os.SEEK_END)
            if out.read(1) != b"\n":
                line = b"\n" + line
        out.write(line)
