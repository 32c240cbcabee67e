"""HetLoRA's config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS
from .adapters import AdapterConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("hetlora")
@dataclass
class HetLoRAConfig(AdapterConfig):
    #: client k's rank is ranks[k % len(ranks)] (a tier per client id); the model's adapters are
    #: built at max(ranks) (model.rank is set to it)
    ranks: list[int] = field(default_factory=lambda: [2, 4, 8])
    #: rank self-pruning (the paper's Sec. 3.2): λ of the penalty on a client's last
    #: components, ‖B[:, ⌊γr⌋:r]‖_F ‖A[⌊γr⌋:r]‖_F summed over modules; 0: no self-pruning
    prune_lambda: float = 0.0
    #: γ: a pruning client keeps rank ⌊γ r⌋
    prune_gamma: float = 0.9

    def check(self, run: RootConfig) -> None:
        super().check(run)
        if not self.ranks or any(int(r) < 1 for r in self.ranks):
            raise ConfigError(f"method.ranks={list(self.ranks)}: one or more ranks, each at least 1")
        if self.prune_lambda < 0:
            raise ConfigError(f"method.prune_lambda={self.prune_lambda}: at least 0 (0: no self-pruning)")
        if not 0 < self.prune_gamma < 1:
            raise ConfigError(f"method.prune_gamma={self.prune_gamma}: between 0 and 1 (a client keeps ⌊γr⌋)")
