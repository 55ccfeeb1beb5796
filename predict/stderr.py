"""What native libraries write to the process's standard error, held back."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def native_stderr_held() -> Iterator[None]:
    """Hold what native code writes to file descriptor 2 inside the block (TensorFlow's CUDA
    plugins report a missing GPU there on import and device set-up), and write it out only if
    the block raises: a bad input's message stays one line."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            os.write(2, held.read())
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
