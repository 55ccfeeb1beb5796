"""The layering the layout promises: the core (``recpipe``) imports no TensorFlow, Spark,
Airflow nor the packages built on it; each package imports none above it, at module level or
inside a function (the command line, ``cli``, is the top floor); nothing imports the Airflow
operators but the DAGs."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

from tests.support import ROOT

HEAVY = ("tensorflow", "pyspark", "airflow", "mlflow", "horovod")
ABOVE_CORE = ("trainer", "features", "predict", "operators", "dags", "cli")
# each production package -> the packages above it, which it must not import anywhere
# (``dev`` is the development kit: production never imports it)
ABOVE = {
    "recpipe": (*ABOVE_CORE, "dev"),
    "features": ("trainer", "predict", "operators", "dags", "cli", "dev"),
    "trainer": ("features", "predict", "operators", "dags", "cli", "dev"),
    "predict": ("trainer", "operators", "dags", "cli", "dev"),
    "operators": ("dags", "cli", "dev"),
    "dags": ("cli", "dev"),
}


def _top_level_imports(path, anywhere: bool = False) -> set[str]:
    """Top-level package names imported at module level (not inside functions), or
    ``anywhere`` in the module."""
    names = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree) if anywhere else tree.body:
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


def test_no_package_imports_one_above_it_even_inside_a_function():
    offenders = {
        str(path.relative_to(ROOT)): sorted(_top_level_imports(path, anywhere=True) & set(above))
        for package, above in ABOVE.items()
        for path in (ROOT / package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_only_the_dags_import_the_operators():
    for package in ("recpipe", "trainer", "features", "predict"):
        for path in (ROOT / package).rglob("*.py"):
            assert "operators" not in _top_level_imports(path), path


def _heavy_after_importing(modules: str) -> list[str]:
    """What of ``HEAVY`` and the packages above the core a fresh interpreter holds after
    importing ``modules`` (comma-separated)."""
    code = (
        f"import sys, {modules};"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r} + {ABOVE_CORE!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.replace("'", '"'))  # a printed list of names


def test_the_command_line_and_launchers_load_without_tensorflow_spark_or_airflow():
    loaded = _heavy_after_importing(
        "cli.main, predict.cli, recpipe.launch, recpipe.layout, recpipe.atomic, recpipe.config.args"
    )
    assert loaded == ["cli", "predict"]  # the modules named, nothing heavy


def test_every_core_module_imports_first_in_a_fresh_interpreter():
    """No import cycle inside the core: each module of ``recpipe`` imported with no other
    ``recpipe`` module loaded before it (a cycle shows only when its far end comes first)."""
    names = sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for path in (ROOT / "recpipe").rglob("*.py")
    )
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'recpipe' or m.startswith('recpipe.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as e:\n"
        "        print(name, e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


# import name -> distribution, where they differ; horovod is built by scripts/setup.sh
DISTRIBUTIONS = {"yaml": "pyyaml", "tf_keras": "tf-keras", "airflow": "apache-airflow"}
BUILT_BY_SETUP = {"horovod"}
PRODUCTION = ("cli", "recpipe", "trainer", "features", "predict", "operators", "dags")


def test_every_third_party_package_the_product_imports_is_declared():
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[\[<>=;, ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    ours = {*PRODUCTION, "dev", "tests", "bench"}
    used = set()
    for package in PRODUCTION:
        for path in (ROOT / package).rglob("*.py"):
            used |= _top_level_imports(path, anywhere=True)
    third_party = {m for m in used if m not in sys.stdlib_module_names and m not in ours} - BUILT_BY_SETUP
    undeclared = sorted(m for m in third_party if DISTRIBUTIONS.get(m, m).replace("_", "-") not in declared)
    assert undeclared == [], f"imported but not in pyproject.toml's dependencies: {undeclared}"


def test_the_export_format_and_store_load_without_tensorflow():
    assert _heavy_after_importing("recpipe.exports.files, recpipe.exports.store") == []


def test_the_trainer_reaches_the_online_tables_through_their_package_only():
    """``trainer.online``'s parts (table, admission, eviction, clock, initializer) are its own:
    the rest of the trainer imports the package, whose ``__init__`` is the interface."""
    offenders = []
    for path in (ROOT / "trainer").rglob("*.py"):
        if path.parent.name == "online":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trainer.online."):
                offenders.append(f"{path.relative_to(ROOT)}: {node.module}")
    assert offenders == []


def test_production_never_imports_the_development_kit_at_module_level():
    """``dev`` (local Airflow, its REST client, data sets) serves demos and tests; the product's
    packages reach it at most from a command's dispatch (``recpipe data``)."""
    offenders = [
        str(path.relative_to(ROOT))
        for package in PRODUCTION
        for path in (ROOT / package).rglob("*.py")
        if "dev" in _top_level_imports(path)
    ]
    assert offenders == []


def test_no_function_of_the_product_runs_past_80_lines():
    """Functions readable in a screen: a longer one does several jobs (split it by job)."""
    long = []
    for package in PRODUCTION:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > 80:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []
