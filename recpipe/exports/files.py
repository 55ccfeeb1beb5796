"""The parameter files of base and delta exports (``trainer.delta`` writes them from a model):
their format, their manifests, a day's chain of exports, and applying a delta to parameters.
No TensorFlow here: an online store or another language's server reads these files alone.

::

    <day_dir>/base/                     a SavedModel (saved_model.pb, variables/, assets.extra/)
              base/params/              every admitted row, in the format below
              delta-<pass>/params/      the rows looked up in training since the previous export,
                                        the ids evicted since then, every other weight
              */manifest.json, _SUCCESS manifest (below), then the marker, written last

    params/tables/<table>.parquet       id (int64) + one fixed_size_list<float32>[dim] column
                                        per layer reading the table (named by its variable)
    params/tombstones/<table>.parquet   id (int64): evicted since the previous export
    params/dense.npz                    every other model variable by name (MLP, hashed tables)
    params/normalization.json           the dense constants serving applies

``manifest.json``: ``kind`` (base / delta), ``day``, ``name`` (``base``, ``delta-<pass>``),
``sequence`` (0 for the base, then 1, 2, ...), ``follows`` and ``follows_ev_step`` (the previous
export's name and ``ev_step``: a delta applies to that export only),
``global_step``, ``ev_step`` (the online tables' clock at the export), ``pass`` (the key,
``HH`` or ``HHMM``, of the pass whose model it holds, when known), ``model_dir`` (the model
exported, when known), ``rebased`` (a delta of a model that does not continue the export
before it: it holds every admitted row), per table ``rows`` /
``tombstones`` / ``rows_used``, and each file's ``bytes`` and ``sha256``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recpipe.digest import file_sha256
from recpipe.errors import PipelineError
from recpipe.layout import SUCCESS, is_finished

BASE = "base"  # the directory name of a day's base export
DELTA_PREFIX = "delta-"
MANIFEST = "manifest.json"
ID = "id"


class DeltaError(PipelineError):
    """A delta cannot be exported or applied (names the directory, table or file)."""


@dataclass
class TableRows:
    """Some rows of one online table: ids ``int64 [n]``, each view's rows ``float32 [n, dim]``
    by variable name, and ``tombstones`` (ids ``int64 [m]`` no longer in the table)."""

    ids: np.ndarray
    views: dict[str, np.ndarray]
    tombstones: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


@dataclass
class Params:
    """What serving needs of a model: its online tables' rows, every other model variable
    (``dense``, by name) and the dense normalisation constants."""

    tables: dict[str, TableRows]
    dense: dict[str, np.ndarray]
    normalization: dict


def write_params(params: Params, directory: Path) -> dict[str, dict]:
    """Write ``params`` under ``directory`` (see the module docstring). Returns each file's
    ``{bytes, sha256}`` by path relative to ``directory``'s parent."""
    (directory / "tables").mkdir(parents=True)
    (directory / "tombstones").mkdir()
    for table, rows in params.tables.items():
        columns = {ID: pa.array(rows.ids, pa.int64())}
        for name, values in rows.views.items():
            dim = values.shape[1]
            flat = pa.array(np.ascontiguousarray(values, np.float32).reshape(-1), pa.float32())
            columns[name] = pa.FixedSizeListArray.from_arrays(flat, dim)
        pq.write_table(pa.table(columns), directory / "tables" / f"{table}.parquet")
        pq.write_table(
            pa.table({ID: pa.array(rows.tombstones, pa.int64())}),
            directory / "tombstones" / f"{table}.parquet",
        )
    np.savez(directory / "dense.npz", **params.dense)
    (directory / "normalization.json").write_text(json.dumps(params.normalization, sort_keys=True))
    root = directory.parent
    return {
        str(p.relative_to(root)): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def read_params(export: Path, verify: bool = True) -> Params:
    """The ``params/`` of a base or delta directory: the tables its manifest lists, no other
    file that happens to lie there.

    Raises:
        DeltaError: the export is unfinished, a listed file is missing, or (``verify``) a
            file's checksum differs from its manifest's.
    """
    manifest = read_manifest(export)
    if verify:
        for rel in manifest["files"]:
            _check(export, manifest, rel)
    directory = export / "params"
    tables = {}
    for table in sorted(manifest["tables"]):
        path = directory / "tables" / f"{table}.parquet"
        data = _read_table(export, path)
        views = {
            name: np.asarray(data[name].combine_chunks().flatten(), np.float32).reshape(
                data.num_rows, data.schema.field(name).type.list_size
            )
            for name in data.column_names
            if name != ID
        }
        tombstones = _read_table(export, directory / "tombstones" / path.name)[ID].to_numpy()
        tables[table] = TableRows(data[ID].to_numpy(), views, tombstones)
    with np.load(directory / "dense.npz") as dense:
        values = {k: dense[k] for k in dense.files}
    normalization = json.loads((directory / "normalization.json").read_text())
    return Params(tables, values, normalization)


def _read_table(export: Path, path: Path, columns: list[str] | None = None) -> pa.Table:
    try:
        return pq.read_table(path, columns=columns)
    except (OSError, pa.ArrowException) as err:
        raise DeltaError(f"{path}: cannot read a file of {export / MANIFEST} ({err})") from None


def _check(export: Path, manifest: dict, rel: str) -> None:
    """Raise ``DeltaError`` unless ``export/rel`` exists with its manifest's checksum."""
    path = export / rel
    want = manifest["files"].get(rel)
    if want is None:
        raise DeltaError(f"{path}: not listed in {export / MANIFEST}")
    if not path.is_file():
        raise DeltaError(f"{path}: missing, though {export / MANIFEST} lists it")
    if file_sha256(path) != want["sha256"]:
        raise DeltaError(f"{path}: checksum differs from {export / MANIFEST}")


def read_manifest(export: Path) -> dict:
    """An export's ``manifest.json``.

    Raises:
        DeltaError: the directory is not a finished export (no ``_SUCCESS``).
    """
    if not is_finished(export):
        raise DeltaError(f"{export} is not a finished export (no {SUCCESS})")
    return json.loads((export / MANIFEST).read_text())


def chain(day_dir: Path) -> list[Path]:
    """The finished exports of a day, base first, then its deltas in ``sequence`` order.

    Raises:
        DeltaError: no finished base.
    """
    base = day_dir / BASE
    if not is_finished(base):
        raise DeltaError(f"{day_dir}: no finished {BASE}/ to apply deltas to")
    deltas = [p for p in day_dir.glob(f"{DELTA_PREFIX}*") if is_finished(p)]
    return [base, *sorted(deltas, key=lambda p: read_manifest(p)["sequence"])]


def pass_of(export: Path) -> str | None:
    """The pass (``HH`` or ``HHMM``, ``recpipe.layout.pass_key``) whose model an export holds:
    its manifest's ``pass``, else a delta's name (``delta-<pass>``); None for a base that does
    not record it. Keys of one model's passes sort as their starts."""
    recorded = read_manifest(export).get("pass")
    if recorded is not None:
        return str(recorded)
    return export.name.removeprefix(DELTA_PREFIX) if export.name.startswith(DELTA_PREFIX) else None


def previous_export(day_dir: Path, name: str, pass_key: str | None = None) -> list[Path]:
    """The exports that export ``name`` of ``day_dir``, made by pass ``pass_key`` (``HH`` or ``HHMM``;
    default: a delta's own name), follows: the day's chain before it (the whole chain for a
    new pass; a re-run replaces its own export only when no later pass exported). Empty for
    a new day's base.

    A pass re-run after a later pass exported (pass 05 failed, 06 exported from 04, 05
    cleared) is refused: its delta would follow the later pass's export though its model
    never trained that pass, so the rows it trained would be skipped and the ids the later
    pass admitted turned into tombstones.

    Raises:
        DeltaError: later passes exported (names them and the way out), or a delta without a
            finished base.
    """
    target = day_dir / name
    if name == BASE and not is_finished(target):
        return []
    exports = chain(day_dir)
    mine = pass_key if pass_key is not None else name.removeprefix(DELTA_PREFIX)
    if name == BASE:
        later = exports[1:]
    else:
        later = [p for p in exports if p != target and (h := pass_of(p)) is not None and h > mine]
    if later:
        raise DeltaError(
            f"{target}: the day's chain already holds {[p.name for p in later]}, exported by later "
            f"passes from models that never trained this one; an export of it now would not "
            "follow them and would lose rows in serving. Leave this pass as it is (in Airflow, "
            "mark the failed task successful: the pass stays untrained, the chain and the store "
            "stay consistent); the next day's base starts a new chain"
        )
    return [p for p in exports if p != target]


def apply(params: Params, delta: Params) -> Params:
    """``params`` with ``delta`` applied: its rows replace or add, its tombstones delete, its
    dense weights and normalisation replace.

    Raises:
        DeltaError: the delta names a table or view ``params`` lacks.
    """
    tables = {}
    for table, rows in params.tables.items():
        change = delta.tables.get(table)
        if change is None:
            tables[table] = rows
            continue
        if set(change.views) != set(rows.views):
            raise DeltaError(f"table {table}: delta views {sorted(change.views)} != {sorted(rows.views)}")
        gone = np.isin(rows.ids, np.concatenate([change.ids, change.tombstones]))
        ids = np.concatenate([rows.ids[~gone], change.ids])
        views = {n: np.concatenate([v[~gone], change.views[n]]) for n, v in rows.views.items()}
        tables[table] = TableRows(ids, views)
    extra = set(delta.tables) - set(params.tables)
    if extra:
        raise DeltaError(f"delta has tables {sorted(extra)} the base lacks")
    return Params(tables, {**params.dense, **delta.dense}, delta.normalization)


def alive_ids(exports: list[Path]) -> dict[str, np.ndarray]:
    """Each table's ids after a chain of exports (base ids, plus each delta's rows, less its
    tombstones; ``int64 [n]``, sorted), read from the id columns of the files each manifest
    lists, checksums verified.

    Raises:
        DeltaError: an unfinished export, or a missing or damaged file.
    """
    alive: dict[str, np.ndarray] = {}  # sorted, unique (numpy: a base holds millions of ids)
    for export in exports:
        manifest = read_manifest(export)
        for table in sorted(manifest["tables"]):
            rows, gone = f"params/tables/{table}.parquet", f"params/tombstones/{table}.parquet"
            for rel in (rows, gone):
                _check(export, manifest, rel)
            ids = np.union1d(
                alive.get(table, np.zeros(0, np.int64)),
                _read_table(export, export / rows, [ID])[ID].to_numpy().astype(np.int64),
            )
            dropped = _read_table(export, export / gone, [ID])[ID].to_numpy().astype(np.int64)
            alive[table] = ids[~np.isin(ids, dropped)]
    return alive


def follows(manifest: dict, previous: dict) -> bool:
    """The export of ``manifest`` comes right after the one of ``previous`` (same day, its name
    and its ``ev_step``)."""
    return (
        manifest["day"] == previous["day"]
        and manifest["follows"] == previous["name"]
        and manifest["follows_ev_step"] == previous["ev_step"]
    )


KIND_BASE, KIND_DELTA = "base", "delta"  # a manifest's ``kind``


def is_base(manifest: dict) -> bool:
    """Whether ``manifest`` is a base's (it follows nothing: applying it replaces the rows)."""
    return manifest["kind"] == KIND_BASE


def new_manifest(day: str, name: str, sequence: int, previous, global_step, ev_step, params, files):
    """A ``manifest.json`` document (see the module docstring): a delta's when it has a
    ``previous`` export's manifest to follow, a base's otherwise; ``rows_used`` filled by the
    caller."""
    return {
        "kind": KIND_DELTA if previous else KIND_BASE,
        "day": day,
        "name": name,
        "sequence": sequence,
        "follows": previous["name"] if previous else None,
        "follows_ev_step": previous["ev_step"] if previous else None,
        "global_step": global_step,
        "ev_step": ev_step,
        "tables": {
            t: {"rows": len(r.ids), "tombstones": len(r.tombstones), "rows_used": None}
            for t, r in params.tables.items()
        },
        "files": files,
    }


def write_export(
    day_dir: Path, name: str, sequence: int, previous, params: Params, global_step, ev_step
) -> dict:
    """Publish ``params`` as the export ``<day_dir>/<name>`` (a base when ``previous``, the
    manifest it follows, is None; else a delta): its ``params/``, ``manifest.json`` and
    ``_SUCCESS``, written in a temporary directory and renamed into place. For exports made
    without a model (tests, ``bench/push.py``); ``trainer.delta`` writes a trained model's.

    Returns:
        The manifest document.
    """
    from recpipe import atomic

    with atomic.directory(Path(day_dir) / name) as tmp:
        files = write_params(params, tmp / "params")
        doc = new_manifest(Path(day_dir).name, name, sequence, previous, global_step, ev_step, params, files)
        (tmp / MANIFEST).write_text(json.dumps(doc))
        (tmp / SUCCESS).touch()
    return doc
