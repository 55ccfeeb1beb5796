"""The interaction towers that tell the EasyRec model classes apart.

A tower maps (embeddings, dense: ``float32 [B, n]`` or None) to (hidden ``float32 [B, H]``,
extra logit ``float32 [B, 1]`` or None). ``embeddings`` is ``float32 [B, F, D]`` (the
features in order, when their tables share a width) or a dict name -> ``float32 [B, D_i]``;
either way the concatenated input is the features' rows in feature order, then ``dense``.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from recpipe.config.model import DNN
from trainer.layers.attention import DINAttention
from trainer.layers.cross import Cross
from trainer.layers.dot_interaction import DotInteraction
from trainer.layers.fm import FM
from trainer.layers.mlp import MLP


def _fields(embeddings) -> tf.Tensor:
    """``float32 [B, F, D]`` (tables of one width)."""
    return tf.stack(list(embeddings.values()), axis=1) if isinstance(embeddings, dict) else embeddings


def _concat(embeddings, dense) -> tf.Tensor:
    """``float32 [B, sum of D_i + n]``: the features' rows, then ``dense``."""
    if isinstance(embeddings, dict):
        parts = list(embeddings.values())
    else:  # [B, F, D] -> [B, F * D], a reshape: no copy
        parts = [tf.reshape(embeddings, [-1, embeddings.shape[1] * embeddings.shape[2]])]
    parts += [dense] if dense is not None else []
    return tf.concat(parts, axis=1) if len(parts) > 1 else parts[0]


class ConcatMLPTower(keras.layers.Layer):
    """DNN and WideAndDeep's deep part: MLP over the concatenated inputs."""

    def __init__(self, dnn: DNN, **kwargs):
        super().__init__(**kwargs)
        self.mlp = MLP(dnn, name="dnn")

    def call(self, embeddings, dense, training=False):
        return self.mlp(_concat(embeddings, dense), training=training), None


class DeepFMTower(keras.layers.Layer):
    """DeepFM: MLP over the concatenated inputs, plus the FM term over the id embeddings
    (Guo et al., "DeepFM", IJCAI 2017); with ``fm_vector`` the term per dimension
    ``float32 [B, D]`` (for a ``final_dnn``), else summed ``[B, 1]``."""

    def __init__(self, dnn: DNN, fm_vector: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.mlp = MLP(dnn, name="dnn")
        self.fm = FM(name="fm")
        self.fm_vector = fm_vector

    def call(self, embeddings, dense, training=False):
        fm = self.fm(_fields(embeddings), vector=self.fm_vector)
        return self.mlp(_concat(embeddings, dense), training=training), fm


class DLRMTower(keras.layers.Layer):
    """DLRM: bottom MLP on dense features to the embedding width, pairwise dot products of
    it and the embeddings, top MLP over [bottom, interactions] (Naumov et al., 2019)."""

    def __init__(self, bot_dnn: DNN, top_dnn: DNN, self_interaction: bool, **kwargs):
        super().__init__(**kwargs)
        self.bottom = MLP(bot_dnn, name="bot_dnn")
        self.interaction = DotInteraction(self_interaction, name="interaction")
        self.top = MLP(top_dnn, name="top_dnn")

    def call(self, embeddings, dense, training=False):
        fields = _fields(embeddings)
        first = fields[:, 0]
        if dense is not None:
            first = self.bottom(dense, training=training)
            fields = tf.concat([first[:, None, :], fields], axis=1)
        z = self.interaction(fields)
        top_in = tf.concat([first, z], axis=1)
        return self.top(top_in, training=training), None


class DCNTower(keras.layers.Layer):
    """DCN-v2 parallel structure: ``cross_num`` cross layers and a deep tower over the same
    x0, concatenated (optionally through ``final_dnn``) (Wang et al., WWW 2021)."""

    def __init__(self, cross_num: int, deep: DNN, final: DNN | None, **kwargs):
        super().__init__(**kwargs)
        self.cross = [Cross(name=f"cross_{i}") for i in range(cross_num)]
        self.deep = MLP(deep, name="deep_tower")
        self.final = MLP(final, name="final_dnn") if final is not None else None

    def call(self, embeddings, dense, training=False):
        x0 = _concat(embeddings, dense)
        x = x0
        for layer in self.cross:
            x = layer((x0, x))
        h = tf.concat([x, self.deep(x0, training=training)], axis=1)
        if self.final is not None:
            h = self.final(h, training=training)
        return h, None


class MultiTowerDINTower(keras.layers.Layer):
    """EasyRec's MultiTowerDIN: an MLP tower per feature group, a DIN attention per
    ``seq_att_groups`` group, their outputs concatenated through ``final_dnn``.

    Args:
        towers: (group features: names, the group's dense feature indices into ``dense``,
            its MLP config), one per ``multi_tower.towers`` entry.
        din: (key feature names, history feature names, ``aux_hist_seq`` names, the
            attention's MLP config), one per ``din_towers`` entry.
        final: ``final_dnn``.

    Call:
        embeddings: dict name -> ``float32 [B, D_i]`` (pooled id / tag features).
        dense: ``float32 [B, n]`` or None.
        sequences: dict history name -> (``float32 [B, L, D]``, ``bool [B, L]`` mask).
    """

    takes_stacked = False  # its towers pick features by name, with or without histories
    takes_sequences = True

    def __init__(self, towers: list, din: list, final: DNN, **kwargs):
        super().__init__(**kwargs)
        self.groups = [(names, columns) for names, columns, _ in towers]
        self.towers = [MLP(cfg, name=f"tower_{i}") for i, (_, _, cfg) in enumerate(towers)]
        self.din = [(keys, hists, auxes) for keys, hists, auxes, _ in din]
        self.attention = [DINAttention(cfg, name=f"din_{i}") for i, (*_, cfg) in enumerate(din)]
        self.final = MLP(final, name="final_dnn")

    def call(self, embeddings, dense, training=False, sequences=None):
        parts = []
        for (names, columns), tower in zip(self.groups, self.towers, strict=True):
            x = [embeddings[n] for n in names]
            if columns:
                x.append(tf.gather(dense, columns, axis=1))
            parts.append(tower(tf.concat(x, axis=1) if len(x) > 1 else x[0], training=training))
        for (keys, hists, auxes), attention in zip(self.din, self.attention, strict=True):
            query = tf.concat([embeddings[k] for k in keys], axis=-1)
            history = tf.concat([sequences[h][0] for h in hists], axis=-1)
            values = tf.concat([sequences[a][0] for a in auxes], axis=-1) if auxes else None
            parts.append(attention(query, history, sequences[hists[0]][1], values=values, training=training))
        return self.final(tf.concat(parts, axis=1), training=training), None
