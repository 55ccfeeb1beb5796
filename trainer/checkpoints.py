"""Checkpoints keyed by variable name, as EasyRec users read them.

A checkpoint ``<model_dir>/model.ckpt-<step>`` holds ``variables/<name>`` for every model
variable (``deepfm/input_layer/user_id/embedding_weights``), the optimizers with their slots,
``global_step`` and the input position (``epoch``, ``batch_in_epoch``). TensorFlow writes the
files first and only then rewrites the ``checkpoint`` state file (atomically), so a crash
during a save never makes a partial checkpoint the latest.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from recpipe.errors import PipelineError
from trainer.embedding_tables import (
    VALUE_SUFFIX,
    TableSlice,
    assign_rows,
    location,
    saved_layout,
    variable_name,
)
from trainer.online import SKETCH_DEPTH

log = logging.getLogger(__name__)


class CheckpointError(PipelineError):
    """A checkpoint or var map cannot be used (names the path or line)."""


def _decode(key: str) -> str:
    # tf.train.Checkpoint escapes "." as ".." and "/" as ".S" in dict keys
    return re.sub(r"\.(.)", lambda m: "/" if m.group(1) == "S" else m.group(1), key)


def resolve(path: str | Path) -> str:
    """A checkpoint prefix from a prefix or a directory (its latest checkpoint).

    Raises:
        CheckpointError: nothing restorable there.
    """
    path = str(path)
    if Path(path).is_dir():
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise CheckpointError(f"no checkpoint in directory {path}")
        return latest
    if not Path(path + ".index").exists():
        raise CheckpointError(f"no checkpoint at {path} ({path}.index missing)")
    return path


def list_variables(path: str | Path) -> list[tuple[str, list[int]]]:
    """(name, shape) of each model variable in a checkpoint (optimizer slots left out)."""
    out = []
    for key, shape in tf.train.list_variables(resolve(path)):
        if key.startswith("variables/") and key.endswith(VALUE_SUFFIX) and ".OPTIMIZER_SLOT" not in key:
            out.append((_decode(key[len("variables/") : -len(VALUE_SUFFIX)]), shape))
        elif key in ("global_step" + VALUE_SUFFIX,):
            out.append(("global_step", shape))
    return sorted(out)


def checkpoint_step(path: str | Path) -> int:
    """The ``global_step`` a checkpoint (prefix or directory) was saved at; 0 when it holds
    none.

    Raises:
        CheckpointError: nothing restorable there.
    """
    reader = tf.train.load_checkpoint(resolve(path))
    key = "global_step" + VALUE_SUFFIX
    return int(reader.get_tensor(key)) if reader.has_tensor(key) else 0


def read_var_map(path: str | Path) -> dict[str, str]:
    """``fine_tune_ckpt_var_map``: lines of ``name_in_current_model<TAB>name_in_checkpoint``.

    Blank lines and ``#`` comments are skipped.

    Raises:
        CheckpointError: a line without exactly two tab-separated names (names file and line).
    """
    mapping = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise CheckpointError(
                f"{path}:{n}: expected 'name_in_current_model<TAB>name_in_checkpoint', got {line!r}"
            )
        mapping[parts[0].strip()] = parts[1].strip()
    return mapping


@dataclass
class FineTuneReport:
    """What a fine-tune restore did, variable by variable."""

    checkpoint: str
    restored: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    shape_mismatch: list[str] = field(default_factory=list)
    slots_restored: list[str] = field(default_factory=list)
    slots_missing: list[str] = field(default_factory=list)  # no slot of that shape saved
    optimizer_iterations: dict[str, int] = field(default_factory=dict)


def saved_names(path: str | Path) -> dict[str, str]:
    """Variable name -> checkpoint key for every variable in a checkpoint, from its object
    graph. Optimizer slots are named ``<slot>/<variable>`` (``m/deepfm/.../embedding_weights``)
    and keyed ``optimizer_<i>/_variables/<n>/...``; the step counters ``optimizer_<i>/iteration``.

    Raises:
        CheckpointError: no checkpoint there.
    """
    reader = tf.train.load_checkpoint(resolve(path))
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    out = {}
    for node in graph.nodes:
        for attr in node.attributes:
            name = attr.full_name
            if attr.checkpoint_key.startswith("optimizer_") and name == "iteration":
                name = attr.checkpoint_key.split("/")[0] + "/iteration"
            out[name] = attr.checkpoint_key
    return out


def fine_tune_restore(
    variables: dict[str, tf.Variable],
    checkpoint: str | Path,
    var_map: dict[str, str] | None = None,
    optimizers: list | None = None,
) -> FineTuneReport:
    """Restore model variables by name from ``checkpoint`` (a prefix or a directory).

    Each variable ``n`` is read from ``var_map.get(n, n)``; with a var map, only the mapped
    variables are restored. Variables not found, or found with another shape, are listed in
    the report and logged as warnings, never skipped silently. The global step is not
    restored: fine-tuning starts at step 0 (EasyRec's ``fine_tune_checkpoint``).

    With ``optimizers`` (tf-keras optimizers, built), the slots of every restored variable
    are restored too, by slot and variable name whichever optimizer held them yesterday
    (``m``/``v`` of Adam and LazyAdam, ``accumulator``/``linear`` of Adagrad and FTRL), and
    each optimizer with a restored slot takes the step count of the optimizer they came
    from, so that Adam's bias correction fits the restored moments. Incremental training then
    continues the moments and accumulators instead of restarting them (PaddleRec's online
    learning keeps them too); the learning-rate schedule continues with the step count.

    Raises:
        CheckpointError: no checkpoint there.
    """
    path = resolve(checkpoint)
    reader = tf.train.load_checkpoint(path)
    shapes = {
        _decode(k[len("variables/") : -len(VALUE_SUFFIX)]): s
        for k, s in tf.train.list_variables(path)
        if k.startswith("variables/") and k.endswith(VALUE_SUFFIX) and ".OPTIMIZER_SLOT" not in k
    }
    report = FineTuneReport(path)
    names = list(var_map) if var_map else list(variables)
    for name in names:
        if name not in variables:
            raise CheckpointError(f"fine_tune_ckpt_var_map names {name!r}, which the current model lacks")
        old = (var_map or {}).get(name, name)
        var = variables[name]
        if old not in shapes:
            report.missing.append(name)
        elif list(shapes[old]) != var.shape.as_list():
            report.shape_mismatch.append(f"{name}: model {var.shape.as_list()} vs checkpoint {shapes[old]}")
        else:
            key = "variables/" + old.replace(".", "..").replace("/", ".S") + VALUE_SUFFIX
            var.assign(reader.get_tensor(key))
            report.restored.append(name)
    if optimizers:
        _restore_slots(optimizers, path, reader, variables, var_map or {}, report)
    log.info(
        "fine-tune from %s: %d variables, %d optimizer slots restored",
        path,
        len(report.restored),
        len(report.slots_restored),
    )
    for name in report.missing:
        log.warning("fine-tune: %s not in checkpoint %s, kept its initial value", name, path)
    for line in report.shape_mismatch:
        log.warning("fine-tune: shape mismatch, not restored: %s", line)
    return report


GROUPS_KEY = "online_groups"


def online_groups(evs: list) -> tf.Variable:
    """Which tables each online group holds, saved with the checkpoint (``online_groups``:
    JSON ``{group variable scope: {table: tag}}``) so that its rows can be read per table
    (``saved_online_tables``) and restored into any grouping."""
    doc = {
        variable_name(ev.keys).rsplit("/", 1)[0]: dict(zip(ev.members, ev.tags, strict=True))
        for ev in evs
        if ev.grouped
    }
    return tf.Variable(json.dumps(doc, sort_keys=True), dtype=tf.string, trainable=False)


@dataclass
class SavedTable:
    """One online table's rows in a checkpoint, whether it was saved alone or in a group.

    Attributes:
        ids: ``int64 [n]`` the admitted ids (as the data holds them).
        freqs, versions, days: ``int64 [n]`` their state.
        arrays: ``float32 [n, dim]`` per saved view and optimizer slot, by the table's own
            names (``<scope>/<table>/embedding_weights``, ``m/<scope>/<table>/...``).
        source: the variable scope it was saved under (``<scope>/<table or group>``).
        tag: the table's tag in that group (0 alone).
    """

    ids: np.ndarray
    freqs: np.ndarray
    versions: np.ndarray
    days: np.ndarray
    arrays: dict[str, np.ndarray]
    source: str
    tag: int


def saved_online_tables(path: str | Path) -> dict[str, SavedTable]:
    """Every online table in a checkpoint by ``<scope>/<table>`` (a group split by its rows'
    tags, ``online_groups``).

    Raises:
        CheckpointError: no checkpoint there.
    """
    path = resolve(path)
    return _online_tables(tf.train.load_checkpoint(path), saved_names(path))


def _online_tables(reader, saved: dict, arrays: bool = True) -> dict[str, SavedTable]:
    """``saved_online_tables`` from an open ``reader`` and its ``saved_names``; without
    ``arrays`` the views and slots are not read (``SavedTable.arrays`` empty)."""
    key = GROUPS_KEY + VALUE_SUFFIX
    groups = json.loads(reader.get_tensor(key)) if reader.has_tensor(key) else {}
    out = {}
    for name, ckpt_key in sorted(saved.items()):
        if not name.endswith("/ev_keys") or ckpt_key.startswith("optimizer_"):
            continue
        source = name.rsplit("/", 1)[0]
        scope, table = source.rsplit("/", 1)

        def read(field, source=source):
            return reader.get_tensor(saved[f"{source}/ev_{field}"])

        keys = read("keys")
        # the views and slots of this table or group, in any layer: <...>/<table>/embedding_weights
        suffix = f"/{table}/embedding_weights"
        values = {n: reader.get_tensor(k) for n, k in saved.items() if arrays and n.endswith(suffix)}
        members = groups.get(source, {table: 0})
        tags = read("tables") if source in groups else np.zeros_like(keys)
        state = {f: read(f) for f in ("freqs", "versions", "days")}
        for member, tag in members.items():
            index = np.flatnonzero((keys >= 0) & (tags == tag))
            out[f"{scope}/{member}"] = SavedTable(
                keys[index] ^ tag,
                *(state[f][index] for f in ("freqs", "versions", "days")),
                {n.replace(suffix, f"/{member}/embedding_weights"): v[index] for n, v in values.items()},
                source,
                int(tag),
            )
    return out


def restore_embedding_variables(evs: list, checkpoint: str | Path, owner=None) -> dict[str, int]:
    """Restore online tables (``EmbeddingVariable``) by name from ``checkpoint``: each takes
    the saved rows of the ids it owns (``owner``: an embedding-parallel ``Sharding``, or None
    for all), with their optimizer slots, whatever world size, ``max_capacity`` or grouping
    wrote them (``EmbeddingVariable.load``; a group takes each member's rows by table name).
    The admission sketch and counts are kept where the table or group was saved as it is
    now, and start empty otherwise. A table the checkpoint lacks keeps its empty state.

    Returns:
        table or group (``<layer scope>/<name>``) -> rows restored.

    Raises:
        CheckpointError: no checkpoint there.
    """
    if not evs:
        return {}
    path = resolve(checkpoint)
    reader = tf.train.load_checkpoint(path)
    saved = saved_names(path)
    tables = _online_tables(reader, saved)
    out = {}
    for ev in evs:
        base = variable_name(ev.keys).rsplit("/", 1)[0]
        scope = base.rsplit("/", 1)[0]
        found = [(m, tag, tables.get(f"{scope}/{m}")) for m, tag in zip(ev.members, ev.tags, strict=True)]
        for member, _, table in found:
            if table is None:
                log.warning("online table %s/%s not in checkpoint %s: it starts empty", scope, member, path)
        found = [f for f in found if f[2] is not None]
        if not found:
            continue
        values = {
            "keys": np.concatenate([t.ids ^ tag for _, tag, t in found]),
            "tables": np.concatenate([np.full(len(t.ids), tag, np.int64) for _, tag, t in found]),
            **{f: np.concatenate([getattr(t, f) for *_, t in found]) for f in ("freqs", "versions", "days")},
        }
        same = len(found) == len(ev.members) and all(t.source == base for *_, t in found)
        if same:  # saved as it is now: its sketch and counts hold
            values["sketch"] = reader.get_tensor(saved[f"{base}/ev_filter_counts"])
            values["stats"] = reader.get_tensor(saved[f"{base}/ev_stats"])
        else:
            values["sketch"] = np.zeros(int(ev.counter.width().numpy()) * SKETCH_DEPTH, np.float32)
            values["stats"] = np.zeros(ev.stats.shape, np.int64)

        def joined(name: str, ev=ev, found=found):
            # the rows of `name` (a view or slot of ev) of every member, by the member's names
            parts = [t.arrays.get(ev.member_name(name, m)) for m, _, t in found]
            return None if any(p is None for p in parts) else np.concatenate(parts)

        weights = [joined(variable_name(v.weights)) for v in ev.views]
        slots = [joined(variable_name(slot)) for slot, _ in ev.optimizer_slots]
        out[base] = ev.load(values, weights, slots, owner)
        ev.refresh()
    log.info("online tables restored from %s: %s rows", path, out)
    return out


def restore_by_name(state, checkpoint: str | Path, owner=None) -> None:
    """Resume a ``trainer.state.TrainState`` from a checkpoint by variable and slot name, as
    ``tf.train.Checkpoint.restore`` would, but into sharded tables too: a ``TableSlice``
    keeps this rank's rows of each saved table, each slot of a sharded variable this
    rank's rows of the saved slot, and each online table the ids ``owner`` (a ``Sharding``)
    gives this rank, whatever world size wrote the checkpoint.

    Raises:
        CheckpointError: no checkpoint there, or it lacks a model variable, a slot or a counter.
    """
    path = resolve(checkpoint)
    partial = tf.train.Checkpoint(
        variables=state.static_variables(),
        global_step=state.global_step,
        epoch=state.epoch,
        batch_in_epoch=state.batch_in_epoch,
    )
    try:
        partial.restore(path).expect_partial().assert_existing_objects_matched()
    except AssertionError as err:
        raise CheckpointError(f"checkpoint {path} does not fit this model: {err}") from None
    reader = tf.train.load_checkpoint(path)
    static = state.static_variables()
    report = FineTuneReport(path, restored=list(static))
    _restore_slots(state.optimizers, path, reader, static, {}, report)
    if report.slots_missing:
        missing = report.slots_missing
        raise CheckpointError(f"checkpoint {path} lacks optimizer slots {missing[:5]} ({len(missing)})")
    saved = saved_names(path)
    for i, opt in enumerate(state.optimizers):
        opt.iterations.assign(reader.get_tensor(saved[f"optimizer_{i}/iteration"]))
    restore_embedding_variables(state.evs, path, owner)


def _restore_slots(
    optimizers, path: str, reader, variables: dict, var_map: dict[str, str], report: FineTuneReport
) -> None:
    saved = saved_names(path)
    layout = saved_layout(reader)
    restored = set(report.restored)
    # slot rows of each restored table: (name in the model, rows in the model's variable)
    parts: dict[str, list[tuple[str, int, int]]] = {}
    for name, var in variables.items():
        if name in restored:
            fused, offset, rows = location(var)
            parts.setdefault(fused, []).append((name, offset, rows))
    cache: dict[str, object] = {}

    def saved_rows(slot_name: str, old: str):
        if old in layout:  # a table in a fused variable of the checkpoint
            fused, offset, rows = layout[old]
        else:
            fused, offset, rows = old, 0, None
        key = saved.get(f"{slot_name}/{fused}")
        if key is None or not key.startswith("optimizer_"):
            return None, None
        if key not in cache:
            cache[key] = reader.get_tensor(key)
        value = cache[key]
        return value[offset : offset + rows] if rows is not None else value, key

    for opt in optimizers:
        sources = []
        for slot in opt.variables:
            slot_name, _, var_name = variable_name(slot).partition("/")
            for name, offset, rows in parts.get(var_name, []):
                value, key = saved_rows(slot_name, var_map.get(name, name))
                if value is not None and isinstance(variables[name], TableSlice):
                    value = variables[name].local(value)  # this rank's rows of a sharded table
                if value is None or [rows, *slot.shape.as_list()[1:]] != list(value.shape):
                    report.slots_missing.append(f"{slot_name}/{name}")
                    continue
                assign_rows(slot, offset, value)
                report.slots_restored.append(f"{slot_name}/{name}")
                sources.append(key.split("/")[0])
        if sources:
            source = max(set(sources), key=sources.count)
            step = int(reader.get_tensor(saved[f"{source}/iteration"]))
            opt.iterations.assign(step)
            report.optimizer_iterations[opt.name] = step


def list_online_tables(path: str | Path) -> list[tuple[str, int, int]]:
    """(table, rows used, capacity) of each online table (``ev_params``) in a checkpoint
    (the capacity of a group's tables is the group's).

    Raises:
        CheckpointError: no checkpoint there.
    """
    path = resolve(path)
    reader = tf.train.load_checkpoint(path)
    saved = saved_names(path)
    shapes = reader.get_variable_to_shape_map()
    out = []
    for name, table in _online_tables(reader, saved, arrays=False).items():
        out.append((name, len(table.ids), int(shapes[saved[f"{table.source}/ev_keys"]][0])))
    return sorted(out)
