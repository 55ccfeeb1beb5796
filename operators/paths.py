"""Where the project lives on a worker, and the data roots task arguments may name.

``RECPIPE_HOME`` (default: this checkout) is the working directory of every job the operators
start; relative paths in configs resolve against it. Paths that reach an operator from a DAG
run's conf or Params must stay inside the project's roots: ``conf/``, ``data/`` and ``var/``.
"""

from __future__ import annotations

import os
from pathlib import Path

from recpipe.home import project_home, var_dir

__all__ = ["PathNotAllowedError", "allowed_roots", "confine", "project_home", "var_dir"]
ROOTS = ("conf", "data", "var")


class PathNotAllowedError(ValueError):
    """A path argument points outside the project's data roots."""


def allowed_roots() -> list[Path]:
    """``conf/``, ``data/`` and ``var/`` of the project (plus ``$RECPIPE_VAR_DIR`` if elsewhere)."""
    home = project_home()
    roots = [home / r for r in ROOTS]
    if var_dir() not in roots:
        roots.append(var_dir())
    return roots


def confine(value: str | os.PathLike, field: str) -> Path:
    """Resolve ``value`` against the project home and check it stays in a data root.

    Args:
        value: a path, relative to ``RECPIPE_HOME`` or absolute.
        field: the argument's name, for the error message.

    Raises:
        PathNotAllowedError: the path (after resolving ``..`` and symlinks) leaves the roots.
    """
    path = (project_home() / value).resolve()
    if not any(path == root or path.is_relative_to(root) for root in allowed_roots()):
        raise PathNotAllowedError(
            f"{field}={str(value)!r} resolves to {path}, outside the project's data roots "
            f"({', '.join(str(r) for r in allowed_roots())})"
        )
    return path
