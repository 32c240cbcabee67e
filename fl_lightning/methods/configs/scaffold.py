"""SCAFFOLD's config: option-II control variates assume plain SGD steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("scaffold")
@dataclass
class ScaffoldConfig(MethodConfig):
    #: run with momentum > 0 or adam/adamw anyway (option II's variates then overestimate
    #: the mean gradient)
    allow_momentum: bool = False
    resumable = ("allow_momentum",)  # a run from before momentum was refused goes on

    def check(self, run: RootConfig) -> None:
        optim = run.optim
        if self.allow_momentum:
            return
        if optim.name != "sgd":
            raise ConfigError(
                f"scaffold with optim.name={optim.name}: option-II control variates assume plain SGD "
                "steps (an adaptive step makes them misestimate the mean gradient); use optim.name=sgd "
                "optim.momentum=0, or method.allow_momentum=true to run it anyway"
            )
        if optim.momentum > 0:
            raise ConfigError(
                f"scaffold with optim.momentum={optim.momentum:g}: option-II control variates assume "
                f"plain SGD (with momentum they overestimate the mean gradient, up to "
                f"{1 / (1 - min(optim.momentum, 0.999)):.3g}x); set optim.momentum=0, or "
                "method.allow_momentum=true to run it anyway"
            )
