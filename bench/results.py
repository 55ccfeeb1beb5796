"""A bench's results file, ``bench/results/<name>.json``: its figures with the command that
made them, the commit (``--dirty`` when the tree had changes), the machine and the date. The
docs render figures from these files only (``docs/hooks/figures.py``)."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "bench" / "results"


def _describe() -> str:
    """The commit, ``-dirty`` when a tracked file outside ``bench/results/`` and ``docs/`` has
    changes (an earlier bench's results file, or a page being written, does not change the
    code being measured)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    outside = (".", ":(exclude)bench/results", ":(exclude)docs")
    changed = git("status", "--porcelain", "--untracked-files=no", "--", *outside)
    return git("describe", "--always") + ("-dirty" if changed else "")


# the tree the bench started from: a long bench must not take a later commit's name
COMMIT = _describe()


def word(key) -> str:
    """A key as the docs' figure paths can name it: dotted words (``train online`` ->
    ``train_online``, ``PSStrategy+geo_step=10`` -> ``PSStrategy_geo_step_10``)."""
    return re.sub(r"[^\w-]", "_", str(key))


def _words(value):
    if isinstance(value, dict):
        return {word(k): _words(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_words(v) for v in value]
    return value


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``), or None where it does not say: two machines
    of one kind can differ in it, and with it in every figure per CPU-second."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return None


def write_results(name: str, figures: dict) -> Path:
    """Write ``figures`` (JSON-able) with their provenance to ``bench/results/<name>.json``
    (atomically: a reader never sees half a file; every key made a ``word``); the path."""
    from recpipe import atomic

    script = Path(sys.argv[0]).resolve()
    where = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    doc = {
        "command": " ".join(["python", str(where), *sys.argv[1:]]),
        "commit": COMMIT,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "cpu_model": cpu_model(),
        "date": datetime.now(UTC).date().isoformat(),
        **_words(figures),
    }
    return atomic.write_text(FOLDER / f"{name}.json", json.dumps(doc, indent=2) + "\n")
