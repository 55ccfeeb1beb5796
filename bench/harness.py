"""The benches' one harness: their shared command line, variants measured in alternating
rounds, medians and ratios to a reference variant, and the results file.

A bench names its variants, each a callable that runs once and returns its figures (a dict of
numbers; ``Clock`` adds ``wall_s`` and ``cpu_s`` where the variant runs in this process, and
``bench.process_tree.run`` measures a variant that is a command). ``alternate`` runs round
after round of every variant, in turn, so that load from other tenants of a shared machine
falls on all of them; ``summarize`` gives each figure's median over the rounds and, for the
reference variant's figures, the median over rounds of each round's ratio (a ratio taken
within a round, where the variants shared the machine's state). ``finish`` writes the results
file the docs render (``bench.results``)::

    args = harness.parser(__doc__, rounds=3).parse_args()
    runs = harness.alternate({"a": run_a, "b": run_b}, args.rounds)
    harness.finish("name", {"rounds": args.rounds, **harness.summarize(runs, reference="a")})
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from bench.results import FOLDER, ROOT, write_results

Figures = dict[str, float]


class Clock:
    """Wall and CPU seconds of a call: this process's CPU (every thread) and the CPU of
    ``pids`` beside it (a JVM a session drives, which ``getrusage`` cannot see)."""

    def __init__(self, *pids: int):
        self.pids = pids

    def cpu(self) -> float:
        """CPU-seconds so far (user + system) of this process, its waited-for children and
        ``pids``."""
        import resource

        import psutil

        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        total = time.process_time() + children.ru_utime + children.ru_stime
        for pid in self.pids:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        return total

    def measure(self, fn: Callable[[], Figures | None]) -> Figures:
        """Call ``fn``; its figures (``{}`` for None) with ``wall_s`` and ``cpu_s`` added
        where it did not give them."""
        wall, cpu = time.perf_counter(), self.cpu()
        figures = dict(fn() or {})
        figures.setdefault("wall_s", time.perf_counter() - wall)
        figures.setdefault("cpu_s", self.cpu() - cpu)
        return figures


def parser(doc: str, rounds: int | None = 3, workdir: str | None = None) -> argparse.ArgumentParser:
    """The bench's command line: its docstring's first line as the description, ``--rounds``
    (each variant runs once a round; None: a bench without rounds) and, with ``workdir``,
    ``--workdir`` (its default under ``var/bench/``). The bench adds its own flags."""
    out = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    if rounds is not None:
        out.add_argument("--rounds", type=int, default=rounds, help="times each variant runs, alternating")
    if workdir is not None:
        out.add_argument("--workdir", type=Path, default=ROOT / "var" / "bench" / workdir)
    return out


def alternate(
    variants: Mapping[str, Callable[[], Figures | None]],
    rounds: int,
    clock: Clock | None = None,
    warm_up: bool = False,
    show: Callable[[str], None] = print,
) -> dict[str, list[Figures]]:
    """Run every variant once a round, in turn, for ``rounds`` rounds (after one unmeasured
    call each with ``warm_up``): each variant's figures by round. Each call goes through
    ``clock`` (default: a ``Clock`` of this process); a line a call is shown."""
    clock = clock or Clock()
    if warm_up:
        for fn in variants.values():
            fn()
    runs: dict[str, list[Figures]] = {name: [] for name in variants}
    for r in range(rounds):
        for name, fn in variants.items():
            figures = clock.measure(fn)
            runs[name].append(figures)
            show(f"round {r + 1}/{rounds} {name}: " + _line(figures))
    return runs


def _line(figures: Mapping) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in figures.items() if isinstance(v, int | float))


def summarize(
    runs: Mapping[str, list[Figures]],
    reference: str | None = None,
    ratios: Iterable[str] = ("wall_s", "cpu_s"),
) -> dict:
    """``{"variants": {name: {figure: median over rounds}}}`` for every numeric figure; with
    ``reference``, also ``{"vs_<reference>": {name: {figure: median of the rounds' ratios}}}``
    for the figures in ``ratios``."""
    out: dict = {"variants": {}}
    for name, rows in runs.items():
        keys = [k for k, v in rows[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
        out["variants"][name] = {k: statistics.median(row[k] for row in rows) for k in keys}
    if reference is not None:
        out[f"vs_{reference}"] = {
            name: {
                k: ratio(runs, name, reference, k) for k in ratios if k in rows[0] and k in runs[reference][0]
            }
            for name, rows in runs.items()
            if name != reference
        }
    return out


def versus(runs: Mapping[str, list[Figures]], reference: str, ratios: Mapping[str, str]) -> dict[str, dict]:
    """Each variant's medians (``summarize``) with, for each ``figure: key`` of ``ratios``,
    ``key``: the median of its rounds' ratios to ``reference`` (1.0 for the reference)."""
    out = {}
    for name, medians in summarize(runs)["variants"].items():
        vs = {key: 1.0 if name == reference else ratio(runs, name, reference, f) for f, key in ratios.items()}
        out[name] = {**medians, **vs}
    return out


def ratio(runs: Mapping[str, list[Figures]], name: str, reference: str, figure: str) -> float:
    """The median over rounds of ``name``'s ``figure`` over ``reference``'s in the same round
    (rounds where the reference's figure is 0 left out)."""
    pairs = zip(runs[name], runs[reference], strict=True)
    return statistics.median(row[figure] / ref[figure] for row, ref in pairs if ref[figure])


def difference(runs: Mapping[str, list[Figures]], name: str, reference: str, figure: str) -> float:
    """The median over rounds of ``name``'s ``figure`` minus ``reference``'s in the same round
    (an AUC's gap, say)."""
    pairs = zip(runs[name], runs[reference], strict=True)
    return statistics.median(row[figure] - ref[figure] for row, ref in pairs)


def table(rows: Mapping[str, Mapping[str, float]], columns: Mapping[str, str]) -> str:
    """A printed table: a line a row (its name first), ``columns`` maps a figure to its
    header; a missing figure is blank."""
    width = max([len(name) for name in rows] + [4])
    head = f"{'':{width}s} " + " ".join(f"{h:>12s}" for h in columns.values())
    lines = [head]
    for name, figures in rows.items():
        cells = [f"{_cell(figures[k]):>12s}" if k in figures else " " * 12 for k in columns]
        lines.append(f"{name:{width}s} " + " ".join(cells))
    return "\n".join(lines)


def _cell(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def finish(name: str, doc: dict, keep_earlier: bool = False) -> Path:
    """Write ``bench/results/<name>.json`` (``bench.results.write_results``) and say where;
    with ``keep_earlier``, ``doc`` merged into the file's earlier figures (``merged``: a run of
    one size or step keeps the others')."""
    path = FOLDER / f"{name}.json"
    if keep_earlier and path.exists():
        doc = merged(json.loads(path.read_text()), doc)
    path = write_results(name, doc)
    print(f"-> {path.relative_to(ROOT)}")
    return path


def merged(earlier: dict, new: dict) -> dict:
    """``earlier`` updated by ``new``, dict by dict at every depth (a value that is not a dict
    replaces the earlier one; keys ``new`` lacks are kept)."""
    out = dict(earlier)
    for key, value in new.items():
        old = out.get(key)
        out[key] = merged(old, value) if isinstance(value, dict) and isinstance(old, dict) else value
    return out
