"""Checksums of files: what a manifest records and a reader verifies (exports, fetched data)."""

from __future__ import annotations

import hashlib
import os

BLOCK = 1 << 20  # bytes read at a time: a file of any size in constant memory


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 (64 characters) of the file at ``path``.

    Raises:
        OSError: the file cannot be read.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()
