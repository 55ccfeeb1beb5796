"""A block of rows as numpy arrays, from which the reader cuts batches."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from recpipe.ids import HOLDOUT


def _kept(table: pa.Table, keep: bool) -> np.ndarray:
    """Rows of ``table`` whose ``_holdout`` column equals ``keep``: bool ``[rows]``."""
    return table[HOLDOUT].to_numpy(zero_copy_only=False) == keep


def _string_buffers(column: pa.Array) -> tuple[bytes, np.ndarray]:
    """A string column without nulls as (its bytes, int64 offsets [n + 1] from 0).

    TensorFlow cuts the values apart again with one ``substr`` (``FeatureReader._ids_of``):
    no Python object per value.
    """
    width = np.int64 if pa.types.is_large_string(column.type) else np.int32
    _, offsets_buf, data_buf = column.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=width)[column.offset : column.offset + len(column) + 1]
    offsets = offsets.astype(np.int64)
    data = b"" if data_buf is None else data_buf[offsets[0] : offsets[-1]].to_pybytes()
    return data, offsets - offsets[0]


class Columns:
    """A block of rows as numpy arrays, from which batches are cut.

    Attributes:
        labels: ``float32 [L, N]``.
        ids: ``int64 [F_id, N]`` hashed ids.
        dense: ``float32 [F_dense, N]``.
        tags: per tag feature, (hashed values ``int64 [M]``, row splits ``int64 [N + 1]``).
        raw: ``object [R, N]`` of bytes: the raw values of the reader's ``raw_columns``, carried
            beside the batch and never into the model (GAUC's ``uid_field``).
    """

    def __init__(
        self, labels: np.ndarray, ids: np.ndarray, dense: np.ndarray, tags: list[tuple], raw: np.ndarray
    ):
        self.labels, self.ids, self.dense, self.tags, self.raw = labels, ids, dense, tags, raw

    @property
    def rows(self) -> int:
        return self.labels.shape[1]

    def take(self, index: np.ndarray) -> Columns:
        """Rows ``index`` (int ``[K]``), in that order."""
        tags = []
        for values, splits in self.tags:
            lengths = np.diff(splits)[index]
            out_splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            shift = np.repeat(splits[:-1][index] - out_splits[:-1], lengths)
            tags.append((values[np.arange(out_splits[-1]) + shift], out_splits))
        return Columns(
            self.labels[:, index], self.ids[:, index], self.dense[:, index], tags, self.raw[:, index]
        )

    def slice(self, start: int, stop: int) -> Columns:
        """Rows ``[start, stop)``."""
        tags = [(v[s[start] : s[stop]], s[start : stop + 1] - s[start]) for v, s in self.tags]
        cut = slice(start, stop)
        return Columns(self.labels[:, cut], self.ids[:, cut], self.dense[:, cut], tags, self.raw[:, cut])

    def concat(self, other: Columns) -> Columns:
        """These rows, then ``other``'s."""
        tags = [
            (np.concatenate([v, ov]), np.concatenate([s, os_[1:] + s[-1]]))
            for (v, s), (ov, os_) in zip(self.tags, other.tags, strict=True)
        ]
        return Columns(
            np.concatenate([self.labels, other.labels], axis=1),
            np.concatenate([self.ids, other.ids], axis=1),
            np.concatenate([self.dense, other.dense], axis=1),
            tags,
            np.concatenate([self.raw, other.raw], axis=1),
        )

    def flat(self) -> tuple:
        """The ``FeatureReader.signature`` tuple, as contiguous arrays (the raw values last, and
        only when there are any)."""
        out = [np.ascontiguousarray(x) for x in self.labels]
        out += [np.ascontiguousarray(self.ids), np.ascontiguousarray(self.dense)]
        for values, splits in self.tags:
            out += [np.ascontiguousarray(values), np.ascontiguousarray(splits)]
        if len(self.raw):
            out.append(np.ascontiguousarray(self.raw))
        return tuple(out)
