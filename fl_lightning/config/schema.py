"""The typed run config's old home: the dataclasses now live in `core/run_config.py`, below the
methods that read them (no import loop through `config/`). Re-exported so that code importing
`fl_lightning.config.schema` keeps working."""

from __future__ import annotations

from ..core.run_config import (
    MAX_AUGMENT_PADDING,
    MAX_IMAGE_SIZE,
    AggregatorConfig,
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    FLConfig,
    LoggerConfig,
    PrivacyConfig,
    RootConfig,
    RuntimeConfig,
    SystemConfig,
    client_tests,
    clients_per_round,
    cross_check,
    participation,
    variant_of,
)

__all__ = [
    "MAX_AUGMENT_PADDING",
    "MAX_IMAGE_SIZE",
    "AggregatorConfig",
    "CheckpointConfig",
    "DataConfig",
    "EvalConfig",
    "FLConfig",
    "LoggerConfig",
    "PrivacyConfig",
    "RootConfig",
    "RuntimeConfig",
    "SystemConfig",
    "client_tests",
    "clients_per_round",
    "cross_check",
    "participation",
    "variant_of",
]
