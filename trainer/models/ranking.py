"""One ranking model; the EasyRec model classes differ only in the parts injected.

    logit = head(tower(deep embeddings, dense)) + tower's extra term + wide logit

Composition follows tensorflow/recommenders' ``Ranking`` model: the model knows nothing of
checkpoints, strategies or tracking.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from recpipe.config.data import FeatureSpec, FeatureType
from trainer.layers.embedding import FeatureEmbedding
from trainer.online import EVClock


class WideLogit(keras.layers.Layer):
    """First-order part: a width-``wide_output_dim`` embedding per wide id / tag feature and a
    linear term per wide raw feature, summed to ``float32 [B, 1]``."""

    def __init__(
        self,
        features: list[FeatureSpec],
        wide_output_dim: int = 1,
        sharding=None,
        clock: EVClock | None = None,
        key_union=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.raw = [f.name for f in features if f.feature_type == FeatureType.RawFeature]
        self.embedding = FeatureEmbedding(
            features,
            dim=wide_output_dim,
            sharding=sharding,
            clock=clock,
            key_union=key_union,
            name="wide_embedding",
        )
        self.linear = keras.layers.Dense(1, use_bias=False, name="linear") if self.raw else None

    def call(self, inputs, training=None):
        parts = []
        if self.embedding.features:  # every wide table has one width: one [B, F, dim] lookup
            rows = self.embedding(inputs, stacked=True, training=training)
            parts.append(tf.reduce_sum(rows, axis=[1, 2])[:, None])
        if self.linear is not None:
            parts.append(self.linear(tf.stack([inputs[n] for n in self.raw], axis=1)))
        return tf.add_n(parts)


class EmbeddedModel(keras.Model):
    """What every recpipe model shares: the deep features' embedding layer (``embedding``,
    named ``input_layer``), their raw features as dense inputs (``dense_names``), the online
    tables' ``EVClock`` (tracked as ``ev_clock``) and the split of the variables for EasyRec's
    multi-optimizer. ``wide`` is None unless a subclass sets it. Args as ``RankingModel``'s."""

    def __init__(
        self,
        deep_features: list[FeatureSpec],
        sharding=None,
        clock: EVClock | None = None,
        key_union=None,
        **kw,
    ):
        super().__init__(**kw)
        if clock is not None:
            self.ev_clock = clock
        self.dense_names = [f.name for f in deep_features if f.feature_type == FeatureType.RawFeature]
        self.embedding = FeatureEmbedding(
            deep_features, sharding=sharding, clock=clock, key_union=key_union, name="input_layer"
        )
        self.wide = None

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
        clock: the ``EVClock`` of the online tables (``ev_params``) of this model and of
            ``wide``, or None when there are none; tracked here as ``ev_clock``.
        key_union: see ``EmbeddingVariable``.
    """

    def __init__(
        self,
        deep_features: list[FeatureSpec],
        tower: keras.layers.Layer,
        wide: WideLogit | None,
        sharding=None,
        clock: EVClock | None = None,
        key_union=None,
        **kw,
    ):
        super().__init__(deep_features, sharding, clock, key_union, **kw)
        self.tower = tower
        self.wide = wide
        self.head = keras.layers.Dense(1, name="logit")

    def call(self, inputs, training=False):
        dense = self.dense_inputs(inputs)
        if self.embedding.sequences:  # DIN: pooled features by name, histories as sequences
            embeddings = self.embedding(inputs, training=training)
            sequences = {
                f.name: self.embedding.sequence(inputs, f, training=training)
                for f in self.embedding.sequences
            }
            hidden, extra = self.tower(embeddings, dense, training=training, sequences=sequences)
        else:
            # tables of one width: a tower that takes the fused lookup's [B, F, D] gets it as it is
            stacked = self.embedding.width is not None and getattr(self.tower, "takes_stacked", True)
            embeddings = self.embedding(inputs, stacked=stacked, training=training)
            hidden, extra = self.tower(embeddings, dense, training=training)
        logit = self.head(hidden)
        if extra is not None:
            logit += extra
        if self.wide is not None:
            logit += self.wide(inputs, training=training)
        return tf.squeeze(logit, axis=1)
