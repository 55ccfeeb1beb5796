"""``train_config``: optimizers, learning rates, distribution and checkpointing.

Names and defaults follow EasyRec's ``train.proto`` / ``optimizer.proto``
(shared/reference/easyrec_train_config.md): several ``optimizer_config`` entries split the
weights (the first for embeddings, the second for dense weights; for WideAndDeep the first is
the wide part's and a third gives the deep embeddings their own).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from recpipe.config.base import OneOf, Section


class ConstantLearningRate(Section):
    """A fixed learning rate."""

    learning_rate: float = Field(0.001, gt=0)
    """The rate."""


class ExponentialDecayLearningRate(Section):
    """lr = initial * decay_factor ** (step / decay_steps), floored at ``min_learning_rate``."""

    initial_learning_rate: float = Field(0.001, gt=0)
    """The rate at step 0."""
    decay_steps: int = Field(10000, gt=0)
    """Steps per decay by ``decay_factor``."""
    decay_factor: float = Field(0.95, gt=0, le=1)
    """Factor per ``decay_steps`` (0-1]."""
    staircase: bool = True
    """Decay in steps (the exponent floored) rather than smoothly."""
    min_learning_rate: float = Field(0.0, ge=0)
    """The floor."""


class LearningRate(OneOf):
    """Learning-rate schedule, with an optional linear warmup from ``warmup_learning_rate``."""

    constant_learning_rate: ConstantLearningRate | None = None
    """A fixed rate."""
    exponential_decay_learning_rate: ExponentialDecayLearningRate | None = None
    """An exponentially decaying rate."""


class _Optimizer(Section):
    """The learning rate and its warmup (every optimizer has them)."""

    learning_rate: LearningRate = Field(
        default_factory=lambda: LearningRate(constant_learning_rate=ConstantLearningRate())
    )
    """The learning-rate schedule."""
    warmup_steps: int = Field(0, ge=0)
    """Steps of linear warmup to the schedule's rate (0: none)."""
    warmup_learning_rate: float = Field(0.0, ge=0)
    """The rate the warmup starts from."""


class SgdOptimizer(_Optimizer):
    """Plain SGD."""


class MomentumOptimizer(_Optimizer):
    """SGD with momentum ``momentum_optimizer_value``."""

    momentum_optimizer_value: float = Field(0.9, ge=0, lt=1)
    """The momentum [0, 1)."""


class MomentumWOptimizer(MomentumOptimizer):
    """SGD with momentum and decoupled weight decay (Loshchilov and Hutter, 2019; EasyRec's
    ``momentumw_optimizer``)."""

    weight_decay: float = Field(1e-6, ge=0)
    """Decoupled weight decay per step, relative to the learning rate (Keras' form; TF
    contrib's ``MomentumWOptimizer``, which EasyRec builds, decays by ``weight_decay`` alone)."""


class AdagradOptimizer(_Optimizer):
    """Adagrad (Duchi et al., 2011), accumulators starting at ``initial_accumulator_value``;
    sparse by nature: a table's rows not in the batch are left alone."""

    initial_accumulator_value: float = Field(0.1, ge=0)
    """The accumulators' start."""


class AdamOptimizer(_Optimizer):
    """Adam (Kingma and Ba, 2015)."""

    beta1: float = Field(0.9, ge=0, lt=1)
    """Decay of the first moment [0, 1)."""
    beta2: float = Field(0.999, ge=0, lt=1)
    """Decay of the second moment [0, 1)."""
    epsilon: float = Field(1e-7, gt=0)
    """Added to the denominator for stability."""


class LazyAdamOptimizer(AdamOptimizer):
    """Adam whose moments and weights of an embedding table change only on the rows a batch
    looks up (EasyRec ``lazy_adam_optimizer``, TF Addons ``LazyAdam``); dense weights get
    plain Adam."""


class AdamWOptimizer(AdamOptimizer):
    """Adam with decoupled weight decay (Loshchilov and Hutter, 2019)."""

    weight_decay: float = Field(1e-4, ge=0)
    """Decoupled weight decay per step, relative to the learning rate."""


class FtrlOptimizer(_Optimizer):
    """FTRL-Proximal (McMahan et al., 2013) with L1 / L2 strengths; a table's update touches
    only the rows in the batch."""

    learning_rate_power: float = Field(-0.5, le=0)
    """The power of the per-coordinate rate (at most 0; -0.5 as in the paper)."""
    initial_accumulator_value: float = Field(0.1, ge=0)
    """The accumulators' start."""
    l1_reg: float = Field(0.0, ge=0)
    """L1 strength (sparsity)."""
    l2_reg: float = Field(0.0, ge=0)
    """L2 strength."""


class OptimizerConfig(OneOf):
    """One ``optimizer_config`` entry: exactly one optimizer."""

    sgd_optimizer: SgdOptimizer | None = None
    """Plain SGD."""
    momentum_optimizer: MomentumOptimizer | None = None
    """SGD with momentum."""
    momentumw_optimizer: MomentumWOptimizer | None = None
    """SGD with momentum and decoupled weight decay."""
    adagrad_optimizer: AdagradOptimizer | None = None
    """Adagrad (sparse on tables)."""
    adam_optimizer: AdamOptimizer | None = None
    """Adam."""
    lazy_adam_optimizer: LazyAdamOptimizer | None = None
    """Adam moving only the table rows a batch looks up (needed for deltas)."""
    adamw_optimizer: AdamWOptimizer | None = None
    """Adam with decoupled weight decay."""
    ftrl_optimizer: FtrlOptimizer | None = None
    """FTRL-Proximal (sparse on tables)."""
    embedding_learning_rate_multiplier: float | None = Field(None, gt=0)
    """The embedding tables this entry updates take their gradients times this (EasyRec's
    field beside the optimizer; null: 1): a rate of its own for the tables under one
    optimizer."""

    _beside = frozenset({"embedding_learning_rate_multiplier"})


class TrainDistribute(StrEnum):
    """EasyRec's ``train_distribute`` names."""

    NoStrategy = "NoStrategy"
    PSStrategy = "PSStrategy"
    MirroredStrategy = "MirroredStrategy"
    MultiWorkerMirroredStrategy = "MultiWorkerMirroredStrategy"
    HorovodStrategy = "HorovodStrategy"
    EmbeddingParallelStrategy = "EmbeddingParallelStrategy"
    SokStrategy = "SokStrategy"

    def with_parameter_servers(self, ps: int) -> bool:
        """Whether this strategy with ``ps`` parameter servers is parameter-server training:
        ``PSStrategy`` always, and ``NoStrategy`` once the cluster has ps (EasyRec's rule: the
        ps/worker estimator; with ``sync_replicas`` its synchronous mode). The launchers and the
        trainer's strategy factory both ask this."""
        return self == TrainDistribute.PSStrategy or (self == TrainDistribute.NoStrategy and ps > 0)

    @property
    def uses_horovod(self) -> bool:
        """Started by ``horovodrun`` (data parallel, or with embedding rows sharded)."""
        return self in (TrainDistribute.HorovodStrategy, TrainDistribute.EmbeddingParallelStrategy)


# the strategies that run on parameter servers (NoStrategy once the cluster has ps)
PS_CAPABLE = (TrainDistribute.NoStrategy, TrainDistribute.PSStrategy)


class SyncMode(StrEnum):
    """PaddleRec's parameter-server update modes (``runner.sync_mode``, and ``half_async`` of
    its cluster launcher's ``distribute_strategy``; shared/reference/paddlerec_distributed_modes.md).

    - ``sync``: every update waits for one batch's gradient from each worker (EasyRec's
      ``sync_replicas: true``).
    - ``async``: each worker's gradient is applied on the ps as soon as it is computed.
    - ``half_async``: gradients are computed without waiting, and merged by id over
      ``max_merge_var_num`` steps before each update (PaddleRec's communicator).
    - ``geo``: each worker trains a local copy and every ``geo_step`` batches adds the change
      of its parameters since its last pull to the ps, then pulls the rows others changed.
    """

    sync = "sync"
    async_ = "async"
    half_async = "half_async"
    geo = "geo"


class TrainConfig(Section):
    """EasyRec ``train_config``."""

    log_step_count_steps: int = Field(10, gt=0)
    """Steps between the loss lines in the log and ``train_metrics.jsonl``."""
    freeze_gradient: str | None = None
    """A regular expression: the model's variables whose name it matches (``re.search``) are
    not trained (EasyRec's ``freeze_gradient``), e.g. a warm-started table. Training refuses
    one that matches no variable, and names them."""
    optimizer_config: list[OptimizerConfig] = Field(
        default_factory=lambda: [OptimizerConfig(adam_optimizer=AdamOptimizer())],
        min_length=1,
        max_length=3,
    )
    """One to three optimizers: the first for embeddings, the second for dense weights (a
    third: WideAndDeep's deep embeddings)."""
    sync_replicas: bool = False
    """EasyRec's synchronous parameter-server training (``sync_mode: sync``)."""
    sync_mode: SyncMode | None = None
    """PaddleRec's parameter-server mode: ``sync``, ``async``, ``half_async``, ``geo`` (null:
    ``sync_replicas`` decides)."""
    geo_step: int = Field(100, gt=0)
    """``geo``: local batches between two pushes of a worker's change."""
    max_merge_var_num: int | None = Field(None, gt=0)
    """``half_async``: gradient steps merged into one update (null: the worker count)."""
    train_distribute: TrainDistribute = TrainDistribute.NoStrategy
    """``NoStrategy``, ``PSStrategy``, ``MirroredStrategy``, ``MultiWorkerMirroredStrategy``,
    ``HorovodStrategy``, ``EmbeddingParallelStrategy`` or ``SokStrategy``."""
    num_gpus_per_worker: int = Field(1, ge=0)
    """``MirroredStrategy``'s replicas on one machine."""
    num_steps: int | None = Field(None, gt=0)
    """The most global steps (null: no limit); training also ends after
    ``data_config.num_epochs``."""
    fine_tune_checkpoint: str | None = None
    """A checkpoint (or model dir) to start from when ``model_dir`` has none."""
    fine_tune_ckpt_var_map: str | None = None
    """A file of ``name_in_model<TAB>name_in_checkpoint`` lines for renamed variables."""
    save_checkpoints_steps: int | None = Field(None, gt=0)
    """Steps between checkpoints (1000 when neither this nor ``save_checkpoints_secs`` is set)."""
    save_checkpoints_secs: int | None = Field(None, gt=0)
    """Seconds between checkpoints instead."""
    server_timeout_secs: int = Field(60, gt=0)
    """A parameter-server job's chief fails, naming the task, when a ps or worker has not
    accepted a connection for this many seconds (its host down or cut off; TensorFlow itself
    would wait for many minutes)."""
    keep_checkpoint_max: int = Field(10, gt=0)
    """Checkpoints kept in ``model_dir``."""
    save_summary_steps: int = Field(1000, gt=0)
    """Steps between TensorBoard summaries."""
    random_seed: int = Field(0, ge=0)
    """Seeds initialisation and the input order: the same seed, config and data give the same
    model (asynchronous parameter-server training aside)."""
    admit_ahead: bool = False
    """Online tables (``ev_params``) admit batch N+1 while batch N trains, in one process
    (``NoStrategy``): the admission's ops run beside the MLP's (TorchRec's sparse pipeline),
    which pays where cores are idle during a step; the same rows, versions and updates as
    admitting each batch in its own step, and checkpoints hold no batch admitted ahead. Off
    by default: on 2 cores the step already keeps them busy (docs/benchmarks.md)."""
    fused_kernels: bool = True
    """The embedding tables' row-wise optimizer updates (``lazy_adam_optimizer``,
    ``adagrad_optimizer``, ``ftrl_optimizer``), the online tables' training lookups and
    their gradients, and their growth in recpipe's C++ kernels (``trainer/kernels``, built by
    ``make setup``): one op a table and step each, over the intra-op threads, with the stock
    ops' results.
    Serving signatures keep the stock ops. False: TensorFlow's stock ops, the reference the
    kernels are tested against."""
    op_determinism: bool = True
    """TensorFlow's op determinism: ops that would add in thread order take a fixed order
    (little cost on CPU, more on GPU; process-wide once on)."""
    inter_op_parallelism_threads: int = Field(0, ge=0)
    """Threads a training process runs independent ops on at once (EasyRec's field of the name;
    TensorFlow's ``tf.config.threading``). 0: TensorFlow's choice, or this machine's cores
    split between the job's processes on it. 1 with ``intra_op_parallelism_threads: 1`` runs
    the step on one thread: less CPU a step where its ops are small (batches of a few hundred
    rows), at the cost of the second core (docs/training.md). Parameter servers keep
    TensorFlow's choice."""
    intra_op_parallelism_threads: int = Field(0, ge=0)
    """Threads one op splits its work over (a matrix product, recpipe's kernels' rows; EasyRec's
    field of the name). 0: as ``inter_op_parallelism_threads``."""

    @model_validator(mode="after")
    def _checkpoint_cadence(self) -> TrainConfig:
        if self.save_checkpoints_steps is not None and self.save_checkpoints_secs is not None:
            raise ValueError("save_checkpoints_steps and save_checkpoints_secs are both set; set only one")
        if self.save_checkpoints_steps is None and self.save_checkpoints_secs is None:
            # EasyRec's default cadence; assigned without re-running validation.
            object.__setattr__(self, "save_checkpoints_steps", 1000)
        if self.sync_replicas and self.train_distribute != TrainDistribute.NoStrategy:
            raise ValueError("sync_replicas: true is only valid with train_distribute: NoStrategy")
        if self.sync_replicas and self.sync_mode not in (None, SyncMode.sync):
            raise ValueError(
                f"sync_mode: {self.sync_mode.value} contradicts sync_replicas: true (EasyRec's "
                "spelling of sync_mode: sync); set one of them"
            )
        if self.sync_mode is not None and self.train_distribute not in PS_CAPABLE:
            raise ValueError(
                f"sync_mode: {self.sync_mode.value} is a parameter-server mode; "
                f"train_distribute: {self.train_distribute.value} has no parameter servers. Use "
                "PSStrategy, or NoStrategy with ps in the cluster (--num_ps)"
            )
        return self

    @property
    def ps_mode(self) -> SyncMode:
        """The parameter-server update mode this config asks for (``sync_mode``, else
        ``sync`` with ``sync_replicas``, else ``async``); it applies only where the job has ps."""
        if self.sync_mode is not None:
            return self.sync_mode
        return SyncMode.sync if self.sync_replicas else SyncMode.async_
