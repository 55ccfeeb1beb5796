"""The DAG files parse in a fresh interpreter without TensorFlow or Spark, one DAG per retrain
config of the folder (a broken one an import error that names it, the others unharmed), wire the
tasks in order, and the manual DAG's Params validate a trigger's conf (JSON schema, path
confinement)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.dags.conftest import MODEL
from tests.support import ROOT

PROBE = r"""
import copy, json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag()
out = {"errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": sorted(bag.dags),
       "heavy": [m for m in ("tensorflow", "pyspark", "mlflow", "torch", "scipy") if m in sys.modules]}
daily = bag.dags["recpipe_daily_retrain"]
out["daily_upstream"] = {t: sorted(daily.task_dict[t].upstream_task_ids) for t in daily.task_dict}
out["schedule"] = daily.timetable.expression
stream = bag.dags["recpipe_stream_retrain"]
out["stream_upstream"] = {t: sorted(stream.task_dict[t].upstream_task_ids) for t in stream.task_dict}
out["stream_schedule"] = [stream.timetable.expression, stream.max_active_runs]
out["max_active_runs"] = daily.max_active_runs
out["timeouts"] = {
    d.dag_id: {t.task_id: t.execution_timeout and t.execution_timeout.total_seconds() for t in d.tasks}
    for d in (daily, bag.dags["recpipe_train"], stream)
}
move = bag.dags["recpipe_champion"].task_dict["move_champion"]
out["champion_timeout"] = move.execution_timeout.total_seconds()
out["champion_models"] = bag.dags["recpipe_champion"].params.get_param("model_name").schema["enum"]
out["champion_preselected"] = bag.dags["recpipe_champion"].params.get_param("model_name").has_value
din = bag.dags["movielens_din_daily"]
out["din"] = {
    "schedule": din.timetable.expression,
    "timezone": getattr(din.timetable.timezone, "name", str(din.timetable.timezone)),
    "tags": sorted(din.tags), "owner": din.owner,
    "pools": sorted({(t.task_id, t.pool, t.pool_slots, t.priority_weight) for t in din.tasks}),
    "notify": [
        (type(cb).__name__, sorted(cb.send_on), cb.to)
        for cb in din.task_dict["register_and_gate"].on_success_callback or []
    ],
}
out["params"] = {}
manual = bag.dags["recpipe_train"]
for name, conf in json.loads(sys.argv[1]).items():
    params = copy.deepcopy(manual.params)
    try:
        params.update(conf)
        params.validate()
        out["params"][name] = "ok"
    except Exception as err:
        out["params"][name] = f"{type(err).__name__}: {err}"
print("PROBE" + json.dumps(out))
"""

CONFS = {
    "defaults": {},
    "good": {
        "train_ds": "1997-09-20:1997-09-26",
        "eval_ds": "1997-09-27",
        "num_workers": 1,
        "edit_config_json": {"train_config.num_steps": 10},
        "full_retrain": True,
    },
    "escape": {"pipeline_config_path": "conf/../../etc/passwd.yaml"},
    "absolute": {"pipeline_config_path": "/etc/x.yaml"},
    "bad_date": {"train_ds": "1997-9-20"},
    "bad_strategy": {"train_distribute": "NoSuchStrategy"},
    "zero_workers": {"num_workers": 0},
    "edits_not_object": {"edit_config_json": "train_config.num_steps=1"},
}


@pytest.fixture(scope="module")
def probe(stack, tmp_path_factory):
    """The DagBag of a folder of four retrain configs: the stack's daily one, the shipped
    stream one, a second daily model (DIN) on its own cron, time zone and pool, and a broken
    one (a gate tolerance below 0)."""
    folder = tmp_path_factory.mktemp("retrain_configs")
    shutil.copy(stack["base"] / "retrain.yaml", folder / "daily.yaml")
    shutil.copy(ROOT / "conf/retrain/movielens_stream.yaml", folder / "stream.yaml")
    din = yaml.safe_load((stack["base"] / "retrain.yaml").read_text())
    din.pop("dag_id")
    din.update(
        pipeline_config_path="conf/movielens_din.yaml",
        model_name="movielens_din",
        schedule="30 2 * * *",
        timezone="Asia/Shanghai",
        tags=["din"],
        owner="ranking-team",
        pool="training",
        pool_slots=2,
        priority_weight=5,
        notifications={"to": ["ranking@example.com"], "on": ["promotion"]},
    )
    (folder / "din.yaml").write_text(yaml.safe_dump(din))
    broken = {**din, "model_name": "broken", "gate": {"tolerance": -1}}
    (folder / "broken.yaml").write_text(yaml.safe_dump(broken))
    # a day no calendar has, unquoted: YAML's date constructor raises, not pydantic
    text = yaml.safe_dump({**din, "model_name": "bad_day", "dag_id": "bad_day"})
    (folder / "impossible_day.yaml").write_text(text.replace("start_date: ", "start_date: 1997-02-30 #"))
    # a second DAG of an existing model (its own dag_id) would share its dirs, registry and keys:
    # every config of that model fails, the duplicate sorting first in name order or last
    shared = {**din, "model_name": "shared_model", "tags": ["shared"]}
    for name in ("aa_experiment", "shared", "zz_same_model"):
        (folder / f"{name}.yaml").write_text(yaml.safe_dump({**shared, "dag_id": f"{name}_daily"}))
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(CONFS)],
        env={**stack["env"], "RECPIPE_RETRAIN_CONFIGS": str(folder)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = [x for x in proc.stdout.splitlines() if x.startswith("PROBE")]
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[0][5:])


def test_dags_import_without_heavy_imports_and_only_the_broken_config_fails(probe):
    assert [name.rsplit("/", 1)[-1] for name in probe["errors"]] == ["recpipe_retrain_configs.py"]
    assert probe["dags"] == [
        "movielens_din_daily",
        "recpipe_champion",
        "recpipe_daily_retrain",
        "recpipe_stream_retrain",
        "recpipe_train",
    ]
    assert probe["heavy"] == []


def test_each_config_is_its_own_dag_with_its_schedule_zone_and_pool(probe):
    din = probe["din"]
    assert din["schedule"] == "30 2 * * *" and din["timezone"] == "Asia/Shanghai"
    assert din["tags"] == ["din", "movielens_din", "recpipe"] and din["owner"] == "ranking-team"
    pools = {task: (pool, slots, weight) for task, pool, slots, weight in din["pools"]}
    # the job tasks share the cluster's training slots; the others take the default pool
    for task in ("evaluate_champion", "train", "evaluate", "export"):
        assert pools[task] == ("training", 2, 5), (task, pools[task])
    assert pools["validate_features"] == ("default_pool", 1, 5)
    # promotions only, to the config's recipients (a rejection sends nothing)
    assert din["notify"] == [["DecisionNotifier", ["promotion"], ["ranking@example.com"]]]


def test_a_broken_config_is_an_import_error_that_names_it_and_its_field(probe):
    # its own file's error: Airflow schedules no DAG of a file with an import error, and the
    # models whose configs load are in dags/recpipe_retrain.py
    (error,) = probe["errors"].values()
    assert "broken.yaml" in error and "gate.tolerance" in error
    assert "impossible_day.yaml:line " in error and "1997-02-30" in error
    for name in ("aa_experiment", "shared", "zz_same_model"):
        others = [o for o in ("aa_experiment", "shared", "zz_same_model") if o != name]
        mine = next(line for line in error.splitlines() if f"{name}.yaml: model_name 'shared_model'" in line)
        assert all(f"{o}.yaml" in mine for o in others), mine
    assert "\ndin.yaml" not in error and "daily.yaml" not in error
    # the champion's DAG moves the models that load, each once, within its timeout
    assert probe["champion_models"] == ["movielens_din", "movielens_stream", MODEL]
    assert probe["champion_preselected"] is False  # the form asks which model; none is chosen for you
    assert 0 < probe["champion_timeout"] <= 3600


def test_daily_dag_wiring(probe):
    up = probe["daily_upstream"]
    chain = [
        "wait_for_raw",
        "prepare_features",
        "validate_features",
        "evaluate_champion",
        "train",
        "evaluate",
        "export",
        "register_and_gate",
        "retention",
    ]
    for before, after in zip(chain, chain[1:], strict=False):
        assert up[after] == [before]
    assert up["batch_predict"] == ["register_and_gate"]  # the stack's config names candidates
    assert probe["max_active_runs"] == 1
    assert probe["schedule"] == "0 0 * * *"  # @daily


def test_manual_dag_params_validate_the_trigger_conf(probe):
    params = probe["params"]
    assert params["defaults"] == "ok" and params["good"] == "ok"
    for name in ("escape", "absolute", "bad_date", "bad_strategy", "zero_workers", "edits_not_object"):
        assert params[name].startswith("ParamValidationError"), (name, params[name])
    assert "pipeline_config_path" in params["escape"]


def test_an_invalid_trigger_is_rejected_by_the_cli(stack):
    from tests.dags.conftest import airflow

    proc = airflow(
        stack["env"], "dags", "test", "recpipe_train", "-c", json.dumps(CONFS["escape"]), check=False
    )
    assert proc.returncode != 0
    assert "pipeline_config_path" in proc.stdout + proc.stderr


SENSOR = r"""
from operators.sensors import RawPartitionSensor
sensor = RawPartitionSensor(task_id="wait", filepath=__import__("sys").argv[1], mode="poke", timeout=1,
                            poke_interval=0.2)
try:
    sensor.execute({})
except Exception as err:
    print("RAISED", type(err).__name__, err)
"""


def test_sensor_timeout_names_the_missing_partition(stack, tmp_path):
    missing = str(tmp_path / "events" / "ds=1999-01-01" / "_SUCCESS")
    proc = subprocess.run(
        [sys.executable, "-c", SENSOR, missing], env=stack["env"], capture_output=True, text=True, timeout=120
    )
    expected = f"RAISED AirflowSensorTimeout raw partition not complete after 1 s: {missing} is missing"
    assert expected in proc.stdout


def test_every_task_of_both_dags_has_its_timeout_from_the_retrain_config(probe):
    # the stack's retrain config: train 3600 s, everything else default_s 1800 s
    for dag_id, timeouts in probe["timeouts"].items():
        assert timeouts and all(t is not None for t in timeouts.values()), (dag_id, timeouts)
        if dag_id == "recpipe_stream_retrain":  # its own config: every task bounded
            assert timeouts["has_rows"] > 0 and timeouts["closes_day"] > 0
            continue
        assert timeouts["train"] == 3600
        assert {t for k, t in timeouts.items() if k != "train"} == {1800}, (dag_id, timeouts)


def test_the_sensor_as_the_daily_dag_runs_it_names_the_missing_partition(stack):
    # reschedule mode, poke every 1 s, 3 s timeout (the stack's retrain config)
    from tests.dags.conftest import airflow

    proc = airflow(stack["env"], "dags", "test", "recpipe_daily_retrain", "1999-01-01", check=False)
    out = proc.stdout + proc.stderr
    assert "raw partition not complete after 3 s:" in out and "ds=1999-01-01/_SUCCESS is missing" in out
    assert "prepare_features" not in [line.split()[-1] for line in out.splitlines() if "success" in line]


def test_stream_dag_wiring(probe):
    up = probe["stream_upstream"]
    chain = ["wait_for_pass", "prepare_features", "has_rows", "train", "export", "push"]
    close = ["closes_day", "evaluate_day", "evaluate_champion", "export_saved_model", "register_and_gate"]
    want = {task: [chain[i - 1]] if i else [] for i, task in enumerate(chain)}
    want["evaluate_pass"] = ["train"]  # reports the score the train job took before training
    want |= {task: [close[i - 1]] if i else ["evaluate_pass", "push"] for i, task in enumerate(close)}
    # retention after the pass, and after the day's close when it closes one
    want["retention"] = ["evaluate_pass", "push", "register_and_gate"]
    assert up == want
    assert probe["stream_schedule"] == ["0 * * * *", 1]


def test_a_failed_run_is_mailed_to_the_configs_recipients(stack, tmp_path):
    """``notifications`` of the retrain config: the day's sensor times out (no raw
    partition), and a real SMTP server (aiosmtpd) receives the failure, naming the task and
    the error, from the SMTP provider's notifier."""
    from aiosmtpd.controller import Controller

    from tests.dags.conftest import airflow
    from tests.support import free_port

    received = []

    class Inbox:
        async def handle_DATA(self, server, session, envelope):
            received.append(envelope)
            return "250 OK"

    retrain = yaml.safe_load((stack["base"] / "retrain.yaml").read_text())
    retrain["notifications"] = {"to": ["ml-team@example.com"], "on": ["failure"]}
    (tmp_path / "retrain.yaml").write_text(yaml.safe_dump(retrain))
    port = free_port()
    smtp = {
        "conn_type": "smtp",
        "host": "127.0.0.1",
        "port": port,
        "extra": {"disable_ssl": True, "disable_tls": True},
    }
    env = {
        **stack["env"],
        "RECPIPE_RETRAIN_CONFIGS": str(tmp_path / "retrain.yaml"),
        "AIRFLOW_CONN_SMTP_DEFAULT": json.dumps(smtp),
    }
    inbox = Controller(Inbox(), hostname="127.0.0.1", port=port)
    inbox.start()
    try:
        airflow(env, "dags", "test", "recpipe_daily_retrain", "1999-01-02", check=False)
    finally:
        inbox.stop()
    import email

    assert [m.rcpt_tos for m in received] == [["ml-team@example.com"]]
    mail = email.message_from_bytes(received[0].content)
    assert mail["Subject"] == "recpipe recpipe_daily_retrain 1999-01-02: wait_for_raw failed"
    body = "".join(p.get_payload(decode=True).decode() for p in mail.walk() if not p.is_multipart())
    assert "ds=1999-01-02/_SUCCESS is missing" in body
