"""Wall time, CPU-seconds and peak memory of a command's whole process tree.

A step of the pipeline is more than one process: ``recpipe features`` starts a JVM that
pyspark never waits for, so neither ``/usr/bin/time`` nor ``getrusage(RUSAGE_CHILDREN)`` sees
its CPU. ``run`` samples the tree with psutil every ``interval`` seconds instead: CPU is the
root's own ``wait4`` figure (itself and the children it reaped) plus the last sample of each
descendant still alive when the root exits; peak RSS is the largest sum over the tree at one
sample (so a short spike between samples can be missed: the interval bounds the error).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil


@dataclass
class Measured:
    """One command: ``wall_s`` (s), ``cpu_s`` (user + system, every process of the tree),
    ``peak_rss_mb`` (MiB, the tree's largest sampled sum), ``returncode`` and ``result`` (the
    last JSON object the command printed on a line of its own, else ``{}``)."""

    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    returncode: int
    result: dict = field(default_factory=dict)


class _Sampler(threading.Thread):
    def __init__(self, root: psutil.Process, interval: float):
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.cpu: dict[int, float] = {}  # descendant pid -> its own CPU-s at the last sample
        self.alive: set[int] = set()
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.sample()
            self.done.wait(self.interval)

    def sample(self) -> None:
        try:
            tree = self.root.children(recursive=True)
        except psutil.Error:
            return
        rss, alive = 0, set()
        try:
            rss += self.root.memory_info().rss
        except psutil.Error:
            return
        for proc in tree:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    rss += proc.memory_info().rss
                self.cpu[proc.pid] = times.user + times.system
                alive.add(proc.pid)
            except psutil.Error:
                continue
        self.alive = alive
        self.peak = max(self.peak, rss)


def recpipe(verb: str, *args: str, config: Path | None = None, edits: dict | None = None) -> list[str]:
    """The argv of ``recpipe <verb>`` run by this Python (``python -m cli``): ``config`` as
    ``--pipeline_config_path``, ``edits`` as ``--edit_config_json``, then ``args``."""
    argv = [sys.executable, "-m", "cli", *verb.split()]
    if config is not None:
        argv += ["--pipeline_config_path", str(config)]
    if edits is not None:
        argv += ["--edit_config_json", json.dumps(edits)]
    return [*argv, *args]


def last_json(text: str) -> dict:
    """The last line of ``text`` that parses as a JSON object, else ``{}``."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return {}


def run(argv: list[str], log: Path, env: dict | None = None, interval: float = 0.2, cwd=None) -> Measured:
    """Run ``argv`` (output to ``log``) and measure its process tree (see the module).

    Returns:
        ``Measured``; a failed command is returned, not raised: the caller names the step.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        sampler = _Sampler(psutil.Process(proc.pid), interval)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        sampler.done.set()
        sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime + sum(sampler.cpu[p] for p in sampler.alive)
    peak = max(sampler.peak, usage.ru_maxrss * 1024)
    return Measured(wall, cpu, peak / 2**20, proc.returncode, last_json(log.read_text(errors="replace")))


def checked(argv: list[str], log: Path, what: str, **kwargs) -> Measured:
    """``run``; a command that fails ends the bench (``SystemExit``) naming ``what``, its exit
    code, its log and the log's last 3,000 characters."""
    measured = run(argv, log, **kwargs)
    if measured.returncode:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{what} failed ({measured.returncode}), see {log}:\n{tail}")
    return measured
