"""Heterogeneous small CNNs for model-heterogeneous FL (FedTGP/FedTSP's "HtFE" settings,
scaled down to 28×28 grey images; any channel count).

Client i gets `members[i mod X]`. Every member ends in a linear layer to `feature_dim`
(the prototype / text dimension; FedTSP sets it to the text encoder's) with batch norm,
followed by a personal linear head, so prototypes of different architectures live in one
space. The batch norm keeps the feature scale fixed: without it FedTSP's alignment term
(cosine × 100, λ = 7, gradients ∝ 1/‖f(x)‖) blows the FedAvg CNN's features up within a
few SGD steps at the paper's lr 0.01 (HtFLlib's ResNets end in batch norm + pooling too).

* `htfe_cnn_a`: the FedAvg CNN (HtFLlib's FedAvgCNN): two unpadded 5×5 convs (32, 64) with
  max-pooling, flatten, linear (images of at least 12×12).
* `htfe_cnn_b`: deeper and narrow: four 3×3 convs (16-32-64-64) with batch norm, global
  average pooling, linear.
* `htfe_cnn_c`: shallow with a large kernel: a 7×7 conv (32) and a 3×3 conv (64), 2×2
  average pooling, linear.

`htfe_cnn3` is the family (a, b, c).

`htfe3` is the papers' own HtFE3 (FedTGP/FedTSP, HtFLlib's `-m HtFE3`): ResNet-10, ResNet-18 and
ResNet-34, torchvision's BasicBlock ResNets with their ImageNet stem (7×7 stride-2 conv and
max-pool, as HtFLlib builds them for 32×32 CIFAR too), from scratch. ResNet-10 is BasicBlock
[1, 1, 1, 1] (HtFLlib's `resnet10`). HtFLlib swaps `fc` for an average pool to the feature
dimension; here the 512-d pooled trunk goes through the same Linear + BatchNorm neck as the
small members, for the reason above.
"""

from __future__ import annotations

from torch import nn

from . import MODELS, register_family
from .backbones import Backbone


def _neck(in_dim: int, feature_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, feature_dim), nn.BatchNorm1d(feature_dim))


@MODELS.register("htfe_cnn_a")
def htfe_cnn_a(
    num_classes: int, in_channels: int = 1, image_size: int = 28, feature_dim: int = 512
) -> Backbone:
    trunk = nn.Sequential(
        nn.Conv2d(in_channels, 32, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2),
    )  # fmt: skip
    side = ((image_size - 4) // 2 - 4) // 2  # 4 for 28×28, 5 for 32×32 (HtFLlib's dim=1600)
    if side < 1:
        raise ValueError(f"htfe_cnn_a needs images of at least 12×12 (got {image_size})")
    flat = 64 * side * side
    return Backbone(trunk, _neck(flat, feature_dim), nn.Linear(feature_dim, num_classes), feature_dim)


def _conv_bn(i: int, o: int) -> list[nn.Module]:
    return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True)]


@MODELS.register("htfe_cnn_b")
def htfe_cnn_b(
    num_classes: int, in_channels: int = 1, image_size: int = 28, feature_dim: int = 512
) -> Backbone:
    trunk = nn.Sequential(
        *_conv_bn(in_channels, 16), nn.MaxPool2d(2), *_conv_bn(16, 32), *_conv_bn(32, 64),
        nn.MaxPool2d(2), *_conv_bn(64, 64), nn.AdaptiveAvgPool2d(1),
    )  # fmt: skip
    return Backbone(trunk, _neck(64, feature_dim), nn.Linear(feature_dim, num_classes), feature_dim)


@MODELS.register("htfe_cnn_c")
def htfe_cnn_c(
    num_classes: int, in_channels: int = 1, image_size: int = 28, feature_dim: int = 512
) -> Backbone:
    trunk = nn.Sequential(
        nn.Conv2d(in_channels, 32, 7, padding=3), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(2),
    )  # fmt: skip
    return Backbone(trunk, _neck(64 * 4, feature_dim), nn.Linear(feature_dim, num_classes), feature_dim)


register_family("htfe_cnn3", ["htfe_cnn_a", "htfe_cnn_b", "htfe_cnn_c"])


def _htfe_resnet(layers: list[int], num_classes: int, in_channels: int, feature_dim: int) -> Backbone:
    # imported here: a client worker of another model never imports torchvision (start-up)
    from torchvision.models.resnet import BasicBlock, ResNet

    net = ResNet(BasicBlock, layers)  # torchvision's init; no pretrained weights
    if in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
    trunk = nn.Sequential(*(m for name, m in net.named_children() if name != "fc"))
    return Backbone(trunk, _neck(512, feature_dim), nn.Linear(feature_dim, num_classes), feature_dim)


@MODELS.register("htfe_resnet10")
def htfe_resnet10(
    num_classes: int, in_channels: int = 3, image_size: int = 32, feature_dim: int = 512
) -> Backbone:
    return _htfe_resnet([1, 1, 1, 1], num_classes, in_channels, feature_dim)


@MODELS.register("htfe_resnet18")
def htfe_resnet18(
    num_classes: int, in_channels: int = 3, image_size: int = 32, feature_dim: int = 512
) -> Backbone:
    return _htfe_resnet([2, 2, 2, 2], num_classes, in_channels, feature_dim)


@MODELS.register("htfe_resnet34")
def htfe_resnet34(
    num_classes: int, in_channels: int = 3, image_size: int = 32, feature_dim: int = 512
) -> Backbone:
    return _htfe_resnet([3, 4, 6, 3], num_classes, in_channels, feature_dim)


register_family("htfe3", ["htfe_resnet10", "htfe_resnet18", "htfe_resnet34"])
