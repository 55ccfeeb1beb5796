"""A Docker engine for the compose test and ``deploy/local-images/build.sh``, kept off this
machine's network rules (docs/deployment.md, "Docker on a shared host").

An engine that already answers on ``DOCKER_HOST`` (or the default socket) is used as it is.
Otherwise ``engine()`` starts a dockerd of its own: no iptables rules (``--iptables=false``:
dockerd would set the FORWARD policy to DROP, which cuts the test hosts' bridges), no IP
forwarding, its bridges in 203.0.113.128/25 (documentation addresses no test host uses; never
the machine's own 192.0.2.0/24), its images under ``/var/lib/recpipe-docker`` so that layers
are cached from run to run. On exit it stops that dockerd, deletes the bridge it left and puts
back the sysctls and iptables rules it found.

    python -m dev.dockerd -- deploy/local-images/build.sh    # a command with an engine
    python -m dev.dockerd start    # an engine kept up for a deployment: prints its DOCKER_HOST
    python -m dev.dockerd stop     # stops it, the host's rules put back
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recpipe.launch.reaper import Reaper

SOCKET = "/run/recpipe-docker/docker.sock"
DATA_ROOT = Path("/var/lib/recpipe-docker")
BRIDGE_IP = "203.0.113.129/28"
ADDRESS_POOL = "base=203.0.113.128/25,size=28"
SYSCTLS = ("net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables")


class EngineError(RuntimeError):
    """No engine answers and none can be started here (not root, no dockerd)."""


def answers(host: str | None = None, timeout: float = 10) -> bool:
    """Whether a Docker engine answers at ``host`` (a ``DOCKER_HOST`` URL; None: the
    environment's or the default socket)."""
    env = {**os.environ, **({"DOCKER_HOST": host} if host else {})}
    try:
        done = subprocess.run(["docker", "info"], env=env, capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _sysctls() -> dict[str, str]:
    out = {}
    for name in SYSCTLS:
        path = Path("/proc/sys") / name.replace(".", "/")
        if path.exists():
            out[name] = path.read_text().strip()
    return out


def _iptables() -> str | None:
    if shutil.which("iptables-save") is None:
        return None
    return subprocess.run(["iptables-save"], capture_output=True, text=True).stdout


def _strip_counters(rules: str | None) -> list[str]:
    return [line for line in (rules or "").splitlines() if not line.startswith(("#", ":"))]


def _restore(sysctls: dict[str, str], rules: str | None) -> None:
    for name, value in sysctls.items():
        path = Path("/proc/sys") / name.replace(".", "/")
        if path.exists() and path.read_text().strip() != value:
            path.write_text(value)
    if rules is not None and _strip_counters(_iptables()) != _strip_counters(rules):
        subprocess.run(["iptables-restore"], input=rules, text=True, check=False)
    if Path("/sys/class/net/docker0").exists():
        subprocess.run(["ip", "link", "del", "docker0"], check=False)


def can_start() -> str | None:
    """None when an engine answers or this process can start one; else why not."""
    if answers():
        return None
    if os.geteuid() != 0:
        return "no Docker engine answers, and only root can start one"
    if not os.path.exists(shutil.which("dockerd") or "/usr/sbin/dockerd"):
        return "no Docker engine answers, and dockerd is not installed (apt-get install docker.io)"
    return None


@contextmanager
def engine(start_timeout: float = 60) -> Iterator[dict[str, str]]:
    """An engine for the block: yields the environment (``DOCKER_HOST``) that reaches it.

    Raises:
        EngineError: none answers and this process cannot start one (not root, or Debian's
            ``docker.io`` not installed: ``apt-get install docker.io``), or the one started did
            not answer within ``start_timeout`` seconds (its log's tail is in the message).
    """
    if answers():
        yield {k: v for k, v in os.environ.items() if k == "DOCKER_HOST"}
        return
    why = can_start()
    if why:
        raise EngineError(why)
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    sysctls, rules = _sysctls(), _iptables()
    run_dir = Path(SOCKET).parent
    run_dir.mkdir(parents=True, exist_ok=True)
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    host = f"unix://{SOCKET}"
    log = open(run_dir / "dockerd.log", "ab")
    proc = subprocess.Popen(
        [
            dockerd,
            f"--host={host}",
            f"--data-root={DATA_ROOT}",
            f"--exec-root={run_dir / 'exec'}",
            f"--pidfile={run_dir / 'dockerd.pid'}",
            "--iptables=false",
            "--ip-forward=false",
            "--ip-masq=false",
            f"--bip={BRIDGE_IP}",
            f"--default-address-pool={ADDRESS_POOL}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    # a SIGKILL of this process still stops the engine (SIGTERM, then SIGKILL after 30 s)
    reaper = Reaper(grace_s=30)
    reaper.watch(proc.pid)
    try:
        deadline = time.monotonic() + start_timeout
        while not answers(host, timeout=5):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (run_dir / "dockerd.log").read_text(errors="replace")[-2000:]
                raise EngineError(f"dockerd did not start (exit {proc.poll()}):\n{tail}")
            time.sleep(0.5)
        yield {"DOCKER_HOST": host}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reaper.close()
        log.close()
        _restore(sysctls, rules)


HOLDER_PID = Path(SOCKET).parent / "holder.pid"  # the process keeping a started engine up


def start(timeout: float = 90) -> int:
    """Keep an engine up after this command ends (a deployment's): a process in a session of
    its own holds ``engine()`` until ``stop``. Prints the ``DOCKER_HOST`` line to export.
    Returns the exit code (2: no engine can be started here, the reason on stderr)."""
    if answers():
        print(f"# an engine answers already: {os.environ.get('DOCKER_HOST') or 'the default socket'}")
        return 0
    why = can_start()
    if why:
        print(f"dev.dockerd: {why}", file=sys.stderr)
        return 2
    Path(SOCKET).parent.mkdir(parents=True, exist_ok=True)
    with open(Path(SOCKET).parent / "holder.log", "ab") as log:
        holder = subprocess.Popen(
            [sys.executable, "-m", "dev.dockerd", "--", "sleep", "infinity"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
    deadline = time.monotonic() + timeout
    while not answers(f"unix://{SOCKET}", timeout=5):
        if holder.poll() is not None or time.monotonic() > deadline:
            holder.kill()
            log_path = Path(SOCKET).parent / "holder.log"
            print(f"dev.dockerd: the engine did not start (see {log_path})", file=sys.stderr)
            return 1
        time.sleep(0.5)
    HOLDER_PID.write_text(str(holder.pid))
    print(f"export DOCKER_HOST=unix://{SOCKET}")
    return 0


def stop(timeout: float = 90) -> int:
    """Stop the engine ``start`` keeps up (its holder ends it and puts back the host's rules);
    nothing to do when none was started."""
    try:
        pid = int(HOLDER_PID.read_text())
    except (OSError, ValueError):
        print("# no engine started by dev.dockerd start")
        return 0
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    HOLDER_PID.unlink(missing_ok=True)
    if Path(f"/proc/{pid}").exists():
        print(f"dev.dockerd: the engine's holder {pid} did not end in {timeout:.0f} s", file=sys.stderr)
        return 1
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """``python -m dev.dockerd -- COMMAND...``: run COMMAND with an engine, then stop it;
    ``start`` / ``stop``: keep one up for a deployment, then stop it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["start"], ["stop"]):
        return start() if argv == ["start"] else stop()
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m dev.dockerd {start | stop | -- COMMAND [ARG...]}", file=sys.stderr)
        return 2
    # SIGTERM ends the command and then the engine, as Ctrl-C does
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with engine() as env:
            return subprocess.run(argv, env={**os.environ, **env}).returncode
    except EngineError as err:
        print(f"dev.dockerd: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
