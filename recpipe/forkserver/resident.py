"""Residents of the fork server: a process kept between requests for one name, so that what
a command builds in memory (a stream pass's model, its traced train step: ``trainer.warm``)
outlives its request and serves the next one.

A command asks for one with ``RECPIPE_RESIDENT=<name>`` in its environment (the stream
DAG's one-process train job sets it to the model's name). Requests share a resident only
when they agree in that name, the module, the working directory, ``PYTHONPATH`` and the
namespaces they come from; the process then runs each one as a forked process would (the
client's streams, environment, signals and exit status) and gives the streams back after it.
A request that fails ends the resident: the next one starts a new process.

A resident runs the code its first request imported. Its key includes the project's code as
it is on disk when a request comes (``code_stamp``: path, size and mtime of every module and
kernel of ``trainer`` and ``recpipe`` where the request's ``sys.path`` finds them), so after a
deploy the next request starts a new process over the new code, and the server ends the old
one as soon as it idles.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from recpipe.forkserver import protocol

ENV = "RECPIPE_RESIDENT"
# the packages whose code a resident keeps (a forked process imports them afresh)
PROJECT = ("trainer", "recpipe")
CODE_SUFFIXES = (".py", ".so", ".cc", ".h")


def code_stamp(cwd: str, pythonpath: str) -> str:
    """A digest of the project's code a request would import: each file of ``PROJECT`` with a
    suffix in ``CODE_SUFFIXES`` by path, size and mtime (ns), the packages looked up as
    ``python -m`` would find them (``cwd``, then ``pythonpath``, then this interpreter's path).
    Any edit, deploy or rebuilt kernel changes it. 16 hex digits."""
    search = [cwd, *(p for p in pythonpath.split(os.pathsep) if p), *sys.path[1:]]
    digest = hashlib.sha256()
    for package in PROJECT:
        root = next(
            (Path(b) / package for b in search if (Path(b) / package / "__init__.py").is_file()), None
        )
        if root is None:
            continue
        for path in sorted(p for p in root.rglob("*") if p.suffix in CODE_SUFFIXES):
            try:
                st = path.stat()
            except OSError:
                continue
            digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def key_of(request: dict, namespaces: dict[str, str]) -> tuple | None:
    """The resident a request asks for, as the server keys it: ``(name, module, cwd,
    PYTHONPATH, namespaces, code_stamp)``; None when it asks for none. Keys that differ only in
    their last item are one resident's before and after a change of code (``same_but_code``)."""
    env = request.get("env") or {}
    name = env.get(ENV)
    if not name:
        return None
    argv, cwd, path = request["argv"], request["cwd"], env.get("PYTHONPATH", "")
    return (name, argv[2], cwd, path, tuple(sorted(namespaces.items())), code_stamp(cwd, path))


def same_but_code(key: tuple, other: tuple) -> bool:
    """Whether two resident keys differ in their code alone (the older one runs stale code)."""
    return key[:-1] == other[:-1] and key[-1] != other[-1]


def requests(channel: socket.socket) -> Iterator[tuple[dict, list[int]]]:
    """The requests the server sends a resident, each with its three standard streams, until
    the server closes the channel."""
    while True:
        request, fds = protocol.receive(channel, max_fds=3)
        if request is None:
            return
        yield request, fds
