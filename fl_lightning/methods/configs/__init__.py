"""The configs of this package's methods, one module per method file, torch-free: the
command line checks a run's method against them before torch, Ray or any data start. The
strategy and objective of `configs/<file>.py` are in `methods/<file>.py`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


def multilabel(run: RootConfig) -> bool:
    """Whether the run's dataset is multi-label, from its registry entry (before loading it)."""
    from ...data.registry import DATASETS

    return bool(DATASETS.get(run.data.name).multilabel)


def require_coarse_groups(run: RootConfig, key: str) -> None:
    """Refuse `key` (a control that keeps or breaks the classes' coarse groups) on a dataset
    whose registry entry has none, naming those that do."""
    from ...core.errors import ConfigError
    from ...data.registry import DATASETS

    if DATASETS.get(run.data.name).coarse_groups is None:
        have = sorted(n for n in DATASETS.names() if DATASETS.get(n).coarse_groups is not None)
        raise ConfigError(
            f"{key} needs coarse groups; data={run.data.name} has none (those with: {', '.join(have)})"
        )
