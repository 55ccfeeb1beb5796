"""The server's wire format: a 4-byte big-endian length, then a JSON object. A request carries
the client's standard streams (three file descriptors, ``SCM_RIGHTS``) with its first bytes."""

from __future__ import annotations

import json
import socket
import struct

HEADER = struct.Struct(">I")
MAX_MESSAGE = 16 << 20  # bytes; an environment and a command line fit many times over


def send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    payload = HEADER.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [payload], fds)
        payload = payload[sent:]
    if payload:  # an empty send to a peer that has answered and closed raises EPIPE
        sock.sendall(payload)


def receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message and the descriptors that came with it; ``(None, [])`` at end of stream.
    Reads exactly one message's bytes: the next one stays in the socket.

    Raises:
        ValueError: a message longer than ``MAX_MESSAGE`` or not a JSON object.
    """
    fds: list[int] = []
    header = b""
    while len(header) < HEADER.size:
        want = HEADER.size - len(header)
        if max_fds and not fds:
            chunk, got, _, _ = socket.recv_fds(sock, want, max_fds)
            fds.extend(got)
        else:
            chunk = sock.recv(want)
        if not chunk:
            for fd in fds:
                _close(fd)
            return None, []
        header += chunk
    (length,) = HEADER.unpack(header)
    if length > MAX_MESSAGE:
        raise ValueError(f"a message of {length} bytes")
    body = b""
    while len(body) < length:
        chunk = sock.recv(min(65536, length - len(body)))
        if not chunk:
            for fd in fds:
                _close(fd)
            return None, []
        body += chunk
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError("a message that is not a JSON object")
    return message, fds


def _close(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:
        pass
