"""A parameter-server chief's watch on its servers (``trainer.server_watch``): a host that
answers (accepting or refusing) is fine; once one has not answered for the timeout, one line
naming the task, and the chief killed."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

from tests.support import ROOT


def _address(sock: socket.socket) -> str:
    host, port = sock.getsockname()
    return f"{host}:{port}"


def test_the_watch_names_the_server_whose_host_does_not_answer_and_kills_the_chief():
    serving = socket.create_server(("127.0.0.1", 0))  # the ps: accepts every connection
    threading.Thread(target=lambda: [serving.accept()[0].close() for _ in iter(int, 1)], daemon=True).start()
    ended = socket.create_server(("127.0.0.1", 0))
    worker = _address(ended)
    ended.close()  # worker 0: its process ended on a live host: refused, which is an answer
    # worker 1: a host cut off answers nothing; so does a listener whose queue is full (the
    # kernel drops further SYNs without a reset)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(0)
    held = socket.create_connection(silent.getsockname())
    ps, cut = _address(serving), _address(silent)
    # a stand-in chief: it starts the watch and sleeps, as a chief stuck in a remote call
    chief = (
        "import time; from trainer.server_watch import watching_servers\n"
        f"with watching_servers({{'ps': [{ps!r}], 'worker': [{worker!r}, {cut!r}]}}, 1.0, 0.1):\n"
        "    print('watching', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", chief], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline() == "watching\n"
        started = time.monotonic()
        proc.wait(30)
        assert proc.returncode == -signal.SIGKILL and time.monotonic() - started >= 0.9
        err = proc.stderr.read()
        assert f"recpipe train: PipelineError: worker 1 ({cut}) unreachable for 1 s" in err
        assert "ps 0" not in err and "worker 0" not in err
    finally:
        proc.kill()
        for sock in (held, silent, serving):
            sock.close()
