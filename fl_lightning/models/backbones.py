"""The image backbones of the FedGLCL/CLIP2FL papers, trained from scratch.

Each splits into `forward_features` (trunk + neck: the representation that MOON,
FedProto and prototype methods use) and `head` (what a classifier method trains on top).
FedGLCL swaps `head` for a projector to the text dimension (`method.projector`: Linear, or
Linear → BN1d (→ ReLU)), which
reproduces the papers' projectors: AlexNet keeps fc1 in the neck (fc1 → fc2-to-text),
ResNet-50 keeps its FC(2048, 2048) in the neck (Table 8 of FedGLCL).
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.errors import ConfigError
from . import MODELS


class Backbone(nn.Module):
    feature_dim: int

    def __init__(self, trunk: nn.Module, neck: nn.Module, head: nn.Module, feature_dim: int) -> None:
        super().__init__()
        self.trunk, self.neck, self.head, self.feature_dim = trunk, neck, head, feature_dim

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.neck(torch.flatten(self.trunk(x), 1))

    def forward_head(self, f: torch.Tensor) -> torch.Tensor:
        return self.head(f)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def _fc(i: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, o), nn.BatchNorm1d(o), nn.ReLU(inplace=True))


def _conv(i: int, o: int, k: int, s: int = 1, p: int = 0) -> list[nn.Module]:
    return [nn.Conv2d(i, o, k, s, p), nn.BatchNorm2d(o), nn.ReLU(inplace=True)]


@MODELS.register("alexnet_bn")
def alexnet_bn(num_classes: int, in_channels: int = 3, image_size: int = 256, hidden: int = 4096) -> Backbone:
    """AlexNet with batch norm, as in FedBN/FedGLCL: five convs, fc1 (neck), fc2 + fc3 (head)."""
    trunk = nn.Sequential(
        *_conv(in_channels, 64, 11, 4, 2), nn.MaxPool2d(3, 2),
        *_conv(64, 192, 5, 1, 2), nn.MaxPool2d(3, 2),
        *_conv(192, 384, 3, 1, 1), *_conv(384, 256, 3, 1, 1), *_conv(256, 256, 3, 1, 1),
        nn.MaxPool2d(3, 2), nn.AdaptiveAvgPool2d((6, 6)),
    )  # fmt: skip
    head = nn.Sequential(_fc(hidden, hidden), nn.Linear(hidden, num_classes))
    return Backbone(trunk, _fc(256 * 36, hidden), head, hidden)


@MODELS.register("vgg11")
def vgg11(num_classes: int, in_channels: int = 3, image_size: int = 32, hidden: int = 512) -> Backbone:
    """VGG-11 with batch norm; adaptive pooling makes it valid for 32×32 and larger."""
    layers: list[nn.Module] = []
    c = in_channels
    for v in (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"):
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += _conv(c, int(v), 3, 1, 1)
            c = int(v)
    layers.append(nn.AdaptiveAvgPool2d(1))
    return Backbone(nn.Sequential(*layers), _fc(512, hidden), nn.Linear(hidden, num_classes), hidden)


@MODELS.register("resnet50")
def resnet50(
    num_classes: int, in_channels: int = 3, image_size: int = 32, hidden: int = 2048, neck: str = "fc_bn_relu"
) -> Backbone:
    """ResNet-50 (torchvision, no pre-training) with a CIFAR stem for small images (3×3
    conv, no max-pool) and the FC(2048, 2048) neck of FedGLCL's Table 8 (`neck=fc_bn_relu`),
    or CLIP2FL's plain Linear(2048, hidden) to the teacher's dimension (`neck=linear`)."""
    if neck not in ("fc_bn_relu", "linear"):
        raise ConfigError(f"model.neck must be fc_bn_relu or linear (got {neck!r})")
    # imported here: a client worker of another model never imports torchvision (start-up)
    from torchvision.models import resnet50 as tv_resnet50

    net = tv_resnet50(weights=None)
    if image_size <= 64:
        net.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        net.maxpool = nn.Identity()
    elif in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
    trunk = nn.Sequential(*(m for name, m in net.named_children() if name != "fc"))
    proj = _fc(2048, hidden) if neck == "fc_bn_relu" else nn.Linear(2048, hidden)
    return Backbone(trunk, proj, nn.Linear(hidden, num_classes), hidden)
