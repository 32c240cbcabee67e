"""Backbones with one contract: `forward_features(x) -> [B, D]`, `forward_head(f) -> logits`,
`head` (the classifier on top of the features), `feature_dim`. Registered by name in `MODELS`."""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

from ..core.registry import Registry

MODELS: Registry[Callable[..., nn.Module]] = Registry("model")


def build_model(name: str, num_classes: int, in_channels: int, image_size: int, **kwargs: Any) -> nn.Module:
    return MODELS.get(name)(num_classes=num_classes, in_channels=in_channels, image_size=image_size, **kwargs)


from . import cnn  # noqa: E402,F401
from . import backbones  # noqa: E402,F401
