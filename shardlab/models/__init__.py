"""Model presets and graph builders."""

from shardlab.models.builder import GraphBuilder
from shardlab.models.config import MlpDemoConfig, TransformerConfig, parse_overrides
from shardlab.models.presets import PRESETS, Preset, build_model, get_preset

__all__ = [
    "PRESETS",
    "GraphBuilder",
    "MlpDemoConfig",
    "Preset",
    "TransformerConfig",
    "build_model",
    "get_preset",
    "parse_overrides",
]
