"""``model_config.model_class`` -> a ``RankingModel`` with that class's parts."""

from __future__ import annotations

from recpipe.config.data import FeatureType
from recpipe.config.errors import ConfigError
from recpipe.config.model import (
    DCNModel,
    DeepFMModel,
    DLRMModel,
    DNNModel,
    ModelClass,
    WideAndDeepModel,
    WideDeep,
)
from recpipe.config.pipeline import PipelineConfig
from trainer.models.ranking import RankingModel, WideLogit
from trainer.models.towers import ConcatMLPTower, DCNTower, DeepFMTower, DLRMTower
from trainer.online import EVClock


class ModelConfigError(ConfigError):
    """The model_config cannot be built (names the field)."""


def _group_features(config: PipelineConfig, kind: WideDeep):
    names: list[str] = []
    for group in config.model.feature_groups:
        if group.wide_deep == kind:
            names += [n for n in group.feature_names if n not in names]
    return [config.feature_config.feature(n) for n in names]


def build_model(config: PipelineConfig, sharding=None, key_union=None) -> RankingModel:
    """Build the model named by ``model_config.model_class``; with a ``sharding``
    (``trainer.distribute.embedding_parallel.Sharding``) its embedding tables hold this
    rank's rows only. With ``ev_params`` features the model gets an ``EVClock`` and online
    tables (``key_union``: the distribution's, see ``EmbeddingVariable``).

    Raises:
        ModelConfigError: no model_config, no DEEP group, or parts that do not fit
            (DeepFM / DLRM need one embedding_dim; DLRM's bottom MLP must end at it).
    """
    mc = config.model
    if mc is None:
        raise ModelConfigError("model_config is missing")
    deep = _group_features(config, WideDeep.DEEP)
    wide = _group_features(config, WideDeep.WIDE)
    if not deep:
        raise ModelConfigError("model_config.feature_groups: a DEEP group is needed")
    dims = {f.embedding_dim for f in deep if f.feature_type != FeatureType.RawFeature}
    cls = mc.model_class
    wide_dim = 1
    if cls == ModelClass.DNN:
        tower = ConcatMLPTower((mc.dnn or DNNModel()).dnn, name="tower")
        wide = []
    elif cls == ModelClass.WideAndDeep:
        sub = mc.wide_and_deep or WideAndDeepModel()
        tower, wide_dim = ConcatMLPTower(sub.dnn, name="tower"), sub.wide_output_dim
    elif cls == ModelClass.DeepFM:
        sub = mc.deepfm or DeepFMModel()
        if len(dims) != 1:
            raise ModelConfigError(
                f"model_config: DeepFM's FM needs one embedding_dim in the deep group, got {dims}"
            )
        tower = DeepFMTower(sub.dnn, name="tower")
    elif cls == ModelClass.DLRM:
        sub = mc.dlrm or DLRMModel()
        if len(dims) != 1 or sub.bot_dnn.hidden_units[-1] not in dims:
            raise ModelConfigError(
                "model_config.dlrm.bot_dnn.hidden_units[-1] must equal the deep group's one embedding_dim "
                f"({sorted(dims)})"
            )
        tower = DLRMTower(sub.bot_dnn, sub.top_dnn, sub.arch_interaction_itself, name="tower")
        wide = []
    else:
        sub = mc.dcn or DCNModel()
        tower = DCNTower(sub.cross_num, sub.deep_tower, sub.final_dnn, name="tower")
        wide = []
    clock = None
    if any(f.ev_params is not None for f in deep + wide):
        clock = EVClock(name="ev_clock")
        clock.build(None)
    parts = {"sharding": sharding, "clock": clock, "key_union": key_union}
    wide_part = WideLogit(wide, wide_dim, name="wide", **parts) if wide else None
    return RankingModel(deep, tower, wide_part, name=cls.value.lower(), **parts)
