"""Bad input to every ``recpipe`` subcommand, generated (Hypothesis): an unknown flag, a number
out of its range or not a number, a value outside a flag's choices, a required flag left out,
and a pipeline config with a field mutated (an unknown key, a number that is not one). Each
answers one line on stderr naming the flag or the dotted field, and exit code 2, before any
work starts (no server is asked, no file is written)."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import ROOT

CONFIG = "conf/movielens_deepfm.yaml"
TRAIN = ["--pipeline_config_path", CONFIG]
# subcommand -> (a valid command line, {flag: (kind, allowed)}, required flags)
COMMANDS = {
    "config": (["config", CONFIG], {"--kind": ("choice", ["pipeline", "retrain", "cluster"])}, []),
    "data synth": (
        ["data", "synth", "criteo", "--rows", "10", "--out", "var/never"],
        {
            "--rows": ("int", 1),
            "--days": ("int", 1),
            "--seed": ("int", 0),
            "--start": ("day", None),
            "--profile": ("choice", ["small", "kaggle"]),
        },
        ["--rows", "--out"],
    ),  # fmt: skip
    "data replay": (
        ["data", "replay", "movielens-100k", "--out", "var/never"],
        {"--granularity": ("choice", ["day", "hour"]), "--pass_minutes": ("choice", ["60", "30", "15"])},
        [],
    ),
    "data fetch": (["data", "fetch", "movielens-100k"], {"--source": ("choice", ["auto", "wheel"])}, []),
    "runs compare": (["runs", "compare", "--experiment", "e", "--no_log"], {"--last": ("int", 1)}, []),
    "champion": (
        ["champion", "show", "--model_name", "m"],
        {"--version": ("int", None)},
        ["--model_name"],
    ),
    "train": (TRAIN, {"--num_workers": ("int", 1), "--num_ps": ("int", 0)}, ["--pipeline_config_path"]),
    "eval": (["eval", *TRAIN], {}, ["--pipeline_config_path"]),
    "export": (["export", *TRAIN, "--export_dir", "var/never"], {}, ["--export_dir"]),
    "serve push": (["serve", "push", "var/never", "--model", "m"], {}, ["--model"]),
    "ckpt list": (["ckpt", "list", "var/never"], {}, []),
    "announce": (["announce", "var/never"], {}, []),
    "config import": (["config", "import", "tests/config/easyrec/deepfm_criteo.config"], {}, []),
    "predict": (
        [
            "predict",
            "--input_path",
            "var/never",
            "--output_path",
            "var/never_out",
            "--saved_model_dir",
            "var/never",
        ],
        {
            "--batch_size": ("int", 1),
            "--input_format": ("choice", ["csv", "parquet"]),
            "--output_format": ("choice", ["csv", "parquet"]),
        },
        ["--input_path", "--output_path"],
    ),  # fmt: skip
}
COMMANDS["train"] = (["train", *TRAIN], *COMMANDS["train"][1:])


def _run(argv: list[str]) -> tuple[int, str]:
    from cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as end:
            code = end.code
    return code, err.getvalue().strip()


def _one_line(code: int, err: str, names: str, argv) -> None:
    assert code == 2, (argv, code, err)
    assert len(err.splitlines()) == 1, (argv, err)
    assert names in err, (argv, names, err)


def _without(argv: list[str], flag: str) -> list[str]:
    i = argv.index(flag)
    return argv[:i] + argv[i + 2 :]


flags = st.from_regex(r"--[a-z]{3,12}_[a-z]{3,12}", fullmatch=True)
not_numbers = st.text(st.characters(codec="ascii", categories=["L", "P"]), min_size=1, max_size=8).filter(
    lambda t: not t.startswith("-") and t.strip() == t and t
)


@pytest.fixture(autouse=True)
def _here(tmp_path, monkeypatch):
    # no command may reach a server or the project's own stores
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("RECPIPE_VAR_DIR", str(tmp_path / "var"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(sorted(COMMANDS)), flag=flags)
def test_an_unknown_flag_is_one_line_naming_it(command, flag):
    argv = COMMANDS[command][0] + [flag, "1"]
    code, err = _run(argv)
    _one_line(code, err, flag, argv)


def _bad_values(kind: str, allowed):
    if kind == "int":
        low = st.integers(-1000, allowed - 1).map(str) if allowed is not None else st.nothing()
        return low | not_numbers
    if kind == "day":
        return st.sampled_from(["2024-02-30", "2023-13-01", "20240101", "tomorrow", "2024-1-1"])
    return not_numbers.filter(lambda t: t not in allowed)


@st.composite
def bad_values(draw):
    command = draw(st.sampled_from(sorted(c for c in COMMANDS if COMMANDS[c][1])))
    argv, kinds, _ = COMMANDS[command]
    flag = draw(st.sampled_from(sorted(kinds)))
    value = draw(_bad_values(*kinds[flag]))
    return command, flag, (_without(argv, flag) if flag in argv else argv) + [f"{flag}={value}"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=bad_values())
def test_a_bad_value_is_one_line_naming_its_flag(case):
    _command, flag, argv = case
    code, err = _run(argv)
    _one_line(code, err, flag, argv)


@pytest.mark.parametrize(
    "command,flag", [(c, f) for c, (_, _, required) in sorted(COMMANDS.items()) for f in required]
)
def test_a_required_flag_left_out_is_one_line_naming_it(command, flag):
    argv = _without(COMMANDS[command][0], flag)
    code, err = _run(argv)
    _one_line(code, err, flag, argv)


def _leaves(doc, path=()):
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _leaves(value, (*path, i))
    else:
        yield path, doc


def _dotted(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + part
    return out


def _mappings(doc, path=()):
    if isinstance(doc, dict):
        yield path
        for key, value in doc.items():
            yield from _mappings(value, (*path, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _mappings(value, (*path, i))


PIPELINE = yaml.safe_load((ROOT / CONFIG).read_text())
NUMBERS = [p for p, v in _leaves(PIPELINE) if isinstance(v, int | float) and not isinstance(v, bool)]
MAPPINGS = [p for p in _mappings(PIPELINE) if p]


def _at(doc, path):
    for part in path:
        doc = doc[part]
    return doc


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    how=st.sampled_from(["unknown_key", "not_a_number"]),
    data=st.data(),
)
def test_a_mutated_config_is_one_line_naming_the_field(how, data, tmp_path):
    import copy

    doc = copy.deepcopy(PIPELINE)
    if how == "unknown_key":
        path = data.draw(st.sampled_from(MAPPINGS), label="mapping")
        _at(doc, path)["no_such_field"] = 1
        field = _dotted((*path, "no_such_field"))
    else:
        path = data.draw(st.sampled_from(NUMBERS), label="number")
        _at(doc, path[:-1])[path[-1]] = "twelve"
        field = _dotted(path)
    out = Path(tmp_path) / f"mutated-{os.getpid()}.yaml"
    out.write_text(yaml.safe_dump(doc))
    code, err = _run(["config", str(out)])
    _one_line(code, err, field, (how, field))
    assert str(out) in err


# what a malformed file may hold: any bytes (non-UTF-8 among them), text, nesting deeper than a
# parser's recursion, and scalars or lists where a message or mapping belongs
MALFORMED = st.one_of(
    st.binary(max_size=120),
    st.text(max_size=120).map(str.encode),
    st.integers(200, 5000).map(lambda n: ("a {" * n + "}" * n).encode()),
    st.integers(200, 5000).map(lambda n: ('{"a": ' * n + "1" + "}" * n).encode()),
    st.integers(200, 5000).map(lambda n: ("[" * n + "]" * n).encode()),
    st.integers(200, 5000).map(lambda n: ("a:\n" + "".join(" " * i + "b:\n" for i in range(1, n))).encode()),
    st.sampled_from([
        b"\xff\xfe\x00model_config {}", b"model_config: 3", b'{"model_config": 3}', b"[1, 2]", b'"x"', b"3",
        b'feature_config: "x"', b"data_config { input_fields: 3 }", b'{"data_config": [1, {"x": 2}]}',
        b"train_config:\n  num_steps: [1, 2]", b"model_config: {model_class: [DeepFM]}", b"- 1\n- 2",
        b"a: [\n", b"{{{", b"model_config { model_class: DeepFM deepfm { } } feature_config { features: 1 }",
    ]),
)  # fmt: skip
# commands that read a file a user names, with the place the file goes
READERS = {
    "config": ["config", "{}"],
    "config import": ["config", "import", "{}"],
    "train": ["train", "--pipeline_config_path", "{}"],
    "eval": ["eval", "--pipeline_config_path", "{}"],
    "export": ["export", "--pipeline_config_path", "{}", "--export_dir", "var/never"],
}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(sorted(READERS)), content=MALFORMED)
def test_a_malformed_file_is_one_line_and_exit_2(command, content, tmp_path):
    path = Path(tmp_path) / f"malformed-{os.getpid()}.config"
    path.write_bytes(content)
    argv = [str(path) if a == "{}" else a for a in READERS[command]]
    code, err = _run(argv)
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (
        argv,
        content[:80],
        err[-2000:],
    )
    assert str(path) in err, (argv, err)
