"""MOON's config."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS, MethodConfig


@METHODS.register("moon")
@dataclass
class MoonConfig(MethodConfig):
    mu: float = 1.0
    temperature: float = 0.5
