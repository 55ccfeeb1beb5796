"""The chief's watch on its parameter servers (``trainer.distribute.ps_watch``): quiet while
every ps accepts connections, one call naming the ps once one has refused them for the timeout."""

from __future__ import annotations

import socket
import threading
import time

from trainer.distribute.ps_watch import PsWatch


def test_the_watch_names_the_ps_that_stopped_accepting_connections():
    up, down = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    addresses = [f"127.0.0.1:{s.getsockname()[1]}" for s in (up, down)]
    lost, called = [], threading.Event()
    watch = PsWatch(
        addresses, timeout_s=0.6, on_lost=lambda ps: (lost.append(ps), called.set()), interval_s=0.1
    )
    watch.start()
    try:
        time.sleep(1.0)  # both answer (the kernel accepts into the backlog): nothing lost
        assert lost == []
        down.close()
        closed = time.monotonic()
        assert called.wait(5)
        assert lost == [f"ps 1 ({addresses[1]})"] and time.monotonic() - closed >= 0.45  # timeout - interval
        time.sleep(0.3)
        assert len(lost) == 1  # once
    finally:
        watch.stop()
        up.close()
