"""What several test modules share that is not a fixture: the checkout's root, the MovieLens
days the trainer tests use, config edits, and free ports. Fixtures live in the ``conftest.py`` files."""

from __future__ import annotations

import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
# the first month of MovieLens days, prepared once per session (tests/trainer/conftest.py)
EARLY = ("1997-09-20", "1997-10-20")


def with_edits(config, edits: dict):
    """A copy of ``config`` with EasyRec-style edits applied and validated."""
    from recpipe.config import apply_edits
    from recpipe.config.loader import validate
    from recpipe.config.pipeline import PipelineConfig

    return validate(PipelineConfig, apply_edits(config.to_dict(), edits), "test config")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
