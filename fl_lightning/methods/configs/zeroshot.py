"""Zero-shot CLIP's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS

if TYPE_CHECKING:
    from ...core.run_config import RootConfig
from .prompting import PromptConfig


@METHODS.register("zeroshot")
@dataclass
class ZeroShotConfig(PromptConfig):
    template: str = "a photo of a {}."  # CLIP's ImageNet template; the class name must come last

    def check(self, run: RootConfig) -> None:
        if not self.template.endswith("{}.") or self.template.count("{}") != 1:
            raise ConfigError(
                f"method.template={self.template!r}: expected words then '{{}}.' (e.g. 'a photo of a {{}}.')"
            )
        super().check(run)
