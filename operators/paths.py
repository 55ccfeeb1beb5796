"""Where the project lives on a worker, and the data roots task arguments may name
(``recpipe.home``, ``recpipe.paths``; re-exported for the operators and DAGs)."""

from __future__ import annotations

from recpipe.home import project_home, var_dir
from recpipe.paths import PathNotAllowedError, allowed_roots, confine, confine_config

__all__ = ["PathNotAllowedError", "allowed_roots", "confine", "confine_config", "project_home", "var_dir"]
