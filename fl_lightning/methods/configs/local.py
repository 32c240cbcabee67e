"""Local training: no hyperparameters; every weight stays with its client."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS, MethodConfig


@METHODS.register("local")
@dataclass
class LocalConfig(MethodConfig):
    personalised = True
