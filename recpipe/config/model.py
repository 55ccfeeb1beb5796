"""``model_config``, ``eval_config`` and ``export_config`` (EasyRec names)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

# the module, not its names: recpipe.layout imports this package (ConfigError) first
from recpipe import layout
from recpipe.config.base import OneOf, Section
from recpipe.config.data import EVParams


class WideDeep(StrEnum):
    """Which part of the model a feature group feeds (EasyRec ``wide_deep``)."""

    DEEP = "DEEP"
    WIDE = "WIDE"


# EasyRec's activation names (a TensorFlow function's path or Keras' name) -> Keras' name;
# dice is DIN's own (trainer/layers/dice.py)
ACTIVATIONS = {
    "relu": "relu", "tf.nn.relu": "relu", "gelu": "gelu", "tf.nn.gelu": "gelu",
    "swish": "swish", "tf.nn.swish": "swish", "silu": "swish", "tf.nn.silu": "swish",
    "elu": "elu", "tf.nn.elu": "elu", "selu": "selu", "tf.nn.selu": "selu",
    "tanh": "tanh", "tf.nn.tanh": "tanh", "sigmoid": "sigmoid", "tf.nn.sigmoid": "sigmoid",
    "leaky_relu": "leaky_relu", "tf.nn.leaky_relu": "leaky_relu", "linear": "linear",
    "dice": "dice",
}  # fmt: skip


class DNN(Section):
    """An MLP block (EasyRec ``dnn``): ``hidden_units`` layers of ``activation``, optional
    dropout and batch norm."""

    hidden_units: list[int] = Field(default_factory=lambda: [256, 128, 64])
    """Units of each layer, input side first."""
    activation: str = "relu"
    """Each layer's activation, EasyRec's spelling: ``relu`` (``tf.nn.relu``), ``gelu``,
    ``swish``, ``elu``, ``selu``, ``tanh``, ``sigmoid``, ``leaky_relu``, ``linear``, or
    ``dice`` (DIN's data-adaptive activation, Zhou et al. 2018)."""
    dropout_ratio: float = Field(0.0, ge=0, lt=1)
    """Dropout after each layer while training (0: none)."""
    use_bn: bool = False
    """Batch normalisation before each activation."""
    dtype_policy: Literal["float32", "mixed_bfloat16"] = "float32"
    """Keras' dtype policy of its layers: ``mixed_bfloat16`` computes the matrix products in
    bfloat16 (the weights, their updates and the MLP's output stay float32): less CPU for the
    MLP where the CPU has bfloat16 instructions (AVX512_BF16, AMX; docs/benchmarks.md),
    much more where it has not, serving included."""

    @field_validator("activation")
    @classmethod
    def _known_activation(cls, value: str) -> str:
        if value not in ACTIVATIONS:
            raise ValueError(f"{value!r}: use one of {', '.join(sorted(set(ACTIVATIONS.values())))}")
        return ACTIVATIONS[value]


class ModelBlock(Section):
    """What every model class's block takes."""

    l2_regularization: float = Field(0.0, ge=0)
    """L2 weight on the model's dense kernels (its MLPs' and output layers' weights; not
    biases nor embeddings): ``l2_regularization * sum(w ** 2) / 2`` added to the loss
    (EasyRec's ``l2_regularization``)."""


class DNNModel(ModelBlock):
    """``model_config.dnn`` of the DNN model class."""

    dnn: DNN = Field(default_factory=DNN)
    """The MLP over every feature group."""


class WideAndDeepModel(ModelBlock):
    """``model_config.wide_and_deep``: the deep MLP and the wide output width."""

    dnn: DNN = Field(default_factory=DNN)
    """The deep part's MLP."""
    final_dnn: DNN | None = None
    """An MLP over ``[wide output (``wide_output_dim`` wide, the wide rows summed), the deep
    MLP's output]``, then the logit (EasyRec's ``final_dnn``); null: the logit is the deep
    part's plus the wide part's summed."""
    wide_output_dim: int = Field(1, gt=0)
    """Width of the wide part's output (its embeddings' width)."""


class DeepFMModel(ModelBlock):
    """``model_config.deepfm``: the deep MLP beside the FM term (Guo et al., 2017)."""

    dnn: DNN = Field(default_factory=DNN)
    """The deep part's MLP."""
    final_dnn: DNN | None = None
    """An MLP over ``[wide logit, FM vector (the per-dimension FM term, ``[B, D]``), the deep
    MLP's output]``, then the logit (EasyRec's ``final_dnn``); null: the logit is the sum of
    the wide, FM and deep outputs."""
    wide_output_dim: int = Field(1, gt=0)
    """Width of the wide part's output (its embeddings' width)."""


class DLRMModel(ModelBlock):
    """``model_config.dlrm``: bottom MLP (dense -> embedding width) and top MLP (Naumov et al., 2019)."""

    bot_dnn: DNN = Field(default_factory=lambda: DNN(hidden_units=[64, 16]))
    """The MLP over the dense features; its last layer is the embeddings' width."""
    top_dnn: DNN = Field(default_factory=lambda: DNN(hidden_units=[128, 64]))
    """The MLP over the pairwise dot products and the bottom MLP's output."""
    arch_interaction_itself: bool = False
    """Include each vector's dot product with itself."""


class DCNModel(ModelBlock):
    """DCN-v2: ``cross_num`` full-rank cross layers beside a DNN (Wang et al., 2021)."""

    cross_num: int = Field(3, gt=0)
    """Cross layers."""
    deep_tower: DNN = Field(default_factory=DNN)
    """The MLP beside them."""
    final_dnn: DNN | None = None
    """An MLP over both outputs concatenated (null: a linear layer)."""


class Tower(Section):
    """One ``multi_tower.towers`` entry: an MLP over the feature group ``input``."""

    input: str
    """The feature group it reads."""
    dnn: DNN = Field(default_factory=lambda: DNN(hidden_units=[64, 32]))
    """Its MLP."""


class DINTower(Section):
    """One ``multi_tower.din_towers`` entry: DIN's attention over the ``seq_att_groups`` group
    ``input``; ``dnn`` scores each history element (its last layer must have one unit)."""

    input: str
    """The ``seq_att_groups`` group it attends over."""
    dnn: DNN = Field(default_factory=lambda: DNN(hidden_units=[64, 32, 1]))
    """The MLP scoring each history element (its last layer one unit)."""


class MultiTowerModel(ModelBlock):
    """``model_config.multi_tower`` (EasyRec's MultiTower / MultiTowerDIN): a tower per feature
    group and a DIN tower per ``seq_att_groups`` group, concatenated into ``final_dnn``."""

    towers: list[Tower] = Field(min_length=1)
    """A tower per feature group."""
    din_towers: list[DINTower] = Field(default_factory=list)
    """A DIN attention tower per sequence group."""
    final_dnn: DNN = Field(default_factory=lambda: DNN(hidden_units=[64, 32]))
    """The MLP over the towers' outputs concatenated."""


def _listed(value):
    """EasyRec's repeated string fields: one name written alone is a list of one."""
    return [value] if isinstance(value, str) else value


class SeqAttMap(Section):
    """One ``seq_att_map``: the target features ``key`` (the candidate's item, say) and the
    SequenceFeatures ``hist_seq`` of the user's earlier ones. Several keys are concatenated
    into the query and their histories, element by element, into the attention's keys, so
    the keys' widths add up to the histories' (or ``allow_key_transform`` is set).

    ``aux_hist_seq`` (EasyRec's name): SequenceFeatures of the same events that have no key
    of their own (the rating the user gave each film, say). They take no part in the scores;
    the attention pools them with the same weights as the history, so the tower sees how the
    user met the earlier items most like the candidate.
    """

    key: list[str] = Field(min_length=1)
    """The target features (the candidate item); one name or a list."""
    hist_seq: list[str] = Field(min_length=1)
    """The SequenceFeatures of the user's earlier ones, of one length; one name or a list."""
    aux_hist_seq: list[str] = Field(default_factory=list)
    """SequenceFeatures of the same events pooled with the history's attention weights."""

    _keys = field_validator("key", "hist_seq", "aux_hist_seq", mode="before")(_listed)


class SeqAttGroup(Section):
    """EasyRec ``seq_att_groups`` (``SeqAttGroupConfig``), also a feature group's
    ``sequence_features``: named (key, history) pairs attended over together (DIN's target
    attention, Zhou et al., KDD 2018).

    In a feature group, each pair's pooled history (and, with ``need_key_feature``, its
    keys' embeddings) is appended to the group's inputs, as EasyRec's sequence feature
    layer does; in ``seq_att_groups`` a ``multi_tower.din_towers`` entry names it.
    """

    group_name: str
    """The group's name, as a DIN tower's ``input`` names it."""
    seq_att_map: list[SeqAttMap] = Field(min_length=1)
    """Its (key, history) pairs."""
    seq_dnn: DNN = Field(default_factory=lambda: DNN(hidden_units=[128, 64, 32, 1]))
    """The MLP scoring each history element in a feature group's attention (its last layer
    one unit); a DIN tower uses its own ``dnn``."""
    need_key_feature: bool = True
    """In a feature group: append the keys' embeddings beside the pooled history."""
    allow_key_transform: bool = False
    """Keys narrower or wider than their histories: the query is padded with zeros to the
    histories' width when they are wider (and not ``transform_dnn``), else the query and
    the histories are each projected by a dense layer to the histories' width."""
    transform_dnn: bool = False
    """With ``allow_key_transform``: project by dense layers even where padding would do."""
    allow_key_search: bool = True
    """A key may be any feature (``false``: only one of the same feature group's)."""


class FeatureGroup(Section):
    """EasyRec ``feature_groups``: named lists of features fed to one part of the model."""

    group_name: str
    """The group's name, as a tower's ``input`` names it."""
    feature_names: list[str] = Field(min_length=1)
    """Its features (``feature_config`` names)."""
    wide_deep: WideDeep = WideDeep.DEEP
    """The part of the model it feeds: ``DEEP`` or ``WIDE``."""
    sequence_features: list[SeqAttGroup] = Field(default_factory=list)
    """DIN attentions whose outputs join the group's inputs (a DEEP group's)."""


class VariationalDropoutConfig(Section):
    """EasyRec ``variational_dropout``: a learned dropout rate per deep input feature, its
    retention penalised, so that the rates rank the features (Chang et al., 2017,
    arXiv:1712.08645). One layer over the model's deep inputs (EasyRec's is per group)."""

    regularization_lambda: float = Field(0.01, ge=0)
    """Weight of the penalty ``sum(1 - p) / batch_size``."""
    embedding_wise_variational_dropout: bool = False
    """A rate per embedding dimension instead of per feature."""


class ModelClass(StrEnum):
    """EasyRec ``model_class`` names supported by recpipe."""

    DNN = "DNN"
    WideAndDeep = "WideAndDeep"
    DeepFM = "DeepFM"
    DLRM = "DLRM"
    DCN = "DCN"
    MultiTower = "MultiTower"
    MultiTowerDIN = "MultiTowerDIN"
    MMoE = "MMoE"
    ESMM = "ESMM"
    DBMTL = "DBMTL"


MULTI_TASK_BLOCK = {ModelClass.MMoE: "mmoe", ModelClass.ESMM: "esmm", ModelClass.DBMTL: "dbmtl"}
# each class's block in model_config
CLASS_BLOCK = {
    ModelClass.DNN: "dnn",
    ModelClass.WideAndDeep: "wide_and_deep",
    ModelClass.DeepFM: "deepfm",
    ModelClass.DLRM: "dlrm",
    ModelClass.DCN: "dcn",
    ModelClass.MultiTower: "multi_tower",
    ModelClass.MultiTowerDIN: "multi_tower",
    **MULTI_TASK_BLOCK,
}


class LossType(StrEnum):
    """EasyRec ``loss_type`` values (shared/reference/easyrec_train_config_and_losses.txt)."""

    CLASSIFICATION = "CLASSIFICATION"
    L2_LOSS = "L2_LOSS"
    SIGMOID_L2_LOSS = "SIGMOID_L2_LOSS"
    CROSS_ENTROPY_LOSS = "CROSS_ENTROPY_LOSS"
    PAIR_WISE_LOSS = "PAIR_WISE_LOSS"
    F1_REWEIGHTED_LOSS = "F1_REWEIGHTED_LOSS"


# losses of the batch as a whole: a row's sample weight has no place in them
BATCH_LOSSES = frozenset({LossType.PAIR_WISE_LOSS, LossType.F1_REWEIGHTED_LOSS})


class Loss(Section):
    """One ``losses`` entry: a loss type and its weight in the sum."""

    loss_type: LossType
    """The loss (EasyRec's ``loss_type`` names)."""
    weight: float = Field(1.0, ge=0)
    """Its weight in the sum."""
    f1_beta_square: float = Field(1.0, gt=0)
    """beta squared of ``F1_REWEIGHTED_LOSS``."""


class TaskTower(Section):
    """One EasyRec ``task_towers`` entry (MMoE, DBMTL; ESMM's ``ctr_tower`` / ``cvr_tower``):
    a task's tower over the shared bottom, its label, loss and metrics.

    ``label_name`` is one of ``data_config.label_fields`` (default: the field at the
    tower's position). ``label_threshold`` (recpipe's): the task's target is 1 where the
    label is at least this, else 0, so that one logged value (a rating) gives several binary
    tasks; unset, the label is the target as it is. ``metrics_set`` defaults to ``eval_config``'s."""

    tower_name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_]*$")
    """The task's name: its metrics are ``<tower_name>/auc``, its output
    ``probability_<tower_name>``."""
    label_name: str | None = None
    """Its label, one of ``data_config.label_fields`` (null: the field at the tower's position)."""
    label_threshold: float | None = None
    """Target 1 where the label is at least this, else 0 (null: the label as it is)."""
    dnn: DNN = Field(default_factory=lambda: DNN(hidden_units=[64, 32]))
    """The tower's MLP."""
    num_class: int = Field(1, ge=1, le=1)
    """Outputs of the task: 1 only (binary); another value is refused."""
    weight: float = Field(1.0, ge=0)
    """The task's weight in the summed loss."""
    loss_type: LossType = LossType.CLASSIFICATION
    """The task's loss."""
    losses: list[Loss] = Field(default_factory=list)
    """Several weighted losses summed for the task (empty: ``loss_type``)."""
    metrics_set: list[Metric] = Field(default_factory=list)
    """The task's metrics (empty: ``eval_config.metrics_set``)."""


class MMoEModel(ModelBlock):
    """``model_config.mmoe``: ``num_expert`` expert MLPs over the shared input, one softmax
    gate and tower per task (Ma et al., "Modeling Task Relationships in Multi-task Learning
    with Multi-gate Mixture-of-Experts", KDD 2018; EasyRec's ``mmoe``)."""

    expert_dnn: DNN = Field(default_factory=lambda: DNN(hidden_units=[128, 64]))
    """Each expert's MLP."""
    num_expert: int = Field(3, ge=1)
    """Experts."""
    task_towers: list[TaskTower] = Field(min_length=1)
    """A tower per task."""


class DBMTLModel(ModelBlock):
    """``model_config.dbmtl``: a shared ``bottom_dnn`` (or MMoE experts with ``num_expert``
    > 0), a tower per task, and each task's ``relation_tower_names`` feeding it their tower
    outputs through its ``relation_dnn`` (Bayesian dependencies between tasks: EasyRec's
    DBMTL, after Ma et al., "Deep Bayesian Multi-Target Learning", 2019)."""

    bottom_dnn: DNN | None = Field(default_factory=lambda: DNN(hidden_units=[128, 64]))
    """The shared bottom MLP (when ``num_expert`` is 0)."""
    expert_dnn: DNN | None = None
    """Each expert's MLP (when ``num_expert`` > 0)."""
    num_expert: int = Field(0, ge=0)
    """MMoE experts instead of the shared bottom (0: none)."""
    task_towers: list[DBMTLTaskTower] = Field(min_length=2)
    """A tower per task, at least two."""


class DBMTLTaskTower(TaskTower):
    """A DBMTL task tower: ``relation_tower_names`` (earlier towers) and ``relation_dnn``."""

    relation_tower_names: list[str] = Field(default_factory=list)
    """Earlier towers whose outputs feed this one."""
    relation_dnn: DNN = Field(default_factory=lambda: DNN(hidden_units=[32]))
    """The MLP over this tower's and those towers' outputs."""


class ESMMModel(ModelBlock):
    """``model_config.esmm``: a CTR tower and a CVR tower over shared embeddings, trained over
    the whole exposure space: the CTR task on ``ctr_tower``'s label, the CTCVR task
    (p_ctr x p_cvr) on ``cvr_tower``'s label, which must imply the first (a conversion is
    a click); p_cvr itself is never fitted on clicked rows alone (Ma et al., "Entire Space
    Multi-Task Model", SIGIR 2018; EasyRec's ``esmm``)."""

    groups: list[Tower] = Field(default_factory=list)
    """An MLP per feature group (``input``), their outputs concatenated as both towers'
    input (EasyRec's ``groups``); empty: the DEEP groups' features concatenated."""
    ctr_tower: TaskTower = Field(default_factory=lambda: TaskTower(tower_name="ctr"))
    """The click task's tower (its label: clicked)."""
    cvr_tower: TaskTower = Field(default_factory=lambda: TaskTower(tower_name="cvr"))
    """The conversion tower (its label: converted, trained as CTCVR)."""


class ModelConfig(Section):
    """EasyRec ``model_config``: the class, its feature groups, and its own block."""

    model_class: ModelClass = ModelClass.DeepFM
    """``DNN``, ``WideAndDeep``, ``DeepFM``, ``DLRM``, ``DCN``, ``MultiTower``, ``MultiTowerDIN``, ``MMoE``,
    ``ESMM`` or ``DBMTL``."""
    feature_groups: list[FeatureGroup] = Field(min_length=1)
    """Named lists of features, each fed to one part of the model."""
    dnn: DNNModel | None = None
    """The ``DNN`` class's block."""
    wide_and_deep: WideAndDeepModel | None = None
    """The ``WideAndDeep`` class's block."""
    deepfm: DeepFMModel | None = None
    """The ``DeepFM`` class's block."""
    dlrm: DLRMModel | None = None
    """The ``DLRM`` class's block."""
    dcn: DCNModel | None = None
    """The ``DCN`` class's block."""
    multi_tower: MultiTowerModel | None = None
    """The ``MultiTower`` and ``MultiTowerDIN`` classes' block."""
    mmoe: MMoEModel | None = None
    """The ``MMoE`` class's block."""
    esmm: ESMMModel | None = None
    """The ``ESMM`` class's block."""
    dbmtl: DBMTLModel | None = None
    """The ``DBMTL`` class's block."""
    seq_att_groups: list[SeqAttGroup] = Field(default_factory=list)
    """Target and history pairs DIN towers attend over."""
    embedding_regularization: float = Field(0.0, ge=0)
    """L2 weight on each embedding row a batch looks up (table updates stay sparse)."""
    loss_type: LossType = LossType.CLASSIFICATION
    """The loss of a single-task model (when ``losses`` is empty)."""
    losses: list[Loss] = Field(default_factory=list)
    """Several weighted losses summed (empty: ``loss_type``)."""
    ev_params: EVParams | None = None
    """Online tables for every id and tag feature without ``ev_params`` of its own (EasyRec's
    model-level ``ev_params``)."""
    variational_dropout: VariationalDropoutConfig | None = None
    """Learned per-feature dropout over the deep inputs (null: none)."""

    @property
    def l2_regularization(self) -> float:
        """The model class's block's ``l2_regularization`` (0 without a block)."""
        block = getattr(self, CLASS_BLOCK[self.model_class], None)
        return block.l2_regularization if block is not None else 0.0

    @model_validator(mode="after")
    def _multi_task_block(self) -> ModelConfig:
        block = MULTI_TASK_BLOCK.get(self.model_class)
        if block is None:
            return self
        if self.model_class != ModelClass.ESMM and getattr(self, block) is None:
            raise ValueError(f"model_config.{block}: model_class {self.model_class.value} needs it")
        names = [t.tower_name for t in self.tasks]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"model_config.{block}: tower_name {twice} given twice")
        if self.model_class == ModelClass.DBMTL:
            for i, tower in enumerate(self.dbmtl.task_towers):
                earlier = names[:i]
                wrong = [n for n in tower.relation_tower_names if n not in earlier]
                if wrong:
                    raise ValueError(
                        f"model_config.dbmtl.task_towers[{i}].relation_tower_names: {wrong} are not "
                        f"towers before {tower.tower_name!r} (those are {earlier})"
                    )
        return self

    @property
    def tasks(self) -> list[TaskTower]:
        """The task towers in output order (empty for a single-task model): MMoE's and
        DBMTL's ``task_towers``; ESMM's CTR task, then its CTCVR task (the ``cvr_tower``'s
        label, p_ctr x p_cvr)."""
        if self.model_class == ModelClass.ESMM:
            esmm = self.esmm or ESMMModel()
            return [esmm.ctr_tower, esmm.cvr_tower]
        block = MULTI_TASK_BLOCK.get(self.model_class)
        return list(getattr(self, block).task_towers) if block else []

    @property
    def task_names(self) -> list[str]:
        """Each task's name, as its metrics (``<name>/auc``) and outputs
        (``probability_<name>``) are keyed: the tower names; ESMM's second task is the CTCVR
        one, ``ctcvr`` (towers ``ctr`` and ``cvr``) or ``<ctr>_<cvr>``."""
        names = [t.tower_name for t in self.tasks]
        if self.model_class == ModelClass.ESMM:
            names[1] = "ctcvr" if names == ["ctr", "cvr"] else f"{names[0]}_{names[1]}"
        return names


LEGACY_NUM_THRESHOLDS = 200


class AUC(Section):
    """``auc`` metric options."""

    num_thresholds: int | None = Field(None, gt=1)
    """Refused: recpipe's AUC is exact (from the ranks of the scores), with no thresholds.
    Only 200, EasyRec's default, which earlier recpipe versions wrote into every export's
    ``pipeline.json``, is accepted (and changes nothing), so those exports still load."""

    @field_validator("num_thresholds")
    @classmethod
    def _exact(cls, value: int | None) -> int | None:
        if value is not None and value != LEGACY_NUM_THRESHOLDS:
            raise ValueError(
                "recpipe computes the exact AUC from the ranks of the scores (no histogram of "
                "thresholds, unlike tf.metrics.auc in EasyRec): remove num_thresholds"
            )
        return value


Reduction = Literal["mean", "mean_by_sample_num", "mean_by_positive_num"]


class GAUC(Section):
    """``gauc`` metric: AUC per ``uid_field`` value (groups holding both classes), reduced
    over the groups by ``reduction``."""

    uid_field: str
    """The column whose values group the rows (the user id)."""
    reduction: Reduction = "mean_by_sample_num"
    """``mean`` (each group alike: EasyRec's default), ``mean_by_sample_num`` (weighted by
    the group's rows: recpipe's default) or ``mean_by_positive_num`` (by its positives)."""


class SessionAUC(Section):
    """``session_auc`` metric: AUC per ``session_id_field`` value (a request's candidates
    ranked against each other), reduced over the sessions by ``reduction``."""

    session_id_field: str
    """The column whose values group the rows (the session or request id)."""
    reduction: Reduction = "mean"
    """As ``gauc``'s (default ``mean``, EasyRec's)."""


class Thresholded(Section):
    """Options of metrics that threshold the probability (accuracy, precision, recall)."""

    threshold: float = Field(0.5, ge=0, le=1)
    """A probability at or above it counts as positive."""


class Empty(Section):
    """A metric without options."""


class Metric(OneOf):
    """One ``metrics_set`` entry, e.g. ``{auc: {}}`` or ``{gauc: {uid_field: user_id}}``."""

    auc: AUC | None = None
    """Area under the ROC curve."""
    gauc: GAUC | None = None
    """Group AUC: AUC per ``uid_field`` value, weighted by rows."""
    logloss: Empty | None = None
    """Mean binary cross-entropy."""
    accuracy: Thresholded | None = None
    """Share of rows classified right at ``threshold``."""
    precision: Thresholded | None = None
    """Precision at ``threshold``."""
    recall: Thresholded | None = None
    """Recall at ``threshold``."""
    max_f1: Empty | None = None
    """The largest F1 over every threshold of the scores."""
    session_auc: SessionAUC | None = None
    """AUC per ``session_id_field`` value, reduced over the sessions."""
    mean_absolute_error: Empty | None = None
    """Mean of ``|label - probability|``."""
    mean_squared_error: Empty | None = None
    """Mean of ``(label - probability) ** 2``."""
    root_mean_squared_error: Empty | None = None
    """Its square root."""

    @property
    def group_field(self) -> str | None:
        """The column a grouped AUC groups by (``gauc``'s ``uid_field``, ``session_auc``'s
        ``session_id_field``), else None."""
        value = self.value()
        return getattr(value, "uid_field", None) or getattr(value, "session_id_field", None)


class EvalMethod(StrEnum):
    """Where evaluation runs while training (EasyRec / PAI ``eval_method``)."""

    separate = "separate"
    master = "master"
    none = "none"


class EvalConfig(Section):
    """EasyRec ``eval_config``; ``eval_method`` as PAI's ``-Deval_method``."""

    eval_method: EvalMethod = EvalMethod.none
    """Evaluation while training: ``separate`` (an evaluator process beside the job),
    ``master`` (the chief evaluates), ``none``; the DAG's evaluate task runs either way."""
    metrics_set: list[Metric] = Field(default_factory=lambda: [Metric(auc=AUC())])
    """The metrics reported."""
    num_examples: int | None = Field(None, gt=0)
    """Score at most this many rows, the first in the readers' fixed order (null: all)."""


class ExportConfig(Section):
    """EasyRec ``export_config``.

    ``exporter_type``: ``final`` exports the model the run's training ended with; ``best``
    the checkpoint whose evaluation while training scored best by ``best_exporter_metric``
    (the evaluator keeps a copy of it in ``<model_dir>/best/``; the day's evaluate task scores
    that one too, so the gate judges what is exported). EasyRec's ``latest`` is ``final`` here
    (the importer translates it). ``enable_early_stop`` ends training once
    ``best_exporter_metric`` has not improved for ``max_check_steps`` steps of evaluated
    checkpoints (EasyRec's ``stop_if_no_increase_hook``). ``exports_to_keep``: how many of the
    newest SavedModel versions (``<export_dir>/<model_name>/<version>/``) the retention task
    keeps; the champion's is kept whatever its age.
    """

    exporter_type: Literal["final", "best"] = "final"
    """``final``: the model training ended with; ``best``: the best evaluated checkpoint
    (needs ``eval_config.eval_method`` ``separate`` or ``master``)."""
    exports_to_keep: int = Field(5, gt=0)
    """Newest SavedModel versions kept under ``<export_dir>/<model_name>/`` (the champion's
    always)."""
    best_exporter_metric: str = "auc"
    """The metric ``best`` and early stopping compare: a key of the evaluation results
    (``auc``, ``gauc``, ``logloss``, ``auc_<task>`` for a multi-task model, ...)."""
    metric_bigger: bool = True
    """Whether a bigger ``best_exporter_metric`` is better (false for ``logloss``)."""
    enable_early_stop: bool = False
    """End training once ``best_exporter_metric`` has not improved for ``max_check_steps``
    steps (needs evaluation while training)."""
    max_check_steps: int = Field(10000, gt=0)
    """Steps from the best evaluated checkpoint to the latest one that end training."""
    asset_files: list[str] = Field(default_factory=list)
    """Files copied into each SavedModel's ``assets.extra/`` under their own names (EasyRec's
    ``asset_files``: a feature-generation config, a vocabulary); a relative path is read from
    the directory the export runs in. A missing file fails the export."""
    multi_placeholder: bool = True
    """EasyRec's: the SavedModel's ``serving_default`` takes one input per feature column
    (true), or one string input ``features``, each row's fields (``data_config``'s, labels
    left out) joined by ``data_config.separator`` (false)."""

    @field_validator("asset_files")
    @classmethod
    def _own_names(cls, value: list[str]) -> list[str]:
        names = [Path(f).name for f in value]
        taken = layout.RESERVED_ASSETS.intersection(names)
        if taken or len(set(names)) != len(names):
            raise ValueError(
                f"{value}: each file's name must be its own and none of {sorted(layout.RESERVED_ASSETS)} "
                "(recpipe's records in assets.extra/)"
            )
        return value
