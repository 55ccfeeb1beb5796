"""Outputs a command owns: a directory it writes is new, or its own earlier output.

Every command that writes a directory for others to read (``recpipe predict`` and the DAG's
``batch_predict``, a feature job's ``ds=`` partitions, an export's version directory) writes it
through ``directory``: the directory is filled aside, a marker (``MARKER``: the command and its
inputs, JSON) is written inside it, and it replaces the target in one rename. Before the work
and again just before the rename, the target is checked (``check``): it may not be a data root
or the project's home, hold one of the command's inputs or lie inside one, and where it exists
and is not empty it must hold a marker of the same command over the same inputs. So re-running
a command replaces only what that command wrote from the same input; nothing else is renamed
aside and deleted. ``config import``'s single file follows the same rule with a header line
(``recpipe.config.importer``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from recpipe import atomic
from recpipe.errors import UsageError
from recpipe.home import project_home
from recpipe.paths import allowed_roots

MARKER = "_recpipe_output.json"


class OutputNotOwnedError(UsageError):
    """The output path would replace data the command did not write (exit 2): the message names
    the flag, the path and why."""


def _resolved(path: str | os.PathLike) -> Path:
    # where the file system puts it: a relative path against the working directory
    return Path(path).resolve()


def marker(command: str, inputs: Iterable[str | os.PathLike]) -> dict:
    """The marker's record: ``{"command": str, "inputs": [absolute paths, sorted]}``."""
    return {"command": command, "inputs": sorted(str(_resolved(p)) for p in inputs)}


def read_marker(directory: str | os.PathLike) -> dict | None:
    """The marker ``directory`` holds, or ``None`` (none, or not a marker recpipe wrote)."""
    try:
        found = json.loads((Path(directory) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _holds(outer: Path, inner: Path) -> bool:
    return inner == outer or inner.is_relative_to(outer)


def refuse_root(final: str | os.PathLike, flag: str) -> Path:
    """``final`` resolved, unless it is ``/``, the project's home or one of its data roots.

    Raises:
        OutputNotOwnedError: it is.
    """
    path = _resolved(final)
    if path in {project_home(), *allowed_roots(), Path("/")}:
        raise OutputNotOwnedError(f"{flag}={path}: a data root; name a new directory under it")
    return path


def mark(directory: Path, command: str, inputs: Iterable[str | os.PathLike] = ()) -> None:
    """Write the marker into a directory being filled aside (for writers that publish it by
    their own rename, as an export's numbered version is)."""
    (Path(directory) / MARKER).write_text(json.dumps(marker(command, inputs), sort_keys=True))


def check(
    final: str | os.PathLike,
    command: str,
    inputs: Iterable[str | os.PathLike] = (),
    flag: str = "--output_path",
    adopt: Callable[[Path], bool] | None = None,
) -> Path:
    """Refuse an output path the command does not own (see the module docstring).

    Args:
        final: the output directory, absolute or relative to the working directory.
        command: the writer's name, e.g. ``"recpipe predict"``.
        inputs: the paths the command reads (files or directories).
        flag: the flag or field that named ``final``, for the message.
        adopt: where given, says whether a directory without a marker is this command's output
            written before markers existed (its own side files say so).

    Returns:
        ``final`` resolved.

    Raises:
        OutputNotOwnedError: ``final`` is a data root or the home, holds or lies inside an
            input, is a file, or is a non-empty directory without a matching marker.
    """
    path = refuse_root(final, flag)
    for given in inputs:
        source = _resolved(given)
        if _holds(path, source):
            raise OutputNotOwnedError(
                f"{flag}={path}: holds the command's input {source}; name a new directory"
            )
        if _holds(source, path):
            raise OutputNotOwnedError(
                f"{flag}={path}: lies inside the command's input {source}; name a new directory"
            )
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise OutputNotOwnedError(f"{flag}={path}: not a directory; name a new directory")
    if path.is_dir() and any(path.iterdir()):
        found = read_marker(path)
        want = marker(command, inputs)
        if found is None and adopt is not None and adopt(path):
            return path
        if found is None:
            raise OutputNotOwnedError(
                f"{flag}={path}: holds files {command} did not write (no {MARKER}); name a new directory"
            )
        if {k: found.get(k) for k in want} != want:
            raise OutputNotOwnedError(
                f"{flag}={path}: written by {found.get('command')} from {found.get('inputs')}, "
                f"not by {command} from {want['inputs']}; name a new directory"
            )
    return path


@contextmanager
def directory(
    final: str | os.PathLike,
    command: str,
    inputs: Iterable[str | os.PathLike] = (),
    flag: str = "--output_path",
    adopt: Callable[[Path], bool] | None = None,
) -> Iterator[Path]:
    """``recpipe.atomic.directory`` for an output the command owns: ``check`` before and after
    the block, the marker written into the yielded temporary directory, then the rename.

    Raises:
        OutputNotOwnedError: as ``check``; nothing is written or removed then.
    """
    inputs = list(inputs)
    check(final, command, inputs, flag, adopt)
    with atomic.directory(final) as tmp:
        yield tmp
        check(final, command, inputs, flag, adopt)  # the world may have moved while the block ran
        mark(tmp, command, inputs)
