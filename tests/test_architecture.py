"""The layering the layout promises: the core (``recpipe``) imports no TensorFlow, Spark,
Airflow nor the packages built on it, and nothing imports the Airflow operators but the DAGs."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.support import ROOT

HEAVY = ("tensorflow", "pyspark", "airflow", "mlflow", "horovod")
ABOVE_CORE = ("trainer", "features", "operators", "dags")


def _top_level_imports(path) -> set[str]:
    """Top-level package names imported at module level (not inside functions)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_the_core_imports_nothing_above_it_at_module_level():
    offenders = {
        str(path.relative_to(ROOT)): sorted(_top_level_imports(path) & {*HEAVY, *ABOVE_CORE})
        for path in (ROOT / "recpipe").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_only_the_dags_import_the_operators():
    for package in ("recpipe", "trainer", "features"):
        for path in (ROOT / package).rglob("*.py"):
            assert "operators" not in _top_level_imports(path), path


def test_the_command_line_and_launchers_load_without_tensorflow_spark_or_airflow():
    code = (
        "import sys, recpipe.cli, recpipe.launch, recpipe.layout, recpipe.atomic, recpipe.config.args;"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r} + {ABOVE_CORE!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
