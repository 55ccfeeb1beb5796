"""Base and delta exports of a model with online tables (``ev_params``): once a day a base (the
full SavedModel plus every parameter), after every pass a delta (only what changed since the
previous export), and the reverse: a SavedModel rebuilt from a base and its deltas. The files
are ``recpipe.exports.files``'.

A row's ``ev_versions`` entry is the ``EVClock.stamp`` of the step it was last looked up in
training, and an export records the clock's step, the newest stamp, as its ``ev_step``; so the
rows touched since the previous export are those with a later version than that export's
``ev_step``: a touched set that costs no state beyond what the table keeps (Monolith's
``TouchedKeySet``, PaddleRec's delta save). The ids alive at the previous export are the
chain's own (the base's ids, plus each delta's rows, less its tombstones), so tombstones come
from the exports, not from state in the trainer (TorchEasyRec added tombstones after evicted
rows kept serving). A delta is exact only when the tables' optimizer moves just the rows in
the batch (``sgd``, ``adagrad``, ``lazy_adam``, ``ftrl``): ``adam`` decays every row.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from recpipe import atomic
from recpipe.config.loader import validate
from recpipe.config.pipeline import PipelineConfig
from recpipe.exports.files import (
    BASE,
    DELTA_PREFIX,
    MANIFEST,
    DeltaError,
    Params,
    alive_ids,
    apply,
    follows,
    new_manifest,
    previous_export,
    read_manifest,
    read_params,
    write_params,
)
from recpipe.layout import PIPELINE_ASSET, SUCCESS, fine_tuned_from
from trainer import online
from trainer.embedding_tables import variable_name
from trainer.input import sample_inputs
from trainer.models.builders import build_model
from trainer.optimizers import split_variables
from trainer.serving import write_saved_model

ROW_WISE = frozenset({"sgd_optimizer", "adagrad_optimizer", "lazy_adam_optimizer", "ftrl_optimizer"})


def check_row_wise(config: PipelineConfig, model) -> None:
    """Raise ``DeltaError`` unless each optimizer updating an online table is row-wise."""
    names = {variable_name(v.weights) for ev in online.tables(model) for v in ev.views}
    entries = config.train_config.optimizer_config
    split = split_variables(model.variable_groups(), len(entries), config.model.model_class)
    for i, (entry, part) in enumerate(zip(entries, split, strict=True)):
        if entry.which() not in ROW_WISE and any(variable_name(v) in names for v in part):
            raise DeltaError(
                f"train_config.optimizer_config[{i}]: {entry.which()} moves every row of the online "
                f"tables at each step, so a delta cannot hold only the touched rows; use one of "
                f"{sorted(ROW_WISE)} for the tables"
            )


def snapshot(model, normalization: dict, since_step: int | None = None) -> tuple[Params, int]:
    """The model's parameters: every admitted row, or (``since_step``) those looked up in
    training after the export whose ``ev_step`` it is (``EVClock.stamp``: versions above it);
    and the clock's step now (the newest version). Tombstones are left empty."""
    tables, step = online.snapshot(model, since_step)
    skip = online.variable_names(model)
    dense = {variable_name(v): v.numpy() for v in model.variables if variable_name(v) not in skip}
    return Params(tables, dense, normalization), step


def export_base(
    config: PipelineConfig,
    model,
    normalization: dict,
    day_dir: Path,
    day: str,
    global_step: int,
    pass_key: str | None = None,
    model_dir: Path | None = None,
) -> Path:
    """Write ``<day_dir>/base/``: the SavedModel and every admitted row (``write_export``).

    Raises:
        DeltaError: the tables' optimizer is not row-wise (``check_row_wise``), or the day's
            deltas follow a base already (a base re-exported under them would break the chain).
    """

    check_row_wise(config, model)
    return write_export(
        model,
        normalization,
        day_dir,
        BASE,
        global_step,
        day=day,
        saved_model=lambda tmp: write_saved_model(config, model, normalization, tmp),
        pass_key=pass_key,
        model_dir=model_dir,
    )


def export_delta(
    config: PipelineConfig,
    model,
    normalization: dict,
    day_dir: Path,
    name: str,
    global_step: int,
    model_dir: Path | None = None,
) -> Path:
    """Write ``<day_dir>/delta-<name>/`` (``write_export``).

    Raises:
        DeltaError: no finished base for the day, later exports follow this one, or the
            optimizer is not row-wise.
    """
    check_row_wise(config, model)
    return write_export(
        model, normalization, day_dir, f"{DELTA_PREFIX}{name}", global_step, model_dir=model_dir
    )


def write_export(
    model,
    normalization: dict,
    day_dir: Path,
    name: str,
    global_step: int,
    day: str | None = None,
    saved_model=None,
    pass_key: str | None = None,
    model_dir: Path | None = None,
) -> Path:
    """Write the export ``<day_dir>/<name>/`` of ``model`` (temporary directory, then rename):

    - ``base`` (``day`` given): every admitted row, and ``saved_model(tmp)``'s SavedModel;
    - ``delta-<pass>``: the rows looked up in training since the export before it in the
      day's chain, the ids evicted since then (those alive after that chain, not now), every
      other model variable.

    The manifest records ``model_dir``, the model exported. A delta of a model that was not
    fine-tuned from the model the export before it holds (``recpipe.layout.fine_tuned_from``;
    the day's passes started again from a champion moved during the day) holds every admitted
    row instead, ``rebased: true``: the chain applied in order still gives this model.

    A re-run for the same ``name`` (a retried pass) replaces it and diffs against the exports
    before it, as long as no later pass exported (``recpipe.exports.files.previous_export``).

    Raises:
        DeltaError: a delta without a finished base for the day, or a pass that later
            passes' exports follow (names them and the way out).
    """
    target = day_dir / name
    if pass_key is None and name.startswith(DELTA_PREFIX):
        pass_key = name.removeprefix(DELTA_PREFIX)
    exports = previous_export(day_dir, name, pass_key)
    previous = read_manifest(exports[-1]) if exports else None
    own = Path(model_dir).resolve() if model_dir is not None else None
    rebased = previous is not None and not _continues(previous, own)
    since = previous["ev_step"] if previous is not None and not rebased else None
    params, ev_step = snapshot(model, normalization, since_step=since)
    now = {table: ids for ev in online.tables(model) for table, ids in ev.member_ids().items()}
    if previous is not None:
        for table, ids in alive_ids(exports).items():
            current = now.get(table, np.zeros(0, np.int64))
            params.tables[table].tombstones = np.sort(ids[~np.isin(ids, current)])
    with atomic.directory(target) as tmp:
        if saved_model is not None:
            saved_model(tmp)
        files = write_params(params, tmp / "params")
        day = day or read_manifest(exports[0])["day"]
        sequence = previous["sequence"] + 1 if previous else 0
        doc = new_manifest(day, name, sequence, previous, global_step, ev_step, params, files)
        doc["pass"] = pass_key
        doc["model_dir"] = str(own) if own is not None else None
        doc["rebased"] = rebased
        for t, ids in now.items():
            doc["tables"][t]["rows_used"] = len(ids)
        (tmp / MANIFEST).write_text(json.dumps(doc, indent=2, sort_keys=True))  # the rename covers it
        (tmp / SUCCESS).touch()
    return target


def _continues(previous: dict, model_dir: Path | None) -> bool:
    """Whether the model in ``model_dir`` continues the model of the export ``previous``
    (its manifest): it is that model dir (a retried export) or was fine-tuned from it. An
    export or a model that records nothing is taken to continue it."""
    before = previous.get("model_dir")
    if model_dir is None or not before:
        return True
    before = Path(before).resolve()
    source = fine_tuned_from(model_dir)
    return model_dir == before or source is None or source == before


def load_params(model, params: Params) -> None:
    """Set ``model``'s variables (built, fresh) to ``params``: dense ones by name, each online
    table's ids and rows (then its id -> row map).

    Raises:
        DeltaError: a model variable or table ``params`` lacks, or a table with more ids than
            its ``max_capacity``.
    """
    skip = online.variable_names(model)
    for var in model.variables:
        name = variable_name(var)
        if name in skip:
            continue
        if name not in params.dense:
            raise DeltaError(f"the exports lack model variable {name!r}")
        var.assign(params.dense[name])
    try:
        online.load_rows(model, params.tables)
    except ValueError as err:
        raise DeltaError(f"the exports do not fit the model: {err}") from None


def build_saved_model(base: Path, deltas: list[Path], out: Path) -> Path:
    """``recpipe serve apply-delta``: the SavedModel of ``base`` with ``deltas`` applied in
    order, written to ``out`` (temporary directory, then rename). Its ``serving_default``
    equals, to float tolerance, a full export at the last delta's step.

    Raises:
        DeltaError: an unfinished export or a checksum mismatch, deltas out of order or from
            another day (each must follow the previous one's directory).
    """

    params = read_params(base)
    previous = read_manifest(base)
    for delta in deltas:
        manifest = read_manifest(delta)
        if not follows(manifest, previous):
            raise DeltaError(
                f"{delta} follows {manifest['follows']!r} of day {manifest['day']}, not {previous['name']!r} "
                f"of day {previous['day']} at ev_step {previous['ev_step']}: give the deltas in order"
            )
        params = apply(params, read_params(delta))
        previous = manifest
    source = base / "assets.extra" / PIPELINE_ASSET
    config = validate(PipelineConfig, json.loads(source.read_text()), str(source))
    model = build_model(config)
    model(sample_inputs(config))
    load_params(model, params)
    with atomic.directory(out) as tmp:
        write_saved_model(config, model, params.normalization, tmp)
    return Path(out)
