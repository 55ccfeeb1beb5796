"""One ranking model; the EasyRec model classes differ only in the parts injected.

    logit = head(tower(deep embeddings, dense)) + tower's extra term + wide logit

Composition follows tensorflow/recommenders' ``Ranking`` model: the model knows nothing of
checkpoints, strategies or tracking.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from recpipe.config.data import FeatureSpec
from recpipe.config.model import DNN
from trainer.layers.embedding import FeatureEmbedding
from trainer.layers.feature_dropout import VariationalDropout
from trainer.layers.mlp import MLP
from trainer.models.sequences import SequenceAttention
from trainer.online import OnlineTables, StepRows


class WideLogit(keras.layers.Layer):
    """First-order part: a width-``wide_output_dim`` embedding per wide id / tag feature and a
    linear term per wide raw feature, summed to ``float32 [B, 1]``."""

    def __init__(
        self,
        features: list[FeatureSpec],
        wide_output_dim: int = 1,
        sharding=None,
        online: OnlineTables | None = None,
        key_union=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.raw = [f.name for f in features if f.kind == "dense"]
        self.embedding = FeatureEmbedding(
            features,
            dim=wide_output_dim,
            sharding=sharding,
            online=online,
            key_union=key_union,
            name="wide_embedding",
        )
        self.linear = keras.layers.Dense(1, use_bias=False, name="linear") if self.raw else None

    def call(self, inputs, training=None, vector: bool = False, step_rows: StepRows | None = None):
        """``float32 [B, 1]``; with ``vector``, the rows summed over the features only,
        ``float32 [B, wide_output_dim]`` (the raw features' linear term added to each).
        ``step_rows``: the call's rows of the online tables, which the deep embedding admitted
        (``FeatureEmbedding``)."""
        parts = []
        if self.embedding.features:  # every wide table has one width: one [B, F, dim] lookup
            rows = self.embedding(inputs, stacked=True, training=training, step_rows=step_rows)
            parts.append(tf.reduce_sum(rows, axis=1) if vector else tf.reduce_sum(rows, axis=[1, 2])[:, None])
        if self.linear is not None:
            parts.append(self.linear(tf.stack([inputs[n] for n in self.raw], axis=1)))
        return parts[0] if len(parts) == 1 else parts[0] + parts[1]


class EmbeddedModel(keras.Model):
    """What every recpipe model shares: the deep features' embedding layer (``embedding``,
    named ``input_layer``), their raw features as dense inputs (``dense_names``), the online
    tables' ``EVClock`` (``online.clock``, tracked as ``ev_clock``) and the split of the
    variables for EasyRec's multi-optimizer. ``wide`` is None unless a subclass sets it. Args
    as ``RankingModel``'s."""

    def __init__(
        self,
        deep_features: list[FeatureSpec],
        sharding=None,
        online: OnlineTables | None = None,
        key_union=None,
        attention: SequenceAttention | None = None,
        **kw,
    ):
        super().__init__(**kw)
        if online is not None:
            self.ev_clock = online.clock
        self.dense_names = [f.name for f in deep_features if f.kind == "dense"]
        self.embedding = FeatureEmbedding(
            deep_features, sharding=sharding, online=online, key_union=key_union, name="input_layer"
        )
        self.wide = None
        self.attention = attention
        self.feature_dropout = None

    def use_feature_dropout(self, regularization_lambda: float, embedding_wise: bool) -> None:
        """Put a ``VariationalDropout`` over the deep inputs: the embedded features in
        ``embedding.features`` order (each its table's width), then the raw ones."""
        widths = [self.embedding.width or f.embedding_dim for f in self.embedding.features]
        widths += [1] * len(self.dense_names)
        self.feature_dropout = VariationalDropout(
            widths, regularization_lambda, embedding_wise, name="variational_dropout"
        )

    def _dropped(self, embeddings, dense, training):
        """``embeddings`` and ``dense`` through ``feature_dropout``, shapes as they came."""
        stacked = not isinstance(embeddings, dict)
        if stacked:
            parts = [tf.reshape(embeddings, [-1, embeddings.shape[1] * embeddings.shape[2]])]
        else:
            parts = [embeddings[f.name] for f in self.embedding.features]
        parts += [dense] if dense is not None else []
        out = self.feature_dropout(tf.concat(parts, axis=1), training=training)
        n = len(self.dense_names)
        kept, dense = (out[:, : out.shape[1] - n], out[:, out.shape[1] - n :]) if n else (out, None)
        if stacked:
            return tf.reshape(kept, tf.shape(embeddings)), dense
        split = tf.split(kept, [int(e.shape[-1]) for e in parts[: len(self.embedding.features)]], axis=1)
        return dict(zip([f.name for f in self.embedding.features], split, strict=True)), dense

    def looked_up(self, inputs, stacked: bool, training, step_rows: StepRows | None = None) -> tuple:
        """(embeddings, dense, sequences): the deep features' rows (``float32 [B, F, D]`` when
        ``stacked`` and there are no SequenceFeatures, else a dict name -> ``float32 [B, D_i]``);
        the raw features ``float32 [B, n]`` followed by the groups' ``sequence_features``
        outputs (``attention``), or None; the histories (name -> ``float32 [B, L, D]`` rows,
        ``bool [B, L]`` mask), or None without SequenceFeatures. ``step_rows`` gets the online
        tables' rows the deep embedding admits, for the wide embedding after it."""
        dense = self.dense_inputs(inputs)
        stacked = stacked and not self.embedding.sequences
        embeddings = self.embedding(inputs, stacked=stacked, training=training, step_rows=step_rows)
        if self.feature_dropout is not None:
            embeddings, dense = self._dropped(embeddings, dense, training)
        if not self.embedding.sequences:
            return embeddings, dense, None
        sequences = {
            f.name: self.embedding.sequence(inputs, f, training=training) for f in self.embedding.sequences
        }
        if self.attention is not None:
            pooled = self.attention(embeddings, sequences, training=training)
            dense = pooled if dense is None else tf.concat([dense, pooled], axis=1)
        return embeddings, dense, sequences

    def dense_inputs(self, inputs) -> tf.Tensor | None:
        """The raw features ``float32 [B, n]`` in ``dense_names`` order, or None."""
        return tf.stack([inputs[n] for n in self.dense_names], axis=1) if self.dense_names else None

    def variable_groups(self) -> dict[str, list[tf.Variable]]:
        """Trainable variables split as EasyRec's multi-optimizer needs: ``wide`` (wide
        embeddings and linear terms), ``embedding`` (deep tables), ``dense`` (the rest)."""
        wide = self.wide.trainable_variables if self.wide is not None else []
        embedding = self.embedding.trainable_variables
        taken = {id(v) for v in wide + embedding}
        dense = [v for v in self.trainable_variables if id(v) not in taken]
        return {"wide": wide, "embedding": embedding, "dense": dense}


class RankingModel(EmbeddedModel):
    """Inputs: the features dict of ``trainer.input.feature_spec``, ids hashed
    (``FeatureReader`` hashes them as it reads, the serving module from raw values). Output:
    logits ``float32 [B]``. The tower gets the deep embeddings as one ``float32 [B, F, D]``
    tensor when every deep table has width ``D``, else as a dict; with SequenceFeatures among
    the deep features (DIN), the dict, and the histories as ``sequences`` (name ->
    ``float32 [B, L, D]`` rows and their ``bool [B, L]`` mask).

    Args:
        deep_features: features of the DEEP groups (id / tag embedded, raw as dense inputs,
            sequences looked up element by element).
        tower: a ``trainer.models.towers`` layer.
        wide: a ``WideLogit`` or None.
        sharding: embedding rows sharded across ranks (``EmbeddingParallelStrategy``), or None.
        online: the ``OnlineTables`` (``ev_params``) of this model and of ``wide``, or None
            when there are none; their clock is tracked here as ``ev_clock``.
        key_union: see ``EmbeddingVariable``.
        attention: the feature groups' ``sequence_features``, or None; its outputs reach the
            tower after the raw features.
        final: EasyRec's ``final_dnn`` (DeepFM, WideAndDeep): the logit is ``head(final([wide,
            tower's extra, hidden]))`` instead of their sum; ``wide_vector``: the wide part
            enters it ``wide_output_dim`` wide (WideAndDeep), else summed to one column.
    """

    def __init__(
        self,
        deep_features: list[FeatureSpec],
        tower: keras.layers.Layer,
        wide: WideLogit | None,
        sharding=None,
        online: OnlineTables | None = None,
        key_union=None,
        attention: SequenceAttention | None = None,
        final: DNN | None = None,
        wide_vector: bool = False,
        **kw,
    ):
        super().__init__(deep_features, sharding, online, key_union, attention, **kw)
        self.tower = tower
        self.wide = wide
        self.final = MLP(final, name="final_dnn") if final is not None else None
        self.wide_vector = wide_vector
        self.head = keras.layers.Dense(1, name="logit")

    def call(self, inputs, training=False):
        # tables of one width: a tower that takes the fused lookup's [B, F, D] gets it as it is
        stacked = self.embedding.width is not None and getattr(self.tower, "takes_stacked", True)
        # the deep embedding admits a feature's ids, the wide one takes their rows from it
        step_rows = StepRows()
        embeddings, dense, sequences = self.looked_up(inputs, stacked, training, step_rows)
        if getattr(self.tower, "takes_sequences", False):  # DIN towers attend themselves
            hidden, extra = self.tower(embeddings, dense, training=training, sequences=sequences)
        else:
            hidden, extra = self.tower(embeddings, dense, training=training)
        if self.final is not None:
            parts, wide = [], self.wide
            if wide is not None:
                parts.append(wide(inputs, training=training, vector=self.wide_vector, step_rows=step_rows))
            parts += [extra] if extra is not None else []
            hidden = self.final(tf.concat([*parts, hidden], axis=1), training=training)
            return tf.squeeze(self.head(hidden), axis=1)
        logit = self.head(hidden)
        if extra is not None:
            logit += extra
        if self.wide is not None:
            logit += self.wide(inputs, training=training, step_rows=step_rows)
        return tf.squeeze(logit, axis=1)
