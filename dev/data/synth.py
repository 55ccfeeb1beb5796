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

from dev.data.csv_files import write_days

NUM_DENSE, NUM_SPARSE = 13, 26
VOCAB_SIZES = [int(v) for v in np.geomspace(10, 200_000, NUM_SPARSE).round()]
COLUMNS = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]


def _vocab(field: int, size: int) -> np.ndarray:
    codes = (np.arange(size, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(field * 7919)) & np.uint64(
        0xFFFFFFFF
    )
    return np.array([f"{c:08x}" for c in codes.tolist()], dtype=object)


def synth_criteo_table(rows: int, seed: int = 0) -> pa.Table:
    """Draw ``rows`` Criteo-schema rows.

    Returns:
        A table with ``label`` int8, ``I1..I13`` int64 (nullable), ``C1..C26`` string (nullable).
    """
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
    for c, size in enumerate(VOCAB_SIZES, start=1):
        index = (rng.zipf(1.3, rows) - 1) % size
        if c <= 8:
            effects = np.random.default_rng(seed * 1000 + c).normal(0.0, 0.6, size)
            z += effects[index]
        missing = rng.random(rows) < 0.02
        columns[f"C{c}"] = pa.array(_vocab(c, size)[index], type=pa.string(), mask=missing)
    z -= np.quantile(z, 0.7)
    label = (rng.random(rows) < 1.0 / (1.0 + np.exp(-z))).astype(np.int8)
    return pa.table({"label": label, **columns})


def synth_criteo(
    rows: int, days: int, out: str | Path, start: str = "2024-01-01", seed: int = 0
) -> dict[str, int]:
    """Write ``rows`` rows spread evenly over ``days`` daily partitions ``out/ds=YYYY-MM-DD/``.

    Returns:
        ``{ds: rows}``.

    Raises:
        ValueError: ``rows`` or ``days`` is not positive.
    """
    if rows <= 0:
        raise ValueError(f"rows and days must be positive (got rows={rows}, days={days})")
    table = synth_criteo_table(rows, seed)
    bounds = np.linspace(0, rows, max(days, 0) + 1).astype(int)
    return write_days(out, start, days, lambda d: table.slice(bounds[d], bounds[d + 1] - bounds[d]), rows)
