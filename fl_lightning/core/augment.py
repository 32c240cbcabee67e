"""Training-time augmentation of the clients' batches (`data.augment`), torchvision's v2 ops on
tensors, applied per batch on the fit's device to the (normalised) resident shard.

* `random_crop`: pad `padding` pixels of black on every side, crop back to the image size at
  a random offset (CIFAR's `RandomCrop(32, padding=4)`);
* `hflip`: mirror left-right with probability 0.5 (`RandomHorizontalFlip()`);
* `rotate`: rotate by an angle uniform in [-degrees, degrees] about the centre, nearest
  neighbour, corners filled black (`RandomRotation(degrees)`, as the Office/DomainNet scripts).

Each image gets its own draw (torchvision's v2 transforms draw once per call, so one crop for a
whole batch). The draws come from a CPU generator seeded from (the fit's seed, step), and the
fit's seed from (run seed, round, client): the same numbers on any device, in the serial and
Ray executors, and in a resumed run's repeat of a round. Black is the normalised value of a
zero pixel, per channel, so augmenting the normalised images equals augmenting the raw ones
and normalising after. The names are torch-free (the config checks them); torch is imported
when a batch is augmented.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

#: the names `data.augment` takes, in no particular order (a batch gets them in the list's order)
AUGMENTATIONS = ("random_crop", "hflip", "rotate")


@dataclass(frozen=True)
class Augment:
    """What `data.augment` asks for, with the black pixel of the dataset's normalisation."""

    names: tuple[str, ...] = ()
    padding: int = 4  # random_crop
    degrees: float = 15.0  # rotate
    fill: tuple[float, ...] = (0.0,)  # a zero pixel, normalised: one value per channel (or one for all)


def black(mean: float | tuple[float, ...], std: float | tuple[float, ...]) -> tuple[float, ...]:
    """The normalised value of a zero pixel: -mean / std per channel."""
    m, s = np.atleast_1d(np.asarray(mean, np.float32)), np.atleast_1d(np.asarray(std, np.float32))
    return tuple(float(v) for v in (np.float32(0) - m) / s)


def step_seed(fit_seed: int, step: int) -> int:
    """The seed of one batch's draws: from the fit's seed (run seed, round, client) and the step."""
    return int(np.random.SeedSequence([fit_seed, step, 0xA06]).generate_state(1)[0])


def augment_batch(x: torch.Tensor, aug: Augment, seed: int) -> torch.Tensor:
    """`x` [B, C, H, W] (float, normalised) with `aug`'s transforms, each image its own draws
    from a generator seeded with `seed`."""
    import torch

    g = torch.Generator().manual_seed(seed)
    fill = [float(v) for v in (aug.fill * x.shape[1] if len(aug.fill) == 1 else aug.fill)]
    for name in aug.names:
        if name == "random_crop":
            x = random_crop(x, aug.padding, fill, g)
        elif name == "hflip":
            x = hflip(x, g)
        elif name == "rotate":
            x = rotate(x, aug.degrees, fill, g)
        else:  # the config refuses unknown names
            raise ValueError(f"unknown augmentation {name!r}")
    return x


def random_crop(x: torch.Tensor, padding: int, fill: list[float], g: torch.Generator) -> torch.Tensor:
    """Each image padded by `padding` with `fill`, then cropped back at its own random offset."""
    import torch
    from torchvision.transforms.v2 import functional as F

    if padding == 0:
        return x
    b, _, h, w = x.shape
    padded: torch.Tensor = F.pad(x, [padding], fill=fill)
    top = torch.randint(0, 2 * padding + 1, (b,), generator=g).to(x.device)
    left = torch.randint(0, 2 * padding + 1, (b,), generator=g).to(x.device)
    rows = (top[:, None] + torch.arange(h, device=x.device))[:, :, None]  # [B, H, 1]
    cols = (left[:, None] + torch.arange(w, device=x.device))[:, None, :]  # [B, 1, W]
    batch = torch.arange(b, device=x.device)[:, None, None]
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2).contiguous()


def hflip(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Each image mirrored left-right with probability 0.5."""
    import torch
    from torchvision.transforms.v2 import functional as F

    flip = (torch.rand(len(x), generator=g) < 0.5).to(x.device)
    return torch.where(flip[:, None, None, None], F.horizontal_flip(x), x)


def rotate(x: torch.Tensor, degrees: float, fill: list[float], g: torch.Generator) -> torch.Tensor:
    """Each image rotated by its own angle in [-degrees, degrees]: torchvision's
    `v2.functional.rotate` (nearest, same grid and fill), one grid per image."""
    import torch

    b, c, h, w = x.shape
    angles = (torch.rand(b, generator=g, dtype=torch.float64) * 2 - 1) * degrees
    # torchvision's inverse matrix for rotate(angle): _get_inverse_affine_matrix(0, -angle, ...)
    theta = torch.tensor(
        [[[math.cos(r), math.sin(r), 0.0], [-math.sin(r), math.cos(r), 0.0]] for r in
         (math.radians(-float(a)) for a in angles)],
        dtype=x.dtype, device=x.device,
    )  # fmt: skip
    base = torch.empty(1, h, w, 3, dtype=x.dtype, device=x.device)  # torchvision's _affine_grid
    base[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=x.device))
    ys = torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=x.device)
    base[..., 1].copy_(ys.unsqueeze_(-1))
    base[..., 2].fill_(1)
    scaled = theta.transpose(1, 2).div_(torch.tensor([0.5 * w, 0.5 * h], dtype=x.dtype, device=x.device))
    grid = base.view(1, h * w, 3).expand(b, -1, -1).bmm(scaled).view(b, h, w, 2)
    ones = torch.ones(b, 1, h, w, dtype=x.dtype, device=x.device)  # where the image lands
    out = torch.nn.functional.grid_sample(
        torch.cat((x, ones), 1), grid, mode="nearest", padding_mode="zeros", align_corners=False
    )
    img, mask = out[:, :c], out[:, c:].expand(-1, c, -1, -1)
    black = torch.tensor(fill, dtype=x.dtype, device=x.device).view(1, -1, 1, 1).expand_as(img)
    return torch.where(mask < 0.5, black, img)
