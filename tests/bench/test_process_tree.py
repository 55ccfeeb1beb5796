"""bench/process_tree.py: a step's CPU-seconds and memory include the processes its root never
waits for (as pyspark never waits for its JVM)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from bench.process_tree import checked, last_json, run

# a child that allocates 300 MiB and burns 1.5 CPU-s, started and never waited for: it ends
# before the root, which never reaps it
CHILD = textwrap.dedent(
    """
    import time
    block = bytearray(300 * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    start = time.process_time()
    while time.process_time() - start < 1.5:
        pass
    time.sleep(0.2)
    """
)
ROOT = (
    "import json, subprocess, sys, time; "
    f"subprocess.Popen([sys.executable, '-c', {CHILD!r}]); "
    "time.sleep(2.5); print(json.dumps({'done': 1}))"
)


def test_cpu_and_memory_of_a_child_the_root_never_waits_for_are_counted(tmp_path):
    measured = run([sys.executable, "-c", ROOT], tmp_path / "log", interval=0.1)
    assert measured.returncode == 0 and measured.result == {"done": 1}
    # the child's 1.5 CPU-s as last sampled: under load the sampler's last look can come a few
    # hundred CPU-ms before the child's end; the root alone, which sleeps, stays near 0.1
    assert measured.cpu_s >= 0.75
    assert measured.peak_rss_mb >= 300
    assert measured.wall_s >= 2.5


def test_last_json_takes_the_last_object_line():
    assert last_json('log\n{"a": 1}\nnoise {\n{"b": 2}\ntrailing') == {"b": 2}
    assert last_json("no json here") == {}


def test_a_failed_command_ends_the_bench_naming_it_and_its_log(tmp_path):
    log = tmp_path / "step.log"
    code = "import sys; print('the reason'); sys.exit(3)"
    with pytest.raises(SystemExit, match=r"(?s)the step failed \(3\), see .*step.log:\nthe reason"):
        checked([sys.executable, "-c", code], log, "the step")
    assert checked([sys.executable, "-c", "print('{\"rows\": 2}')"], log, "ok").result == {"rows": 2}
