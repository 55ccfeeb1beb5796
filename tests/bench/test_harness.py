"""bench/harness.py: variants alternate within each round, medians and ratios are taken as
its docstring says, and a process beside this one counts in the CPU-seconds."""

from __future__ import annotations

import subprocess
import sys

from bench import harness


def test_variants_alternate_round_by_round_and_each_call_is_timed():
    calls = []
    variants = {name: (lambda n=name: calls.append(n) or {"x": len(calls)}) for name in ("a", "b")}
    runs = harness.alternate(variants, rounds=3, warm_up=True, show=lambda line: None)
    assert calls == ["a", "b"] * 4  # the warm-up round, then three
    assert [r["x"] for r in runs["a"]] == [3, 5, 7] and [r["x"] for r in runs["b"]] == [4, 6, 8]
    assert all(r["wall_s"] >= 0 and r["cpu_s"] >= 0 for rows in runs.values() for r in rows)


def test_medians_over_rounds_and_ratios_within_each_round():
    runs = {
        "ref": [{"wall_s": 1.0, "cpu_s": 2.0}, {"wall_s": 4.0, "cpu_s": 2.0}, {"wall_s": 2.0, "cpu_s": 2.0}],
        "new": [{"wall_s": 0.5, "cpu_s": 1.0}, {"wall_s": 4.0, "cpu_s": 3.0}, {"wall_s": 1.0, "cpu_s": 2.0}],
    }
    out = harness.summarize(runs, reference="ref")
    assert out["variants"]["ref"] == {"wall_s": 2.0, "cpu_s": 2.0}
    assert out["variants"]["new"] == {"wall_s": 1.0, "cpu_s": 2.0}
    # each round's ratio first (0.5, 1.0, 0.5), then their median; not 1.0 / 2.0 of the medians
    assert out["vs_ref"] == {"new": {"wall_s": 0.5, "cpu_s": 1.0}}
    assert harness.ratio(runs, "new", "ref", "cpu_s") == 1.0
    # differences as ratios: each round's first (-1, 1, 0), then their median
    assert harness.difference(runs, "new", "ref", "cpu_s") == 0.0
    assert harness.difference(runs, "new", "ref", "wall_s") == -0.5


# burns 0.6 CPU-s when told to, then says so
BURN = """
import sys, time
sys.stdin.readline()
t = time.process_time()
while time.process_time() - t < 0.6:
    pass
print("done", flush=True)
sys.stdin.readline()
"""


def test_the_clock_counts_a_process_beside_this_one():
    child = subprocess.Popen(
        [sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:

        def burn() -> None:  # this process waits: its own CPU stays near 0
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline() == "done\n"

        alone = harness.Clock().measure(burn)
        assert alone["cpu_s"] < 0.3
    finally:
        child.communicate("")
    child = subprocess.Popen(
        [sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        beside = harness.Clock(child.pid).measure(burn)
        assert beside["cpu_s"] >= 0.6
    finally:
        child.communicate("")


def test_a_run_of_one_size_keeps_the_earlier_sizes_and_replaces_what_it_measured():
    earlier = {"sizes": {"1": {"train": {"cpu_s": 5.0, "floor": {"cpu_s": 4.0}}, "goals": {"a": 1}}}, "x": 1}
    new = {"sizes": {"1": {"train": {"cpu_s": 6.0, "floor": None}, "goals": {"b": 2}}, "10": {"train": {}}}}
    assert harness.merged(earlier, new) == {
        "sizes": {
            "1": {"train": {"cpu_s": 6.0, "floor": None}, "goals": {"a": 1, "b": 2}},
            "10": {"train": {}},
        },
        "x": 1,
    }
    assert earlier["sizes"]["1"]["goals"] == {"a": 1}  # the earlier document is left as it was


def test_versus_gives_each_variant_its_medians_and_its_rounds_ratios_to_the_reference():
    runs = {
        "ref": [{"wall_s": 1.0, "rate": 10.0}, {"wall_s": 4.0, "rate": 10.0}, {"wall_s": 2.0, "rate": 10.0}],
        "new": [{"wall_s": 0.5, "rate": 30.0}, {"wall_s": 4.0, "rate": 10.0}, {"wall_s": 1.0, "rate": 20.0}],
    }
    out = harness.versus(runs, "ref", {"wall_s": "wall_vs_ref", "rate": "rate_vs_ref"})
    assert out["ref"] == {"wall_s": 2.0, "rate": 10.0, "wall_vs_ref": 1.0, "rate_vs_ref": 1.0}
    assert out["new"] == {"wall_s": 1.0, "rate": 20.0, "wall_vs_ref": 0.5, "rate_vs_ref": 2.0}
