"""A synthetic stream whose id vocabulary drifts day by day, for the online-table benchmark
(``bench/online_tables.py``; never for quality claims beyond it).

Columns ``label,user_id,item_id,category,price``. On day ``d`` the users are the ``users``
ids from ``d * user_drift`` on: each day ``user_drift`` new users enter and as many of the
oldest leave. Each user has a fixed Zipf-like popularity (exponent 1.1 over a hashed rank),
faded linearly over the oldest 30 % of the window, so an id is drawn on many consecutive days,
then fades away; items likewise. The label is Bernoulli(sigmoid(z)), z the sum of a fixed effect
per user, per item and per category and a price term, centred for ~30 % positives, so ids
seen yesterday carry signal today and an id's row is worth learning only while it lives.

With ``slices`` (``bench/freshness.py``) the windows slide within the day too: the day is cut
into ``slices`` equal spans of time, span ``k``'s ids are drawn from the windows starting at
``(day + k / slices) * drift``, and each row gets a ``timestamp`` (int64 Unix seconds, in its
span, rows in time order): new ids arrive all day, as on a live site, so a model synced more
often has seen more of them.
"""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
from scipy.special import erfinv

from dev.data.csv_files import write_days

COLUMNS = ["label", "user_id", "item_id", "category", "price"]


def _draw(rng: np.random.Generator, rows: int, size: int, first: int, salt: int) -> np.ndarray:
    """``rows`` ids from the window ``[first, first + size)`` by popularity (module docstring)."""
    ids = np.arange(first, first + size, dtype=np.int64)
    rank = (
        (ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(salt)) >> np.uint64(40)
    ) % np.uint64(size)
    weight = 1.0 / (1.0 + rank.astype(np.float64)) ** 1.1
    weight *= np.minimum(1.0, (ids - first + 1) / (0.3 * size))  # the oldest fade out
    return rng.choice(ids, size=rows, p=weight / weight.sum())


def drift_day(
    day: int,
    rows: int,
    users: int,
    items: int,
    user_drift: int,
    item_drift: int,
    seed: int = 0,
    slices: int | None = None,
    start: str = "2024-01-01",
) -> pa.Table:
    """Day ``day``'s rows (see the module docstring); day 0 is ``start``.

    Returns:
        ``label`` int8, ``user_id`` / ``item_id`` / ``category`` string, ``price`` float64;
        with ``slices``, ``timestamp`` int64 (Unix seconds) last.
    """
    rng = np.random.default_rng([seed, day])
    if slices:
        span = np.sort(rng.integers(0, slices, rows))  # each row's slice of the day
        counts = np.bincount(span, minlength=slices)
        user = np.concatenate(
            [_draw(rng, n, users, int((day + k / slices) * user_drift), 1) for k, n in enumerate(counts)]
        )
        item = np.concatenate(
            [_draw(rng, n, items, int((day + k / slices) * item_drift), 2) for k, n in enumerate(counts)]
        )
        midnight = (date.fromisoformat(start) + timedelta(days=day) - date(1970, 1, 1)).days * 86400
        seconds = np.sort((span * 86400 // slices) + rng.integers(0, 86400 // slices, rows))
    else:
        user = _draw(rng, rows, users, day * user_drift, 1)
        item = _draw(rng, rows, items, day * item_drift, 2)
    category = item % 50
    price = np.exp(rng.normal(2.0, 0.8, rows))

    def effect(ids: np.ndarray, salt: int, scale: float) -> np.ndarray:
        # a fixed effect per id, the same on every day: a hash of (salt, id) to a normal
        h = (ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(salt)) >> np.uint64(11)
        u = (h.astype(np.float64) + 0.5) / 2.0**53
        return scale * np.sqrt(2.0) * _erfinv(2.0 * u - 1.0)

    z = effect(user, 1, 0.8) + effect(item, 2, 0.8) + effect(category, 3, 0.3) - 0.4 * (np.log(price) - 2.0)
    z -= 0.85
    label = (rng.random(rows) < 1.0 / (1.0 + np.exp(-z))).astype(np.int8)
    return pa.table(
        {
            "label": label,
            "user_id": pa.array([f"u{u}" for u in user.tolist()]),
            "item_id": pa.array([f"i{i}" for i in item.tolist()]),
            "category": pa.array([f"c{c}" for c in category.tolist()]),
            "price": price.round(2),
            **({"timestamp": midnight + seconds} if slices else {}),
        }
    )


def _erfinv(x: np.ndarray) -> np.ndarray:

    return erfinv(np.clip(x, -1 + 1e-12, 1 - 1e-12))


def synth_drift(
    rows: int,
    days: int,
    out: str | Path,
    start: str = "2024-01-01",
    seed: int = 0,
    users: int = 20_000,
    items: int = 5_000,
    user_drift: int = 1_000,
    item_drift: int = 100,
    slices: int | None = None,
) -> dict[str, int]:
    """Write ``rows`` rows a day for ``days`` days as ``out/ds=YYYY-MM-DD/`` CSV partitions
    (``slices``: ids drift within the day too, rows carry a ``timestamp``; module docstring).

    Returns:
        ``{ds: rows}``.

    Raises:
        ValueError: ``rows`` or ``days`` is not positive.
    """

    def day(d: int):
        return drift_day(d, rows, users, items, user_drift, item_drift, seed, slices, start)

    return write_days(out, start, days, day, rows)
