"""What a training job checkpoints: model, optimizers, progress, and the checkpoint over them."""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from recpipe.config.pipeline import PipelineConfig
from trainer import online
from trainer.checkpoints import online_groups
from trainer.embedding_tables import (
    checkpoint_map,
    embedding_layout,
    is_sharded,
    sharded_names,
    variable_name,
)
from trainer.input import sample_inputs
from trainer.models.builders import build_model
from trainer.models.ranking import RankingModel
from trainer.optimizers import build_optimizer, freeze, split_variables


@dataclass
class TrainState:
    """Model, optimizers (built over ``var_split``), progress counters and their checkpoint.

    Attributes:
        variables: checkpoint name -> variable or ``TableSlice`` (``checkpoint_map``).
        checkpoint: ``tf.train.Checkpoint`` with ``variables``, ``embedding_layout``,
            ``global_step``, ``epoch``, ``batch_in_epoch`` and ``optimizer_<i>``.
        sharded_names: names of the variables that hold only this rank's embedding rows.
        summed_names: per-rank counts of online tables, summed over ranks at a save.
        ev_names: every variable of the online tables (``ev_params``).
    """

    model: RankingModel
    optimizers: list
    var_split: list[list[tf.Variable]]
    global_step: tf.Variable
    epoch: tf.Variable
    batch_in_epoch: tf.Variable
    variables: dict
    checkpoint: tf.train.Checkpoint
    sharded_names: frozenset[str]
    summed_names: frozenset[str] = frozenset()
    ev_names: frozenset[str] = frozenset()

    @property
    def evs(self) -> list:
        """The model's online tables (``EmbeddingVariable``)."""
        return online.tables(self.model)

    def static_variables(self) -> dict:
        """``variables`` less the online tables', which restore by id, not by shape."""
        return {n: v for n, v in self.variables.items() if n not in self.ev_names}

    def counters(self) -> tuple[tf.Variable, ...]:
        """Variables a train step increments: global_step, batch_in_epoch and the online
        tables' clock."""
        clock = getattr(self.model, "ev_clock", None)
        extra = (clock.step,) if clock is not None else ()
        return (self.global_step, self.batch_in_epoch, *extra)

    def all_variables(self) -> list[tf.Variable]:
        """Model, optimizer and progress variables, in an order equal in every build."""
        out = list(self.model.variables)
        for opt in self.optimizers:
            out += list(opt.variables)
        return out + [self.global_step, self.epoch, self.batch_in_epoch]

    def is_per_rank(self, var: tf.Variable) -> bool:
        """Holds this rank's own values (sharded rows or per-rank counts): never broadcast."""
        return self.is_sharded(var) or variable_name(var) in self.summed_names

    def is_online(self, var: tf.Variable) -> bool:
        """A variable of an online table, or an optimizer slot of one (``<slot>/<variable>``)."""
        name = variable_name(var)
        return name in self.ev_names or name.partition("/")[2] in self.ev_names

    def is_sharded(self, var: tf.Variable) -> bool:
        """A sharded embedding variable, or an optimizer slot of one (``<slot>/<variable>``)."""
        name = variable_name(var)
        return name in self.sharded_names or name.partition("/")[2] in self.sharded_names


def build_state(
    config: PipelineConfig,
    sharding=None,
    strategy: tf.distribute.Strategy | None = None,
    key_union=None,
) -> TrainState:
    """Build the model (its tables sharded with ``sharding``; ``key_union`` for online
    tables, see ``EmbeddingVariable``), the optimizers of
    ``train_config.optimizer_config`` and the progress counters under ``strategy``'s scope
    (default: the current strategy), and the checkpoint over them."""
    with (strategy or tf.distribute.get_strategy()).scope():
        model = build_model(config, sharding, key_union)
        model(sample_inputs(config))
        tc = config.train_config
        optimizers = [
            build_optimizer(c, f"optimizer_{i}", tc.fused_kernels) for i, c in enumerate(tc.optimizer_config)
        ]
        var_split = split_variables(model.variable_groups(), len(optimizers), config.model.model_class)
        var_split = freeze(var_split, config.train_config.freeze_gradient)
        for opt, variables in zip(optimizers, var_split, strict=True):
            opt.build(variables)
            for ev in online.tables(model):
                ev.register_optimizer(opt)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        batch_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="batch_in_epoch")
    # the layout (a string) stays outside the strategy: collectives cannot broadcast strings
    variables = checkpoint_map(model)
    checkpoint = tf.train.Checkpoint(
        variables=variables,
        embedding_layout=embedding_layout(variables),
        online_groups=online_groups(online.tables(model)),
        global_step=global_step,
        epoch=epoch,
        batch_in_epoch=batch_in_epoch,
        **{f"optimizer_{i}": opt for i, opt in enumerate(optimizers)},
    )
    return TrainState(
        model,
        optimizers,
        var_split,
        global_step,
        epoch,
        batch_in_epoch,
        variables,
        checkpoint,
        sharded_names(model) | (online.row_names(model) if is_sharded(model) else frozenset()),
        online.summed_names(model) if is_sharded(model) else frozenset(),
        online.variable_names(model),
    )
