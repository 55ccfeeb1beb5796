"""``model_config``, ``eval_config`` and ``export_config`` (EasyRec names)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from recpipe.config.base import OneOf, Section
from recpipe.config.data import EVParams


class WideDeep(StrEnum):
    """Which part of the model a feature group feeds (EasyRec ``wide_deep``)."""

    DEEP = "DEEP"
    WIDE = "WIDE"


class FeatureGroup(Section):
    """EasyRec ``feature_groups``: named lists of features fed to one part of the model."""

    group_name: str
    feature_names: list[str] = Field(min_length=1)
    wide_deep: WideDeep = WideDeep.DEEP


class DNN(Section):
    """An MLP block (EasyRec ``dnn``): ReLU ``hidden_units``, optional dropout and batch norm."""

    hidden_units: list[int] = Field(default_factory=lambda: [256, 128, 64])
    dropout_ratio: float = Field(0.0, ge=0, lt=1)
    use_bn: bool = False


class DNNModel(Section):
    """``model_config.dnn`` of the DNN model class."""

    dnn: DNN = Field(default_factory=DNN)


class WideAndDeepModel(Section):
    """``model_config.wide_and_deep``: the deep MLP and the wide output width."""

    dnn: DNN = Field(default_factory=DNN)
    wide_output_dim: int = Field(1, gt=0)


class DeepFMModel(Section):
    """``model_config.deepfm``: the deep MLP beside the FM term (Guo et al., 2017)."""

    dnn: DNN = Field(default_factory=DNN)
    final_dnn: DNN | None = None
    wide_output_dim: int = Field(1, gt=0)


class DLRMModel(Section):
    """``model_config.dlrm``: bottom MLP (dense -> embedding width) and top MLP (Naumov et al., 2019)."""

    bot_dnn: DNN = Field(default_factory=lambda: DNN(hidden_units=[64, 16]))
    top_dnn: DNN = Field(default_factory=lambda: DNN(hidden_units=[128, 64]))
    arch_interaction_itself: bool = False


class DCNModel(Section):
    """DCN-v2: ``cross_num`` full-rank cross layers beside a DNN (Wang et al., 2021)."""

    cross_num: int = Field(3, gt=0)
    deep_tower: DNN = Field(default_factory=DNN)
    final_dnn: DNN | None = None


class Tower(Section):
    """One ``multi_tower.towers`` entry: an MLP over the feature group ``input``."""

    input: str
    dnn: DNN = Field(default_factory=lambda: DNN(hidden_units=[64, 32]))


class DINTower(Section):
    """One ``multi_tower.din_towers`` entry: DIN's attention over the ``seq_att_groups`` group
    ``input``; ``dnn`` scores each history element (its last layer must have one unit)."""

    input: str
    dnn: DNN = Field(default_factory=lambda: DNN(hidden_units=[64, 32, 1]))


class MultiTowerModel(Section):
    """``model_config.multi_tower`` (EasyRec's MultiTower / MultiTowerDIN): a tower per feature
    group and a DIN tower per ``seq_att_groups`` group, concatenated into ``final_dnn``."""

    towers: list[Tower] = Field(min_length=1)
    din_towers: list[DINTower] = Field(default_factory=list)
    final_dnn: DNN = Field(default_factory=lambda: DNN(hidden_units=[64, 32]))


class SeqAttMap(Section):
    """One ``seq_att_map``: the target feature ``key`` (the candidate's item, say) and the
    SequenceFeature ``hist_seq`` of the user's earlier ones, embedded by the same table."""

    key: str
    hist_seq: str


class SeqAttGroup(Section):
    """EasyRec ``seq_att_groups``: named (key, history) pairs attended over together: the
    keys' embeddings are concatenated into the query, the histories' into its keys."""

    group_name: str
    seq_att_map: list[SeqAttMap] = Field(min_length=1)


class ModelClass(StrEnum):
    """EasyRec ``model_class`` names supported by recpipe."""

    DNN = "DNN"
    WideAndDeep = "WideAndDeep"
    DeepFM = "DeepFM"
    DLRM = "DLRM"
    DCN = "DCN"
    MultiTowerDIN = "MultiTowerDIN"


class LossType(StrEnum):
    """EasyRec ``loss_type`` values (shared/reference/easyrec_train_config_and_losses.txt)."""

    CLASSIFICATION = "CLASSIFICATION"
    L2_LOSS = "L2_LOSS"
    SIGMOID_L2_LOSS = "SIGMOID_L2_LOSS"
    CROSS_ENTROPY_LOSS = "CROSS_ENTROPY_LOSS"
    PAIR_WISE_LOSS = "PAIR_WISE_LOSS"
    F1_REWEIGHTED_LOSS = "F1_REWEIGHTED_LOSS"


class Loss(Section):
    """One ``losses`` entry: a loss type and its weight in the sum."""

    loss_type: LossType
    weight: float = Field(1.0, ge=0)
    f1_beta_square: float = Field(1.0, gt=0)


class ModelConfig(Section):
    """EasyRec ``model_config``: the class, its feature groups, and its own block."""

    model_class: ModelClass = ModelClass.DeepFM
    feature_groups: list[FeatureGroup] = Field(min_length=1)
    dnn: DNNModel | None = None
    wide_and_deep: WideAndDeepModel | None = None
    deepfm: DeepFMModel | None = None
    dlrm: DLRMModel | None = None
    dcn: DCNModel | None = None
    multi_tower: MultiTowerModel | None = None
    seq_att_groups: list[SeqAttGroup] = Field(default_factory=list)
    # L2 weight on each embedding row a batch looks up (EasyRec), so table updates stay sparse
    embedding_regularization: float = Field(0.0, ge=0)
    loss_type: LossType = LossType.CLASSIFICATION
    losses: list[Loss] = Field(default_factory=list)
    # default ev_params of every id / tag feature that has none (EasyRec EasyRecModel.ev_params)
    ev_params: EVParams | None = None


class AUC(Section):
    """``auc`` metric options."""

    num_thresholds: int = Field(200, gt=1)


class GAUC(Section):
    """``gauc`` metric: AUC per ``uid_field`` value, weighted by rows."""

    uid_field: str


class Thresholded(Section):
    """Options of metrics that threshold the probability (accuracy, precision, recall)."""

    threshold: float = Field(0.5, ge=0, le=1)


class Empty(Section):
    """A metric without options."""


class Metric(OneOf):
    """One ``metrics_set`` entry, e.g. ``{auc: {}}`` or ``{gauc: {uid_field: user_id}}``."""

    auc: AUC | None = None
    gauc: GAUC | None = None
    logloss: Empty | None = None
    accuracy: Thresholded | None = None
    precision: Thresholded | None = None
    recall: Thresholded | None = None


class EvalMethod(StrEnum):
    """Where evaluation runs while training (EasyRec / PAI ``eval_method``)."""

    separate = "separate"
    master = "master"
    none = "none"


class EvalConfig(Section):
    """EasyRec ``eval_config``; ``eval_method`` as PAI's ``-Deval_method``."""

    eval_method: EvalMethod = EvalMethod.none
    metrics_set: list[Metric] = Field(default_factory=lambda: [Metric(auc=AUC())])
    num_examples: int | None = Field(None, gt=0)


class ExportConfig(Section):
    """EasyRec ``export_config``."""

    exporter_type: str = Field("final", pattern="^(final|latest|best)$")
    exports_to_keep: int = Field(5, gt=0)
    best_exporter_metric: str = "auc"
