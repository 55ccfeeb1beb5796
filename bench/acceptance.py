"""The real-data acceptance tests' figures as a results file the docs render.

Runs ``tests/trainer/test_acceptance.py`` (every model class, the sparse optimizers, one job of
each strategy family, online tables, MMoE, DIN; out of time on MovieLens: train on
1997-09-20..1998-02-28, evaluate on 1998-03-01..1998-04-22), each test writing its figures to
``var/acceptance/<name>.json``, then gathers them into ``bench/results/acceptance.json``:
``{name: figures}`` beside whether the tests passed. The same tests run in CI (marked slow);
this command is how their figures reach the docs.

    python bench/acceptance.py [-k EXPRESSION]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

FIGURES = ROOT / "var" / "acceptance"


def main() -> int:
    parser = harness.parser(__doc__, rounds=None)
    parser.add_argument("-k", dest="expression", help="pytest's -k: a subset of the tests")
    args = parser.parse_args()
    shutil.rmtree(FIGURES, ignore_errors=True)  # no figure of an earlier run
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/trainer/test_acceptance.py"]
    if args.expression:
        cmd += ["-k", args.expression]
    passed = subprocess.run(cmd, cwd=ROOT).returncode == 0
    figures = {p.stem: json.loads(p.read_text()) for p in sorted(FIGURES.glob("*.json"))}
    if not figures:
        print("no figures: every test failed before writing its own", file=sys.stderr)
        return 1
    harness.finish("acceptance", {"passed": passed, "tests": figures})
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
