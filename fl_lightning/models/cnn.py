"""Small CNNs for 28×28 (and smaller) grey images.

`cnn` is the FedAvg paper's CNN (McMahan et al. 2017): two 5×5 conv layers (32, 64
channels) with 2×2 max-pooling, a 512-unit hidden layer, a linear head. Padding keeps
it valid for inputs as small as 8×8 (scikit-learn digits).

`fedavg_cnn` is PFLlib's FedAvgCNN, FedDTR's 4-layer CNN: the same layers with unpadded
convolutions, so a 32×32 image gives Linear(1600 → 512) (padded: 4096 → 512).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..core.errors import ConfigError
from . import MODELS

NECKS = ("relu", "linear")  # model.neck: the hidden layer's activation


class SmallCNN(nn.Module):
    def __init__(
        self,
        num_classes: int,
        in_channels: int = 1,
        image_size: int = 28,
        channels: tuple[int, int] = (32, 64),
        hidden: int = 512,
        batch_norm: bool = False,
        padding: int = 2,
        neck: str = "relu",
    ) -> None:
        super().__init__()
        if neck not in NECKS:
            raise ConfigError(f"model.neck={neck!r}: expected one of {', '.join(NECKS)}")
        c1, c2 = channels

        def norm(c: int, dim: int = 2) -> nn.Module:
            return (nn.BatchNorm2d(c) if dim == 2 else nn.BatchNorm1d(c)) if batch_norm else nn.Identity()

        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 5, padding=padding),
            norm(c1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=padding),
            norm(c2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        side = ((image_size + 2 * padding - 4) // 2 + 2 * padding - 4) // 2
        if side < 1:
            raise ConfigError(  # one line from `check_image_size`, before any data loads (a traceback was)
                f"the CNN needs larger images than {image_size}px at padding {padding}: "
                "set data.image_size larger"
            )
        flat = c2 * side**2
        # neck=linear: no activation after the hidden layer, as CLIP2FL's `add_mlp` (its
        # student's features, the federated features and the text prototypes may take any sign)
        act = nn.ReLU(inplace=True) if neck == "relu" else nn.Identity()
        self.neck = nn.Sequential(nn.Linear(flat, hidden), norm(hidden, 1), act)
        self.feature_dim = hidden
        self.head = nn.Linear(hidden, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.neck(self.features(x))

    def forward_head(self, f: torch.Tensor) -> torch.Tensor:
        return self.head(f)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def _pair(channels: Sequence[int]) -> tuple[int, int]:
    """`model.channels` as a pair (a yaml list arrives as a list); anything else is one line."""
    if isinstance(channels, (str, bytes)) or not isinstance(channels, Sequence) or len(channels) != 2:
        raise ConfigError(f"model.channels={channels!r}: expected the two conv widths, e.g. [32, 64]")
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in channels):
        raise ConfigError(f"model.channels={list(channels)!r}: the widths must be integers >= 1")
    c1, c2 = channels
    return int(c1), int(c2)


@MODELS.register("cnn")
def cnn(
    num_classes: int,
    in_channels: int = 1,
    image_size: int = 28,
    channels: Sequence[int] = (32, 64),
    hidden: int = 512,
    neck: str = "relu",
) -> SmallCNN:
    return SmallCNN(num_classes, in_channels, image_size, _pair(channels), hidden, neck=neck)


@MODELS.register("cnn_bn")
def cnn_bn(
    num_classes: int,
    in_channels: int = 1,
    image_size: int = 28,
    channels: Sequence[int] = (32, 64),
    hidden: int = 512,
) -> SmallCNN:
    """`cnn` with batch norm after each conv and the hidden layer (for FedBN and friends)."""
    return SmallCNN(num_classes, in_channels, image_size, _pair(channels), hidden, batch_norm=True)


@MODELS.register("fedavg_cnn")
def fedavg_cnn(
    num_classes: int,
    in_channels: int = 3,
    image_size: int = 32,
    channels: Sequence[int] = (32, 64),
    hidden: int = 512,
) -> SmallCNN:
    """PFLlib's FedAvgCNN (FedDTR's CNN): `cnn` with unpadded convolutions."""
    return SmallCNN(num_classes, in_channels, image_size, _pair(channels), hidden, padding=0)
