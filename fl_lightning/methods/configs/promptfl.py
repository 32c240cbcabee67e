"""PromptFL's config."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS
from .prompting import PromptConfig


@METHODS.register("promptfl")
@dataclass
class PromptFLConfig(PromptConfig):
    weighted: bool = False  # false: the authors' plain mean of the contexts; true: example-weighted
    own_classes: bool = False  # true: a client scores only its own classes (FedTPG's FedCoOp)
