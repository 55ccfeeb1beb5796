"""The chief's watch on its parameter servers.

A ps whose host is cut off from the network sends no reset: TensorFlow's remote calls to it
wait on TCP retransmissions for many minutes, and the chief with them (measured here: no step
and no error in the 400 s after the cut). A ps holds its share of the variables and nothing else
holds them, so the job cannot go on without it: the watch connects to every ps's address
every ``interval_s`` and, when one has refused or dropped every attempt for ``timeout_s``,
ends the chief with one line naming that ps; the task's retry resumes from the latest
checkpoint. A ps that is alive but busy still accepts connections (its kernel answers).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


class PsWatch:
    """Watch ``addresses`` (``host:port``, TF_CONFIG's ``cluster.ps``) from a daemon thread.

    Args:
        addresses: the ps tasks' addresses, in task order.
        timeout_s: seconds without one successful connection before a ps counts as lost.
        on_lost: called once, from the watch's thread, with ``"ps <i> (<address>)"``; it is
            expected to end the process (``recpipe.errors.exit_now``).
        interval_s: seconds between two rounds of connections.
    """

    def __init__(
        self,
        addresses: list[str],
        timeout_s: float,
        on_lost: Callable[[str], None],
        interval_s: float = 2.0,
    ):
        self.addresses = list(addresses)
        self.timeout_s, self.interval_s, self.on_lost = timeout_s, interval_s, on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="recpipe-ps-watch", daemon=True)

    def start(self) -> PsWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _reachable(self, address: str) -> bool:
        host, port = address.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=min(self.interval_s * 2, 5)).close()
            return True
        except OSError:
            return False

    def _run(self) -> None:
        last_ok = [time.monotonic()] * len(self.addresses)
        while not self._stop.wait(self.interval_s):
            for i, address in enumerate(self.addresses):
                if self._reachable(address):
                    last_ok[i] = time.monotonic()
                elif time.monotonic() - last_ok[i] > self.timeout_s and not self._stop.is_set():
                    log.error("ps %d (%s) unreachable for %.0f s", i, address, self.timeout_s)
                    self.on_lost(f"ps {i} ({address})")
                    return


@contextmanager
def watching_ps(addresses: list[str], timeout_s: float, prog: str = "recpipe train") -> Iterator[PsWatch]:
    """A ``PsWatch`` for the block: a ps lost meanwhile ends this process with exit code 1 and
    ``<prog>: PipelineError: ps <i> (<address>) unreachable for <timeout_s> s ...``."""
    from recpipe.errors import PipelineError, exit_now

    def lost(ps: str) -> None:
        exit_now(
            PipelineError(
                f"{ps} unreachable for {timeout_s:.0f} s (train_config.ps_timeout_secs): the variables "
                "it holds are lost to the job; the job stops here and a retry resumes from the "
                "latest checkpoint"
            ),
            prog,
        )

    watch = PsWatch(addresses, timeout_s, lost).start()
    try:
        yield watch
    finally:
        watch.stop()
