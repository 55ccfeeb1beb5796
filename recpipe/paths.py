"""The data roots that paths from a run's conf, Params or overrides may name.

Relative paths in configs resolve against ``RECPIPE_HOME`` (``recpipe.home``). Paths that
reach a task from a DAG run (its conf, Params, ``edit_config_json``) must stay inside the
project's roots: ``data/`` and ``var/`` (and ``$RECPIPE_VAR_DIR``) for data, models and
exports; ``conf/`` for files read only (a field named ``*config_path``, a var map), so that no
run can write a model or an export over the deployment's configs.
"""

from __future__ import annotations

import os
from pathlib import Path

from recpipe.config.errors import ConfigError
from recpipe.home import project_home, var_dir

ROOTS = ("conf", "data", "var")


class PathNotAllowedError(ConfigError):
    """A path argument points outside the roots it may name."""


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
    roots = allowed_roots()
    if not field.endswith(("config_path", "fine_tune_ckpt_var_map")):  # conf/: read-only files
        roots = [r for r in roots if r != project_home() / "conf"]
    if not any(path == root or path.is_relative_to(root) for root in roots):
        raise PathNotAllowedError(
            f"{field}={str(value)!r} resolves to {path}, outside the roots it may name "
            f"({', '.join(str(r) for r in roots)})"
        )
    return path


def confine_config(config) -> None:
    """Check every path a ``PipelineConfig`` names (``named_paths``) with ``confine``.

    Raises:
        PathNotAllowedError: the first path outside the roots, named by its field.
    """
    for field, value in config.named_paths().items():
        confine(value, field)
