"""ResNet-8 of CReFF's code (Shang et al., IJCAI 2022; reused by CLIP2FL, arXiv:2312.08648),
for 32×32 (and 28×28) images.

`ResNet_cifar(resnet_size=8, scaling=4)`: a 3×3 stem conv (64 channels) + BN + ReLU, three
stages of one BasicBlock each (64, 128, 256 channels; strides 1, 2, 2; a 1×1 conv + BN
shortcut where the shape changes), global average pooling → 256, then CLIP2FL's "add_mlp":
one Linear(256 → `feature_dim`) with no activation, the feature z the classifier, the
per-class gradients and the federated features live in; `head` = Linear(feature_dim → C).
`feature_dim` is the neck width: CLIP2FL sets it to the teacher's embedding dimension (512
for CLIP ViT-B/32). Convolutions start from N(0, 2/(k²·out)) as in the authors' code.
The pooling is adaptive (the code's AvgPool2d(8) on 32×32 inputs), so 28×28 works too.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import MODELS


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.downsample(x))


class ResNet8(nn.Module):
    def __init__(
        self, num_classes: int, in_channels: int = 3, scaling: int = 4, feature_dim: int = 512
    ) -> None:
        super().__init__()
        w = 16 * scaling
        self.trunk = nn.Sequential(
            nn.Conv2d(in_channels, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
            BasicBlock(w, w), BasicBlock(w, 2 * w, 2), BasicBlock(2 * w, 4 * w, 2),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )  # fmt: skip
        self.neck = nn.Linear(4 * w, feature_dim)  # CLIP2FL's add_mlp: no activation
        self.head = nn.Linear(feature_dim, num_classes)
        self.feature_dim = feature_dim
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / n))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.neck(self.trunk(x))

    def forward_head(self, f: torch.Tensor) -> torch.Tensor:
        return self.head(f)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


@MODELS.register("resnet8")
def resnet8(
    num_classes: int, in_channels: int = 3, image_size: int = 32, scaling: int = 4, feature_dim: int = 512
) -> ResNet8:
    """CReFF's ResNet-8 (width scaling 4: 64/128/256 channels) + Linear(256 → feature_dim)."""
    return ResNet8(num_classes, in_channels, scaling, feature_dim)
