"""A parameter-server job's chief watched from outside: its servers (the ps and worker tasks)
reachable, or the chief ended naming the one that is not.

A host cut off from the network sends no reset: TensorFlow's remote calls to its server wait
on TCP retransmissions for many minutes, and the chief with them (measured here: a ps's or a
worker's host cut off, no step and no error in the 400 s after). A ps holds its share of the
variables, and the steps scheduled on a worker never return while it is away, so the job
cannot go on without either. A small process beside the chief (``python -m
trainer.server_watch``; a thread of the chief can be held by TensorFlow's own
remote calls, which keep Python's lock) connects to every server's address every
``interval_s``; when one's host has answered no attempt (neither accepted nor refused it)
for ``timeout_s`` it prints one line naming that task to the chief's stderr and kills the
chief; the train task's retry resumes from the latest checkpoint. A refusal is an answer: a
server process that ended on a live host is TensorFlow's to handle (it raises at once, and
the coordinator runs a lost worker's steps on the others). A server that is alive but busy
still accepts connections (its kernel answers).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def probe(address: str, timeout_s: float) -> bool | None:
    """A TCP connect to ``address`` (``host:port``): True when accepted, False when refused
    (no server on a live host), None when nothing answered within ``timeout_s`` seconds (no
    route, no such name, a host cut off)."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
        return True
    except ConnectionRefusedError:
        return False
    except OSError:
        return None


class ServerWatch:
    """Watch the servers of ``tasks`` (``{"ps": ["host:port", ...], "worker": [...]}``, as in
    TF_CONFIG's ``cluster``) in rounds, in the calling thread (``run``).

    Args:
        tasks: task type -> addresses, in task order.
        timeout_s: seconds without an answer from a task's host before it counts as lost.
        on_lost: called once with ``"<type> <i> (<address>)"``; ``run`` returns after it.
        interval_s: seconds between two rounds of connections.
        alive: checked each round; ``run`` returns when it is False (the watched process ended).
    """

    def __init__(
        self,
        tasks: dict[str, list[str]],
        timeout_s: float,
        on_lost: Callable[[str], None],
        interval_s: float = 2.0,
        alive: Callable[[], bool] = lambda: True,
    ):
        self.tasks = [(f"{kind} {i} ({a})", a) for kind, each in tasks.items() for i, a in enumerate(each)]
        self.timeout_s, self.interval_s, self.on_lost, self.alive = timeout_s, interval_s, on_lost, alive

    def _answers(self, address: str) -> bool:
        """Whether ``address``'s host answers: it accepts, or refuses (a server whose process
        ended on a live host: TensorFlow sees that at once and deals with it)."""
        return probe(address, min(self.interval_s * 2, 5)) is not None

    def run(self) -> str | None:
        """Watch until a task is lost (returns its name, after ``on_lost``) or ``alive()`` is
        False (returns None)."""
        last_ok = [time.monotonic()] * len(self.tasks)
        while self.alive():
            for i, (name, address) in enumerate(self.tasks):
                if self._answers(address):
                    last_ok[i] = time.monotonic()
                elif time.monotonic() - last_ok[i] > self.timeout_s and self.alive():
                    self.on_lost(name)
                    return name
            time.sleep(self.interval_s)
        return None


def lost_message(task: str, timeout_s: float, prog: str = "recpipe train") -> str:
    """The line a lost task ends the chief with (``recpipe.errors``' form of a pipeline error)."""
    what = "the variables it holds are lost to the job" if task.startswith("ps") else "its steps never return"
    return (
        f"{prog}: PipelineError: {task} unreachable for {timeout_s:.0f} s "
        f"(train_config.server_timeout_secs): {what}; the job stops here and a retry resumes from "
        "the latest checkpoint"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer.server_watch --pid PID --timeout_s S TYPE=ADDRESS ...``"""
    parser = argparse.ArgumentParser(prog="python -m trainer.server_watch")
    parser.add_argument("--pid", type=int, required=True, help="the chief: killed when a task is lost")
    parser.add_argument("--timeout_s", type=float, required=True)
    parser.add_argument("--interval_s", type=float, default=2.0)
    parser.add_argument("tasks", nargs="+", help="TYPE=HOST:PORT, in task order per type")
    args = parser.parse_args(argv)
    tasks: dict[str, list[str]] = {}
    for item in args.tasks:
        kind, address = item.split("=", 1)
        tasks.setdefault(kind, []).append(address)

    def alive() -> bool:
        return os.getppid() == args.pid  # re-parented: the chief is gone

    def lost(task: str) -> None:
        print(lost_message(task, args.timeout_s), file=sys.stderr, flush=True)
        os.kill(args.pid, signal.SIGKILL)

    ServerWatch(tasks, args.timeout_s, lost, args.interval_s, alive).run()
    return 0


@contextmanager
def watching_servers(
    tasks: dict[str, list[str]], timeout_s: float, interval_s: float = 2.0
) -> Iterator[None]:
    """This process (a parameter-server chief) watched by ``main`` for the block: a task lost
    meanwhile kills it after ``lost_message`` on its stderr (exit status 137, SIGKILL)."""
    argv = [sys.executable, "-m", "trainer.server_watch", "--pid", str(os.getpid())]
    argv += ["--timeout_s", str(timeout_s), "--interval_s", str(interval_s)]
    argv += [f"{kind}={a}" for kind, each in tasks.items() for a in each]
    watcher = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        yield
    finally:
        watcher.terminate()
        watcher.wait()


if __name__ == "__main__":
    raise SystemExit(main())
