"""The docs: README is a front page whose layout table matches the tree, and the reference in
docs/ builds with MkDocs, every broken link or anchor an error, and every page's generated
part (figures, config and command references) equal to what its source gives today."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support import ROOT


def _layout_rows() -> list[str]:
    text = (ROOT / "README.md").read_text()
    table = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    return [line for line in table.splitlines() if line.startswith("| `")]


def test_the_readme_is_a_front_page_whose_layout_table_matches_the_tree():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    named = set()
    for row in _layout_rows():
        first = row.split("|")[1]
        named |= {p.rstrip("/") for p in re.findall(r"`([^`]+)`", first)}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    top = {line.split("/")[0] for line in tracked.splitlines() if "/" in line and not line.startswith(".")}
    assert top - named == set(), f"folders missing from README's layout: {sorted(top - named)}"
    assert {p for p in named if not (ROOT / p).exists()} == set(), "the layout names what is not there"
    # every file a row names inside a folder exists there
    for row in _layout_rows():
        cells = row.split("|")
        folder = cells[1].strip().strip("`").rstrip("/")
        if not (ROOT / folder).is_dir():
            continue
        for name in re.findall(r"`([\w./-]+\.(?:py|sh|java))`", cells[2]):
            found = list((ROOT / folder).rglob(name.split("/")[-1]))
            assert found, f"README's layout: {folder}/ has no {name}"


def test_the_reference_names_every_package_folder_in_its_layout():
    """docs/index.md's layout has a line for every folder of code, two levels deep, and names
    no folder that is gone."""
    text = (ROOT / "docs" / "index.md").read_text().split("## Layout", 1)[1]
    named = {m.rstrip("/") for m in re.findall(r"^\| `([^`]+)`", text, re.M)}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    code = {"cli", "dags", "operators", "features", "trainer", "predict", "recpipe"}
    folders = set()
    for line in tracked.splitlines():
        parts = line.split("/")
        if line.endswith(".py") and parts[0] in code:
            folders |= {"/".join(parts[:n]) for n in range(1, min(len(parts), 4))}
    folders.add("features/jvm")
    assert folders - named == set(), f"folders missing from docs/index.md's layout: {sorted(folders - named)}"
    assert {p for p in named if not (ROOT / p).is_dir()} == set()


def test_the_reference_builds_with_every_link_checked(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert {"config.md", "online-learning.md", "stream.md", "dags.md", "benchmarks.md"} <= pages
    assert (tmp_path / "site" / "benchmarks" / "index.html").is_file()


def test_a_figure_is_quoted_from_its_benchs_results_file_and_a_wrong_one_fails_the_build():
    import json

    import pytest
    from mkdocs.exceptions import PluginError

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    from figures import RESULTS, render

    doc = json.loads((RESULTS / "push.json").read_text())
    # the page holds the value (GitHub shows it); rendering writes it anew from the file
    page = 'push: <span data-fig="push figures.push.wall_vs_floor .2f">9.99</span>x'
    page += ' (<span data-source="push"></span>)'
    text = render(page, "a.md")
    figure = f"{doc['figures']['push']['wall_vs_floor']:.2f}"
    assert text.startswith(f'push: <span data-fig="push figures.push.wall_vs_floor .2f">{figure}</span>x')
    assert '(<span data-source="push">`python bench/push.py' in text and render(text, "a.md") == text
    met = render('<span data-fig="model_classes goals.din_vs_deepfm met"></span>', "a.md")
    assert met.split(">", 1)[1].removesuffix("</span>") in ("met", "**not met**")
    with pytest.raises(PluginError, match="a.md: bench/results/push.json has no 'figures.nothing'"):
        render('<span data-fig="push figures.nothing"></span>', "a.md")
    with pytest.raises(PluginError, match="a.md: no results file bench/results/none.json"):
        render('<span data-fig="none x"></span>', "a.md")


def test_the_config_reference_is_the_codes_and_a_page_naming_a_missing_field_fails():
    import pytest
    from mkdocs.exceptions import PluginError

    from recpipe.config.reference import markdown, missing_descriptions

    assert missing_descriptions() == []  # every field says what it is
    retrain = markdown("retrain")
    assert "| `window_days` | int | `1` | >= 1 | Days of held-out rows" in retrain
    assert "| `gate` | [GateConfig](#gateconfig) | (its defaults) |" in retrain

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    from reference import render

    fine = "`train_config.num_steps`, `gate.window_days=3`, `timeouts.tasks.train`, `gate.p_value`, `gate.py`"
    assert render(fine, "a.md") == fine
    block = "<!-- config_reference cluster -->\n<!-- /config_reference -->"
    assert "### ClusterConfig" in render(block, "a.md")
    with pytest.raises(
        PluginError, match=r"a.md: no such config field: feature_config.features\[0\].embeding_dim"
    ):
        render("set `feature_config.features[0].embeding_dim`", "a.md")
    with pytest.raises(PluginError, match="config_reference 'model'"):
        render("<!-- config_reference model -->\n<!-- /config_reference -->", "a.md")


def test_the_cli_reference_is_the_parsers_help_and_a_page_naming_a_missing_flag_fails():
    import pytest
    from mkdocs.exceptions import PluginError

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    from cli_reference import commands, render

    assert {("train",), ("serve", "push"), ("champion", "rollback"), ("runs", "compare")} <= set(commands())
    page = render("<!-- cli_help -->\n<!-- /cli_help -->", "a.md")
    assert "### recpipe serve push" in page and "--section.field=value" in page
    # flags of the command named, overrides of config fields with '='
    fine = "`recpipe train --pipeline_config_path c.yaml --train_ds=1997-09-20 --train_config.num_steps=5`"
    assert render(fine, "a.md") == fine
    with pytest.raises(PluginError, match="a.md: no such flag: recpipe train --train_ds"):
        render("`recpipe train --pipeline_config_path c.yaml --train_ds 1997-09-20`", "a.md")
    with pytest.raises(PluginError, match="recpipe serve push --nope"):
        render("```\nrecpipe serve push --nope\n```", "a.md")


def test_every_shell_block_says_how_its_commands_are_checked():
    import pytest
    from mkdocs.exceptions import PluginError

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    from commands import check

    check((ROOT / "README.md").read_text(), "README.md")  # outside the site: checked here
    with pytest.raises(PluginError, match=r"page.md:3: a shell block without"):
        check("text\n\n```bash\nrecpipe train\n```\n", "page.md")
    with pytest.raises(PluginError, match=r"tests/test_docs.py::test_nothing, which does not exist"):
        check("<!-- commands: run by tests/test_docs.py::test_nothing -->\n```bash\nls\n```\n", "page.md")
    with pytest.raises(PluginError, match=r"'not run:' is not"):
        check("<!-- commands: not run: -->\n```bash\nls\n```\n", "page.md")
    check(
        "<!-- commands: synopsis -->\n```bash\nrecpipe train [--flag]\n```\n```python\nx = 1\n```\n", "p.md"
    )


def test_a_results_file_names_its_cpu_and_the_source_line_says_it(tmp_path, monkeypatch):
    """Two machines of one kind can differ in their CPU, and with it every figure per
    CPU-second: a bench's results file records the CPU's model, which the page's source line
    quotes."""
    import json

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    import figures

    from bench import results

    monkeypatch.setattr(results, "FOLDER", tmp_path)
    monkeypatch.setattr(figures, "RESULTS", tmp_path)
    doc = json.loads(results.write_results("probe", {"x": 1}).read_text())
    assert doc["cpu_model"] == results.cpu_model() and doc["cpu_model"]
    text = figures.render('<span data-source="probe"></span>', "a.md")
    assert f", {doc['machine']}, {doc['cpu_model']}, {doc['date']}</span>" in text
