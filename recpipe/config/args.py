"""The pipeline-config flags every config-reading command shares (EasyRec's)."""

from __future__ import annotations

import argparse
from typing import Any

from recpipe.config.loader import load_pipeline_config
from recpipe.config.overrides import parse_edit_config_json, parse_extend_args
from recpipe.config.pipeline import PipelineConfig

OVERRIDES_HELP = (
    "Overrides of the pipeline config, applied after --edit_config_json: --section.field=value "
    "(--train_config.num_steps=500, --data_config.batch_size=64, a top-level field as "
    "--train_ds=1997-09-20:1997-09-26; always with '='). Values are YAML scalars; days are "
    "YYYY-MM-DD or START:END (inclusive), passes YYYY-MM-DD/HH. Every field: docs/config-reference.md."
)


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--pipeline_config_path`` and ``--edit_config_json`` to ``parser``."""
    parser.add_argument("--pipeline_config_path", required=True, help="conf/*.yaml")
    parser.add_argument("--edit_config_json", default=None, help="e.g. '{\"train_config.num_steps\": 500}'")
    parser.epilog = " ".join(filter(None, [parser.epilog, OVERRIDES_HELP]))


def config_from_args(args: argparse.Namespace, extra: list[str]) -> PipelineConfig:
    """Load the pipeline config with ``--edit_config_json`` and ``--section.field=value``
    (``extra``, the flags argparse left) applied, in that order.

    Raises:
        ConfigError: bad file, override or value.
    """
    return load_pipeline_config(args.pipeline_config_path, edits_from_args(args.edit_config_json, extra))


def edits_from_args(edit_config_json: str | None, extra: list[str]) -> dict[str, Any]:
    """``--edit_config_json``'s edits, then the ``--section.field=value`` ones (which win).

    Raises:
        ConfigError: a malformed override.
    """
    edits: dict[str, Any] = {}
    if edit_config_json:
        edits.update(parse_edit_config_json(edit_config_json))
    edits.update(parse_extend_args(extra))
    return edits
