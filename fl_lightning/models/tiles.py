"""Models that see an image as a grid of tiles, one feature vector (token) per tile: the
`fmnist_multilabel` mosaics are 2x2 grids of 28x28 Fashion-MNIST images, so a trunk
pretrained on single 28x28 images (`fl-lightning pretrain data=fmnist model=cnn`) describes
each tile, and C-Tran attends over 4 tile tokens instead of 49 patches of a random trunk.

* `TileTrunk` (C-Tran's `trunk=tiles`, and `tilenet`'s): the image cut into `grid` x `grid`
  tiles, each through one shared single-image backbone (`tile_model`, its head removed),
  returned as a feature map [B, D, grid, grid] (one token per tile).
* `tilenet`: the same trunk, max-pooled over the tiles, and a linear head: the multi-label
  classifier a FedAvg baseline trains on the same pretrained trunk as C-Tran.

Weights: the tile backbone sits at `trunk.encoder.`, so a weights file of the single-image
backbone (`model.weights=<file>`) loads into it.
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.errors import ConfigError
from . import MODELS


class TileTrunk(nn.Module):
    """[B, C, g*h, g*w] -> [B, D, g, g]: one shared backbone's features per tile."""

    def __init__(self, in_channels: int, image_size: int, grid: int, tile_model: str) -> None:
        super().__init__()
        if grid < 1 or image_size % grid:
            raise ConfigError(f"model.grid={grid} must divide the image size {image_size} into equal tiles")
        if tile_model in ("ctran", "tilenet"):
            raise ConfigError(f"model.tile_model={tile_model!r} must be a single-image backbone (e.g. cnn)")
        from . import build_model

        self.grid, self.tile = grid, image_size // grid
        enc = build_model(tile_model, 1, in_channels, self.tile)
        if not hasattr(enc, "forward_features") or not hasattr(enc, "feature_dim"):
            raise ConfigError(f"model.tile_model={tile_model!r} has no forward_features / feature_dim")
        enc.head = nn.Identity()  # the single-image classifier: neither used nor sent
        self.encoder = enc
        self.width = int(enc.feature_dim)  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, g, t = x.shape[0], x.shape[1], self.grid, self.tile
        if x.shape[-1] != g * t or x.shape[-2] != g * t:
            raise ValueError(f"TileTrunk expects {g * t}x{g * t} images, got {tuple(x.shape[-2:])}")
        # [B, C, g, t, g, t] -> [B, g, g, C, t, t]: tiles in row-major order
        tiles = x.reshape(b, c, g, t, g, t).permute(0, 2, 4, 1, 3, 5).reshape(b * g * g, c, t, t)
        f: torch.Tensor = self.encoder.forward_features(tiles)  # type: ignore[operator]
        return f.reshape(b, g, g, -1).permute(0, 3, 1, 2)


class TileNet(nn.Module):
    """Tile features, max over tiles, a linear multi-label head."""

    weights_prefix = "trunk.encoder."

    def __init__(self, trunk: TileTrunk, num_classes: int) -> None:
        super().__init__()
        self.trunk = trunk
        self.feature_dim = trunk.width
        self.head = nn.Linear(trunk.width, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.trunk(x).flatten(2).amax(dim=2)

    def forward_head(self, f: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(f)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


@MODELS.register("tilenet")
def tilenet(
    num_classes: int, in_channels: int = 1, image_size: int = 56, grid: int = 2, tile_model: str = "cnn"
) -> TileNet:
    """Multi-label on a grid of tiles: one shared single-image trunk per tile, max over tiles, a linear
    head."""
    return TileNet(TileTrunk(in_channels, image_size, grid, tile_model), num_classes)
