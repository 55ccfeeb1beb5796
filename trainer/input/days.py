"""Which feature partitions a job reads, and which rows of a day shared by training and
evaluation each side takes (``data_config.holdout_percent``)."""

from __future__ import annotations

from pathlib import Path

from recpipe.config.pipeline import PipelineConfig
from recpipe.errors import PipelineError
from recpipe.layout import finished_partitions, overlaps, parse_ds_range, partition_ds


class InputError(PipelineError):
    """No finished feature partition matches the requested days."""


def holdout_split(config: PipelineConfig, days: list[str], role: str) -> tuple[list[Path], dict[Path, bool]]:
    """The finished partitions of ``days`` (days or ``YYYY-MM-DD/HH`` passes) for ``role``
    ("train" or "eval") and, for the days in both ``train_ds`` and ``eval_ds``, which rows to
    keep: ``{partition: is_holdout}``.

    A day in both ranges is split by the Spark job's ``_holdout`` column (``data_config.
    holdout_percent``): evaluation reads only its held-out rows. Training then leaves out the
    held-out rows of every day it trains on, not only those of the shared days: the gate's
    window may grow later (``gate.window_days``), and its held-out rows must not have been
    trained on by this model, which becomes the next one's champion and ancestor. Without a
    shared day (an out-of-time evaluation), both read whole days.

    Raises:
        InputError: no finished partition; or a shared day without holdout (the config has
            ``holdout_percent: 0``, so training would see the evaluation rows).
    """
    root = config.train_input_path if role == "train" else config.eval_input_path or config.train_input_path
    partitions = finished_partitions(root, days)
    if not partitions:
        raise InputError(f"no finished feature partition under {root} for ds {days[0]}..{days[-1]}")
    if not (config.train_ds and config.eval_ds):
        return partitions, {}
    # compared by the minutes they cover, so that a day in one range and its passes in the
    # other overlap
    train, evaluated = parse_ds_range(config.train_ds), parse_ds_range(config.eval_ds)
    shared = [d for d in train if any(overlaps(d, e) for e in evaluated)]
    if shared and config.eval_input_path not in (None, config.train_input_path):
        shared = []  # separate eval data: nothing to split
    keep = {}
    for part in partitions:
        if any(overlaps(partition_ds(part), d) for d in shared):
            if not config.data_config.holdout_percent:
                raise InputError(
                    f"{part.name} is in both train_ds and eval_ds but data_config.holdout_percent "
                    "is 0: set it (and re-run the feature job) or make the ranges disjoint"
                )
            keep[part] = role == "eval"
        elif shared and role == "train":
            keep[part] = False  # held out for any later, wider gate window
    return partitions, keep
