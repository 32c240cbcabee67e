"""Loaders of the standard datasets (Fashion-MNIST, digits, MNIST, CIFAR and their
long-tailed variants), registered in `DATASETS` (`registry.py`, which also holds
`ArrayDataset` and the loading entry points). They are read from their usual on-disk
formats under `data.root` and, where torchvision can, downloaded with `data.download=true`;
the other loaders register the rest of the table:

| name | on disk under `data.root` | download |
|---|---|---|
| fmnist | `fashion-mnist/*-ubyte.gz` | apt / torchvision |
| mnist | `MNIST/raw/*-ubyte[.gz]` (torchvision layout) | torchvision |
| cifar10, cifar10_lt | `cifar-10-batches-py/` (python pickles) | torchvision |
| cifar100, cifar100_lt | `cifar-100-python/` | torchvision |
| tiny_imagenet | `tiny-imagenet-200/` (wnids.txt, train/, val/) | no |
| imagenet_lt | `ImageNet_LT/ImageNet_LT_{train,test}.txt` + the images under `imagenet/` | no |
| office_caltech, domainnet, pacs | `<dir>/<domain>/<class>/*` or FedBN split files | no |
| voc2007 | `VOCdevkit/VOC2007/` | torchvision |
| coco | `coco/{train,val}2014/` + `coco/annotations/instances_*.json` | no |
| flair | `flair/flair_federated.hdf5` (ml-flair `prepare_dataset.py`) | no |
| caltech101 ... imagenet_r | CoOp's released layout (`coop.py`: split_zhou_*.json + images) | no |

Large folder datasets are decoded once, resized to `data.image_size` (squashed to a
square, as the Office/DomainNet reference code does), and kept in memory as uint8; the
decoded arrays are cached under `<data.root>/.cache/`. See `folders.py` and `cache.py`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from ..core.errors import ConfigError
from .cache import cached_arrays
from .fetch import (
    FMNIST_FILES,
    CorruptDataFile,
    fetch_fmnist,
    fmnist_check,
    fmnist_dir,
    fmnist_present,
    fmnist_shapes,
    read_fmnist_file,
    read_idx,
)
from .longtail import longtail_indices
from .registry import DATASETS, ArrayDataset, DatasetEntry, text_name
from .safe_pickle import load_data_pickle

# `read_idx` (an IDX file, gzipped or not, checked against its header) lives in fetch.py.


# --- Fashion-MNIST (embedded default) -----------------------------------------------
FMNIST_CLASSES = [
    "t-shirt", "trouser", "pullover", "dress", "coat",
    "sandal", "shirt", "sneaker", "bag", "ankle boot",
]  # fmt: skip
DIGIT_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def load_fmnist_arrays(root: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The four files, read and checked once (one line if one is broken), then from the
    `.cache/` beside them until a file changes: inflating them costs every run ~0.3 s."""

    def read() -> dict[str, np.ndarray]:
        return {f: read_fmnist_file(root, f) for f in FMNIST_FILES}

    shapes = fmnist_shapes(root)

    def whole(arrays: dict[str, np.ndarray]) -> bool:  # a cached copy passes a fresh read's checks
        try:
            for f in FMNIST_FILES:
                if arrays[f].dtype != np.uint8:
                    return False
                fmnist_check(f, arrays[f], shapes)
        except (KeyError, CorruptDataFile):
            return False
        return True

    arrays = cached_arrays(root, "fmnist", [fmnist_dir(root) / f for f in FMNIST_FILES], read, valid=whole)
    tx, ty, vx, vy = (arrays[f] for f in FMNIST_FILES)
    return tx[:, None], ty.astype(np.int64), vx[:, None], vy.astype(np.int64)


def _load_fmnist(root: str) -> ArrayDataset:
    tx, ty, vx, vy = load_fmnist_arrays(root)
    return ArrayDataset("fmnist", tx, ty, vx, vy, list(FMNIST_CLASSES), mean=0.2860, std=0.3530)


def fmnist_where(root: str) -> str:
    return (
        f"Fashion-MNIST not found: expected {', '.join(FMNIST_FILES)} in {fmnist_dir(root)}; "
        f"run `fl-lightning fetch fmnist --root {root}` or add data.download=true"
    )


DATASETS.register("fmnist")(
    DatasetEntry(
        load=_load_fmnist,
        present=fmnist_present,
        where=fmnist_where,
        download=fetch_fmnist,
        class_names=tuple(FMNIST_CLASSES),
    )  # fmt: skip
)


# --- scikit-learn digits (ships inside scikit-learn; a tiny real dataset) -------------
def _load_digits(root: str) -> ArrayDataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images * (255.0 / 16.0)).round().astype(np.uint8)[:, None]
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))  # fixed 80/20 split
    tr, te = order[: int(0.8 * len(y))], order[int(0.8 * len(y)) :]
    return ArrayDataset("digits", x[tr], y[tr], x[te], y[te], list(DIGIT_NAMES), mean=0.3, std=0.4)


DATASETS.register("digits")(
    DatasetEntry(
        load=_load_digits,
        present=lambda root: True,
        where=lambda root: "",
        class_names=tuple(DIGIT_NAMES),
    )  # fmt: skip
)


# --- MNIST (torchvision layout) -------------------------------------------------------
MNIST_FILES = (
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
)  # fmt: skip


def _mnist_file(root: str, stem: str) -> Path | None:
    raw = Path(root) / "MNIST" / "raw"
    for p in (raw / stem, raw / f"{stem}.gz"):
        if p.is_file():
            return p
    return None


def _mnist_where(root: str) -> str:
    return (
        f"MNIST not found: expected {', '.join(MNIST_FILES)} (optionally .gz) in "
        f"{Path(root) / 'MNIST' / 'raw'}; add data.download=true to fetch it with torchvision"
    )


def _read_mnist(root: str, stem: str) -> np.ndarray:
    path = _mnist_file(root, stem)
    if path is None:
        raise ConfigError(_mnist_where(root))
    try:
        return read_idx(path)
    except (CorruptDataFile, OSError) as e:
        raise ConfigError(
            f"MNIST file {path} is corrupt ({e}); delete it and add data.download=true to fetch it again"
        ) from None


def _load_mnist(root: str) -> ArrayDataset:
    tx, ty, vx, vy = (_read_mnist(root, f) for f in MNIST_FILES)
    return ArrayDataset(
        "mnist", tx[:, None], ty.astype(np.int64), vx[:, None], vy.astype(np.int64),
        list(DIGIT_NAMES), mean=0.1307, std=0.3081,
    )  # fmt: skip


def _download_mnist(root: str) -> None:
    from torchvision.datasets import MNIST

    MNIST(root, train=True, download=True)
    MNIST(root, train=False, download=True)


DATASETS.register("mnist")(
    DatasetEntry(
        load=_load_mnist,
        present=lambda root: all(_mnist_file(root, f) is not None for f in MNIST_FILES),
        where=_mnist_where,
        download=_download_mnist,
        class_names=tuple(DIGIT_NAMES),
    )
)


# --- CIFAR-10 / CIFAR-100 (python pickle batches) and their long-tailed variants -------
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR100_RAW = """
apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly
camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile
cup dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo keyboard lamp
lawn_mower leopard lion lizard lobster man maple_tree motorcycle mountain mouse mushroom oak_tree
orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy porcupine possum
rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper snail snake spider
squirrel streetcar sunflower sweet_pepper table tank telephone television tiger tractor train
trout tulip turtle wardrobe whale willow_tree wolf woman worm
""".split()
CIFAR100_CLASSES = [text_name(n) for n in CIFAR100_RAW]  # the standard fine labels, in label order
assert len(CIFAR100_CLASSES) == 100
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)

_CIFAR = {
    # name: (folder, train files, test files, label key, class names, torchvision class)
    10: (
        "cifar-10-batches-py",
        [f"data_batch_{i}" for i in range(1, 6)],
        ["test_batch"],
        "labels",
        CIFAR10_CLASSES,
        "CIFAR10",
    ),
    100: ("cifar-100-python", ["train"], ["test"], "fine_labels", CIFAR100_CLASSES, "CIFAR100"),
}


def _read_cifar(paths: list[Path], key: str) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for p in paths:
        d = load_data_pickle(p, "CIFAR")  # a data root is untrusted: no code runs from it
        try:  # Python 2's batches give str keys, ones pickled from Python 3 bytes keys
            d = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in d.items()}
            x = np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
            y = np.asarray(d[key], dtype=np.int64).reshape(-1)
        except (AttributeError, KeyError, TypeError, ValueError, IndexError):
            raise ConfigError(
                f"CIFAR file {p} is not a CIFAR batch (a dict with 'data' of N x 3072 bytes and "
                f"{key!r}); replace it"
            ) from None
        if len(x) != len(y):
            raise ConfigError(f"CIFAR file {p} has {len(x)} images but {len(y)} labels; replace it")
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def _register_cifar(n: int) -> None:
    folder, train_files, test_files, key, names, tv_cls = _CIFAR[n]
    files = [*train_files, *test_files]

    def present(root: str) -> bool:
        return all((Path(root) / folder / f).is_file() for f in files)

    def where(root: str) -> str:
        return (
            f"CIFAR-{n} not found: expected {', '.join(files)} in {Path(root) / folder} "
            f"(the python version); add data.download=true to fetch it with torchvision"
        )

    def download(root: str) -> None:
        import torchvision.datasets as tvd

        getattr(tvd, tv_cls)(root, train=True, download=True)

    def load(root: str, name: str = f"cifar{n}", imbalance_factor: float = 1.0) -> ArrayDataset:
        d = Path(root) / folder
        tx, ty = _read_cifar([d / f for f in train_files], key)
        vx, vy = _read_cifar([d / f for f in test_files], key)
        if imbalance_factor > 1:  # long-tailed training set (CReFF/CLIP2FL); balanced test set
            keep = longtail_indices(ty, imbalance_factor, np.random.default_rng(0))
            tx, ty = tx[keep], ty[keep]
        return ArrayDataset(name, tx, ty, vx, vy, list(names), mean=CIFAR_MEAN, std=CIFAR_STD)

    def load_lt(root: str, imbalance_factor: float = 100.0) -> ArrayDataset:
        if imbalance_factor <= 1:
            raise ConfigError(f"cifar{n}_lt needs data.imbalance_factor > 1 (got {imbalance_factor})")
        return load(root, f"cifar{n}_lt", imbalance_factor)

    balanced = DatasetEntry(
        load=lambda root: load(root),
        present=present,
        where=where,
        download=download,
        class_names=tuple(names),
    )
    DATASETS.register(f"cifar{n}")(balanced)
    DATASETS.register(f"cifar{n}_lt")(replace(balanced, load=load_lt))


_register_cifar(10)
_register_cifar(100)
