"""Synthetic Criteo-schema daily logs, for benchmarks at scale (never for quality claims).

Columns as Criteo's Display Advertising data (``label,I1..I13,C1..C26``): 13 non-negative
integer counts with ~20 % missing (``I2`` may be -1, as in Criteo), 26 categorical ids as
8-hex-digit strings drawn with Zipf-like frequencies from vocabularies of 10 to 200,000, a few
missing. A planted signal makes AUC meaningful: the label is Bernoulli(sigmoid(z)) where z
sums per-id effects of C1..C8 and effects of log(1 + I1..I4), centred for ~25 % positives.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dev.data.csv_files import write_days

NUM_DENSE, NUM_SPARSE = 13, 26
VOCAB_SIZES = [int(v) for v in np.geomspace(10, 200_000, NUM_SPARSE).round()]
# the published cardinalities of C1..C26 in Criteo's Kaggle Display Advertising Challenge data
# (7 days, 45.8M rows), as DLRM's and TorchRec's Kaggle preprocessing counts them
KAGGLE_CARDINALITIES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip
PROFILES = ("small", "kaggle")
COLUMNS = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]


def _vocab(field: int, size: int) -> np.ndarray:
    codes = (np.arange(size, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(field * 7919)) & np.uint64(
        0xFFFFFFFF
    )
    return np.array([f"{c:08x}" for c in codes.tolist()], dtype=object)


def _kaggle_ids(rng, field: int, size: int, rows: int, day: int, zipf: float, new_share: float) -> np.ndarray:
    """``rows`` ids of a field of ``size`` ids (``KAGGLE_CARDINALITIES``) on day ``day``: Zipf
    ranks over the field, of which ``new_share`` (fields of 10,000 ids and more) take a new id
    every day, as ids come and go in real logs; ids as decimal strings of a 32-bit mix."""
    rank = (rng.zipf(zipf, rows) - 1) % size
    ids = rank.astype(np.uint64)
    if size >= 10_000 and new_share > 0:
        # a fixed share of the ranks (by a hash of the rank) is renamed each day
        renewed = ((ids * np.uint64(0x9E3779B1)) & np.uint64(0xFFFF)) < np.uint64(int(new_share * 0x10000))
        ids = np.where(renewed, ids + np.uint64(size) * np.uint64(day + 1), ids)
    mixed = (ids * np.uint64(2654435761) + np.uint64(field * 7919)) & np.uint64(0xFFFFFFFF)
    return mixed


def synth_criteo_table(
    rows: int, seed: int = 0, profile: str = "small", day: int = 0, zipf: float = 1.01, new_share: float = 0.1
) -> pa.Table:
    """Draw ``rows`` Criteo-schema rows.

    Profiles: ``small`` (vocabularies of 10 to 200,000 ids, Zipf 1.3: fast, for mechanics) and
    ``kaggle`` (the Kaggle data's published cardinalities, ``KAGGLE_CARDINALITIES``, up to 10.1
    million ids; Zipf ``zipf`` frequencies; ``new_share`` of the ranks of each large field
    renamed every ``day``): a 3M-row day holds over a million distinct ids in its largest
    fields, and each day brings new ones.

    Returns:
        A table with ``label`` int8, ``I1..I13`` int64 (nullable), ``C1..C26`` string (nullable).

    Raises:
        ValueError: an unknown ``profile``.
    """
    if profile not in PROFILES:
        raise ValueError(f"profile {profile!r}: expected one of {', '.join(PROFILES)}")
    rng = np.random.default_rng(seed)
    z = np.zeros(rows)
    columns: dict[str, pa.Array] = {}
    for i in range(1, NUM_DENSE + 1):
        values = np.floor(np.exp(rng.normal(1.5, 1.2, rows))).astype(np.int64)
        if i == 2:
            values -= 1  # Criteo's I2 takes -1
        if i <= 4:
            z += (0.35 if i % 2 else -0.3) * (np.log1p(np.maximum(values, 0)) - 1.5)
        missing = rng.random(rows) < 0.2
        columns[f"I{i}"] = pa.array(values, mask=missing)
    sizes = KAGGLE_CARDINALITIES if profile == "kaggle" else VOCAB_SIZES
    for c, size in enumerate(sizes, start=1):
        missing = rng.random(rows) < 0.02
        if profile == "kaggle":
            ids = _kaggle_ids(rng, c, size, rows, day, zipf, new_share)
            if c <= 8:  # an effect per id, from a hash of it (no table of 10M effects)
                z += 0.6 * (((ids * np.uint64(0x2545F491)) >> np.uint64(8)) % np.uint64(1000) / 500.0 - 1.0)
            column = pc.cast(pa.array(ids, mask=missing), pa.string())
        else:
            index = (rng.zipf(1.3, rows) - 1) % size
            if c <= 8:
                effects = np.random.default_rng(seed * 1000 + c).normal(0.0, 0.6, size)
                z += effects[index]
            column = pa.array(_vocab(c, size)[index], type=pa.string(), mask=missing)
        columns[f"C{c}"] = column
    z -= np.quantile(z, 0.7)
    label = (rng.random(rows) < 1.0 / (1.0 + np.exp(-z))).astype(np.int8)
    return pa.table({"label": label, **columns})


def synth_criteo(
    rows: int, days: int, out: str | Path, start: str = "2024-01-01", seed: int = 0, profile: str = "small"
) -> dict[str, int]:
    """Write ``rows`` rows spread evenly over ``days`` daily partitions ``out/ds=YYYY-MM-DD/``
    (``profile``: see ``synth_criteo_table``; ``kaggle`` days are drawn one at a time, each
    with its own new ids).

    Returns:
        ``{ds: rows}``.

    Raises:
        ValueError: ``rows`` or ``days`` is not positive, or an unknown ``profile``.
    """
    if rows <= 0:
        raise ValueError(f"rows and days must be positive (got rows={rows}, days={days})")
    bounds = np.linspace(0, rows, max(days, 0) + 1).astype(int)
    if profile == "kaggle":
        return write_days(
            out,
            start,
            days,
            lambda d: synth_criteo_table(int(bounds[d + 1] - bounds[d]), seed + d, profile, day=d),
            rows,
        )
    table = synth_criteo_table(rows, seed, profile)
    return write_days(out, start, days, lambda d: table.slice(bounds[d], bounds[d + 1] - bounds[d]), rows)
