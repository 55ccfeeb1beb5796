"""Residents of the fork server: a process kept between requests for one name, so that what
a command builds in memory (a stream pass's model, its traced train step: ``trainer.warm``)
outlives its request and serves the next one.

A command asks for one with ``RECPIPE_RESIDENT=<name>`` in its environment (the stream
DAG's one-process train job sets it to the model's name). Requests share a resident only
when they agree in that name, the module, the working directory, ``PYTHONPATH`` and the
namespaces they come from; the process then runs each one as a forked process would (the
client's streams, environment, signals and exit status) and gives the streams back after it.
A request that fails ends the resident: the next one starts a new process.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

from recpipe.forkserver import protocol

ENV = "RECPIPE_RESIDENT"


def key_of(request: dict, namespaces: dict[str, str]) -> tuple | None:
    """The resident a request asks for, as the server keys it: ``(name, module, cwd,
    PYTHONPATH, namespaces)``; None when it asks for none."""
    env = request.get("env") or {}
    name = env.get(ENV)
    if not name:
        return None
    argv = request["argv"]
    return (name, argv[2], request["cwd"], env.get("PYTHONPATH", ""), tuple(sorted(namespaces.items())))


def requests(channel: socket.socket) -> Iterator[tuple[dict, list[int]]]:
    """The requests the server sends a resident, each with its three standard streams, until
    the server closes the channel."""
    while True:
        request, fds = protocol.receive(channel, max_fds=3)
        if request is None:
            return
        yield request, fds
