"""Online-learning tables (``ev_params``): one row per admitted id, admission by count,
eviction by steps, by days and by capacity, and the clock they run on.

The package's parts, each with one job: ``table`` (the id -> row map and each row's state),
``admit`` (a step's admission of its ids, on the stock ops or in the kernel), ``row_io`` (rows
in and out: restores, deltas, summaries), ``admission`` (the count-min sketch), ``eviction``
(which rows go), ``initializer`` (a new row's values), ``clock`` (steps and days),
``registry`` (a model's tables by name, shared by its layers), ``step_rows`` (a step's rows
handed from the admitting view to the others). What the rest of the trainer calls is here:

- building: ``table_specs`` (which features get an online table), ``EVClock``,
  ``OnlineTables``, ``EmbeddingVariable`` (made by ``trainer.layers.embedding``), ``StepRows``
  (made by the model for each call);
- the loop: ``start_day`` (the day boundary), ``refresh`` (after a restore or a broadcast),
  ``summaries``, ``AheadSteps`` (``ahead``: each batch admitted in the step before its own);
- exports and checkpoints: ``snapshot``, ``load_rows``, ``variable_names``, ``row_names``,
  ``summed_names``; a save that sums per-rank sketches widens them first (``widened``);
- serving with the store's rows: ``RecordIds``, ``ProvidedRows``, ``row_inputs`` (``served``).
"""

from __future__ import annotations

from recpipe.config.data import EVParams, FeatureSpec
from recpipe.exports.files import TableRows
from trainer.embedding_tables import EmbeddingConfigError, variable_name
from trainer.online.admission import SKETCH_DEPTH, SKETCH_NAME, widened
from trainer.online.ahead import AheadSteps
from trainer.online.clock import EVClock, day_number
from trainer.online.registry import OnlineTables
from trainer.online.served import ProvidedRows, RecordIds, row_inputs
from trainer.online.step_rows import StepRows
from trainer.online.table import FREE, STATS, EmbeddingVariable, EVView, table_tag

__all__ = [
    "AheadSteps",
    "FREE",
    "ProvidedRows",
    "RecordIds",
    "SKETCH_DEPTH",
    "SKETCH_NAME",
    "STATS",
    "StepRows",
    "EVClock",
    "EVView",
    "EmbeddingVariable",
    "OnlineTables",
    "TableRows",
    "clock",
    "day_number",
    "load_rows",
    "refresh",
    "row_inputs",
    "row_names",
    "snapshot",
    "start_day",
    "summed_names",
    "table_specs",
    "table_tag",
    "tables",
    "variable_names",
    "widened",
]


def table_specs(features: list[FeatureSpec], dim: int | None = None) -> dict[str, tuple[EVParams, int]]:
    """Table name -> (ev_params, dim) for the online tables (features with ``ev_params``).

    Raises:
        EmbeddingConfigError: features sharing an ``embedding_name`` differ in ``ev_params`` or
            dimension, or one of them has none.
    """
    out: dict[str, tuple[EVParams, int]] = {}
    hashed = {f.embedding_name or f.name for f in features if f.ev_params is None}
    for f in features:
        if f.ev_params is None:
            continue
        table = f.embedding_name or f.name
        entry = (f.ev_params, dim or f.embedding_dim)
        if table in hashed or out.setdefault(table, entry) != entry:
            raise EmbeddingConfigError(
                f"feature_config: features sharing embedding_name {table!r} need one ev_params and "
                "embedding_dim (all of them, or none)"
            )
    return out


def tables(model) -> list[EmbeddingVariable]:
    """Every online table of ``model`` (shared by its views), in a fixed order: a group of
    tables is one (``EmbeddingVariable.members``)."""
    out: list[EmbeddingVariable] = []
    for layer in model.submodules:
        for view in getattr(layer, "evs", {}).values():
            if not any(view.ev is ev for ev in out):
                out.append(view.ev)
    return out


def clock(model) -> EVClock | None:
    """The model's ``EVClock``, or None (no online tables)."""
    return getattr(model, "ev_clock", None)


def start_day(model, ds: str) -> int:
    """The day boundary before training ``ds`` (a day or a pass): each table's ``new_day`` when
    ``ds`` is later than the day the model last trained on, then the clock moves to it.
    Returns rows evicted."""
    time = clock(model)
    if time is None:
        return 0
    day = day_number(ds)
    evicted = 0
    if day > int(time.day.numpy()):
        evicted = sum(ev.new_day(day) for ev in tables(model))
        time.day.assign(day)
    return evicted


def refresh(model) -> None:
    """Rebuild every online table's map and free rows (after a restore or a broadcast)."""
    for ev in tables(model):
        ev.refresh()


def snapshot(model, since_step: int | None = None) -> tuple[dict[str, TableRows], int]:
    """Each table's admitted rows, or (``since_step``) those looked up in training after it
    (``EmbeddingVariable.rows_since``); and the clock's step now (the newest version)."""
    rows = {table: part for ev in tables(model) for table, part in ev.rows_since(since_step).items()}
    return rows, int(clock(model).step.numpy())


def load_rows(model, rows: dict[str, TableRows]) -> None:
    """Make each table hold exactly its ``rows`` (by table name), then rebuild the maps.

    Raises:
        ValueError: a table ``rows`` lacks, or one with more ids than its ``max_capacity``.
    """
    for ev in tables(model):
        ev.set_rows(rows)  # a group takes each member's
    refresh(model)


def variable_names(model) -> frozenset[str]:
    """Names of every variable of the online tables (restored by id, ``EmbeddingVariable.load``,
    not by shape)."""
    return frozenset(
        variable_name(v)
        for ev in tables(model)
        for v in ev.row_variables + ev.summed_variables + ev.derived_variables
    )


def row_names(model) -> frozenset[str]:
    """Names of the variables with one entry per row (sharded with the rows)."""
    return frozenset(variable_name(v) for ev in tables(model) for v in ev.row_variables)


def summed_names(model) -> frozenset[str]:
    """Names of the per-process counts that add up to the job's (sketch and stats)."""
    return frozenset(variable_name(v) for ev in tables(model) for v in ev.summed_variables)
