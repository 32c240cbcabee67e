"""Small MLPs on precomputed features (frozen-feature mode: `data=fmnist_digits20_eff`, whose
"images" are a frozen trunk's 1,280 pooled features as [N, 1280, 1, 1]).

* `mlp`: Linear -> BatchNorm1d -> ReLU to `hidden` (the feature dimension), a linear head
  (the review's E1 "image encoder": 1280 -> 256).
* `mlp3`: a model-heterogeneous family (FedTSP / FedTGP's HtFE setting on features), each
  member ending in Linear + BatchNorm1d to `feature_dim` as the `htfe_cnn3` members do:
  `mlp_a` one 512-wide BN layer, `mlp_b` two 256-wide BN layers, `mlp_c` one 1024-wide layer
  without batch norm.
"""

from __future__ import annotations

from torch import nn

from . import MODELS, register_family
from .backbones import Backbone


def _flat(in_channels: int, image_size: int) -> int:
    return int(in_channels) * int(image_size) ** 2


def _block(i: int, o: int, batch_norm: bool = True) -> list[nn.Module]:
    return [nn.Linear(i, o), *([nn.BatchNorm1d(o)] if batch_norm else []), nn.ReLU(inplace=True)]


@MODELS.register("mlp")
def mlp(
    num_classes: int, in_channels: int = 1280, image_size: int = 1, hidden: int = 256, batch_norm: bool = True
) -> Backbone:
    neck = nn.Sequential(*_block(_flat(in_channels, image_size), hidden, batch_norm))
    return Backbone(nn.Flatten(), neck, nn.Linear(hidden, num_classes), hidden)


def _member(widths: list[int], batch_norm: bool, num_classes: int, in_dim: int, feature_dim: int) -> Backbone:
    layers: list[nn.Module] = [nn.Flatten()]
    for i, o in zip([in_dim, *widths[:-1]], widths, strict=True):
        layers += _block(i, o, batch_norm)
    neck = nn.Sequential(nn.Linear(widths[-1], feature_dim), nn.BatchNorm1d(feature_dim))
    return Backbone(nn.Sequential(*layers), neck, nn.Linear(feature_dim, num_classes), feature_dim)


@MODELS.register("mlp_a")
def mlp_a(num_classes: int, in_channels: int = 1280, image_size: int = 1, feature_dim: int = 512) -> Backbone:
    return _member([512], True, num_classes, _flat(in_channels, image_size), feature_dim)


@MODELS.register("mlp_b")
def mlp_b(num_classes: int, in_channels: int = 1280, image_size: int = 1, feature_dim: int = 512) -> Backbone:
    return _member([256, 256], True, num_classes, _flat(in_channels, image_size), feature_dim)


@MODELS.register("mlp_c")
def mlp_c(num_classes: int, in_channels: int = 1280, image_size: int = 1, feature_dim: int = 512) -> Backbone:
    return _member([1024], False, num_classes, _flat(in_channels, image_size), feature_dim)


register_family("mlp3", ["mlp_a", "mlp_b", "mlp_c"])
