"""FedTPG's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS
from .promptfl import PromptFLConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("fedtpg")
@dataclass
class FedTPGConfig(PromptFLConfig):
    # weighted (PromptFL's): false, the authors' plain mean of the selected clients' generators
    own_classes: bool = True  # a client scores its own classes, their names the generator's input
    depth: int = 0  # self-attention blocks after the cross-attention (MODEL.DEPTH)
    heads: int = 4  # attention heads (cross_heads, self_heads)
    template: str = "{}"  # the text of a class name the generator reads (the code: the bare name)

    def check(self, run: RootConfig) -> None:
        if self.depth < 0 or self.heads < 1 or self.template.count("{}") != 1:
            raise ConfigError("method.depth must be >= 0, method.heads >= 1, method.template hold one '{}'")
        model = run.model or {}
        if (
            model.get("ctx_init")
            or model.get("class_specific")
            or model.get("class_token_position", "end") != "end"
        ):
            raise ConfigError(
                "method=fedtpg generates one context for the classes, before their names: leave "
                "model.ctx_init, model.class_specific and model.class_token_position unset"
            )
        super().check(run)
