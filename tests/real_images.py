"""Real dataset images that ship inside an installed package, written in a dataset's own on-disk
format: foolbox's wheel carries 20 test images each of CIFAR-10, CIFAR-100, MNIST and
Fashion-MNIST and 20 ImageNet ones (`foolbox/data/<dataset>_<index>_<label>.png`). Read as
files: foolbox is never imported (its own dependencies are not needed)."""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path

import numpy as np


def foolbox_images(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images [N, C, H, W] (in file order) and int64 labels of `dataset` (cifar10, cifar100,
    mnist, fashionMNIST) from foolbox's package data."""
    from PIL import Image

    spec = importlib.util.find_spec("foolbox")  # finds the package without importing it
    assert spec is not None and spec.submodule_search_locations, "pip install foolbox==3.3.4 --no-deps"
    files = sorted((Path(spec.submodule_search_locations[0]) / "data").glob(f"{dataset}_*.png"))
    assert files, f"no {dataset} images in foolbox's package data"
    xs, ys = [], []
    for f in files:
        with Image.open(f) as im:
            a = np.asarray(im, dtype=np.uint8)
        xs.append(a.transpose(2, 0, 1) if a.ndim == 3 else a[None])
        ys.append(int(f.stem.rsplit("_", 1)[1]))
    return np.stack(xs), np.asarray(ys, dtype=np.int64)


def cifar10_root(root: Path, test: int = 5) -> Path:
    """`root` holding `cifar-10-batches-py/` in the official format (python-2-style pickles of
    bytes keys, N x 3072 rows): foolbox's 20 CIFAR-10 images, the last `test` of them the test
    batch, the others spread over the five training batches."""
    x, y = foolbox_images("cifar10")
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    train = np.array_split(np.arange(len(y) - test), 5)
    batches = {f"data_batch_{i + 1}": idx for i, idx in enumerate(train)}
    batches["test_batch"] = np.arange(len(y) - test, len(y))
    for name, idx in batches.items():
        batch = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in y[idx]],
            b"data": x[idx].reshape(len(idx), 3072),
            b"filenames": [f"foolbox_{i}.png".encode() for i in idx],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {b"label_names": [b"airplane"] * 10, b"num_cases_per_batch": len(train[0]), b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return root
