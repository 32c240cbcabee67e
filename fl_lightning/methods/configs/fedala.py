"""FedALA's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("fedala")
@dataclass
class FedALAConfig(MethodConfig):
    personalised = True
    eta: float = 1.0  # η, the ALA weights' learning rate (PFLlib -et)
    rand_percent: float = 80.0  # s, % of local data ALA learns on (PFLlib -s)
    layer_idx: int = 2  # p, the higher layers as a count of parameter tensors (PFLlib -p)
    threshold: float = 0.1  # first ALA: stop when the loss std falls below (PFLlib)
    num_pre_loss: int = 10  # ... over this many epochs (PFLlib)
    ala_batch_size: int = 10  # PFLlib's batch size (-lbs)
    start_max_epochs: int = 100  # cap on the first ALA (PFLlib: none)

    def check(self, run: RootConfig) -> None:
        counts = (self.layer_idx, self.num_pre_loss, self.ala_batch_size, self.start_max_epochs)
        if not (self.eta > 0 and 0 < self.rand_percent <= 100 and self.threshold >= 0 and min(counts) >= 1):
            raise ConfigError(
                "fedala needs method.eta > 0, 0 < rand_percent <= 100, layer_idx >= 1, threshold >= 0, "
                "num_pre_loss >= 1, ala_batch_size >= 1 and start_max_epochs >= 1"
            )
