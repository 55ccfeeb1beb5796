"""Hosts for the multi-host tests: Linux network namespaces joined by veth pairs to a bridge,
each with its own interface and an address from the documentation range 198.51.100.0/24; the
filesystem stays shared, as a ReadWriteMany volume or NFS would be in a cluster. A test (as
root) runs commands on a host, partitions and heals one, limits a link's rate (``tc`` ``tbf``;
``netem`` is not in this kernel), and everything is removed when the block ends, even when
the test fails; what a killed run left is swept when the next one starts (its names share
``PREFIX``). Never imported by production code."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

# namespaces rph-<pid>-<n>-<host>, links rph-<pid>-<n><i> and rph-<pid>-<n>b (15 characters at
# most): a sweep removes only these, and only a process's that is gone
PREFIX = "rph"
SUBNET = "198.51.100"  # TEST-NET-2: never a private or public range
_count = iter(range(10**6))
ETC = Path("/etc/netns")  # a namespace's own /etc files, mounted by ip netns exec


def _owner_alive(name: str) -> bool:
    try:
        pid = int(name.split("-")[1])
    except (IndexError, ValueError):
        return False
    return pid == os.getpid() or Path(f"/proc/{pid}").exists()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def sweep() -> list[str]:
    """Remove the namespaces, links and ``/etc/netns`` files named with ``PREFIX`` whose
    process is gone (a killed run's; a concurrent test's stay); returns the namespaces and links."""
    gone = []
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(PREFIX + "-") and not _owner_alive(name):
            for pid in _ip("netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", name, check=False)
            shutil.rmtree(ETC / name, ignore_errors=True)
            gone.append(name)
    for line in _ip("-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(PREFIX + "-") and not _owner_alive(name):
            _ip("link", "del", name, check=False)
            gone.append(name)
    for etc in ETC.glob(PREFIX + "-*") if ETC.is_dir() else ():
        if not _owner_alive(etc.name):
            shutil.rmtree(etc, ignore_errors=True)
    return gone


class Hosts:
    """``names`` as hosts ``<SUBNET>.10``, ``.11``, ... on a bridge at ``<SUBNET>.1`` (the root
    namespace, where the test runs, reaches every host through it).

    Use as a context manager; ``address(name)`` is a host's address, ``run`` / ``popen`` run a
    command there (``ip netns exec``), ``partition`` / ``heal`` cut a host's link and restore it,
    ``limit`` caps its rate.
    """

    def __init__(self, names: list[str]):
        self.names = list(names)
        if len(self.names) > 10:
            raise ValueError("at most 10 hosts (interface names are 15 characters)")
        self.run_id = f"{os.getpid()}-{next(_count) % 10}"
        self.bridge = f"{PREFIX}-{self.run_id}b"
        self.procs: list[subprocess.Popen] = []

    def namespace(self, name: str) -> str:
        return f"{PREFIX}-{self.run_id}-{name}"

    def address(self, name: str) -> str:
        return f"{SUBNET}.{10 + self.names.index(name)}"

    @property
    def gateway(self) -> str:
        """The bridge's address: the root namespace, where the test runs."""
        return f"{SUBNET}.1"

    def link(self, name: str) -> str:
        """The bridge-side end of the host's veth pair (what ``partition`` and ``limit`` act on)."""
        return f"{PREFIX}-{self.run_id}{self.names.index(name)}"

    def __enter__(self) -> Hosts:
        sweep()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{SUBNET}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for name in self.names:
                ns, outer, inner = self.namespace(name), self.link(name), self.link(name) + "i"
                _ip("netns", "add", ns)
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", ns)
                _ip("-n", ns, "link", "set", inner, "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.address(name)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("link", "set", outer, "master", self.bridge)
                _ip("link", "set", outer, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop what ``popen`` started, remove the namespaces (their veth ends go with them)
        and the bridge."""
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        for name in self.names:
            # the pair goes with its root-side end at once; a namespace's own cleanup (which
            # would take its end along) runs later, in the kernel's time
            _ip("link", "del", self.link(name), check=False)
            _ip("netns", "del", self.namespace(name), check=False)
            shutil.rmtree(ETC / self.namespace(name), ignore_errors=True)
        _ip("link", "del", self.bridge, check=False)

    def write_etc(self, name: str, file: str, text: str) -> Path:
        """Host ``name``'s own ``/etc/<file>`` (``ip netns exec`` mounts
        ``/etc/netns/<namespace>/<file>`` over it; ``hosts``: its names); removed on close."""
        path = ETC / self.namespace(name) / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def _command(self, name: str, command: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(name), *command]

    def run(
        self, name: str, command: list[str], timeout: float = 60, **kwargs
    ) -> subprocess.CompletedProcess:
        """Run ``command`` on host ``name`` and wait (text output captured)."""
        return subprocess.run(
            self._command(name, command), capture_output=True, text=True, timeout=timeout, **kwargs
        )

    def popen(self, name: str, command: list[str], log: Path | None = None, **kwargs) -> subprocess.Popen:
        """Start ``command`` on host ``name`` in its own process group (stopped on close);
        output to ``log`` or discarded."""
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 (the child keeps it)
        proc = subprocess.Popen(
            self._command(name, command),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **kwargs,
        )
        self.procs.append(proc)
        return proc

    def partition(self, name: str) -> None:
        """Cut host ``name`` off the others (its link down)."""
        _ip("link", "set", self.link(name), "down")

    def heal(self, name: str) -> None:
        _ip("link", "set", self.link(name), "up")

    def limit(self, name: str, rate: str = "10mbit") -> None:
        """Cap host ``name``'s link at ``rate`` both ways (a ``tc`` token bucket on each end)."""
        tbf = ["root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
        subprocess.run(
            ["tc", "qdisc", "replace", "dev", self.link(name), *tbf], check=True, capture_output=True
        )
        self.run(name, ["tc", "qdisc", "replace", "dev", "eth0", *tbf], check=True)
