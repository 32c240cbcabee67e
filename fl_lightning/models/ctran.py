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

Trunks: `cnn` (three 3x3 conv-ReLU-maxpool stages, 32/64/128 channels: 7x7 tokens of a 56x56
image, the Fashion-MNIST mosaics) and `resnet18` (torchvision's, layer4's 512-channel map;
weights only from a local file, `weights=<path>`, random otherwise).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..core.errors import ConfigError
from . import MODELS

UNKNOWN, NEGATIVE, POSITIVE = -1, 0, 1


def _cnn_trunk(in_channels: int) -> tuple[nn.Module, int]:
    layers: list[nn.Module] = []
    c = in_channels
    for out in (32, 64, 128):
        layers += [nn.Conv2d(c, out, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
        c = out
    return nn.Sequential(*layers), c


def _resnet18_trunk(in_channels: int, weights: str | None) -> tuple[nn.Module, int]:
    from torchvision.models import resnet18

    net = resnet18(weights=None)  # no download: pretrained weights come from `weights`
    if weights:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise ConfigError(f"model.weights={weights!r}: no such file (a torchvision resnet18 state dict)")
        state = torch.load(path, map_location="cpu", weights_only=True)
        net.load_state_dict(state.get("state_dict", state), strict=False)
    if in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
    stages = (net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3, net.layer4)
    trunk = nn.Sequential(*stages)
    return trunk, 512


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
        weights: str | None = None,
    ) -> None:
        super().__init__()
        if d_model % heads:
            raise ConfigError(f"model.d_model={d_model} must be a multiple of model.heads={heads}")
        if trunk == "cnn":
            self.trunk, width = _cnn_trunk(in_channels)
        elif trunk == "resnet18":
            self.trunk, width = _resnet18_trunk(in_channels, weights)
        else:
            raise ConfigError(f"model.trunk={trunk!r} is not one of: cnn, resnet18")
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

    def fix_embeddings(self, labels: torch.Tensor, states: torch.Tensor) -> None:
        """Use fixed label embeddings [C, d] and state embeddings [2, d] (positive, negative)
        instead of learned ones: buffers outside the state dict, never trained or sent."""
        if labels.shape != (self.num_classes, self.d_model) or states.shape != (2, self.d_model):
            raise ConfigError(
                f"fixed label/state embeddings of shape {tuple(labels.shape)}/{tuple(states.shape)} "
                f"do not fit C-Tran with {self.num_classes} labels and d_model={self.d_model}"
            )
        del self.label_emb, self.state_emb
        self.register_buffer("label_emb", labels.float().clone(), persistent=False)
        self.register_buffer("state_emb", states.float().clone(), persistent=False)

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
    weights: str | None = None,
) -> CTran:
    """`d_model` None: 512 (C-Tran's and CLIP ViT-B/16's width); fedlgt and fedctran set it
    to their text encoder's width."""
    del image_size  # the token count follows the image; nothing depends on it
    return CTran(num_classes, in_channels, trunk, d_model or 512, layers, heads, dropout, weights)
