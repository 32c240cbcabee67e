"""`data.image_size` for a dataset whose loader reads images at their native size (Fashion-MNIST,
MNIST, digits, CIFAR, the stand-ins): its uint8 images resized once to S x S when loaded
(torchvision's bilinear resize with antialiasing, as PIL's bilinear resize of the folder
loaders), and cached in `<data.root>/.cache/` keyed by the source images' bytes and S, so a
subset, a long-tailed variant or a changed file gets its own entry. A cached copy is used only
when it holds uint8 arrays of exactly the expected shapes (else it is rebuilt)."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from .cache import cached_arrays

if TYPE_CHECKING:  # registry imports this module when it loads a dataset
    from .registry import ArrayDataset

_CHUNK = 2048  # images resized at a time: bounds the float copy torch makes of a chunk


def resize_images(x: np.ndarray, size: int) -> np.ndarray:
    """uint8 [N, C, H, W] -> uint8 [N, C, size, size]."""
    import torch
    from torchvision.transforms.v2 import functional as F

    out = np.empty((len(x), x.shape[1], size, size), dtype=np.uint8)
    for i in range(0, len(x), _CHUNK):
        chunk = torch.from_numpy(np.array(x[i : i + _CHUNK]))  # a copy: object-store arrays are read-only
        out[i : i + _CHUNK] = F.resize(chunk, [size, size], antialias=True).numpy()
    return out


def _digest(arrays: tuple[np.ndarray, ...]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(repr((a.dtype.str, a.shape)).encode())
        h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


def resized(ds: ArrayDataset, size: int | None, root: str) -> ArrayDataset:
    """`ds` with its images at `size` x `size` (unchanged when `size` is None or already theirs)."""
    if size is None or (ds.train_x.shape[2:] == (size, size) and ds.test_x.shape[2:] == (size, size)):
        return ds
    shapes = {k: (len(a), a.shape[1], size, size) for k, a in (("train", ds.train_x), ("test", ds.test_x))}

    def build() -> dict[str, np.ndarray]:
        return {"train": resize_images(ds.train_x, size), "test": resize_images(ds.test_x, size)}

    def whole(arrays: dict[str, np.ndarray]) -> bool:  # as a fresh resize would give them
        return all(k in arrays and arrays[k].dtype == np.uint8 and arrays[k].shape == shape
                   for k, shape in shapes.items())  # fmt: skip

    salt = f"resize|{size}|{_digest((ds.train_x, ds.test_x))}"
    arrays = cached_arrays(root, f"{ds.name}-{size}px", [], build, salt=salt, valid=whole)
    return replace(ds, train_x=arrays["train"], test_x=arrays["test"])
