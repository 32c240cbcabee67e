"""Text encoders, prompt templates and class-text features (`TEXT_ENCODERS` registry)."""
from __future__ import annotations

from typing import Any, Callable

from ..core.registry import Registry

TEXT_ENCODERS: Registry[Callable[..., Any]] = Registry("text encoder")
