"""``python -m recpipe.forkserver.client python -m MODULE ARGS``: run the command in the fork
server named by ``$RECPIPE_FORKSERVER`` (``recpipe.forkserver``), or start it here when there
is none or it refuses. Standard library only: this process starts in milliseconds.

The client relays SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the forked
process's group and exits as it did: with its code, or killed by the same signal.
"""

from __future__ import annotations

import os
import signal
import socket
import sys

from recpipe.forkserver import ENV, protocol

RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _ask(path: str, argv: list[str]) -> tuple[socket.socket, int] | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        protocol.send(sock, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}, [0, 1, 2])
        reply, _ = protocol.receive(sock)
    except (OSError, ValueError) as e:
        print(f"recpipe.forkserver: {path}: {e}; starting the process here", file=sys.stderr)
        sock.close()
        return None
    if reply is None or "pid" not in reply:
        reason = reply.get("refused") if reply else "the server closed the connection"
        print(f"recpipe.forkserver: not forked ({reason}); starting the process here", file=sys.stderr)
        sock.close()
        return None
    return sock, int(reply["pid"])


def main() -> None:
    argv = sys.argv[1:]
    if not argv:
        sys.exit("usage: python -m recpipe.forkserver.client COMMAND [ARGS...]")
    path = os.environ.get(ENV, "")
    asked = _ask(path, argv) if path and path != "off" else None
    if asked is None:
        os.execvp(argv[0], argv)
    sock, pid = asked

    def relay(signum, frame):
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signum)
                return
            except (ProcessLookupError, PermissionError):
                continue

    for sig in RELAYED:
        signal.signal(sig, relay)
    reply, _ = protocol.receive(sock)
    if reply is None or "returncode" not in reply:
        print(f"recpipe.forkserver: the server ended before process {pid}", file=sys.stderr)
        sys.exit(1)
    code = int(reply["returncode"])
    if code < 0:  # killed by a signal: end the same way, so the launcher sees what it would
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # the two no handler can take
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
