"""Offline STAND-INS built from Fashion-MNIST, for machines without the real datasets.

They exercise the same code paths as the real feature-skew and multi-label datasets, not
their difficulty or their numbers: never report results on them as results on
Office/DomainNet/PACS or VOC/COCO/FLAIR.

* `fmnist_domains` (stands in for Office-Caltech-10 / DomainNet / PACS): every image is
  shown in exactly one visual domain (original, rotated, inverted, noisy, blurred), with a
  domain id per sample; `data.domains` picks a subset. Use `data.partition=domain`.
* `fmnist_multilabel` (stands in for VOC / COCO): 56x56 2x2 mosaics of 1-4 Fashion-MNIST
  images (empty tiles black), labels the multi-hot set of the classes shown.

Both are deterministic (fixed seed 0), independent of the run seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from .datasets import FMNIST_CLASSES, fmnist_where, load_fmnist_arrays
from .fetch import fetch_fmnist, fmnist_present
from .longtail import longtail_indices
from .registry import DATASETS, ArrayDataset, DatasetEntry


def _rotated(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.ascontiguousarray(np.rot90(x, k=1, axes=(-2, -1)))


def _inverted(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return 255 - x


def _noisy(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.clip(x.astype(np.float32) + rng.normal(0.0, 48.0, x.shape), 0, 255).astype(np.uint8)


def _blurred(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    from scipy.ndimage import gaussian_filter

    return (
        np.clip(gaussian_filter(x.astype(np.float32), sigma=(0, 0, 1.2, 1.2)), 0, 255)
        .round()
        .astype(np.uint8)
    )


DOMAIN_TRANSFORMS: dict[str, Callable[[np.ndarray, np.random.Generator], np.ndarray]] = {
    "original": lambda x, rng: x,
    "rotated": _rotated,
    "inverted": _inverted,
    "noisy": _noisy,
    "blurred": _blurred,
}
FMNIST_DOMAINS = tuple(DOMAIN_TRANSFORMS)
STANDIN_DOMAINS = "Office-Caltech-10 / DomainNet / PACS (feature skew)"
STANDIN_MULTILABEL = "VOC 2007 / MS-COCO (multi-label)"


def _to_domains(
    x: np.ndarray, domains: Sequence[str], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Each image in one domain: a random, equal-sized (±1) assignment."""
    dom = (rng.permutation(len(x)) % len(domains)).astype(np.int64)
    out = np.empty_like(x)
    for k, name in enumerate(domains):
        idx = np.flatnonzero(dom == k)
        out[idx] = DOMAIN_TRANSFORMS[name](x[idx], rng)
    return out, dom


def _load_fmnist_domains(root: str, domains: Sequence[str] | None = None) -> ArrayDataset:
    chosen = list(domains) if domains else list(FMNIST_DOMAINS)
    bad = [d for d in chosen if d not in DOMAIN_TRANSFORMS]
    if bad:
        raise ConfigError(
            f"unknown fmnist_domains domain {bad[0]!r} in data.domains; valid: {', '.join(FMNIST_DOMAINS)}"
        )
    tx, ty, vx, vy = load_fmnist_arrays(root)
    rng = np.random.default_rng(0)
    tx, td = _to_domains(tx, chosen, rng)
    vx, vd = _to_domains(vx, chosen, rng)
    mean = float(tx.mean(dtype=np.float64) / 255.0)
    std = float(tx.std(dtype=np.float64) / 255.0)
    return ArrayDataset(
        "fmnist_domains", tx, ty, vx, vy, list(FMNIST_CLASSES), mean=mean, std=std,
        train_domains=td, test_domains=vd, domain_names=chosen, standin=STANDIN_DOMAINS,
    )  # fmt: skip


def mosaics(
    x: np.ndarray, y: np.ndarray, num_classes: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """2x2 mosaics using every image once: each holds 1-4 images (uniform) in random tiles.
    Returns uint8 [M, C, 2H, 2W] and float32 multi-hot [M, num_classes]."""
    n, c, h, w = x.shape
    order = rng.permutation(n)
    ks = rng.integers(1, 5, size=(n,))  # more than enough draws
    ends = np.cumsum(ks)
    m = int(np.searchsorted(ends, n, side="left")) + 1
    ks = ks[:m]
    ks[-1] -= ends[m - 1] - n  # the last mosaic takes what is left
    starts = np.concatenate([[0], np.cumsum(ks)[:-1]])
    tiles = rng.permuted(np.tile(np.arange(4), (m, 1)), axis=1)  # random tile order per mosaic
    out = np.zeros((m, c, 2 * h, 2 * w), dtype=x.dtype)
    labels = np.zeros((m, num_classes), dtype=np.float32)
    for t in range(4):  # the t-th image of each mosaic that has one
        rows = np.flatnonzero(ks > t)
        src = order[starts[rows] + t]
        labels[rows, y[src]] = 1.0
        for pos in range(4):
            sel = tiles[rows, t] == pos
            r0, c0 = (pos // 2) * h, (pos % 2) * w
            out[rows[sel], :, r0 : r0 + h, c0 : c0 + w] = x[src[sel]]
    return out, labels


def _load_fmnist_multilabel(
    root: str, imbalance_factor: float = 1.0, source_subset: int | None = None
) -> ArrayDataset:
    """`source_subset`: the training mosaics are built from the first N training images only
    (images N.. stay out of every client: `fl-lightning pretrain` learns from them);
    `imbalance_factor` > 1: from a long-tailed subset of those (class 0 the head, the
    exponential profile of CIFAR-LT), so label frequencies have a long tail as FLAIR's do.
    The test mosaics use every test image (balanced). Defaults: all 60,000, balanced."""
    tx, ty, vx, vy = load_fmnist_arrays(root)
    if source_subset is not None:
        if not 0 < source_subset <= len(ty):
            raise ConfigError(f"data.source_subset={source_subset} must lie in [1, {len(ty)}]")
        tx, ty = tx[:source_subset], ty[:source_subset]
    rng = np.random.default_rng(0)
    if imbalance_factor > 1:
        keep = longtail_indices(ty, imbalance_factor, np.random.default_rng(0x10E7A11))
        tx, ty = tx[keep], ty[keep]
    tx, ty = mosaics(tx, ty, len(FMNIST_CLASSES), rng)
    vx, vy = mosaics(vx, vy, len(FMNIST_CLASSES), rng)
    mean, std = float(tx.mean(dtype=np.float64) / 255.0), float(tx.std(dtype=np.float64) / 255.0)
    return ArrayDataset(
        "fmnist_multilabel", tx, ty, vx, vy, list(FMNIST_CLASSES), mean=mean, std=std,
        multilabel=True, standin=STANDIN_MULTILABEL,
    )  # fmt: skip


def _fmnist_entry(load: Callable[..., ArrayDataset], **extra: Any) -> DatasetEntry:
    """A dataset built from the Fashion-MNIST files: present, fetched and named as they are."""
    return DatasetEntry(
        load=load,
        present=fmnist_present,
        where=fmnist_where,
        download=fetch_fmnist,
        class_names=tuple(FMNIST_CLASSES),
        **extra,
    )


DATASETS.register("fmnist_domains")(
    _fmnist_entry(_load_fmnist_domains, domains=FMNIST_DOMAINS, standin=STANDIN_DOMAINS)
)
DATASETS.register("fmnist_multilabel")(
    _fmnist_entry(_load_fmnist_multilabel, multilabel=True, standin=STANDIN_MULTILABEL)
)
