"""Pick the ``Distribution`` for ``train_config.train_distribute``."""

# Imports inside functions: each strategy's module is imported when it is chosen: a job loads
# only its own (Horovod's among them).

from __future__ import annotations

import functools
import json
import os

from recpipe.config.train import SyncMode, TrainConfig, TrainDistribute
from trainer.distribute.base import Distribution, StrategyError, online_tables_refused, set_threads


def distribution_for(train_config: TrainConfig, online_tables: list[str] = ()) -> Distribution:
    """This process's part of the job, from ``train_distribute`` and what the launcher set
    (TF_CONFIG, horovodrun's environment). ``online_tables``: the features with ``ev_params``.

    Raises:
        StrategyError: ``SokStrategy`` (needs a GPU and NVIDIA SOK); ``sync_replicas``
            without ps; a multi-worker strategy without its environment; online tables under
            a distribution that cannot hold them (checked before it starts).
    """
    kind = train_config.train_distribute
    make = _constructor(train_config)
    cls = make.func if isinstance(make, functools.partial) else make
    if online_tables and not cls.holds_online_tables:
        raise online_tables_refused(kind.value, list(online_tables))
    set_threads(train_config.inter_op_parallelism_threads, train_config.intra_op_parallelism_threads)
    return make()


def _constructor(train_config: TrainConfig):
    """The ``Distribution`` class (or a partial of it) for ``train_distribute``."""
    kind = train_config.train_distribute
    ps = len(json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {}).get("ps", []))
    mode = train_config.ps_mode
    if kind.with_parameter_servers(ps):
        from trainer.distribute import parameter_server

        if mode == SyncMode.geo:
            from trainer.distribute.geo import GeoParameterServerDistribution

            return functools.partial(GeoParameterServerDistribution, train_config.geo_step)
        if mode == SyncMode.half_async:
            return functools.partial(
                parameter_server.HalfAsyncParameterServerDistribution, train_config.max_merge_var_num
            )
        if mode == SyncMode.sync:
            return parameter_server.SynchronousParameterServerDistribution
        return parameter_server.ParameterServerDistribution
    if kind == TrainDistribute.NoStrategy and train_config.sync_mode not in (None, SyncMode.async_):
        raise StrategyError(
            f"train_config.sync_mode: {mode.value} is a parameter-server mode and needs ps in the "
            "cluster (--num_ps M, cluster.ps.count > 0)"
        )
    if kind == TrainDistribute.NoStrategy and not train_config.sync_replicas:
        return Distribution
    if kind == TrainDistribute.MirroredStrategy:
        from trainer.distribute.mirrored import MirroredDistribution

        return functools.partial(MirroredDistribution, train_config.num_gpus_per_worker)
    if kind == TrainDistribute.MultiWorkerMirroredStrategy:
        from trainer.distribute.mirrored import MultiWorkerMirroredDistribution

        return MultiWorkerMirroredDistribution
    if kind == TrainDistribute.HorovodStrategy:
        from trainer.distribute.horovod import HorovodDistribution

        return HorovodDistribution
    if kind == TrainDistribute.EmbeddingParallelStrategy:
        from trainer.distribute.embedding_parallel import EmbeddingParallelDistribution

        return EmbeddingParallelDistribution
    if kind == TrainDistribute.SokStrategy:
        raise StrategyError("train_config.train_distribute: SokStrategy needs a GPU and NVIDIA SOK")
    raise StrategyError(
        f"train_config.sync_replicas: {kind.value} with sync_replicas is synchronous parameter-server "
        "training and needs ps in the cluster (cluster.ps.count > 0); without ps, use "
        "MultiWorkerMirroredStrategy or HorovodStrategy for synchronous data parallelism"
    )
