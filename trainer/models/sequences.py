"""A feature group's ``sequence_features``: DIN's target attention whose outputs join the
group's inputs, as EasyRec's sequence feature layer appends them (Zhou et al., KDD 2018,
"Deep Interest Network"; EasyRec's "序列特征" doc)."""

from __future__ import annotations

from dataclasses import dataclass, field

import tensorflow as tf
import tf_keras as keras

from recpipe.config.model import DNN
from trainer.layers.attention import DINAttention


@dataclass(frozen=True)
class TargetAttention:
    """One ``SeqAttGroup`` resolved against the features; ``group``: the feature group whose
    ``sequence_features`` hold it.

    ``keys``: the target features' names (pooled embeddings, concatenated into the query);
    ``hists``: the SequenceFeatures' names (concatenated element by element); ``auxes``:
    ``aux_hist_seq`` names; ``width``: the histories' summed width; ``transform``: ``None``
    (the keys' width equals it), ``"pad"`` (the query padded with zeros) or ``"dense"``
    (query and histories projected to ``width``)."""

    name: str
    group: str
    keys: list[str]
    hists: list[str]
    auxes: list[str] = field(default_factory=list)
    dnn: DNN = field(default_factory=lambda: DNN(hidden_units=[128, 64, 32, 1]))
    need_key_feature: bool = True
    width: int = 0
    transform: str | None = None
    aux_width: int = 0

    @property
    def output_width(self) -> int:
        """Columns it appends: the pooled histories, the pooled ``auxes``, the query."""
        return self.width + self.aux_width + (self.width if self.need_key_feature else 0)


class SequenceAttention(keras.layers.Layer):
    """Every target attention of the DEEP groups, their outputs side by side.

    Call:
        embeddings: dict name -> ``float32 [B, D_i]`` (the pooled id / tag features).
        sequences: dict name -> (``float32 [B, L, D]`` rows, ``bool [B, L]`` mask) of the
            SequenceFeatures (``FeatureEmbedding.sequence``).

    Returns:
        ``float32 [B, X]``: per attention, the history pooled by its scores (``width``), the
        auxiliary histories pooled alike, then (``need_key_feature``) the query.
    """

    def __init__(self, attentions: list[TargetAttention], **kwargs):
        super().__init__(**kwargs)
        self.attentions = attentions
        self.scorers = [DINAttention(a.dnn, name=f"seq_dnn_{a.name}") for a in attentions]
        self.key_transform = {
            a.name: keras.layers.Dense(a.width, name=f"key_transform_{a.name}")
            for a in attentions
            if a.transform == "dense"
        }
        self.hist_transform = {
            a.name: keras.layers.Dense(a.width, name=f"hist_transform_{a.name}")
            for a in attentions
            if a.transform == "dense"
        }

    def call(self, embeddings, sequences, training=False):
        parts = []
        for a, scorer in zip(self.attentions, self.scorers, strict=True):
            query = tf.concat([embeddings[k] for k in a.keys], axis=-1)
            history = tf.concat([sequences[h][0] for h in a.hists], axis=-1)
            mask = sequences[a.hists[0]][1]
            if a.transform == "pad":
                query = tf.pad(query, [[0, 0], [0, a.width - query.shape[-1]]])
            elif a.transform == "dense":
                query = self.key_transform[a.name](query)
                history = self.hist_transform[a.name](history)
            values = tf.concat([sequences[x][0] for x in a.auxes], axis=-1) if a.auxes else None
            parts.append(scorer(query, history, mask, values=values, training=training))
            if a.need_key_feature:
                parts.append(query)
        return tf.concat(parts, axis=1) if len(parts) > 1 else parts[0]
