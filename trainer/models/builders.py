"""``model_config.model_class`` -> a ``RankingModel`` with that class's parts."""

from __future__ import annotations

from recpipe.config.data import FeatureType
from recpipe.config.errors import ConfigError
from recpipe.config.model import (
    MULTI_TASK_BLOCK,
    DCNModel,
    DeepFMModel,
    DLRMModel,
    DNNModel,
    ModelClass,
    MultiTowerModel,
    WideAndDeepModel,
    WideDeep,
)
from recpipe.config.pipeline import PipelineConfig
from trainer.models.multitask import MultiTaskModel
from trainer.models.ranking import RankingModel, WideLogit
from trainer.models.towers import ConcatMLPTower, DCNTower, DeepFMTower, DLRMTower, MultiTowerDINTower
from trainer.online import EVClock


class ModelConfigError(ConfigError):
    """The model_config cannot be built (names the field)."""


def _group_features(config: PipelineConfig, kind: WideDeep):
    names: list[str] = []
    for group in config.model.feature_groups:
        if group.wide_deep == kind:
            names += [n for n in group.feature_names if n not in names]
    return [config.feature_config.feature(n) for n in names]


def _clock(features) -> EVClock | None:
    """The model's ``EVClock`` when any of ``features`` has an online table, else None."""
    if not any(f.ev_params is not None for f in features):
        return None
    clock = EVClock(name="ev_clock")
    clock.build(None)
    return clock


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
    if mc.model_class == ModelClass.MultiTowerDIN:
        return _multi_tower_din(config, sharding, key_union)
    if mc.model_class in MULTI_TASK_BLOCK:
        return _multi_task(config, sharding, key_union)
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
        tower, wide_dim = DeepFMTower(sub.dnn, name="tower"), sub.wide_output_dim
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
    parts = {"sharding": sharding, "clock": _clock(deep + wide), "key_union": key_union}
    wide_part = WideLogit(wide, wide_dim, name="wide", **parts) if wide else None
    return RankingModel(deep, tower, wide_part, name=cls.value.lower(), **parts)


def _multi_tower_din(config: PipelineConfig, sharding, key_union) -> RankingModel:
    """EasyRec's MultiTowerDIN: ``multi_tower.towers`` over feature groups, ``din_towers``
    over ``seq_att_groups`` (keys and their SequenceFeature histories), ``final_dnn``.

    Raises:
        ModelConfigError: a tower's input names no group, a history is not a SequenceFeature,
            a key is one, or a key and its history are embedded by different tables.
    """
    mc = config.model
    multi = mc.multi_tower or MultiTowerModel(towers=[{"input": g.group_name} for g in mc.feature_groups])
    fc = config.feature_config
    groups = {g.group_name: g.feature_names for g in mc.feature_groups}
    atts = {g.group_name: g for g in mc.seq_att_groups}
    names: list[str] = []
    towers = []
    raw = [n for g in groups.values() for n in g if fc.feature(n).feature_type == FeatureType.RawFeature]
    raw = list(dict.fromkeys(raw))
    for i, tower in enumerate(multi.towers):
        if tower.input not in groups:
            raise ModelConfigError(
                f"model_config.multi_tower.towers[{i}].input: no feature group {tower.input!r} "
                f"(groups: {sorted(groups)})"
            )
        members = groups[tower.input]
        embedded = [n for n in members if fc.feature(n).feature_type != FeatureType.RawFeature]
        columns = [raw.index(n) for n in members if n in raw]
        towers.append((embedded, columns, tower.dnn))
        names += members
    din = []
    for i, tower in enumerate(multi.din_towers):
        where = f"model_config.multi_tower.din_towers[{i}]"
        if tower.input not in atts:
            raise ModelConfigError(
                f"{where}.input: no seq_att_groups group {tower.input!r} (groups: {sorted(atts)})"
            )
        keys, hists, auxes = [], [], []
        for j, pair in enumerate(atts[tower.input].seq_att_map):
            at = f"model_config.seq_att_groups[{tower.input}].seq_att_map[{j}]"
            try:
                key, hist = fc.feature(pair.key), fc.feature(pair.hist_seq)
            except KeyError as err:
                raise ModelConfigError(f"{at}: {err.args[0]}") from err
            if hist.feature_type != FeatureType.SequenceFeature:
                raise ModelConfigError(
                    f"{at}.hist_seq: {hist.name!r} is a {hist.feature_type.value}, not a SequenceFeature"
                )
            if key.feature_type in (FeatureType.SequenceFeature, FeatureType.RawFeature):
                raise ModelConfigError(f"{at}.key: {key.name!r} must be an IdFeature or TagFeature")
            if (hist.embedding_name or hist.name) != (key.embedding_name or key.name):
                raise ModelConfigError(
                    f"{at}: {hist.name!r} must share {key.name!r}'s table: set its embedding_name to "
                    f"{key.embedding_name or key.name!r}"
                )
            keys.append(key.name)
            hists.append(hist.name)
            for k, name in enumerate(pair.aux_hist_seq):
                try:
                    aux = fc.feature(name)
                except KeyError as err:
                    raise ModelConfigError(f"{at}.aux_hist_seq[{k}]: {err.args[0]}") from err
                if aux.feature_type != FeatureType.SequenceFeature:
                    kind = aux.feature_type.value
                    raise ModelConfigError(
                        f"{at}.aux_hist_seq[{k}]: {name!r} is a {kind}, not a SequenceFeature"
                    )
                auxes.append(name)
        din.append((keys, hists, auxes, tower.dnn))
        names += keys + hists + auxes
    deep = [fc.feature(n) for n in dict.fromkeys(names)]
    # the dense inputs in the order the towers index them
    deep = [f for f in deep if f.feature_type != FeatureType.RawFeature] + [fc.feature(n) for n in raw]
    tower = MultiTowerDINTower(towers, din, multi.final_dnn, name="tower")
    parts = {"sharding": sharding, "clock": _clock(deep), "key_union": key_union}
    return RankingModel(deep, tower, None, name="multitowerdin", **parts)


def _multi_task(config: PipelineConfig, sharding, key_union) -> MultiTaskModel:
    """MMoE, ESMM or DBMTL over the DEEP groups' features (a WIDE group has no part here).

    Raises:
        ModelConfigError: no DEEP group, a WIDE group, or a SequenceFeature among the inputs.
    """
    mc = config.model
    block = MULTI_TASK_BLOCK[mc.model_class]
    deep = _group_features(config, WideDeep.DEEP)
    if not deep:
        raise ModelConfigError("model_config.feature_groups: a DEEP group is needed")
    if _group_features(config, WideDeep.WIDE):
        raise ModelConfigError(f"model_config.feature_groups: {mc.model_class.value} has no WIDE part")
    seq = [f.name for f in deep if f.feature_type == FeatureType.SequenceFeature]
    if seq:
        raise ModelConfigError(
            f"model_config.{block}: SequenceFeature {seq} needs model_class MultiTowerDIN's attention"
        )
    parts = {"sharding": sharding, "clock": _clock(deep), "key_union": key_union}
    return MultiTaskModel(deep, mc, name=mc.model_class.value.lower(), **parts)
