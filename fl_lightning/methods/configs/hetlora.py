"""HetLoRA's config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS
from .adapters import AdapterConfig

if TYPE_CHECKING:
    from ...config import RootConfig


@METHODS.register("hetlora")
@dataclass
class HetLoRAConfig(AdapterConfig):
    #: client k's rank is ranks[k % len(ranks)] (a tier per client id); the model's adapters are
    #: built at max(ranks) (model.rank is set to it)
    ranks: list[int] = field(default_factory=lambda: [2, 4, 8])

    def check(self, run: RootConfig) -> None:
        super().check(run)
        if not self.ranks or any(int(r) < 1 for r in self.ranks):
            raise ConfigError(f"method.ranks={list(self.ranks)}: one or more ranks, each at least 1")
