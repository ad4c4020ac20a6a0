"""Configuration: the engine settings and SOW topic definitions, from YAML or an AMPS XML file."""

from sowstream.config.amps import load_amps_xml
from sowstream.config.errors import ConfigError
from sowstream.config.fields import SUPPORTED_MESSAGE_TYPES
from sowstream.config.loader import load_config, load_config_text, load_yaml_text
from sowstream.config.models import (
    EngineConfig,
    ExpirationPolicy,
    HistoryConfig,
    RocksDBConfig,
    TopicConfig,
)
from sowstream.config.root import SowstreamConfig
from sowstream.units import parse_interval, parse_size

__all__ = [
    "SUPPORTED_MESSAGE_TYPES",
    "ConfigError",
    "EngineConfig",
    "ExpirationPolicy",
    "HistoryConfig",
    "RocksDBConfig",
    "SowstreamConfig",
    "TopicConfig",
    "load_amps_xml",
    "load_config",
    "load_config_text",
    "load_yaml_text",
    "parse_interval",
    "parse_size",
]
