"""The one error type config loading raises."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the file and dotted field path."""
