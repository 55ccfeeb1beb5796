"""The strategy seam of the single-process trainer."""

from __future__ import annotations

import pytest
import tensorflow as tf


def test_strategy_seam_fails_clearly_for_what_one_process_cannot_run():
    from recpipe.config.train import TrainConfig
    from trainer.strategies import StrategyError, strategy_for

    assert strategy_for(TrainConfig()) is tf.distribute.get_strategy()
    with pytest.raises(StrategyError, match="SokStrategy needs a GPU and NVIDIA SOK"):
        strategy_for(TrainConfig(train_distribute="SokStrategy"))
    with pytest.raises(StrategyError, match="HorovodStrategy runs as a multi-process job"):
        strategy_for(TrainConfig(train_distribute="HorovodStrategy"))
    with pytest.raises(StrategyError, match="NoStrategy with sync_replicas"):
        strategy_for(TrainConfig(sync_replicas=True))
