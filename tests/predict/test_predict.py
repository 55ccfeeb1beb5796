"""``recpipe predict``: a team's EasyRec DeepFM config imported, trained and exported, then a
day scored as EasyRec's predict scores it (probs / logits beside the reserved columns), in one
process and on Spark, with the SavedModel's own scores as the reference."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from recpipe.config.easyrec import import_config
from recpipe.config.loader import validate
from recpipe.config.pipeline import PipelineConfig
from tests.support import RECPIPE, ROOT

pytestmark = pytest.mark.slow

SAMPLE = ROOT / "tests/config/easyrec/deepfm_criteo.config"
DAYS = ["2024-01-01", "2024-01-02"]
COLUMNS = ["label", "i1", "i2", "c1", "c2", "c3"]


def _day(rng: np.random.Generator, rows: int) -> list[list[str]]:
    """Criteo-like rows in the sample config's columns; blanks where ``default_val`` fills."""
    c1 = rng.integers(0, 50, rows)
    i1 = rng.exponential(3.0, rows)
    label = (rng.random(rows) < 1 / (1 + np.exp(-(c1 % 5 - 2 + 0.2 * i1)))).astype(int)
    out = []
    for r in range(rows):
        tags = ",".join(f"t{t}" for t in rng.choice(20, size=rng.integers(0, 3), replace=False))
        out.append([
            str(label[r]), "" if r % 17 == 0 else f"{i1[r]:.3f}",
            "" if r % 11 == 0 else f"{rng.normal():.4f}", f"u{c1[r]}",
            "" if r % 13 == 0 else str(int(rng.integers(0, 9999))), tags,
        ])  # fmt: skip
    return out


@pytest.fixture(scope="module")
def exported(spark, tmp_path_factory):
    """(the export's version directory, the raw root, the var dir): the sample config imported
    as ``recpipe config import`` writes it, two days prepared, 60 steps trained, exported."""
    from features.prepare import prepare_day
    from trainer.loop import Trainer, TrainJob
    from trainer.scoring import load_model
    from trainer.serving import export_saved_model

    var = tmp_path_factory.mktemp("var")
    raw = var / "raw"
    rng = np.random.default_rng(7)
    for ds in DAYS:
        part = raw / f"ds={ds}"
        part.mkdir(parents=True)
        (part / "part-00000.tsv").write_text("".join("\t".join(r) + "\n" for r in _day(rng, 3000)))
        (part / "_SUCCESS").write_text("")
    data = import_config(SAMPLE.read_text(), str(SAMPLE))
    data |= {
        "model_dir": str(var / "model"),
        "raw_input_path": str(raw),
        "train_input_path": str(var / "features"),
    }
    data["train_config"]["num_steps"] = 60
    config = validate(PipelineConfig, data, str(SAMPLE))
    for ds in DAYS:
        prepare_day(spark, config, ds)
    Trainer(TrainJob(config=config, model_dir=var / "model", train_days=DAYS)).train()
    model, _ = load_model(config, var / "model")
    version = export_saved_model(config, model, var / "model", var / "export")
    # the same model behind EasyRec's single placeholder (export_config.multi_placeholder: false)
    joined = config.model_copy(
        update={"export_config": config.export_config.model_copy(update={"multi_placeholder": False})}
    )
    export_saved_model(joined, model, var / "model", var / "export_joined")
    return version, raw, var


def _signature_scores(version: Path, rows: list[list[str]]) -> np.ndarray:
    """The SavedModel's own ``probability`` on ``rows``, its inputs built by hand as the config
    says: blanks of i1 and c2 take default_val "0", a blank i2 is missing (NaN)."""
    fn = tf.saved_model.load(str(version)).signatures["serving_default"]
    cols = dict(zip(COLUMNS, map(list, zip(*rows, strict=True)), strict=True))
    request = {
        "i1": tf.constant([float(v or 0) for v in cols["i1"]], tf.float64),
        "i2": tf.constant([float(v) if v else np.nan for v in cols["i2"]], tf.float64),
        "c1": tf.constant(cols["c1"]),
        "c2": tf.constant([int(v or 0) for v in cols["c2"]], tf.int64),
        "c3": tf.constant(cols["c3"]),
    }
    return fn(**request)["probability"].numpy()


def _run(var: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**__import__("os").environ, "RECPIPE_VAR_DIR": str(var)}
    return subprocess.run([*RECPIPE, "predict", *args], capture_output=True, text=True, env=env, timeout=300)


def test_a_day_is_scored_as_the_saved_model_scores_it(exported):
    version, raw, var = exported
    day = raw / f"ds={DAYS[1]}"
    out = var / "scores" / f"ds={DAYS[1]}"
    done = _run(var, "--input_path", str(day), "--output_path", str(out),
                "--saved_model_dir", str(version.parent), "--batch_size", "700")  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rows"] == 3000 and result["saved_model"] == str(version)  # the newest version
    assert result["columns"] == [*COLUMNS, "probs", "logits"]
    assert sorted(p.name for p in out.iterdir()) == ["_SUCCESS", "_recpipe_output.json", "part-00000.csv"]
    # EasyRec's CSV output: no header, \u0001 between fields, the reserved columns as they came
    lines = (out / "part-00000.csv").read_text().splitlines()
    rows = [line.split("\t") for line in (day / "part-00000.tsv").read_text().splitlines()]
    assert len(lines) == 3000
    fields = [line.split("\x01") for line in lines]
    assert [f[:6] for f in fields] == [[c.strip('"') for c in r] for r in rows]
    probs = np.array([float(f[6]) for f in fields])
    logits = np.array([float(f[7]) for f in fields])
    np.testing.assert_allclose(probs, _signature_scores(version, rows), atol=1e-6)
    np.testing.assert_allclose(probs, 1 / (1 + np.exp(-logits)), atol=1e-6)
    assert 0.05 < probs.std() and 0.2 < probs.mean() < 0.8  # it learned something


def test_parquet_on_spark_scores_as_one_process(exported, spark, tmp_path):
    from predict.local import PredictOptions, predict_files
    from predict.model import ScoringModel
    from predict.spark import predict_on_spark

    version, raw, var = exported
    table = pacsv.read_csv(
        raw / f"ds={DAYS[0]}" / "part-00000.tsv",
        read_options=pacsv.ReadOptions(column_names=COLUMNS),
        parse_options=pacsv.ParseOptions(delimiter="\t"),
        convert_options=pacsv.ConvertOptions(column_types={"c1": pa.string(), "c3": pa.string()}),
    )
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(table.slice(0, 1700), source / "a.parquet")
    pq.write_table(table.slice(1700), source / "b.parquet")
    options = PredictOptions(reserved_cols="label,c1", output_cols="probs float", batch_size=512)
    local = predict_files(ScoringModel(version), source, tmp_path / "local", options)
    spread = predict_on_spark(spark, version, source, tmp_path / "spark", options)
    assert local["rows"] == spread["rows"] == 3000 and local["columns"] == spread["columns"] == [
        "label",
        "c1",
        "probs",
    ]
    one = pq.read_table(tmp_path / "local").to_pandas()
    many = pq.read_table(tmp_path / "spark").to_pandas()
    assert one["probs"].dtype == np.float32 and (tmp_path / "spark" / "_SUCCESS").exists()
    merged = one.assign(n=range(3000)).sort_values(["c1", "label", "probs"]).reset_index(drop=True)
    other = many.sort_values(["c1", "label", "probs"]).reset_index(drop=True)
    np.testing.assert_allclose(merged["probs"], other["probs"], atol=1e-6)
    assert list(merged["c1"]) == list(other["c1"])


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ("drop_c2", "no column 'c2', which the model takes"),
        ("bad_i2", "row 3: column 'i2': 'abc' is not a double value"),
        ("outside", "--input_path='/etc' resolves to /etc, outside the roots"),
        ("reserved", "--reserved_cols: the input has no column 'user'"),
    ],
)
def test_bad_input_is_one_line_and_leaves_the_output_as_it_was(exported, edit, named):
    version, raw, var = exported
    rows = [
        line.split("\t") for line in (raw / f"ds={DAYS[0]}" / "part-00000.tsv").read_text().splitlines()[:5]
    ]
    day = var / "bad" / edit
    day.mkdir(parents=True)
    header, extra = list(COLUMNS), []
    if edit == "drop_c2":
        header, rows = [c for c in COLUMNS if c != "c2"], [r[:4] + r[5:] for r in rows]
    if edit == "bad_i2":
        rows[2][2] = "abc"
    if edit == "reserved":
        extra = ["--reserved_cols", "label,user"]
    (day / "part-0.tsv").write_text("\t".join(header) + "\n" + "".join("\t".join(r) + "\n" for r in rows))
    out = var / "bad" / f"{edit}-out"
    out.mkdir()
    (out / "kept").write_text("an earlier run's output")
    from recpipe.outputs import MARKER, marker

    (out / MARKER).write_text(json.dumps(marker("recpipe predict", [day])))  # this command's own
    where = "/etc" if edit == "outside" else str(day)
    done = _run(
        var,
        "--input_path",
        where,
        "--output_path",
        str(out),
        "--saved_model_dir",
        str(version),
        "--with_header",
        *extra,
    )
    assert done.returncode == 2 and named in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["_recpipe_output.json", "kept"] and not any(
        p.name.startswith(".tmp") for p in out.parent.iterdir()
    )


def test_the_registered_champion_scores(exported, tmp_path):
    from mlflow import MlflowClient

    version, raw, var = exported
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("criteo")
    registered = client.create_model_version("criteo", str(version), tags={"export_path": str(version)})
    client.set_registered_model_alias("criteo", "champion", registered.version)
    out = var / "by_alias"
    day = str(raw / f"ds={DAYS[1]}")
    done = _run(var, "--input_path", day, "--output_path", str(out), "--model_name", "criteo",
                "--tracking_uri", uri, "--output_format", "parquet", "--reserved_cols", "")  # fmt: skip
    assert done.returncode == 0, done.stderr
    scores = pq.read_table(out)
    assert scores.column_names == ["probs", "logits"] and scores.num_rows == 3000
    missing = _run(var, "--input_path", day, "--output_path", str(out), "--model_name", "nope",
                   "--tracking_uri", uri)  # fmt: skip
    assert missing.returncode == 1 and "--model_name=nope --alias=champion" in missing.stderr


def test_one_joined_input_scores_as_one_input_per_column(exported):
    """EasyRec's multi_placeholder: false: the signature takes one string a row, the fields
    joined by data_config.separator; predict joins the columns, and the scores do not move."""
    version, raw, var = exported
    joined = next((var / "export_joined").iterdir())
    fn = tf.saved_model.load(str(joined)).signatures["serving_default"]
    assert list(fn.structured_input_signature[1]) == ["features"]
    day = raw / f"ds={DAYS[1]}"
    rows = [line.split("\t") for line in (day / "part-00000.tsv").read_text().splitlines()]
    # the label left out; blank i1 and c2 take default_val "0", a blank i2 is missing
    mine = fn(features=tf.constant(["\t".join(r[1:]) for r in rows]))["probability"].numpy()
    np.testing.assert_allclose(mine, _signature_scores(version, rows), atol=1e-6)
    out = var / "scores_joined"
    done = _run(var, "--input_path", str(day), "--output_path", str(out), "--saved_model_dir", str(joined),
                "--output_format", "parquet")  # fmt: skip
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(pq.read_table(out).column("probs").to_numpy(), mine, atol=1e-6)


def test_the_import_is_the_hand_written_config_and_trains_to_the_same_scores(exported):
    """The round trip: EasyRec's file imported is, field by field with recpipe's defaults
    filled, the YAML a recpipe user writes for the same model; trained on the same days for the
    same steps, the hand-written config's export scores the day as the imported one's does."""
    from recpipe.config.loader import load_pipeline_config
    from trainer.loop import Trainer, TrainJob
    from trainer.scoring import load_model
    from trainer.serving import export_saved_model

    version, raw, var = exported
    paths = {
        "model_dir": str(var / "model_hand"),
        "raw_input_path": str(raw),
        "train_input_path": str(var / "features"),
    }
    imported = validate(PipelineConfig, import_config(SAMPLE.read_text(), str(SAMPLE)) | paths, str(SAMPLE))
    hand = load_pipeline_config(SAMPLE.with_suffix(".yaml"), paths)
    assert imported.model_dump() == hand.model_dump()
    config = load_pipeline_config(SAMPLE.with_suffix(".yaml"), {**paths, "train_config.num_steps": 60})
    Trainer(TrainJob(config=config, model_dir=var / "model_hand", train_days=DAYS)).train()
    model, _ = load_model(config, var / "model_hand")
    mine = export_saved_model(config, model, var / "model_hand", var / "export_hand")
    rows = [line.split("\t") for line in (raw / f"ds={DAYS[1]}" / "part-00000.tsv").read_text().splitlines()]
    np.testing.assert_allclose(_signature_scores(mine, rows), _signature_scores(version, rows), atol=1e-5)


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: (size, mtime in ns), to prove a refused command left it alone."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_output_is_a_new_directory_or_the_commands_own_earlier_output(exported):
    """``--output_path`` may not be a data root, the input, inside it or holding it, nor a
    directory another command (or this one from another input) wrote: each is refused with exit
    2 in one line, every file under the var dir untouched; a re-run replaces its own output."""
    version, raw, var = exported
    day, other = raw / f"ds={DAYS[1]}", raw / f"ds={DAYS[0]}"
    model = ["--saved_model_dir", str(version)]
    before = _tree(var)
    for target, why in (
        (var, "a data root"),
        (day, "holds the command's input"),
        (day / "scores", "lies inside the command's input"),
        (raw, "holds the command's input"),
        (other, "did not write"),
        (var / "model", "did not write"),
    ):
        done = _run(var, "--input_path", str(day), "--output_path", str(target), *model)
        assert done.returncode == 2 and why in done.stderr, (target, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert _tree(var) == before
    out = var / "owned" / f"ds={DAYS[1]}"
    for _ in range(2):  # a re-run replaces its own earlier output
        done = _run(var, "--input_path", str(day), "--output_path", str(out), *model)
        assert done.returncode == 0, done.stderr
        assert json.loads((out / "_recpipe_output.json").read_text())["inputs"] == [str(day)]
    scored = _tree(out)
    done = _run(var, "--input_path", str(other), "--output_path", str(out), *model)
    assert done.returncode == 2 and "not by recpipe predict from" in done.stderr, done.stderr
    assert _tree(out) == scored and _tree(raw) == {k: v for k, v in before.items() if k.startswith(str(raw))}


def test_blank_lines_and_empty_part_files_are_no_rows(exported):
    """A CSV ending in blank lines and an empty part file: scored, and counted as the rows
    they hold (the DAG's check compares this count with the job's)."""
    from predict.files import count_rows

    version, raw, var = exported
    lines = (raw / f"ds={DAYS[0]}" / "part-00000.tsv").read_text().splitlines()[:40]
    day = var / "blank" / "ds=2024-01-03"
    day.mkdir(parents=True)
    (day / "part-00000.tsv").write_text("\n".join(lines) + "\n\n\n")
    (day / "part-00001.tsv").write_text("")
    assert count_rows(day) == 40
    out = var / "blank" / "scores"
    done = _run(var, "--input_path", str(day), "--output_path", str(out), "--saved_model_dir", str(version))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["rows"] == 40 == count_rows(out)
