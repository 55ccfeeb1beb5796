"""Multi-task ranking models: EasyRec's MMoE, ESMM and DBMTL over one set of embeddings.

    logits[:, t] = head_t(tower_t(bottom_t(embeddings, dense)))

Each task is one binary target; the model returns ``float32 [B, T]`` logits in the order of
``ModelConfig.tasks`` (ESMM's second column is the CTCVR logit, ``logit(p_ctr * p_cvr)``), so
the loss, the metrics and the serving signature treat every task alike.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from recpipe.config.data import FeatureSpec
from recpipe.config.model import ModelClass, ModelConfig
from trainer.layers.mlp import MLP
from trainer.layers.mmoe import MMoE
from trainer.models.ranking import EmbeddedModel
from trainer.models.towers import _concat
from trainer.online import OnlineTables

# log p_ctcvr is kept below this, so that log(1 - p) stays finite
_LOG_ONE = -1e-7


def ctcvr_logit(ctr_logit: tf.Tensor, cvr_logit: tf.Tensor) -> tf.Tensor:
    """``logit(sigmoid(a) * sigmoid(b))`` for ``float32 [B]`` logits, in log space: the
    sigmoid cross entropy of it is ESMM's CTCVR loss on the product of probabilities."""
    log_p = tf.minimum(-tf.nn.softplus(-ctr_logit) - tf.nn.softplus(-cvr_logit), _LOG_ONE)
    return log_p - tf.math.log(-tf.math.expm1(log_p))


class MultiTaskModel(EmbeddedModel):
    """Inputs as ``RankingModel``'s; output logits ``float32 [B, T]``, one column per task.

    Args:
        deep_features: the DEEP groups' features (id / tag embedded, raw as dense inputs).
        model_config: ``model_config`` with ``model_class`` MMoE, ESMM or DBMTL.
        sharding, online, key_union, attention: as ``RankingModel``'s.
        groups: ESMM's ``groups``: (a feature group's name, its member names, its MLP config)
            each; an MLP reads its group's features and ``sequence_features`` outputs, and the
            MLPs' outputs side by side are the towers' input. Empty: the features concatenated.
    """

    def __init__(
        self,
        deep_features: list[FeatureSpec],
        model_config: ModelConfig,
        sharding=None,
        online: OnlineTables | None = None,
        key_union=None,
        attention=None,
        groups: list | None = None,
        **kw,
    ):
        super().__init__(deep_features, sharding, online, key_union, attention, **kw)
        embedded = {f.name for f in self.embedding.features}
        self.groups = []
        for group, names, _ in groups or []:
            columns = [self.dense_names.index(n) for n in names if n in self.dense_names]
            offset = len(self.dense_names)  # the attentions' outputs follow the raw features
            for att in attention.attentions if attention is not None else []:
                if att.group == group:
                    columns += range(offset, offset + att.output_width)
                offset += att.output_width
            self.groups.append(([n for n in names if n in embedded], columns))
        self.group_mlps = [MLP(cfg, name=f"group_{i}") for i, (*_, cfg) in enumerate(groups or [])]
        self.model_class = model_config.model_class
        tasks = model_config.tasks
        self.task_names = model_config.task_names
        self.cvr_name = tasks[1].tower_name if self.model_class == ModelClass.ESMM else None
        self.bottom = None
        self.mmoe = None
        self.relations: list[tuple[list[int], MLP | None]] = []
        if self.model_class == ModelClass.MMoE:
            cfg = model_config.mmoe
            self.mmoe = MMoE(cfg.expert_dnn, cfg.num_expert, len(tasks), name="mmoe")
        elif self.model_class == ModelClass.DBMTL:
            cfg = model_config.dbmtl
            if cfg.bottom_dnn is not None:
                self.bottom = MLP(cfg.bottom_dnn, name="bottom_dnn")
            if cfg.num_expert:
                expert = cfg.expert_dnn or cfg.bottom_dnn
                self.mmoe = MMoE(expert, cfg.num_expert, len(tasks), name="mmoe")
            names = [t.tower_name for t in tasks]
            for t in tasks:
                related = [names.index(n) for n in t.relation_tower_names]
                dnn = MLP(t.relation_dnn, name=f"relation_{t.tower_name}") if related else None
                self.relations.append((related, dnn))
        self.towers = [MLP(t.dnn, name=f"tower_{t.tower_name}") for t in tasks]
        self.heads = [keras.layers.Dense(1, name=f"logit_{t.tower_name}") for t in tasks]

    def _inputs(self, inputs, training):
        if not self.groups:
            embeddings, dense, _ = self.looked_up(inputs, self.embedding.width is not None, training)
            return _concat(embeddings, dense)
        embeddings, dense, _ = self.looked_up(inputs, False, training)
        parts = []
        for (names, columns), mlp in zip(self.groups, self.group_mlps, strict=True):
            x = [embeddings[n] for n in names] + ([tf.gather(dense, columns, axis=1)] if columns else [])
            parts.append(mlp(tf.concat(x, axis=1) if len(x) > 1 else x[0], training=training))
        return tf.concat(parts, axis=1)

    def task_logits(self, inputs, training=False) -> list[tf.Tensor]:
        """Each tower's own logit ``float32 [B]`` (ESMM: the CTR and the CVR logits)."""
        x = self._inputs(inputs, training)
        if self.bottom is not None:
            x = self.bottom(x, training=training)
        shared = self.mmoe(x, training=training) if self.mmoe is not None else [x] * len(self.towers)
        hidden = []
        for tower, bottom in zip(self.towers, shared, strict=True):
            hidden.append(tower(bottom, training=training))
        if self.relations:  # DBMTL: a task also reads the towers it depends on
            related_hidden = []
            for h, (related, dnn) in zip(hidden, self.relations, strict=True):
                if related:
                    h = dnn(tf.concat([h, *(related_hidden[i] for i in related)], axis=1), training=training)
                related_hidden.append(h)
            hidden = related_hidden
        return [tf.squeeze(head(h), axis=1) for head, h in zip(self.heads, hidden, strict=True)]

    def task_outputs(self, inputs, training=False) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """One forward pass: the tasks' logits ``float32 [B, T]`` and the probabilities
        served beside them (``float32 [B]`` by name: ESMM's p_cvr, else none)."""
        logits = self.task_logits(inputs, training=training)
        extra = {}
        if self.model_class == ModelClass.ESMM:
            ctr, cvr = logits
            logits, extra = [ctr, ctcvr_logit(ctr, cvr)], {self.cvr_name: tf.sigmoid(cvr)}
        return tf.stack(logits, axis=1), extra

    def call(self, inputs, training=False):
        return self.task_outputs(inputs, training=training)[0]
