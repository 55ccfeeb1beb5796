"""A trainer kept warm between one-process jobs of one model: the next stream pass takes the
model, optimizers and traced train step the last pass left, instead of building and tracing
them again (about a second of a pass's train task on the development machine, half of it the
first step's trace).

Only in a process that outlives its job: a fork server's resident (``recpipe.forkserver.
resident``; ``RECPIPE_RESIDENT`` names it). The pass states the checkpoint it starts from
(``train_config.fine_tune_checkpoint``) and the warm state is taken only if it is the one the
last job saved, unchanged on disk since, and the config differs only in what changes between
passes (compare-and-set: anything else and the job builds afresh, and says why). The job still
restores that checkpoint into the kept variables, as a new process would, with the step
counters and optimizers' step counts at their start values first: the state a pass trains from
is the checkpoint's, whatever the last pass left in memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RESIDENT_ENV = "RECPIPE_RESIDENT"
# what changes between two passes of one model without changing what is built
PER_JOB = ("model_dir", "train_ds", "eval_ds")
PER_JOB_TRAIN = ("fine_tune_checkpoint",)


@dataclass
class Warm:
    """What a finished job leaves for the next.

    Attributes:
        key: the config less ``PER_JOB`` fields (JSON).
        checkpoint: the checkpoint prefix the job saved last.
        stamp: that checkpoint's index file's (inode, size, mtime ns).
        state: the ``trainer.state.TrainState``.
        saved: the state its checkpoint manager saved (``Distribution.saved_state``).
        dist: the ``Distribution`` the step was traced under.
        traced: ``(input signature, train step, AheadSteps or None)``.
    """

    key: str
    checkpoint: str
    stamp: tuple
    state: Any
    saved: Any
    dist: Any
    traced: tuple | None


_kept: Warm | None = None


def enabled() -> bool:
    """This process may outlive its job (``RECPIPE_RESIDENT`` is set)."""
    return bool(os.environ.get(RESIDENT_ENV))


def config_key(config) -> str:
    """``config`` (``PipelineConfig``) as JSON, less what changes from pass to pass."""
    doc = config.to_dict()
    for name in PER_JOB:
        doc.pop(name, None)
    for name in PER_JOB_TRAIN:
        doc.get("train_config", {}).pop(name, None)
    return json.dumps(doc, sort_keys=True, default=str)


def _stamp(checkpoint: str) -> tuple | None:
    # the index holds every tensor's checksum: its bytes name the checkpoint's content, where a
    # rewrite in place of the same size within the clock's grain keeps the inode, size and mtime
    try:
        with open(checkpoint + ".index", "rb") as f:
            st = os.fstat(f.fileno())
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, digest)


def take(config, continue_train: bool) -> Warm | None:
    """The kept state, if this job may train from it (module doc); None otherwise, and the
    kept state is let go."""
    global _kept
    kept, _kept = _kept, None
    if kept is None:
        return None
    source = config.train_config.fine_tune_checkpoint
    why = None
    if continue_train:
        why = "the job resumes its own checkpoint"
    elif config_key(config) != kept.key:
        why = "the config changed"
    elif not source:
        why = "the job has no fine_tune_checkpoint"
    else:
        from trainer.checkpoints import CheckpointError, resolve

        try:
            path = str(resolve(source))
        except CheckpointError:
            path = None
        if path != kept.checkpoint:
            why = f"it starts from {path or source}, not {kept.checkpoint}"
        elif _stamp(path) != kept.stamp:
            why = f"{path} changed on disk since this process saved it"
    if why is not None:
        log.info("warm trainer: building afresh (%s)", why)
        return None
    log.info("warm trainer: reusing the model and traced step that saved %s", kept.checkpoint)
    return kept


def keep(trainer, checkpoint: str) -> None:
    """Keep ``trainer``'s (``trainer.loop.Trainer``) built state after a job that saved
    ``checkpoint`` and succeeded, when ``enabled()``."""
    global _kept
    stamp = _stamp(checkpoint) if checkpoint else None
    if not enabled() or stamp is None:
        return
    _kept = Warm(
        config_key(trainer.config),
        str(Path(checkpoint)),
        stamp,
        trainer.state,
        trainer.saved,
        trainer.dist,
        trainer.traced,
    )
