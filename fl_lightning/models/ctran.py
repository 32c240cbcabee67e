"""C-Tran (Lanchantin et al., CVPR 2021): multi-label classification by a transformer over
image tokens and one token per label (FedLGT's model, spec part 2 §2.2).

    x -> trunk -> spatial tokens Z [B, HW, d] (a linear map when the trunk's width is not d)
    label token c = label embedding l_c + state embedding s_c, s in {unknown, positive, negative}
    LayerNorm([Z; L~]) -> `layers` post-LN encoder layers (ReLU, FFN width d, no mask, no
    positions) -> the C label-token outputs o_c -> logit_c = w_c . o_c + b_c (the diagonal of
    one Linear(d, C): C-Tran's per-label readout)

States are given per sample and label: `UNKNOWN` (-1), `NEGATIVE` (0), `POSITIVE` (1), the
values C-Tran's code uses; unknown is the zero vector (C-Tran's `padding_idx=0`).
Prediction runs with every state unknown.

The label and state embeddings are learned parameters (C-Tran, FedC-Tran) until
`fix_embeddings` replaces them with fixed tensors (FedLGT's universal label embedding from a
frozen text encoder): non-persistent buffers, so they are not in the state dict, never sent,
averaged or checkpointed.

Trunks (`trunk=`): `cnn` (three 3x3 conv-ReLU-maxpool stages, 32/64/128 channels: 7x7 tokens
of a 56x56 image, the Fashion-MNIST mosaics), `tiles` (one token per tile of a `grid` x `grid`
image, each from the single-image backbone `tile_model`: models/tiles.py), `resnet18`
(torchvision's, layer4's 512-channel map) and `efficientnet_lite0` (its 1280-channel last map,
ImageNet weights from an installed package when `pretrained`: models/efficientnet.py).
Pretrained trunk weights come from `model.weights=<file>` (models/weights.py), loaded at
`weights_prefix`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..core.errors import ConfigError
from . import MODEL_TRAITS, MODELS, ModelTraits

UNKNOWN, NEGATIVE, POSITIVE = -1, 0, 1


def _cnn_trunk(in_channels: int) -> tuple[nn.Module, int]:
    layers: list[nn.Module] = []
    c = in_channels
    for out in (32, 64, 128):
        layers += [nn.Conv2d(c, out, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
        c = out
    return nn.Sequential(*layers), c


class ResNet18Trunk(nn.Module):
    """torchvision's ResNet-18 up to layer4, under torchvision's names (so its state dict,
    less `fc.`, is a weights file for this trunk); grey images are repeated to 3 channels."""

    def __init__(self) -> None:
        super().__init__()
        from torchvision.models import resnet18

        net = resnet18(weights=None)  # no download: pretrained weights come from model.weights
        self.conv1, self.bn1, self.relu, self.maxpool = net.conv1, net.bn1, net.relu, net.maxpool
        self.layer1, self.layer2, self.layer3, self.layer4 = net.layer1, net.layer2, net.layer3, net.layer4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        out: torch.Tensor = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return out


def _trunk(
    name: str,
    in_channels: int,
    image_size: int,
    grid: int,
    tile_model: str,
    input_size: int | None,
    pretrained: bool,
) -> tuple[nn.Module, int, str]:
    """(trunk, its channel width, the weights prefix of what a weights file fills)."""
    if name == "cnn":
        trunk, width = _cnn_trunk(in_channels)
        return trunk, width, "trunk."
    if name == "tiles":
        from .tiles import TileTrunk

        tiles = TileTrunk(in_channels, image_size, grid, tile_model)
        return tiles, tiles.width, "trunk.encoder."
    if name == "resnet18":
        if in_channels not in (1, 3):
            raise ConfigError(f"model.trunk=resnet18 takes grey or RGB images (got {in_channels} channels)")
        return ResNet18Trunk(), 512, "trunk."
    if name == "efficientnet_lite0":
        from .efficientnet import WIDTH, EfficientNetTrunk

        return EfficientNetTrunk(in_channels, input_size or max(image_size, 64), pretrained), WIDTH, "trunk."
    raise ConfigError(f"model.trunk={name!r} is not one of: {', '.join(TRUNKS)}")


TRUNKS = ("cnn", "tiles", "resnet18", "efficientnet_lite0")


def pretrained_loaded(kwargs: dict[str, Any]) -> bool:
    """Whether a C-Tran built with `kwargs` loads ImageNet weights: `pretrained` is read by the
    efficientnet_lite0 trunk only (the others start random or from model.weights)."""
    return bool(kwargs.get("pretrained", True)) and kwargs.get("trunk", "cnn") == "efficientnet_lite0"


def _recorded(kwargs: dict[str, Any]) -> dict[str, Any]:
    """config.yaml's `model.pretrained`: whether ImageNet weights were loaded (`pretrained_loaded`)."""
    return {**kwargs, "pretrained": pretrained_loaded(kwargs)} if "pretrained" in kwargs else kwargs


MODEL_TRAITS["ctran"] = ModelTraits(recorded_kwargs=_recorded, slow_on_cpu="C-Tran")


class CTran(nn.Module):
    label_emb: torch.Tensor  # [C, d]: a Parameter, or a buffer once fixed
    state_emb: torch.Tensor  # [2, d]: positive, negative (unknown is the zero vector)

    def __init__(
        self,
        num_classes: int,
        in_channels: int = 1,
        trunk: str = "cnn",
        d_model: int = 512,
        layers: int = 3,
        heads: int = 4,
        dropout: float = 0.1,
        image_size: int = 56,
        grid: int = 2,
        tile_model: str = "cnn",
        input_size: int | None = None,
        pretrained: bool = True,
    ) -> None:
        super().__init__()
        if d_model % heads:
            raise ConfigError(f"model.d_model={d_model} must be a multiple of model.heads={heads}")
        self.trunk, width, self.weights_prefix = _trunk(
            trunk, in_channels, image_size, grid, tile_model, input_size, pretrained
        )
        self.num_classes, self.d_model = num_classes, d_model
        self.proj = nn.Linear(width, d_model) if width != d_model else nn.Identity()
        self.label_emb = nn.Parameter(torch.randn(num_classes, d_model) * 0.02)
        self.state_emb = nn.Parameter(torch.randn(2, d_model) * 0.02)
        self.norm = nn.LayerNorm(d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=d_model, dropout=dropout, activation="relu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_classes)  # per-label readout: its diagonal
        self.feature_dim = d_model

    def fix_embeddings(self, labels: torch.Tensor | None, states: torch.Tensor | None) -> None:
        """Use fixed label embeddings [C, d] and/or state embeddings [2, d] (positive,
        negative) instead of learned ones: buffers outside the state dict, never trained or
        sent. None keeps that table learned."""
        for name, value, rows in (("label_emb", labels, self.num_classes), ("state_emb", states, 2)):
            if value is None:
                continue
            if value.shape != (rows, self.d_model):
                raise ConfigError(
                    f"fixed {name} of shape {tuple(value.shape)} does not fit C-Tran with "
                    f"{self.num_classes} labels and d_model={self.d_model} (expected {(rows, self.d_model)})"
                )
            delattr(self, name)
            self.register_buffer(name, value.float().clone(), persistent=False)

    def _state_vectors(self, states: torch.Tensor) -> torch.Tensor:
        table = torch.cat([torch.zeros_like(self.state_emb[:1]), self.state_emb])  # unknown = 0
        index = torch.where(states == POSITIVE, 1, torch.where(states == NEGATIVE, 2, 0))
        return table[index]  # [B, C, d]

    def forward_features(self, x: torch.Tensor, states: torch.Tensor | None = None) -> torch.Tensor:
        """The label tokens' outputs [B, C, d]; `states` [B, C] (default: all unknown)."""
        z = self.proj(self.trunk(x).flatten(2).transpose(1, 2))  # [B, HW, d]
        if states is None:
            states = torch.full((x.shape[0], self.num_classes), UNKNOWN, device=x.device)
        labels = self.label_emb.unsqueeze(0) + self._state_vectors(states)
        h = self.encoder(self.norm(torch.cat([z, labels], dim=1)))
        out: torch.Tensor = h[:, -self.num_classes :]
        return out

    def forward_head(self, o: torch.Tensor) -> torch.Tensor:
        return (o * self.head.weight).sum(-1) + self.head.bias

    def forward(self, x: torch.Tensor, states: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward_head(self.forward_features(x, states))


@MODELS.register("ctran")
def ctran(
    num_classes: int,
    in_channels: int = 1,
    image_size: int = 56,
    trunk: str = "cnn",
    d_model: int | None = None,
    layers: int = 3,
    heads: int = 4,
    dropout: float = 0.1,
    grid: int = 2,
    tile_model: str = "cnn",
    input_size: int | None = None,
    pretrained: bool = True,
) -> CTran:
    """`d_model` None: 512 (C-Tran's and CLIP ViT-B/16's width); fedlgt and fedctran set it
    to their text encoder's width. `grid`, `tile_model`: trunk=tiles; `input_size`,
    `pretrained` (ImageNet weights): trunk=efficientnet_lite0."""
    return CTran(
        num_classes, in_channels, trunk, d_model or 512, layers, heads, dropout, image_size, grid, tile_model,
        input_size, pretrained,
    )  # fmt: skip


class ResNet18Classifier(nn.Module):
    """torchvision's ResNet-18 with a linear head (`model=resnet18`): FedLGT's FedAvg
    baseline, a multi-label classifier on the same ImageNet trunk (`model.weights`: a
    torchvision state dict) as C-Tran with `trunk=resnet18`."""

    weights_prefix = "trunk."

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.trunk = ResNet18Trunk()
        self.head = nn.Linear(512, num_classes)
        self.feature_dim = 512

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(nn.functional.adaptive_avg_pool2d(self.trunk(x), 1), 1)

    def forward_head(self, f: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(f)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


@MODELS.register("resnet18")
def resnet18(num_classes: int, in_channels: int = 3, image_size: int = 224) -> ResNet18Classifier:
    if in_channels not in (1, 3):
        raise ConfigError(f"model=resnet18 takes grey or RGB images (got {in_channels} channels)")
    return ResNet18Classifier(num_classes)
