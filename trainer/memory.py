"""This process's memory, for the result lines and the per-phase profile of a training job
(issue 40: where a day's memory goes). Linux's ``/proc/self/status`` ``VmHWM`` (the peak so
far); ``getrusage`` where it is missing."""

from __future__ import annotations

import ctypes
import ctypes.util
import resource

MB = 1 << 20


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _libc()


def release_free_memory() -> bool:
    """Hand the pages that malloc holds free back to the system (glibc's ``malloc_trim(0)``,
    which also releases free pages inside its heaps, not only at their tops). TensorFlow's CPU
    tensors come from malloc, and a training step frees as much as it allocates; the holes
    they leave (about 0.45 GB at steady state in a 3M-row day's online training, issue 40) stay
    resident until trimmed, and a growing table's next doubling then adds to them. About
    2 ms (1M-row day); the training loop calls it after the first step and every 100 steps
    (``trainer.loop.TRIM_STEPS``).
    Returns whether it ran (False where the C library has no ``malloc_trim``: not glibc)."""
    if _LIBC is None:
        return False
    _LIBC.malloc_trim(0)
    return True


def _status(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        return None
    return None


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MiB (2 decimals)."""
    peak = _status("VmHWM")
    if peak is None:  # ru_maxrss is in KiB on Linux
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return round(peak / MB, 2)


class MemoryProfile:
    """The peak resident memory (MiB) up to the end of each phase of a job, in order: what a
    phase added is its peak less the one before (``phases``)."""

    def __init__(self):
        self.peaks: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """The peak so far, as the end of ``phase`` (a phase marked twice keeps its first).
        Never below an earlier phase's: the kernel's ``VmHWM`` is taken from approximate
        per-thread RSS counters and was seen to read 0.17 MiB lower a phase later."""
        self.peaks.setdefault(phase, max([peak_rss_mb(), *self.peaks.values()]))

    def phases(self) -> dict[str, float]:
        """``{phase: peak MiB at its end}``, in the order marked."""
        return dict(self.peaks)
