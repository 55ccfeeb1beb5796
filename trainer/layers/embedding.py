"""Hashed embedding lookups for id and tag features (EasyRec's ``input_layer``).

Each table is ``[hash_bucket_size, dim]``, named ``<table>/embedding_weights`` where
``<table>`` is the feature's ``embedding_name`` (shared tables) or its name. Ids follow
``recpipe.ids``: FarmHash Fingerprint64 of the clean string modulo ``hash_bucket_size``.

Tables of one width live in one fused variable (``embedding_weights_dim<dim>``), stacked
at row offsets, so that a batch's id features are looked up by one gather and the optimizer
updates one ``tf.IndexedSlices`` instead of one per table (26 Criteo tables: ~2,900 graph ops
a step become ~500). Checkpoints still hold one ``<table>/embedding_weights`` entry per table
(``TableSlice``), so names, ``fine_tune_ckpt_var_map`` and ``recpipe ckpt list`` are as
EasyRec users know them, and checkpoints written before tables were fused still restore.

Features with ``ev_params`` use online tables instead (``EmbeddingVariable``: ids keyed by
their full fingerprint, admission and eviction). Tables of one ``ev_params`` and dimension
form a group looked up once a step (``trainer.online.table``); under embedding-parallel
sharding a key (``id XOR tag`` in a group) goes to rank ``key mod W``.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras
from tensorflow.python.distribute.sharded_variable import ShardedVariable

from recpipe.config.data import FeatureSpec, FeatureType
from trainer.embedding_tables import EmbeddingConfigError, TableSlice, table_shapes
from trainer.online import EmbeddingVariable, EVView, OnlineTables, StepRows, table_specs


class _Index:
    def __init__(self, online: OnlineTables | None, key_union):
        self.tables: dict[str, TableSlice] = {}
        self.fused: dict[int, tf.Variable] = {}
        self.evs: dict[str, EVView] = {}
        self.online, self.key_union = online, key_union


class FeatureEmbedding(keras.layers.Layer):
    """Id / tag features -> one embedding per feature.

    Args:
        features: the id and tag features to embed.
        dim: table width for every feature (the wide part uses 1); default each
            feature's ``embedding_dim``.
        sharding: a ``trainer.distribute.embedding_parallel.Sharding``: hold this rank's
            rows only (global row ``g`` at local row ``g div W``) and look ids up across
            ranks (every rank must call the layer at the same point of its step).
        online: the model's ``OnlineTables`` (needed with ``ev_params`` features): the
            layers of one model share each online table through it.

    Call:
        inputs: dict with ``int64 [B]`` per id feature and ``RaggedTensor int64 [B, (n)]``
            per tag feature: ids hashed into ``[0, hash_bucket_size)`` (``trainer.hashing``),
            full fingerprints for ``ev_params`` features.
        training: online tables admit and evict (``EmbeddingVariable.admit``).
        stacked: return one ``float32 [B, F, width]`` tensor, the features in order,
            instead of the dict (needs one ``width``). The id features' rows are then the
            fused lookup's output as it is: no per-feature tensors to split and stack again,
            forward or backward.
        step_rows: the model call's ``trainer.online.StepRows``: the online tables' rows
            this layer admits are put there, and rows another layer admitted for the same ids
            taken from it (the wide embedding after the deep one).

    Returns:
        dict feature name -> ``float32 [B, dim]``; tags combined by ``combiner``
        (sum or mean; an empty tag list gives zeros). Or the stacked tensor.

    Raises:
        EmbeddingConfigError: ``stacked`` with features of different widths; ``ev_params``
            features without ``online`` tables.

    Attributes:
        tables: table name -> ``TableSlice`` (after build).
        evs: table name -> ``EVView``, this layer's weights over the online tables (after
            build; ``EmbeddingVariable``s shared with the model's other embedding layers).
        fused: width -> the fused ``tf.Variable`` ``[sum of the tables' rows, width]``.
        width: the one width of every feature's table, or None when they differ.
    """

    def __init__(
        self,
        features: list[FeatureSpec],
        dim: int | None = None,
        sharding=None,
        online: OnlineTables | None = None,
        key_union=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.sharding = sharding
        # ids and tags (a bucketized RawFeature's buckets are ids); dense values pass by
        self.features = [f for f in features if f.kind != "dense" and not _attended(f)]
        # looked up as sequences (``sequence``), never pooled; their tables built here too
        self.sequences = [f for f in features if _attended(f)]
        self.shapes = table_shapes(self.features + self.sequences, dim)
        self.ev_params = table_specs(self.features + self.sequences, dim)
        if self.ev_params and online is None:
            raise EmbeddingConfigError(f"{self.name}: ev_params tables need the model's OnlineTables")
        widths = {width for _, width in self.shapes.values()} | {w for _, w in self.ev_params.values()}
        self.width = widths.pop() if len(widths) == 1 else None
        # a plain holder: Keras would track dicts of variables / slices as SavedModel children
        self._index = _Index(online, key_union)

    @property
    def evs(self) -> dict[str, EVView]:
        return self._index.evs

    @property
    def tables(self) -> dict[str, TableSlice]:
        return self._index.tables

    @property
    def fused(self) -> dict[int, tf.Variable]:
        return self._index.fused

    def build(self, input_shape=None):
        widths = sorted({width for _, width in self.shapes.values()})
        for width in widths:
            names = [t for t, (_, w) in self.shapes.items() if w == width]
            total = sum(self.shapes[t][0] for t in names)
            shard = self.sharding
            self.fused[width] = fused = self.add_weight(
                name=f"embedding_weights_dim{width}",
                shape=(shard.rows(total) if shard else total, width),
                # ranks draw different rows: the global seed is the same on every rank
                initializer=keras.initializers.TruncatedNormal(
                    stddev=0.01, seed=None if shard is None else 7919 * (shard.rank + 1) + width
                ),
            )
            offset = 0
            for table in names:
                rows = self.shapes[table][0]
                self.tables[table] = TableSlice(fused, offset, rows, table, shard)
                offset += rows
        maps = {}
        online, key_union = self._index.online, self._index.key_union
        groups = online.groups(table_specs(self.features + self.sequences)) if self.ev_params else {}
        views: dict[str, EVView] = {}
        for table, (params, width) in self.ev_params.items():
            group, members = groups[table]
            if group not in views:
                # this process's share of the bounds under embedding-parallel sharding; a group
                # holds up to max_capacity rows per member table, in any mix
                share = self.sharding.rows if self.sharding else (lambda n: n)
                rows = share(params.max_capacity * len(members))
                start = max(1, share(params.start_capacity))

                def create(group=group, members=members, params=params, rows=rows, start=start):
                    return EmbeddingVariable(
                        self,
                        group,
                        params,
                        online.clock,
                        rows,
                        key_union,
                        start,
                        members,
                        online.fused_kernels,
                    )

                # the deep and wide lookups of a feature share its table (ids, map, admission)
                views[group] = online.table(group, create).view(self, width)
                maps[group] = views[group].ev.map
            self.evs[table] = views[group]
        # tracked, so that a SavedModel holds each id -> row map
        self.ev_maps = maps
        # EasyRec's attention combiner: one scoring vector per pooled sequence
        self.scorers = {
            f.name: self.add_weight(
                name=f"{f.name}_attention",
                shape=(self.shapes[f.embedding_name or f.name][1], 1),
                initializer=keras.initializers.GlorotUniform(),
            )
            for f in self.features
            if f.sequence_combiner is not None and (f.embedding_name or f.name) in self.shapes
        }
        super().build(input_shape)

    def _ids(self, f: FeatureSpec, values):
        """Hashed ids of one feature as rows of its fused variable.

        Raises:
            TypeError: the values are not ``int64`` ids.
        """
        if values.dtype != tf.int64:
            raise TypeError(
                f"{self.name}: feature {f.name!r} arrived as {values.dtype.name}; the model takes int64 ids "
                "hashed by trainer.hashing.hash_ids (FeatureReader and the serving module hash them)"
            )
        name = f.embedding_name or f.name
        if name in self.evs:
            return values, self.evs[name]
        table = self.tables[name]
        return values + table.offset, table.fused

    def _gather(
        self, fused, ids: tf.Tensor, training: bool = False, step_rows: StepRows | None = None
    ) -> tf.Tensor:
        if isinstance(fused, EVView):
            if self.sharding:
                return self.sharding.lookup_keys(fused, ids, training)
            return fused.lookup(ids, training=training, step_rows=step_rows)
        if self.sharding:
            return self.sharding.lookup(fused, ids)
        if isinstance(fused, ShardedVariable):  # partitioned across ps: one gather per part
            return tf.nn.embedding_lookup(fused, ids)
        return tf.gather(fused, ids)

    def _pooled(
        self,
        f: FeatureSpec,
        fused,
        ids: tf.RaggedTensor,
        training: bool = False,
        step_rows: StepRows | None = None,
    ) -> tf.Tensor:
        """A tag feature's rows combined per example: ``float32 [B, width]``."""
        return self._combined(f, self._gather(fused, ids.flat_values, training, step_rows), ids)

    def _combined(self, f: FeatureSpec, rows: tf.Tensor, ids: tf.RaggedTensor) -> tf.Tensor:
        """A tag feature's rows (``float32 [n, width]`` of ``ids.flat_values``) combined per
        example by ``combiner``: ``float32 [B, width]``."""
        summed = tf.math.unsorted_segment_sum(rows, ids.value_rowids(), num_segments=ids.nrows())
        if f.combiner == "mean":
            counts = tf.cast(tf.maximum(ids.row_lengths(), 1), summed.dtype)
            summed = summed / counts[:, None]
        return summed

    def _attention_pooled(self, f: FeatureSpec, fused, ids: tf.RaggedTensor) -> tf.Tensor:
        """A sequence pooled by EasyRec's attention combiner: each element's row ``r_i``
        scored ``r_i . w``, ``softmax`` over the example's elements, ``sum_i a_i r_i``:
        ``float32 [B, width]`` (zeros for an empty sequence).

        Raises:
            EmbeddingConfigError: the feature's table is an online one.
        """
        if isinstance(fused, EVView) or f.name not in self.scorers:
            raise EmbeddingConfigError(
                f"{self.name}: feature {f.name!r}: sequence_combiner pools a hashed table's rows, "
                "not an online table's (model_config.ev_params)"
            )
        rows = self._gather(fused, ids.flat_values)
        segments, n = ids.value_rowids(), ids.nrows()
        logits = tf.squeeze(tf.matmul(rows, self.scorers[f.name]), -1)
        top = tf.gather(tf.math.unsorted_segment_max(logits, segments, n), segments)
        weights = tf.exp(logits - top)
        weights /= tf.gather(tf.math.unsorted_segment_sum(weights, segments, n), segments)
        return tf.math.unsorted_segment_sum(rows * weights[:, None], segments, n)

    def sequence(self, inputs: dict, f: FeatureSpec, training=None) -> tuple[tf.Tensor, tf.Tensor]:
        """A SequenceFeature's last ``sequence_length`` ids looked up in its table (shared with
        the feature its ``embedding_name`` names).

        In an online table (``ev_params``) a history's ids are looked up without being
        counted: in training they go through the table's admission with a count of zero, so
        a row they read is stamped as used at this step (a delta carries what its gradient
        moves; eviction spares it), and an id without a row gets one only when admission
        would admit it on the sightings it has had as a feature (``filter_freq`` 0: at once).
        Ids still without a row read zeros.

        Args:
            inputs: the features dict; ``inputs[f.name]`` is ``RaggedTensor int64 [B, (n)]``,
                oldest first.

        Returns:
            (``float32 [B, L, width]``, zero rows past each history's end; ``bool [B, L]``,
            the valid elements), ``L`` = ``sequence_length``.
        """
        length = f.sequence_length
        training = self._training(training)
        ids, fused = self._ids(f, inputs[f.name][:, -length:])
        if isinstance(fused, EVView):
            rows = self._history_rows(f, fused, ids.flat_values, training)
        else:
            rows = self._gather(fused, ids.flat_values)
        width = rows.shape[-1]
        padded = ids.with_flat_values(rows).to_tensor(shape=[None, length, width])
        return padded, tf.sequence_mask(ids.row_lengths(), length)

    def _history_rows(self, f: FeatureSpec, view: EVView, ids: tf.Tensor, training: bool) -> tf.Tensor:
        """Rows of a history's ids (``int64 [n]``) in an online table, uncounted (``sequence``):
        ``float32 [n, dim]``."""
        members = None
        if view.ev.grouped:  # a group's key: the id XOR its member's tag
            i = view.ev.members.index(f.embedding_name or f.name)
            ids = tf.bitwise.bitwise_xor(ids, tf.constant(view.ev.tags[i], tf.int64))
            members = tf.fill(tf.shape(ids, out_type=tf.int64), tf.constant(i, tf.int64))
        if self.sharding:
            return self.sharding.lookup_keys(view, ids, training, members, counted=False)
        return view.lookup(ids, tf.zeros_like(ids) if training else None, training=training, members=members)

    def _training(self, training) -> bool:
        """Lookups in training, or in an admission pass of the next batch (``trainer.online.ahead``:
        the model is called with ``training=False`` there, the tables admit as in training)."""
        online = self._index.online
        return bool(training) or (online is not None and online.clock.ahead.recording)

    def call(self, inputs: dict, stacked: bool = False, training=None, step_rows: StepRows | None = None):
        training = self._training(training)
        if stacked and self.width is None:
            raise EmbeddingConfigError(
                f"{self.name}: stacked embeddings need one embedding_dim, got {sorted(self.fused)}"
            )
        pooled: dict[str, tf.Tensor] = {}
        by_width: dict[int, list[tuple[str, tf.Tensor]]] = {}
        groups: dict[int, list] = {}
        for f in self.features:
            ids, fused = self._ids(f, inputs[f.name])
            if f.sequence_combiner is not None:
                pooled[f.name] = self._attention_pooled(f, fused, ids[:, -f.sequence_length :])
            elif isinstance(fused, EVView) and fused.ev.grouped:
                groups.setdefault(id(fused), []).append((f, ids, fused))
            elif f.feature_type == FeatureType.TagFeature:
                pooled[f.name] = self._pooled(f, fused, ids, training, step_rows)
            elif isinstance(fused, EVView):  # one lookup per online table
                pooled[f.name] = self._gather(fused, ids, training, step_rows)
            else:
                by_width.setdefault(fused.shape[1], []).append((f.name, ids))
        # blocks: (feature names, float32 [B, F, width]) of rows already side by side
        blocks: list[tuple[list[str], tf.Tensor]] = []
        for named in groups.values():
            block, tags = self._group_rows(named, training, step_rows)
            pooled.update(tags)
            if block is not None:
                blocks.append(block)
        if stacked:
            named = by_width.get(self.width, [])
            if named:
                # one gather for every hashed id feature: [B, F] ids -> [B, F, width]
                rows = self._gather(self.fused[self.width], tf.stack([ids for _, ids in named], axis=1))
                blocks.append(([n for n, _ in named], rows))
            return self._stacked(blocks, pooled)
        out = dict(pooled)
        for names, block in blocks:
            out.update(zip(names, tf.unstack(block, axis=1), strict=True))
        for width, named in by_width.items():
            # one gather for every id feature of this width: [F, B] ids -> [F, B, width]
            rows = self._gather(self.fused[width], tf.stack([ids for _, ids in named]))
            out.update(zip([n for n, _ in named], tf.unstack(rows), strict=True))
        return {f.name: out[f.name] for f in self.features}

    def _group_rows(
        self, named: list, training: bool, step_rows: StepRows | None = None
    ) -> tuple[tuple | None, dict[str, tf.Tensor]]:
        """One lookup of a group's ids of every feature in ``named`` (``(feature, ids, view)``).
        Returns the id features' rows as a block ``(names, float32 [B, F, width])`` (their ids
        go batch-major, ``EVView.member_keys``, so the rows come side by side) or None, and
        each tag feature's combined rows (name -> ``float32 [B, width]``)."""
        view = named[0][2]
        index = {f.name: view.ev.members.index(f.embedding_name or f.name) for f, _, _ in named}
        columns = [(f, ids) for f, ids, _ in named if f.feature_type != FeatureType.TagFeature]
        tails = [(f, ids) for f, ids, _ in named if f.feature_type == FeatureType.TagFeature]
        keys, members = view.member_keys(
            [(index[f.name], ids) for f, ids in columns],
            [(index[f.name], ids.flat_values) for f, ids in tails],
            step_rows,
        )
        if self.sharding:
            rows = self.sharding.lookup_keys(view, keys, training, members)
        else:
            rows = view.lookup(keys, training=training, members=members, step_rows=step_rows)
        tags = {}
        if tails:
            sizes = [tf.size(keys) - sum(tf.size(ids.flat_values) for _, ids in tails)]
            sizes += [tf.size(ids.flat_values) for _, ids in tails]
            rows, *pieces = tf.split(rows, tf.stack(sizes), num=len(sizes))
            tags = {f.name: self._combined(f, p, ids) for (f, ids), p in zip(tails, pieces, strict=True)}
        if not columns:
            return None, tags
        return ([f.name for f, _ in columns], tf.reshape(rows, [-1, len(columns), view.dim])), tags

    def _stacked(self, blocks: list[tuple[list[str], tf.Tensor]], pooled: dict[str, tf.Tensor]) -> tf.Tensor:
        """``float32 [B, F, width]`` in feature order from ``blocks`` (feature names and their
        rows ``[B, F_i, width]``: the hashed features' one gather, each online group's lookup)
        and the ``pooled`` features (``[B, width]``): runs of features side by side in a block
        are sliced from it (the whole block when it is all of them), runs of pooled features
        stacked, and the pieces concatenated."""
        where = {name: (b, j) for b, (names, _) in enumerate(blocks) for j, name in enumerate(names)}
        pieces: list[tf.Tensor] = []
        run: list = []  # ("block", b, first, end) or ("pooled", tensors)

        def flush():
            if not run:
                return
            if run[0] == "pooled":
                pieces.append(tf.stack(run[1], axis=1))
            else:
                _, b, first, end = run
                block = blocks[b][1]
                pieces.append(block if (first, end) == (0, len(blocks[b][0])) else block[:, first:end])
            run.clear()

        for f in self.features:
            if f.name in where:
                b, j = where[f.name]
                if run and run[0] == "block" and run[1] == b and run[3] == j:
                    run[3] = j + 1
                    continue
                flush()
                run.extend(["block", b, j, j + 1])
            else:
                if run and run[0] == "pooled":
                    run[1].append(pooled[f.name])
                    continue
                flush()
                run.extend(["pooled", [pooled[f.name]]])
        flush()
        return pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=1)


def _attended(f: FeatureSpec) -> bool:
    """A SequenceFeature attended over (a group's ``sequence_features``), not pooled by a
    ``sequence_combiner``."""
    return f.feature_type == FeatureType.SequenceFeature and f.sequence_combiner is None
