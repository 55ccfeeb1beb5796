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
    SeqAttGroup,
    WideAndDeepModel,
    WideDeep,
)
from recpipe.config.pipeline import PipelineConfig
from trainer.models.multitask import MultiTaskModel
from trainer.models.ranking import RankingModel, WideLogit
from trainer.models.sequences import SequenceAttention, TargetAttention
from trainer.models.towers import ConcatMLPTower, DCNTower, DeepFMTower, DLRMTower, MultiTowerDINTower
from trainer.online import EVClock, OnlineTables


class ModelConfigError(ConfigError):
    """The model_config cannot be built (names the field)."""


def _group_features(config: PipelineConfig, kind: WideDeep):
    """The ``kind`` groups' features, then the keys and histories their ``sequence_features``
    attend over (a key outside its group joins the inputs, as EasyRec's key search reads it).

    Raises:
        ModelConfigError: a SequenceFeature among a group's ``feature_names`` without a
            ``sequence_combiner`` (it is attended over, not pooled), or an attention that does
            not resolve (``_target_attention``).
    """
    fc = config.feature_config
    names: list[str] = []
    for i, group in enumerate(config.model.feature_groups):
        if group.wide_deep != kind:
            continue
        if config.model.model_class != ModelClass.MultiTowerDIN:
            seq = [
                n
                for n in group.feature_names
                if fc.feature(n).feature_type == FeatureType.SequenceFeature
                and fc.feature(n).sequence_combiner is None
            ]
            if seq:
                raise ModelConfigError(
                    f"model_config.feature_groups[{i}].feature_names: SequenceFeature {seq} is attended "
                    "over: name it in the group's sequence_features (seq_att_map.hist_seq), or give it "
                    "a sequence_combiner to pool it"
                )
        names += [n for n in group.feature_names if n not in names]
        if group.sequence_features and kind != WideDeep.DEEP:
            raise ModelConfigError(f"model_config.feature_groups[{i}].sequence_features: a DEEP group's only")
        for att in _group_attentions(config, i):
            names += [n for n in att.keys + att.hists + att.auxes if n not in names]
    return [fc.feature(n) for n in names]


def _group_attentions(config: PipelineConfig, index: int) -> list[TargetAttention]:
    """Feature group ``index``'s ``sequence_features``, resolved."""
    group = config.model.feature_groups[index]
    where = f"model_config.feature_groups[{index}].sequence_features"
    return [
        _target_attention(config.feature_config, sag, f"{where}[{j}]", group.feature_names, group.group_name)
        for j, sag in enumerate(group.sequence_features)
    ]


def _attentions(config: PipelineConfig) -> SequenceAttention | None:
    """The DEEP groups' ``sequence_features`` as one layer, or None when there are none.

    Raises:
        ModelConfigError: the model class has no place for them (MultiTower's, DLRM's).
    """
    mc = config.model
    attentions = [
        att
        for i, g in enumerate(mc.feature_groups)
        if g.wide_deep == WideDeep.DEEP
        for att in _group_attentions(config, i)
    ]
    if not attentions:
        return None
    if mc.model_class in (ModelClass.MultiTower, ModelClass.MultiTowerDIN, ModelClass.DLRM):
        raise ModelConfigError(
            f"model_config.feature_groups[].sequence_features: not with model_class {mc.model_class.value} "
            "(MultiTowerDIN: seq_att_groups and multi_tower.din_towers)"
        )
    names = [a.name for a in attentions]
    if len(set(names)) != len(names):
        raise ModelConfigError(
            f"model_config.feature_groups[].sequence_features: group_name repeated in {names}"
        )
    return SequenceAttention(attentions, name="sequence_attention")


def _target_attention(
    fc, sag: SeqAttGroup, where: str, members: list[str] | None = None, group: str = ""
) -> TargetAttention:
    """``sag``'s keys, histories and auxiliary histories checked against the features.

    Raises:
        ModelConfigError: a name that is no feature, a history that is no SequenceFeature, a
            key that is one (or a RawFeature), a key outside ``members`` without
            ``allow_key_search``, or keys whose widths do not add up to the histories'
            without ``allow_key_transform``.
    """
    keys, hists, auxes = [], [], []
    key_width = hist_width = aux_width = 0
    for j, pair in enumerate(sag.seq_att_map):
        at = f"{where}.seq_att_map[{j}]"
        for field, names, kinds in (
            ("key", pair.key, None),
            ("hist_seq", pair.hist_seq, FeatureType.SequenceFeature),
            ("aux_hist_seq", pair.aux_hist_seq, FeatureType.SequenceFeature),
        ):
            for k, name in enumerate(names):
                try:
                    f = fc.feature(name)
                except KeyError as err:
                    raise ModelConfigError(f"{at}.{field}[{k}]: {err.args[0]}") from err
                if kinds is not None and f.feature_type != kinds:
                    raise ModelConfigError(
                        f"{at}.{field}[{k}]: {name!r} is a {f.feature_type.value}, not a SequenceFeature"
                    )
                if kinds is None:
                    if f.feature_type == FeatureType.SequenceFeature or f.kind == "dense":
                        raise ModelConfigError(f"{at}.key[{k}]: {name!r} must be an IdFeature or TagFeature")
                    if members is not None and not sag.allow_key_search and name not in members:
                        raise ModelConfigError(
                            f"{at}.key[{k}]: {name!r} is not in the feature group (allow_key_search: false)"
                        )
                    key_width += f.embedding_dim
                    keys.append(name)
                elif field == "hist_seq":
                    hist_width += f.embedding_dim
                    hists.append(name)
                else:
                    aux_width += f.embedding_dim
                    auxes.append(name)
    transform = None
    if key_width != hist_width:
        if not sag.allow_key_transform:
            raise ModelConfigError(
                f"{where}: the keys' embedding_dim add up to {key_width}, the histories' to {hist_width}: "
                "make them equal or set allow_key_transform"
            )
        transform = "pad" if hist_width > key_width and not sag.transform_dnn else "dense"
    return TargetAttention(
        name=sag.group_name,
        group=group,
        aux_width=aux_width,
        keys=keys,
        hists=hists,
        auxes=auxes,
        dnn=sag.seq_dnn,
        need_key_feature=sag.need_key_feature,
        width=hist_width,
        transform=transform,
    )


def _online_tables(config: PipelineConfig, features) -> OnlineTables | None:
    """The model's ``OnlineTables`` (with its ``EVClock``) when any of ``features`` has an
    online table, else None; the tables admit and look rows up in recpipe's kernels with
    ``train_config.fused_kernels``."""
    if not any(f.ev_params is not None for f in features):
        return None
    clock = EVClock(name="ev_clock")
    clock.build(None)
    return OnlineTables(clock, fused_kernels=config.train_config.fused_kernels)


def build_model(config: PipelineConfig, sharding=None, key_union=None) -> RankingModel:
    """Build the model named by ``model_config.model_class``; with a ``sharding``
    (``trainer.distribute.embedding_parallel.Sharding``) its embedding tables hold this
    rank's rows only. With ``ev_params`` features the model gets an ``EVClock`` and online
    tables (``OnlineTables``; ``key_union``: the distribution's, see ``EmbeddingVariable``);
    ``model_config.variational_dropout`` puts a learned feature dropout over its deep inputs.

    Raises:
        ModelConfigError: no model_config, no DEEP group, or parts that do not fit
            (DeepFM / DLRM need one embedding_dim; DLRM's bottom MLP must end at it).
    """
    model = _build_model(config, sharding, key_union)
    vd = config.model.variational_dropout
    if vd is not None:
        model.use_feature_dropout(vd.regularization_lambda, vd.embedding_wise_variational_dropout)
    return model


def _build_model(config: PipelineConfig, sharding=None, key_union=None) -> RankingModel:
    """The model of ``model_class`` before ``variational_dropout``."""
    mc = config.model
    if mc is None:
        raise ModelConfigError("model_config is missing")
    if mc.model_class in (ModelClass.MultiTower, ModelClass.MultiTowerDIN):
        return _multi_tower_din(config, sharding, key_union)
    if mc.model_class in MULTI_TASK_BLOCK:
        return _multi_task(config, sharding, key_union)
    deep = _group_features(config, WideDeep.DEEP)
    wide = _group_features(config, WideDeep.WIDE)
    if not deep:
        raise ModelConfigError("model_config.feature_groups: a DEEP group is needed")
    dims = {f.embedding_dim for f in deep if f.kind != "dense"}
    cls = mc.model_class
    wide_dim = 1
    final, wide_vector = None, False
    if cls == ModelClass.DNN:
        tower = ConcatMLPTower((mc.dnn or DNNModel()).dnn, name="tower")
        wide = []
    elif cls == ModelClass.WideAndDeep:
        sub = mc.wide_and_deep or WideAndDeepModel()
        tower, wide_dim = ConcatMLPTower(sub.dnn, name="tower"), sub.wide_output_dim
        final, wide_vector = sub.final_dnn, True
    elif cls == ModelClass.DeepFM:
        sub = mc.deepfm or DeepFMModel()
        if len(dims) != 1:
            raise ModelConfigError(
                f"model_config: DeepFM's FM needs one embedding_dim in the deep group, got {dims}"
            )
        final = sub.final_dnn
        tower = DeepFMTower(sub.dnn, fm_vector=final is not None, name="tower")
        wide_dim = sub.wide_output_dim
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
    parts = {"sharding": sharding, "online": _online_tables(config, deep + wide), "key_union": key_union}
    wide_part = WideLogit(wide, wide_dim, name="wide", **parts) if wide else None
    attention = _attentions(config)
    return RankingModel(
        deep,
        tower,
        wide_part,
        attention=attention,
        final=final,
        wide_vector=wide_vector,
        name=cls.value.lower(),
        **parts,
    )


def _multi_tower_din(config: PipelineConfig, sharding, key_union) -> RankingModel:
    """EasyRec's MultiTower and MultiTowerDIN: ``multi_tower.towers`` over feature groups, ``din_towers``
    over ``seq_att_groups`` (keys and their SequenceFeature histories), ``final_dnn``.

    Raises:
        ModelConfigError: a tower's input names no group, a history is not a SequenceFeature,
            a key is one, or a key and its history are embedded by different tables.
    """
    mc = config.model
    _attentions(config)  # refused here, with the reason
    multi = mc.multi_tower or MultiTowerModel(towers=[{"input": g.group_name} for g in mc.feature_groups])
    fc = config.feature_config
    groups = {g.group_name: g.feature_names for g in mc.feature_groups}
    atts = {g.group_name: g for g in mc.seq_att_groups}
    names: list[str] = []
    towers = []
    raw = [n for g in groups.values() for n in g if fc.feature(n).kind == "dense"]
    raw = list(dict.fromkeys(raw))
    for i, tower in enumerate(multi.towers):
        if tower.input not in groups:
            raise ModelConfigError(
                f"model_config.multi_tower.towers[{i}].input: no feature group {tower.input!r} "
                f"(groups: {sorted(groups)})"
            )
        members = groups[tower.input]
        embedded = [n for n in members if fc.feature(n).kind != "dense"]
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
        att = _target_attention(fc, atts[tower.input], f"model_config.seq_att_groups[{tower.input}]")
        keys, hists, auxes = att.keys, att.hists, att.auxes
        din.append((keys, hists, auxes, tower.dnn))
        names += keys + hists + auxes
    deep = [fc.feature(n) for n in dict.fromkeys(names)]
    # the dense inputs in the order the towers index them
    deep = [f for f in deep if f.kind != "dense"] + [fc.feature(n) for n in raw]
    tower = MultiTowerDINTower(towers, din, multi.final_dnn, name="tower")
    parts = {"sharding": sharding, "online": _online_tables(config, deep), "key_union": key_union}
    return RankingModel(deep, tower, None, name=mc.model_class.value.lower(), **parts)


def _multi_task(config: PipelineConfig, sharding, key_union) -> MultiTaskModel:
    """MMoE, ESMM or DBMTL over the DEEP groups' features (a WIDE group has no part here).

    Raises:
        ModelConfigError: no DEEP group, a WIDE group, or a SequenceFeature among the inputs.
    """
    mc = config.model
    deep = _group_features(config, WideDeep.DEEP)
    if not deep:
        raise ModelConfigError("model_config.feature_groups: a DEEP group is needed")
    if _group_features(config, WideDeep.WIDE):
        raise ModelConfigError(f"model_config.feature_groups: {mc.model_class.value} has no WIDE part")
    parts = {"sharding": sharding, "online": _online_tables(config, deep), "key_union": key_union}
    groups = []
    if mc.model_class == ModelClass.ESMM and mc.esmm is not None and mc.esmm.groups:
        members = {g.group_name: g.feature_names for g in mc.feature_groups}
        for i, tower in enumerate(mc.esmm.groups):
            if tower.input not in members:
                raise ModelConfigError(
                    f"model_config.esmm.groups[{i}].input: no feature group {tower.input!r} "
                    f"(groups: {sorted(members)})"
                )
            groups.append((tower.input, members[tower.input], tower.dnn))
    return MultiTaskModel(
        deep, mc, attention=_attentions(config), groups=groups, name=mc.model_class.value.lower(), **parts
    )
