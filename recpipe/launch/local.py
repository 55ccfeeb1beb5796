"""Processes on this machine: each in its own session (process group), one log file each, all
of a job in one private network namespace with an allowlisted environment
(``recpipe.launch.isolation``)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from recpipe.forkserver import forked, socket_path
from recpipe.launch.base import JobFailedError, JobSpec, JobTimeoutError
from recpipe.launch.isolation import PrivateNetwork, job_environment
from recpipe.launch.reaper import Reaper

log = logging.getLogger(__name__)
TAIL_LINES = 40


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" if it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            return b"\n".join(f.read().splitlines()[-lines:]).decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


# restarts of a restartable process (a parameter-server worker) before the job fails
MAX_RESTARTS = 3
# seconds between the logs' forwarding and the checks of the job; a process's exit is seen
# within EXIT_CHECK_S (a stream pass's job waits for nothing after its last process ends)
POLL_S = 0.5
EXIT_CHECK_S = 0.02
# the job's start (unix seconds) in every process's environment: a restarted evaluator tells
# this job's end-of-training marker from an earlier job's by it
JOB_STARTED_ENV = "RECPIPE_JOB_STARTED"


class LocalLauncher:
    """Runs a job's processes on 127.0.0.1 of a network namespace of their own (unreachable from
    other hosts and from this host's other processes; ``recpipe.launch.isolation``), with an
    allowlisted environment, and forwards their output to the task log.

    Each process starts a new session, so ``kill`` (Airflow's ``on_kill``) can signal its whole
    tree: SIGTERM to every process group, SIGKILL after ``grace_s`` seconds. A launcher that is
    itself killed (SIGKILL of the task) leaves nothing either: a watcher
    (``recpipe.launch.reaper``) ends every group it started, the namespace's holder included,
    and so does a job whose start failed halfway.

    Args:
        log_dir: where ``<job>-<i>.log`` files go (created).
        grace_s: seconds between SIGTERM and SIGKILL.
        timeout_s: stop the whole job (every process tree) after this many seconds and raise
            ``JobTimeoutError``; None waits for ever (a hung collective then holds the job).

    Attributes:
        degraded: ``{role: reason}`` of the optional processes (``JobSpec.optional``) that
            failed in the last ``run`` while the job went on.
    """

    def __init__(self, log_dir: str | os.PathLike, grace_s: float = 10.0, timeout_s: float | None = None):
        self.log_dir = Path(log_dir)
        self.grace_s = grace_s
        self.timeout_s = timeout_s
        self.degraded: dict[str, str] = {}
        self._procs: list[subprocess.Popen] = []
        self._job_env: dict[str, str] = {}
        self._network = PrivateNetwork()

    def run(self, job: JobSpec) -> list[Path]:
        """Start every process of ``job``, stream their logs, wait for all.

        Raises:
            JobFailedError: a process exited non-zero; the others were stopped. The message
                names the process and ends with the tail of its log.
            JobTimeoutError: ``timeout_s`` passed; every process was stopped.
        """
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.degraded = {}
        logs = [self.log_dir / f"{job.name}-{i}.log" for i in range(len(job.argv))]
        started = time.monotonic()
        # every process, restarted ones too, learns when the job began (JOB_STARTED_ENV)
        self._job_env = {JOB_STARTED_ENV: repr(time.time())}
        self._reaper = Reaper(self.grace_s)
        offsets = [0] * len(logs)
        restarts = dict.fromkeys(job.restart, 0)
        given_up: set[int] = set()  # optional processes that failed for good
        try:
            # a resident outlives the job: it cannot live in a namespace that ends with it
            resident = job.resident and socket_path() is not None
            self._network = PrivateNetwork() if resident else PrivateNetwork().open()
            if self._network.holder is not None:
                self._reaper.watch(self._network.holder.pid)
            for i, path in enumerate(logs):
                self._procs.append(self._start(job, i, path, "wb"))
            log.info("started %s: %s", job.name, "; ".join(" ".join(a) for a in job.argv))
            while True:
                pairs = enumerate(zip(logs, offsets, strict=True))
                offsets = [self._forward(p, o, job.name, job.role(i)) for i, (p, o) in pairs]
                codes = self._restart_or_drop(job, [p.poll() for p in self._procs], logs, restarts, given_up)
                failed = [i for i, c in enumerate(codes) if c not in (None, 0) and i not in given_up]
                if failed:
                    # of processes that failed within one poll, one killed by a signal is the
                    # cause: the others' collectives failed because it was gone
                    i = min(failed, key=lambda i: (codes[i] > 0, i))
                    self.kill()
                    last = tail(logs[i])
                    raise JobFailedError(
                        f"{job.name} {job.role(i)} exited with code {codes[i]} (log {logs[i]}); "
                        f"last lines:\n{last}",
                        exit_code=codes[i],
                        last_line=next((x for x in reversed(last.splitlines()) if x.strip()), ""),
                    )
                tasks = [c for i, c in enumerate(codes) if i not in job.servers and i not in given_up]
                if all(c == 0 for c in tasks):
                    self.kill()  # servers serve until the tasks are done
                    for i, (p, o) in enumerate(zip(logs, offsets, strict=True)):
                        self._forward(p, o, job.name, job.role(i))
                    return logs
                if self.timeout_s is not None and time.monotonic() - started > self.timeout_s:
                    self.kill()
                    running = [job.role(i) for i, c in enumerate(codes) if c is None]
                    raise JobTimeoutError(
                        f"{job.name} ran past its timeout of {self.timeout_s:.0f} s; stopped "
                        f"{', '.join(running)} (a hung collective or a stuck input?). Log of "
                        f"{job.role(0)} ({logs[0]}), last lines:\n{tail(logs[0])}"
                    )
                self._until_an_exit(POLL_S)
        except BaseException:
            self.kill()  # Airflow's AirflowTaskTimeout or a KeyboardInterrupt: no orphans
            raise
        finally:
            self._procs = []
            self._network.close()
            self._reaper.close()

    def _until_an_exit(self, seconds: float) -> None:
        """Sleep ``seconds``, or until one of the job's running processes exits."""
        deadline = time.monotonic() + seconds
        running = [p for p in self._procs if p.poll() is None]
        while time.monotonic() < deadline and all(p.poll() is None for p in running):
            time.sleep(EXIT_CHECK_S)

    def _restart_or_drop(
        self, job: JobSpec, codes: list, logs: list[Path], restarts: dict, given_up: set
    ) -> list:
        """After a poll (``codes``: each process's exit code or None): restart a failed
        process of ``job.restart`` (up to ``MAX_RESTARTS`` times, counted in ``restarts``), and
        let the job go on without a failed one of ``job.optional`` (added to ``given_up`` and
        ``self.degraded``). Returns the codes, None for the processes restarted."""
        codes = list(codes)
        for i in job.restart:
            if codes[i] not in (None, 0) and i not in given_up and restarts[i] < MAX_RESTARTS:
                restarts[i] += 1
                log.warning(
                    "%s %s exited with code %s; restarting it (%d of %d)",
                    job.name,
                    job.role(i),
                    codes[i],
                    restarts[i],
                    MAX_RESTARTS,
                )
                self._procs[i] = self._start(job, i, logs[i], "ab")
                codes[i] = None
        for i in job.optional - given_up:
            if codes[i] not in (None, 0):
                given_up.add(i)
                reason = f"exited with code {codes[i]} (log {logs[i]})"
                self.degraded[job.role(i)] = reason
                log.error(
                    "%s %s %s; the job goes on without it. Last lines:\n%s",
                    job.name,
                    job.role(i),
                    reason,
                    tail(logs[i]),
                )
        return codes

    def _start(self, job: JobSpec, i: int, path: Path, mode: str) -> subprocess.Popen:
        with path.open(mode) as out:
            process = subprocess.Popen(
                # through the warm fork server when one is configured (recpipe.forkserver)
                self._network.wrap(forked(job.argv[i])),
                cwd=job.cwd,
                # none of the worker's secrets (Airflow's, the stores' passwords) reach a job
                env=job_environment({**job.process_env(i), **self._job_env}),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._reaper.watch(process.pid)  # a session leader: its group is its pid
        return process

    @staticmethod
    def _forward(path: Path, offset: int, name: str, role: str) -> int:
        with path.open("rb") as f:
            f.seek(offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        for line in chunk[:end].decode("utf-8", "replace").splitlines():
            log.info("[%s %s] %s", name, role, line)
        return offset + end

    def kill(self) -> None:
        """SIGTERM every process group of the job, then SIGKILL those still alive."""
        procs = [p for p in self._procs if p.poll() is None]
        for p in procs:
            _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p.pid, signal.SIGKILL)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.warning("process %d did not exit after SIGKILL", p.pid)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
