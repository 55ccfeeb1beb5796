"""Typed pipeline and cluster configs (pydantic v2), with EasyRec's section names."""

from recpipe.config.cluster import ClusterConfig, RoleResources
from recpipe.config.errors import ConfigError
from recpipe.config.loader import load_cluster_config, load_pipeline_config
from recpipe.config.overrides import apply_edits, parse_edit_config_json, parse_extend_args
from recpipe.config.pipeline import PipelineConfig

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "PipelineConfig",
    "RoleResources",
    "apply_edits",
    "load_cluster_config",
    "load_pipeline_config",
    "parse_edit_config_json",
    "parse_extend_args",
]
