"""Differentiable Siamese Augmentation's six operations (Zhao & Bilen 2021), as CReFF and
CLIP2FL apply them to the real images whose classifier gradients clients upload
(`dsa_strategy='color_crop_cutout_flip_scale_rotate'`, `ParamDiffAug` defaults, not Siamese):
each call picks one operation at random and draws its parameters per image.

Written from the description of the method, not from its code; every draw comes from the
given `torch.Generator`, so a client's gradients depend only on its seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class DSAParams:
    """`ParamDiffAug` defaults."""

    ratio_scale: float = 1.2
    ratio_rotate: float = 15.0  # degrees
    ratio_crop_pad: float = 0.125
    ratio_cutout: float = 0.5
    prob_flip: float = 0.5
    brightness: float = 1.0
    saturation: float = 2.0
    contrast: float = 0.5


def _rand(x: Tensor, g: torch.Generator) -> Tensor:
    return torch.rand(x.shape[0], 1, 1, 1, generator=g).to(x)


def color(x: Tensor, g: torch.Generator, p: DSAParams) -> Tensor:
    """Brightness, then saturation, then contrast."""
    x = x + (_rand(x, g) - 0.5) * p.brightness
    mean = x.mean(dim=1, keepdim=True)
    x = (x - mean) * (_rand(x, g) * p.saturation) + mean
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return (x - mean) * (_rand(x, g) + p.contrast) + mean


def crop(x: Tensor, g: torch.Generator, p: DSAParams) -> Tensor:
    """Translate each image by up to ratio_crop_pad of its size (zero fill)."""
    n, _, h, w = x.shape
    sh, sw = int(h * p.ratio_crop_pad + 0.5), int(w * p.ratio_crop_pad + 0.5)
    dy = torch.randint(-sh, sh + 1, (n,), generator=g).tolist()
    dx = torch.randint(-sw, sw + 1, (n,), generator=g).tolist()
    padded = F.pad(x, (sw, sw, sh, sh))
    return torch.stack(
        [padded[i, :, sh + dy[i] : sh + dy[i] + h, sw + dx[i] : sw + dx[i] + w] for i in range(n)]
    )


def cutout(x: Tensor, g: torch.Generator, p: DSAParams) -> Tensor:
    """Zero one square of side ratio_cutout · size per image, centred anywhere (clipped)."""
    n, _, h, w = x.shape
    ch, cw = int(h * p.ratio_cutout + 0.5), int(w * p.ratio_cutout + 0.5)
    cy = torch.randint(0, h + (1 - ch % 2), (n,), generator=g)
    cx = torch.randint(0, w + (1 - cw % 2), (n,), generator=g)
    ys, xs = torch.arange(h)[None, :], torch.arange(w)[None, :]
    in_y = (ys >= (cy - ch // 2)[:, None]) & (ys < (cy - ch // 2 + ch)[:, None])
    in_x = (xs >= (cx - cw // 2)[:, None]) & (xs < (cx - cw // 2 + cw)[:, None])
    keep = ~(in_y[:, :, None] & in_x[:, None, :])
    return x * keep[:, None].to(x)


def flip(x: Tensor, g: torch.Generator, p: DSAParams) -> Tensor:
    """Mirror each image left-right with probability prob_flip."""
    mask = (torch.rand(x.shape[0], generator=g) < p.prob_flip).to(x.device)[:, None, None, None]
    return torch.where(mask, x.flip(3), x)


def _affine(x: Tensor, theta: Tensor) -> Tensor:
    grid = F.affine_grid(theta.to(x), list(x.shape), align_corners=True)
    return F.grid_sample(x, grid, align_corners=True)


def scale(x: Tensor, g: torch.Generator, p: DSAParams) -> Tensor:
    """Scale each axis by a factor in [1/ratio_scale, ratio_scale]."""
    n, r = x.shape[0], p.ratio_scale
    sx = torch.rand(n, generator=g) * (r - 1.0 / r) + 1.0 / r
    sy = torch.rand(n, generator=g) * (r - 1.0 / r) + 1.0 / r
    zero = torch.zeros(n)
    theta = torch.stack([torch.stack([sx, zero, zero], 1), torch.stack([zero, sy, zero], 1)], 1)
    return _affine(x, theta)


def rotate(x: Tensor, g: torch.Generator, p: DSAParams) -> Tensor:
    """Rotate each image by an angle in [−ratio_rotate, ratio_rotate] degrees."""
    n = x.shape[0]
    a = (torch.rand(n, generator=g) - 0.5) * 2 * p.ratio_rotate / 180 * math.pi
    zero = torch.zeros(n)
    theta = torch.stack(
        [torch.stack([a.cos(), a.sin(), zero], 1), torch.stack([-a.sin(), a.cos(), zero], 1)], 1
    )
    return _affine(x, theta)


OPS: dict[str, Callable[[Tensor, torch.Generator, DSAParams], Tensor]] = {
    "color": color, "crop": crop, "cutout": cutout, "flip": flip, "scale": scale, "rotate": rotate,
}  # fmt: skip


def dsa(
    x: Tensor, g: torch.Generator, ops: tuple[str, ...] = tuple(OPS), params: DSAParams = DSAParams()
) -> Tensor:
    """One operation of `ops`, picked at random, applied to the batch `x` [B, C, H, W]."""
    op = ops[int(torch.randint(len(ops), (1,), generator=g))]
    return OPS[op](x, g, params)
