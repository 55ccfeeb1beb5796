"""Embedding tables: their shapes, the fused-variable layout, row slices and assignments,
parameter-server placement, and the checkpoint names they are saved under. The embedding
layer (``trainer.layers.embedding``) builds them; checkpoints, the train state and the
distributions read them here.

Tables of one width live in one fused variable (``embedding_weights_dim<dim>``), stacked at
row offsets; a ``TableSlice`` is one table inside it, saved to checkpoints as
``<scope>/<table>/embedding_weights`` so names stay as EasyRec users know them. With
embedding-parallel sharding a fused variable holds only this rank's rows; with parameter
servers it may be a ``ShardedVariable`` partitioned across them.
"""

from __future__ import annotations

import json

import tensorflow as tf
from tensorflow.python.distribute import values as distribute_values
from tensorflow.python.distribute.sharded_variable import ShardedVariable
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.trackable.base import Trackable

from recpipe.config.data import FeatureSpec
from recpipe.config.errors import ConfigError

VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


class EmbeddingConfigError(ConfigError):
    """Features sharing a table disagree on its shape, or a table has no size."""


def table_shapes(features: list[FeatureSpec], dim: int | None = None) -> dict[str, tuple[int, int]]:
    """Table name -> (rows, dim) for id / tag features without ``ev_params``; ``dim``
    overrides embedding_dim.

    Raises:
        EmbeddingConfigError: a feature lacks ``hash_bucket_size`` and ``num_buckets``, or
            features sharing an
            ``embedding_name`` differ in size or dimension.
    """
    shapes: dict[str, tuple[int, int]] = {}
    for f in features:
        if f.ev_params is not None:
            continue  # an online table (trainer.online.table_specs)
        if f.table_rows is None:
            raise EmbeddingConfigError(
                f"feature_config: {f.name!r} needs hash_bucket_size or num_buckets for an embedding table"
            )
        table = f.embedding_name or f.name
        shape = (f.table_rows, dim or f.embedding_dim)
        if shapes.setdefault(table, shape) != shape:
            raise EmbeddingConfigError(
                f"feature_config: features sharing embedding_name {table!r} need one table size and "
                f"embedding_dim, got {shapes[table]} and {shape}"
            )
    return shapes


def assign_rows(variable: tf.Variable, offset: int, value) -> tf.Operation:
    """``variable[offset : offset + len(value)] = value``, on every replica of a mirrored
    variable too (a sliced ``assign`` of a ``MirroredVariable`` writes only its primary copy)."""
    value = tf.convert_to_tensor(value, variable.dtype)
    rows = tf.range(offset, offset + tf.shape(value)[0])
    return variable.scatter_update(tf.IndexedSlices(value, rows))


def base_name(variable) -> str:
    """A variable's name without ``:0``; a ``ShardedVariable``'s (partitioned across ps) is its
    first part's without ``/part_0``."""
    if isinstance(variable, ShardedVariable):
        return variable.variables[0].name.split(":")[0].rsplit("/part_", 1)[0]
    return variable.name.split(":")[0]


class TableSlice(Trackable):
    """One table inside a fused variable: global rows ``[offset, offset + rows)`` of ``fused``.

    Saved to and restored from checkpoints as a variable of its own (key
    ``.../<table>/embedding_weights/.ATTRIBUTES/VARIABLE_VALUE``, float32 ``[rows, dim]``).
    With a ``sharding`` (``EmbeddingParallelStrategy``), ``fused`` holds only this rank's rows;
    the table's rows there are the contiguous local range ``[local_offset, local_offset +
    local_rows)``, ``value()`` returns them, and ``assign`` takes the whole table and keeps
    this rank's rows (so a checkpoint restores to any world size).

    Attributes:
        shape: the whole table's shape ``[rows, dim]``.
    """

    def __init__(self, fused: tf.Variable, offset: int, rows: int, table: str, sharding=None):
        self.fused, self.offset, self.rows, self.sharding = fused, offset, rows, sharding
        if sharding is None:
            self.local_offset, self.local_rows = offset, rows
        else:
            self.local_offset = sharding.rows(offset)
            self.local_rows = sharding.rows(offset + rows) - self.local_offset
        self.name = f"{base_name(fused).rsplit('/', 1)[0]}/{table}/embedding_weights:0"
        self.shape = tf.TensorShape([rows, fused.shape[1]])
        self.dtype = fused.dtype

    def value(self) -> tf.Tensor:
        """``float32 [local_rows, dim]``: this table's rows of the fused variable.

        A gather of the rows (``ResourceGather``), not a slice: slicing a variable first reads
        all of it, and a checkpoint save holds every table's tensor until it writes, so with
        26 tables of one width the save held 26 copies of the fused variable (3.7 GB for
        26 x 100,000 x 16 rows, issue 40)."""
        if isinstance(self.fused, ShardedVariable):
            return self.fused[self.local_offset : self.local_offset + self.local_rows]
        rows = tf.range(self.local_offset, self.local_offset + self.local_rows, dtype=tf.int64)
        return tf.gather(self.fused, rows)

    def numpy(self):
        return self.value().numpy()

    def local(self, table_rows):
        """This rank's rows of a whole-table array ``[rows, ...]`` (all of it unsharded)."""
        return table_rows if self.sharding is None else self.sharding.local(table_rows, self.offset)

    def assign(self, value):
        return assign_rows(self.fused, self.local_offset, self.local(value))

    def _serialize_to_tensors(self):
        return {"VARIABLE_VALUE": self.value()}

    def _restore_from_tensors(self, restored_tensors):
        return self.assign(restored_tensors["VARIABLE_VALUE"])


def variable_name(var: tf.Variable) -> str:
    """A variable's checkpoint name: its TensorFlow name without ``:0`` (a ``ShardedVariable``'s:
    its first part's without ``/part_0``)."""
    if isinstance(var, ShardedVariable):
        return var.variables[0].name.split(":")[0].removesuffix("/part_0")
    return var.name.split(":")[0]


def name_map(variables: list[tf.Variable]) -> dict[str, tf.Variable]:
    """Name -> variable; names must be unique (every layer is named explicitly).

    Raises:
        ValueError: two variables share a name (a model built without explicit names).
    """
    out: dict[str, tf.Variable] = {}
    for var in variables:
        name = variable_name(var)
        if name in out:
            raise ValueError(f"two variables are named {name!r}")
        out[name] = var
    return out


LAYOUT_KEY = "embedding_layout"


def location(var, local: bool = True) -> tuple[str, int, int]:
    """(variable holding it, first row, rows) of a model variable or a ``TableSlice``: in this
    process's variable, or (``local=False``) in the unsharded layout checkpoints hold."""
    if isinstance(var, TableSlice):
        if local:
            return base_name(var.fused), var.local_offset, var.local_rows
        return base_name(var.fused), var.offset, var.rows
    return variable_name(var), 0, var.shape[0] if var.shape.rank else 1


def checkpoint_map(model) -> dict[str, tf.Variable | TableSlice]:
    """Name -> what a checkpoint saves for each model variable: fused embedding variables
    are replaced by their tables (``TableSlice``), so checkpoints keep one entry per table,
    and a dense weight partitioned across ps by its ``ShardedVariable`` (saved whole)."""
    tables: dict = {}
    for module in model.submodules:
        for table in getattr(module, "tables", {}).values():
            if isinstance(table, TableSlice):
                # a fused variable partitioned across ps lists its parts as model variables
                fused = table.fused
                parts = list(fused.variables) if isinstance(fused, ShardedVariable) else [fused]
                tables.setdefault(parts[0].ref(), []).append(table)
                for part in parts[1:]:
                    tables[part.ref()] = []
        # a dense weight partitioned across ps (a kernel over 256 KiB) is saved whole, under its
        # own name, as every other strategy saves it
        for value in vars(module).values():
            if isinstance(value, ShardedVariable) and value.variables[0].ref() not in tables:
                tables[value.variables[0].ref()] = [value]
                for part in value.variables[1:]:
                    tables[part.ref()] = []
    out: list = []
    for var in model.variables:
        out.extend(tables.get(var.ref(), [var]))
    return name_map(out)


def embedding_layout(variables: dict) -> tf.Variable:
    """Where each table sits in its fused variable, saved with the checkpoint
    (``embedding_layout``: JSON ``{table: [fused variable, first row, rows]}``) so that a
    fine-tune can take the optimizer slots of each table by name."""
    layout = {n: list(location(v, local=False)) for n, v in variables.items() if isinstance(v, TableSlice)}
    return tf.Variable(json.dumps(layout, sort_keys=True), dtype=tf.string, trainable=False)


def saved_layout(reader) -> dict[str, tuple[str, int, int]]:
    key = LAYOUT_KEY + VALUE_SUFFIX
    if not reader.has_tensor(key):
        return {}
    return {k: tuple(v) for k, v in json.loads(reader.get_tensor(key)).items()}


def placement(model) -> list[str]:
    """One line per fused table variable partitioned across ps: its rows, parts and devices."""
    out = []
    for layer in model.submodules:
        tables = getattr(layer, "fused", None)  # batch norm's ``fused`` is a flag, not tables
        for fused in tables.values() if isinstance(tables, dict) else ():
            if isinstance(fused, ShardedVariable):
                devices = ", ".join(f"{v.shape[0]} on {v.device}" for v in fused.variables)
                out.append(
                    f"{base_name(fused)}: {fused.shape[0]} rows in {len(fused.variables)} parts ({devices})"
                )
    return out


def is_sharded(model) -> bool:
    """Whether ``model``'s embedding layers hold only this rank's rows (embedding-parallel)."""
    return any(getattr(layer, "sharding", None) is not None for layer in model.submodules)


def sharded_names(model) -> frozenset[str]:
    """Names of the fused tables that hold only this rank's rows (embedding-parallel; the
    online tables' are ``trainer.online.row_names``)."""
    names: set[str] = set()
    for layer in model.submodules:
        if getattr(layer, "sharding", None) is not None:
            names |= {variable_name(v) for v in getattr(layer, "fused", {}).values()}
    return frozenset(names)


def plain_variable(variable) -> bool:
    """A variable of this process (not a distributed or sharded one): fused kernels and
    ``VariableShape`` take its handle."""
    return isinstance(variable, resource_variable_ops.BaseResourceVariable) and not isinstance(
        variable, distribute_values.DistributedValues
    )


def rows_of(variable) -> tf.Tensor:
    """``int64 []``: the first dimension of ``variable``, read from its shape only.
    ``tf.shape(variable)`` reads the whole value, and a scatter or in-place update of it later
    in the step then copies every row first (copy on write of a buffer still shared)."""
    if plain_variable(variable):
        return tf.raw_ops.VariableShape(input=variable.handle, out_type=tf.int64)[0]
    return tf.shape(variable, out_type=tf.int64)[0]


_UNIQUE = "_recpipe_unique_rows"  # an attribute of a traced row tensor


def gather_unique(variable, rows: tf.Tensor) -> tf.Tensor:
    """``tf.gather(variable, rows)`` for ``rows`` (``int64 [U]``) known to be distinct: the
    gradient's ``tf.IndexedSlices`` then already has one entry per row, and
    ``sums_duplicates`` tells the optimizers so (tf-keras would sum duplicates again: a
    ``tf.unique`` over the rows and a segment sum a step)."""
    rows = tf.identity(rows)
    if not tf.executing_eagerly():
        setattr(rows, _UNIQUE, True)
    return tf.gather(variable, rows)


def sums_duplicates(grad: tf.IndexedSlices) -> bool:
    """Whether ``grad`` (a table's gradient) may hold a row more than once: False only for the
    gradient of one ``gather_unique`` (its indices the reshaped rows) or of one
    ``trainer.kernels.gather_rows``; a gradient of several lookups of one table concatenates
    theirs."""
    op = grad.indices.op if hasattr(grad.indices, "op") else None
    if op is not None and op.type == "RecpipeGatherRowsGrad":
        return False
    if op is None or op.type != "Reshape":
        return True
    return not getattr(op.inputs[0], _UNIQUE, False)
