"""The multi-host harness (``dev/hosts.py``) itself: hosts reach each other by their
addresses and not 127.0.0.1's services, a partition cuts a host off and healing restores it,
a rate limit slows what reaches a host, and nothing is left behind: not by a test that
fails, and what a killed run left is swept at the next start."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from dev.hosts import PREFIX, Hosts, sweep

FETCH = (
    "import sys, urllib.request; "
    "print(len(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read()))"
)


def _ours() -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [n for n in names if n.startswith(PREFIX + "-")] + [
        line.split(":")[1].strip()
        for line in links.splitlines()
        if line.split(":")[1].strip().startswith(PREFIX)
    ]


def _fetch(hosts: Hosts, name: str, url: str, timeout: float = 5) -> subprocess.CompletedProcess:
    return hosts.run(name, [sys.executable, "-c", FETCH, url, str(timeout)], timeout=timeout + 30)


def test_hosts_reach_each_other_partition_heal_and_limit(tmp_path):
    (tmp_path / "blob").write_bytes(b"x" * 400_000)
    with Hosts(["a", "b", "c"]) as hosts:
        server = hosts.address("a")
        hosts.popen("a", [sys.executable, "-m", "http.server", "8000", "--bind", server, "-d", str(tmp_path)])
        url = f"http://{server}:8000/blob"
        deadline = time.monotonic() + 30
        while (done := _fetch(hosts, "b", url)).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert done.stdout.strip() == "400000", done.stderr[-500:]
        # the root namespace's 127.0.0.1 services are not a host's
        redis = hosts.run(
            "b", [sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 6379), 2)"]
        )
        assert redis.returncode != 0
        hosts.partition("a")
        assert _fetch(hosts, "c", url, timeout=2).returncode != 0
        hosts.heal("a")
        deadline = time.monotonic() + 30
        while (done := _fetch(hosts, "c", url)).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert done.returncode == 0, done.stderr[-500:]
        # 400 kB at 1 Mbit/s: at least 3 s (the server's replies go out on a's link)
        hosts.limit("a", "1mbit")
        start = time.monotonic()
        assert _fetch(hosts, "b", url, timeout=30).returncode == 0
        assert time.monotonic() - start > 2.5
    assert _ours() == []


def test_nothing_is_left_by_a_failing_test_or_a_killed_run():
    with pytest.raises(RuntimeError), Hosts(["a", "b"]) as hosts:
        assert hosts.run("a", ["ip", "-o", "addr", "show", "eth0"]).stdout.count("198.51.100.10/24") == 1
        raise RuntimeError("the test failed")
    assert _ours() == []
    # a killed run's namespace: its owner's pid is gone
    stale = f"{PREFIX}-4194999-0-x"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    assert stale in sweep()
    assert stale not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_an_engine_kept_up_for_a_deployment_stops_on_request():
    """docs/deployment.md's ``dev.dockerd start`` / ``stop``, run as written: the engine answers
    after ``start`` returns, and ``stop`` ends it (its holder and dockerd gone, the socket too)."""
    from dev import dockerd
    from tests.support import ROOT, doc_commands, run_doc_commands

    if dockerd.answers():
        pytest.skip("an engine answers already: start would use it, not start one")
    why = dockerd.can_start()
    if why:
        pytest.skip(why)
    test = "tests/test_hosts.py::test_an_engine_kept_up_for_a_deployment_stops_on_request"
    text = doc_commands("deployment.md", test)
    try:
        done = run_doc_commands(text, ROOT, timeout=180)
        assert done.returncode == 0 and done.stdout.strip().splitlines()[-1][:1].isdigit(), done.stdout
    finally:
        subprocess.run([sys.executable, "-m", "dev.dockerd", "stop"], cwd=ROOT, timeout=120)
    assert not dockerd.answers(f"unix://{dockerd.SOCKET}", timeout=5)
    assert not dockerd.HOLDER_PID.exists()
