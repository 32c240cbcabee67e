"""FedRep's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("fedrep")
@dataclass
class FedRepConfig(MethodConfig):
    personalised = True
    head_epochs: int = 1  # PFLlib -pls (plocal_epochs) default; the FedRep paper used 10
    body_epochs: int | None = None  # None: fl.local_epochs (PFLlib -ls, default 1)

    def check(self, run: RootConfig) -> None:
        if self.head_epochs < 1 or (self.body_epochs is not None and self.body_epochs < 1):
            raise ConfigError("fedrep needs method.head_epochs >= 1 and method.body_epochs >= 1 (or null)")
