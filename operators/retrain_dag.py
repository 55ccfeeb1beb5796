"""The factory of the tasks the retrain DAGs share (``dags/``), made from one retrain config
(``recpipe.config.retrain``): each task gets its timeout by task id, the config's sections
whole (``gate``, ``sensor``) and the arguments every recpipe operator takes. A DAG file then
holds only what is its own: the schedule, its templates and the order of its tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from operators.evaluate import EvalOperator
from operators.export import ExportOperator, export_asset
from operators.feature_job import feature_job, raw_partition_sensor
from operators.notify import on_decision, on_failure
from operators.predict import BatchPredictOperator
from operators.register import RegisterModelOperator
from operators.retention import RetentionOperator
from operators.tracking import fail_parent_run
from operators.train import DistributedTrainOperator
from recpipe.config.retrain import RetrainConfig
from recpipe.layout import CHAMPION_EVAL_RESULT, SUCCESS, partition_text

# a run's overrides: the retrain config's, then the run's (Params / trigger conf); rendered
# natively as a dict. spark-submit takes them as one argument of JSON text (the "=" form keeps
# the native renderer from turning the text back into a dict)
EDITS = "{{ retrain.with_run_edits(params.edit_config_json) }}"
EDITS_ARG = "--edit_config_json={{ retrain.with_run_edits(params.edit_config_json) | tojson }}"


def xcom(task_id: str, key: str | None = None) -> str:
    """The template of task ``task_id``'s XCom (its return value), or of its ``key``,
    rendered natively: ``xcom("export", "export")`` is
    ``{{ ti.xcom_pull(task_ids='export')['export'] }}``."""
    pulled = f"ti.xcom_pull(task_ids='{task_id}')" + (f"['{key}']" if key else "")
    return "{{ " + pulled + " }}"


def _midnight(d, tz: str) -> datetime:
    import pendulum

    return pendulum.datetime(d.year, d.month, d.day, tz=tz)


@dataclass(frozen=True)
class TaskDefaults:
    """What every recpipe operator of one DAG is given (``common``) and, for the tasks that
    run a job on the cluster, the cluster config and the model's pool slots besides (``job``).

    Attributes:
        pipeline_config_path: the EasyRec pipeline config (templated).
        experiment: the MLflow experiment; mlflow_conn_id: its Airflow connection.
        cluster_config_path: the cluster config of job tasks (templated).
        pass_minutes: the DAG's pass length in minutes; None: a day a run.
        pool, pool_slots: the Airflow pool a job task takes slots of (``retrain.pool``);
            None: the default pool.
        edit_config_json: the run's overrides, a template (``EDITS``).
    """

    pipeline_config_path: str
    experiment: str
    mlflow_conn_id: str
    cluster_config_path: str
    pass_minutes: int | None = None
    pool: str | None = None
    pool_slots: int = 1
    edit_config_json: str = EDITS

    @classmethod
    def of(
        cls,
        retrain: RetrainConfig,
        pipeline_config_path: str | None = None,
        cluster_config_path: str | None = None,
        pass_minutes: int | None = None,
    ) -> TaskDefaults:
        """The defaults of ``retrain``'s DAG; a path given replaces the config's."""
        return cls(
            pipeline_config_path=pipeline_config_path or retrain.pipeline_config_path,
            experiment=retrain.experiment,
            mlflow_conn_id=retrain.tracking.mlflow_conn_id,
            cluster_config_path=cluster_config_path or retrain.cluster_config_path,
            pass_minutes=pass_minutes,
            pool=retrain.pool,
            pool_slots=retrain.pool_slots,
        )

    def common(self) -> dict:
        """Keyword arguments of every recpipe operator."""
        return {
            "pipeline_config_path": self.pipeline_config_path,
            "edit_config_json": self.edit_config_json,
            "experiment": self.experiment,
            "mlflow_conn_id": self.mlflow_conn_id,
            "pass_minutes": self.pass_minutes,
        }

    def job(self) -> dict:
        """``common`` and the cluster config, and the pool slots when a pool is set."""
        slots = {"pool": self.pool, "pool_slots": self.pool_slots} if self.pool else {}
        return {**self.common(), "cluster_config_path": self.cluster_config_path, **slots}


class RetrainTasks:
    """Tasks of one retrain config's DAG.

    Args:
        home: the project root (``operators.paths.project_home``).
        retrain: the DAG's retrain config.
        pipeline_config_path, cluster_config_path: what the tasks pass on (templated; default:
            the retrain config's).
        pass_minutes: the DAG runs a pass every this many minutes (its MLflow runs are named
            by day and pass); None: a day a run.

    Attributes:
        runs: ``<runs_dir>/<model_name>``, where model dirs live.
        exports: ``<export_dir>/<model_name>``.
        defaults: the arguments of every task (``TaskDefaults``).
    """

    def __init__(
        self,
        home: Path,
        retrain: RetrainConfig,
        pipeline_config_path: str | None = None,
        cluster_config_path: str | None = None,
        pass_minutes: int | None = None,
    ):
        self.home, self.retrain = home, retrain
        self.runs = f"{retrain.runs_dir}/{retrain.model_name}"
        self.exports = f"{retrain.export_dir}/{retrain.model_name}"
        self.defaults = TaskDefaults.of(retrain, pipeline_config_path, cluster_config_path, pass_minutes)

    def dag(self, dag_id: str, *, description: str, schedule, params: dict | None = None, **kwargs) -> DAG:
        """The DAG: native rendering (Params arrive typed), the retrain config as the macro
        ``retrain``, failed tasks failing the parent MLflow run, retries from ``tracking``,
        owner and priority weight from the config, and the Params ``full_retrain`` and
        ``edit_config_json`` (``params`` adds or replaces). A scheduled DAG starts at
        ``start_date``'s midnight in ``timezone`` (its cron times are that zone's)."""
        retrain = self.retrain
        tracking = retrain.tracking
        defaults = {
            "owner": retrain.owner,
            "priority_weight": retrain.priority_weight,
            "on_failure_callback": [
                fail_parent_run(retrain.experiment, tracking.mlflow_conn_id, self.defaults.pass_minutes),
                *on_failure(retrain.notifications),
            ],
        }
        if schedule is not None:
            defaults |= {
                "retries": tracking.retries,
                "retry_delay": timedelta(seconds=tracking.retry_delay_s),
            }
            kwargs.setdefault("start_date", _midnight(retrain.start_date, retrain.timezone))
            end = retrain.end_date
            kwargs.setdefault("end_date", _midnight(end, retrain.timezone) if end else None)
            kwargs.setdefault("catchup", retrain.catchup)
        return DAG(
            dag_id=dag_id,
            description=description,
            schedule=schedule,
            render_template_as_native_obj=True,
            default_args=defaults,
            params={
                "full_retrain": Param(
                    False, type="boolean", description="train from scratch, not from the last model"
                ),
                "edit_config_json": Param(
                    {},
                    type="object",
                    description="EasyRec overrides (dotted path -> value) on top of the retrain config's",
                ),
                **(params or {}),
            },
            user_defined_macros={"retrain": self.retrain},
            **{
                "max_active_runs": retrain.max_active_runs,
                "tags": ["recpipe", retrain.model_name, *retrain.tags],
                **kwargs,
            },
        )

    def _timeout(self, task_id: str) -> dict:
        return {"task_id": task_id, "execution_timeout": self.retrain.timeouts.of(task_id)}

    def _task(self, operator, task_id: str, defaults: dict, fields: dict, kwargs: dict):
        """``operator`` with ``task_id``'s timeout, then ``fields``, ``defaults`` and the
        caller's ``kwargs``, each replacing the one before."""
        return operator(**{**self._timeout(task_id), **fields, **defaults, **kwargs})

    def wait_for_raw(self, task_id: str, raw_input_path: str, hh: str | None = None):
        """A ``RawPartitionSensor`` on the ``_SUCCESS`` of the run's raw day (or, with ``hh``,
        the pass it names) under ``raw_input_path``, by the config's ``sensor`` section."""
        marker = f"{partition_text(raw_input_path, '{{ ds }}', hh)}/{SUCCESS}"
        return raw_partition_sensor(task_id, marker, self.retrain)

    def prepare(self, ds: str, name: str):
        """``prepare_features``: the Spark job of ``ds`` (templated), with the run's overrides."""
        return feature_job(self.home, self.retrain, ds, EDITS_ARG, name)

    def train(self, model_dir: str, **kwargs) -> DistributedTrainOperator:
        """``train``, warm-started from ``runs`` (the champion's model dir) unless the run
        sets ``full_retrain``."""
        fields = {
            "model_dir": model_dir,
            "warm_start_root": self.runs,
            "model_name": self.retrain.model_name,
            "alias": self.retrain.gate.alias,
            "full_retrain": "{{ params.full_retrain }}",
        }
        return self._task(DistributedTrainOperator, "train", self.defaults.job(), fields, kwargs)

    def evaluate(self, task_id: str, model_dir: str, eval_ds: str, **kwargs) -> EvalOperator:
        """An evaluation job of ``model_dir`` on ``eval_ds``."""
        fields = {"model_dir": model_dir, "eval_ds": eval_ds}
        return self._task(EvalOperator, task_id, self.defaults.job(), fields, kwargs)

    def evaluate_champion(self, model_dir: str, eval_ds: str, **kwargs) -> EvalOperator:
        """``evaluate_champion``: the champion (alias ``gate.alias``) on the candidate's rows."""
        return self.evaluate(
            "evaluate_champion",
            model_dir,
            eval_ds,
            champion_of=self.retrain.model_name,
            alias=self.retrain.gate.alias,
            result_name=CHAMPION_EVAL_RESULT,
            step="evaluate_champion",
            **kwargs,
        )

    def export(self, model_dir: str, task_id: str = "export", **kwargs) -> ExportOperator:
        """A SavedModel export of ``model_dir`` under ``exports``, an outlet of the model's asset."""
        fields = {
            "model_dir": model_dir,
            "export_dir": self.exports,
            "outlets": [export_asset(self.retrain.model_name)],
        }
        return self._task(ExportOperator, task_id, self.defaults.job(), fields, kwargs)

    def register(
        self, task_id: str = "register_and_gate", gate: dict | None = None, **kwargs
    ) -> RegisterModelOperator:
        """Register the export and gate it by the config's ``gate`` section (``gate``: fields
        to replace)."""
        fields = {
            "model_name": self.retrain.model_name,
            "gate": self.retrain.gate.model_copy(update=gate or {}),
            "on_success_callback": on_decision(self.retrain.notifications) or None,
        }
        return self._task(RegisterModelOperator, task_id, self.defaults.common(), fields, kwargs)

    def approval(self, register: RegisterModelOperator):
        """With ``gate.approval: required``: after ``register``, ``needs_approval`` (a short
        circuit: only a promotion the gate decided waits), ``approve_promotion`` (Airflow's
        Human-in-the-loop task) and ``apply_approval``; returns the last, or None without
        approval. Whatever comes after must run on ``none_failed``."""
        from airflow.providers.standard.operators.python import ShortCircuitOperator

        from operators.approval import ApplyApprovalOperator, approval_task, needs_approval

        gate = self.retrain.gate
        if gate.approval != "required":
            return None
        needs = ShortCircuitOperator(
            **self._timeout("needs_approval"),
            python_callable=needs_approval,
            op_args=[xcom(register.task_id)],
        )
        approve = approval_task(gate.approval_timeout_s)
        apply = ApplyApprovalOperator(
            **self._timeout("apply_approval"),
            model_name=self.retrain.model_name,
            alias=gate.alias,
            **self.defaults.common(),
        )
        register >> needs >> approve >> apply
        return apply

    def batch_predict(self, model_dir: str, **kwargs) -> BatchPredictOperator | None:
        """``batch_predict``: the config's ``batch_predict`` partition scored by the version
        holding ``gate.alias`` when it runs; None without that section."""
        if self.retrain.batch_predict is None:
            return None
        fields = {
            "model_name": self.retrain.model_name,
            "alias": self.retrain.gate.alias,
            "batch_predict": self.retrain.batch_predict,
            "model_dir": model_dir,
        }
        return self._task(BatchPredictOperator, "batch_predict", self.defaults.job(), fields, kwargs)

    def retention(self, **kwargs) -> RetentionOperator:
        """``retention``: model dirs older than ``retention_days`` and SavedModel versions
        beyond ``export_config.exports_to_keep``, never the champion's nor those of the
        ``retention_champions`` champions before it."""
        fields = {
            "runs_root": self.runs,
            "export_root": self.exports,
            "keep_days": self.retrain.retention_days,
            "keep_champions": self.retrain.retention_champions,
            "model_name": self.retrain.model_name,
            "alias": self.retrain.gate.alias,
        }
        return self._task(RetentionOperator, "retention", self.defaults.common(), fields, kwargs)
