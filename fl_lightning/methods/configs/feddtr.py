"""FedDTR's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.checks import check_targets, positive
from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig
from . import multilabel

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("feddtr")
@dataclass
class FedDTRConfig(MethodConfig):
    personalised = True
    tau: float = 0.01  # [code] ×100 cosine logits; the paper states no temperature
    template: str = "This is a {}"  # paper §3.1
    text: bool = True  # Table 7 "w.o. Text" = false
    #: the anchors: text | permuted | orthogonal | uniform | centred (text/targets.py); the
    #: paper's Table 6 "nonsensical labels" is `template` with made-up words instead
    targets: str = "text"
    prior: bool = True  # Table 7 "w.o. IP" = false
    freeze_text: bool = True  # Table 7 "w.o. Freeze" = false (Eq. 1 instead of Eq. 2)
    global_head: bool = True  # the frozen global head h_f

    def check(self, run: RootConfig) -> None:
        positive(self, "tau")  # divides the cosine logits
        check_targets(self.targets)
        if self.targets != "text" and not self.text:
            raise ConfigError(f"feddtr: method.targets={self.targets} needs method.text=true (no anchors)")
        if self.prior and not self.text:
            raise ConfigError("feddtr: method.prior=true needs method.text=true (P_i is built from text)")
        if self.prior and multilabel(run):
            raise ConfigError(
                f"feddtr's prior needs single-label data (class counts); data={run.data.name} is multi-label"
            )
