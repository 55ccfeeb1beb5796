"""Pick the ``Distribution`` for ``train_config.train_distribute``."""

from __future__ import annotations

from recpipe.config.train import TrainConfig, TrainDistribute
from trainer.distribute.base import Distribution, StrategyError


def distribution_for(train_config: TrainConfig) -> Distribution:
    """This process's part of the job, from ``train_distribute`` and what the launcher set
    (TF_CONFIG, horovodrun's environment).

    Raises:
        StrategyError: ``SokStrategy`` (needs a GPU and NVIDIA SOK); a strategy that is not
            available in this version; a multi-worker strategy without its environment.
    """
    kind = train_config.train_distribute
    if kind == TrainDistribute.NoStrategy and not train_config.sync_replicas:
        return Distribution()
    if kind == TrainDistribute.MirroredStrategy:
        from trainer.distribute.mirrored import MirroredDistribution

        return MirroredDistribution(train_config.num_gpus_per_worker)
    if kind == TrainDistribute.MultiWorkerMirroredStrategy:
        from trainer.distribute.mirrored import MultiWorkerMirroredDistribution

        return MultiWorkerMirroredDistribution()
    if kind == TrainDistribute.HorovodStrategy:
        from trainer.distribute.horovod import HorovodDistribution

        return HorovodDistribution()
    if kind == TrainDistribute.SokStrategy:
        raise StrategyError("train_config.train_distribute: SokStrategy needs a GPU and NVIDIA SOK")
    raise StrategyError(
        f"train_config.train_distribute: {kind.value}"
        f"{' with sync_replicas' if train_config.sync_replicas else ''} is not available in this "
        "version (parameter-server and embedding-parallel training are being built); use "
        "NoStrategy, MirroredStrategy, MultiWorkerMirroredStrategy or HorovodStrategy"
    )
