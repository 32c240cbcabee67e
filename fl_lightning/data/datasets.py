"""In-memory image datasets (`DATASETS` registry).

A dataset is a few numpy arrays: uint8 images [N, C, H, W] and labels for the train and
test sets (int64 [N] class ids, or float32 multi-hot [N, C] when `multilabel`), with
text-ready class names and the normalisation to apply. Feature-skew datasets also carry a
domain id per sample, and FLAIR a natural client (user) per training sample. The driver
loads them once; Ray shares them with actors through the object store.

Every entry says where its files are expected (`where`), so a missing dataset ends with
one clear message. Standard datasets are read from their usual on-disk formats under
`data.root` and, where torchvision can, downloaded with `data.download=true`:

| name | on disk under `data.root` | download |
|---|---|---|
| fmnist | `fashion-mnist/*-ubyte.gz` | apt / torchvision |
| mnist | `MNIST/raw/*-ubyte[.gz]` (torchvision layout) | torchvision |
| cifar10, cifar10_lt | `cifar-10-batches-py/` (python pickles) | torchvision |
| cifar100, cifar100_lt | `cifar-100-python/` | torchvision |
| tiny_imagenet | `tiny-imagenet-200/` (wnids.txt, train/, val/) | no |
| office_caltech, domainnet, pacs | `<dir>/<domain>/<class>/*` or FedBN split files | no |
| voc2007 | `VOCdevkit/VOC2007/` | torchvision |
| coco | `coco/{train,val}2014/` + `coco/annotations/instances_*.json` | no |
| flair | `flair/flair_federated.hdf5` (ml-flair `prepare_dataset.py`) | no |

Large folder datasets are decoded once, resized to `data.image_size` (squashed to a
square, as the Office/DomainNet reference code does), and kept in memory as uint8; the
decoded arrays are cached under `<data.root>/.cache/`. See `folders.py`.
"""
from __future__ import annotations

import gzip
import inspect
import pickle
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from ..core.errors import ConfigError
from ..core.registry import Registry
from .fetch import FMNIST_FILES, fetch_fmnist, fmnist_dir, fmnist_present


def text_name(raw: str) -> str:
    """A class name ready for prompts: `aquarium_fish` -> `aquarium fish`."""
    return " ".join(raw.replace("_", " ").split())


@dataclass
class ArrayDataset:
    name: str
    train_x: np.ndarray  # uint8 [N, C, H, W]
    train_y: np.ndarray  # int64 [N], or float32 multi-hot [N, num_classes] when multilabel
    test_x: np.ndarray
    test_y: np.ndarray
    class_names: list[str]
    mean: float | tuple[float, ...]  # one value, or one per channel
    std: float | tuple[float, ...]
    multilabel: bool = False
    train_domains: Optional[np.ndarray] = None  # int64 [N] domain id per sample (feature skew)
    test_domains: Optional[np.ndarray] = None
    domain_names: list[str] = field(default_factory=list)
    train_groups: Optional[np.ndarray] = None  # int64 [N] natural client (e.g. FLAIR user) per sample
    group_names: list[str] = field(default_factory=list)
    standin: str = ""  # non-empty for an offline stand-in: what it stands in for

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def in_channels(self) -> int:
        return int(self.train_x.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.train_x.shape[2])

    def tensors(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised float images and labels (long ids, or float multi-hot). Copies:
        object-store arrays are read-only."""
        mean = np.asarray(self.mean, dtype=np.float32).reshape(-1, 1, 1)
        std = np.asarray(self.std, dtype=np.float32).reshape(-1, 1, 1)
        xt = (torch.from_numpy(np.array(x, dtype=np.float32)) / 255.0 - torch.from_numpy(mean)) / torch.from_numpy(std)
        ydt = np.float32 if self.multilabel else np.int64
        return xt, torch.from_numpy(np.array(y, dtype=ydt))

    def subset(self, train: Optional[int] = None, test: Optional[int] = None) -> "ArrayDataset":
        """The first `train` training and `test` test samples (quick runs, tests)."""
        if train is None and test is None:
            return self

        def cut(a: Optional[np.ndarray], n: Optional[int]) -> Optional[np.ndarray]:
            return None if a is None else a[:n]

        return replace(
            self,
            train_x=self.train_x[:train], train_y=self.train_y[:train],
            test_x=self.test_x[:test], test_y=self.test_y[:test],
            train_domains=cut(self.train_domains, train), test_domains=cut(self.test_domains, test),
            train_groups=cut(self.train_groups, train),
        )  # fmt: skip


@dataclass(frozen=True)
class DatasetEntry:
    """How to find, fetch and load one dataset. `load(root, **options)` receives only the
    options its signature names (image_size, imbalance_factor, domains, ...)."""

    load: Callable[..., ArrayDataset]
    present: Callable[[str], bool]
    where: Callable[[str], str]  # message: which files are expected where
    download: Optional[Callable[[str], Any]] = None  # fetch into root (network); None: manual only
    class_names: Optional[tuple[str, ...]] = None  # known without loading the data
    multilabel: bool = False
    domains: tuple[str, ...] = ()
    standin: str = ""  # non-empty for an offline stand-in: what it stands in for


DATASETS: Registry[DatasetEntry] = Registry("dataset")


def _accepted(fn: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(options)
    return {k: v for k, v in options.items() if k in params}


def check_dataset(name: str, root: str, download: bool) -> None:
    """Fail before any work starts when a dataset is missing and may not be downloaded."""
    entry = DATASETS.get(name)
    if entry.present(root):
        return
    if not download:
        raise ConfigError(entry.where(root))
    if entry.download is None:
        raise ConfigError(f"{entry.where(root)}; {name} cannot be downloaded automatically")


def load_dataset(name: str, root: str, download: bool = False, **options: Any) -> ArrayDataset:
    """Load a registered dataset from `root` (downloading first when allowed and possible)."""
    entry = DATASETS.get(name)
    root = str(Path(root).expanduser())
    check_dataset(name, root, download)
    if not entry.present(root):
        try:
            entry.download(root)  # type: ignore[misc]
        except Exception as e:  # network, disk, checksum: one clear line, no traceback
            cause = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise ConfigError(f"could not download {name} into {root} ({cause}); {entry.where(root)}") from None
        if not entry.present(root):
            raise ConfigError(entry.where(root))
    accepted = _accepted(entry.load, options)
    unused = [k for k, v in options.items() if k not in accepted and k != "imbalance_factor" and v not in (None, False)]
    if unused:  # imbalance_factor may be meant for the `longtail` partitioner instead
        raise ConfigError(f"data.{unused[0]} does not apply to dataset {name!r}")
    return entry.load(root, **accepted)


def dataset_options(data: Any) -> dict[str, Any]:
    """The loader options a `data` config section carries."""
    domains = data.get("domains")
    return {
        "image_size": data.get("image_size"),
        "imbalance_factor": float(data.get("imbalance_factor", 1.0)),
        "domains": list(domains) if domains is not None else None,
        "fine_grained": bool(data.get("fine_grained", False)),
        "max_users": data.get("max_users"),
    }


def load_from_config(data: Any) -> ArrayDataset:
    """Load the dataset a `data` config section names, with its options and subsets."""
    ds = load_dataset(data.name, data.root, bool(data.download), **dataset_options(data))
    return ds.subset(data.get("train_subset"), data.get("test_subset"))


# --- shared helpers ---------------------------------------------------------------------
def read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST format), gzipped or not."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)




def longtail_counts(counts: Sequence[int], imbalance_factor: float) -> np.ndarray:
    """Cui et al. 2019 exponential profile: n_c = floor(n_max * (1/IF)^(c/(C-1))), class 0
    the head, n_max the largest class; never more than a class has. Applying it to data
    already long-tailed by the same factor keeps every sample."""
    counts = np.asarray(counts, dtype=np.int64)
    c = len(counts)
    if imbalance_factor < 1:
        raise ConfigError(f"data.imbalance_factor must be >= 1 (got {imbalance_factor})")
    if c < 2 or imbalance_factor == 1:
        return counts.copy()
    n_max = int(counts.max())
    target = np.array([int(n_max * (1.0 / imbalance_factor) ** (i / (c - 1.0))) for i in range(c)])
    return np.minimum(counts, np.maximum(target, 1))


def longtail_indices(labels: np.ndarray, imbalance_factor: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of a long-tailed subset of `labels` (random samples within each class)."""
    num_classes = int(labels.max()) + 1 if len(labels) else 0
    counts = np.bincount(labels, minlength=num_classes)
    keep = longtail_counts(counts, imbalance_factor)
    chosen = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in enumerate(keep)]
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


# --- Fashion-MNIST (embedded default) -----------------------------------------------
FMNIST_CLASSES = [
    "t-shirt", "trouser", "pullover", "dress", "coat",
    "sandal", "shirt", "sneaker", "bag", "ankle boot",
]  # fmt: skip
DIGIT_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def load_fmnist_arrays(root: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    d = fmnist_dir(root)
    tx, ty, vx, vy = (read_idx(d / f) for f in FMNIST_FILES)
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
        load=_load_fmnist, present=fmnist_present, where=fmnist_where,
        download=fetch_fmnist, class_names=tuple(FMNIST_CLASSES),
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
        load=_load_digits, present=lambda root: True, where=lambda root: "",
        class_names=tuple(DIGIT_NAMES),
    )  # fmt: skip
)


# --- MNIST (torchvision layout) -------------------------------------------------------
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _mnist_file(root: str, stem: str) -> Optional[Path]:
    raw = Path(root) / "MNIST" / "raw"
    for p in (raw / stem, raw / f"{stem}.gz"):
        if p.is_file():
            return p
    return None


def _load_mnist(root: str) -> ArrayDataset:
    tx, ty, vx, vy = (read_idx(_mnist_file(root, f)) for f in MNIST_FILES)  # type: ignore[arg-type]
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
        where=lambda root: (
            f"MNIST not found: expected {', '.join(MNIST_FILES)} (optionally .gz) in "
            f"{Path(root) / 'MNIST' / 'raw'}; add data.download=true to fetch it with torchvision"
        ),
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
    10: ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "labels", CIFAR10_CLASSES, "CIFAR10"),
    100: ("cifar-100-python", ["train"], ["test"], "fine_labels", CIFAR100_CLASSES, "CIFAR100"),
}


def _read_cifar(paths: list[Path], key: str) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for p in paths:
        with open(p, "rb") as f:
            d = pickle.load(f, encoding="latin1")
        xs.append(np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(d[key], dtype=np.int64))
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

    common = dict(present=present, where=where, download=download, class_names=tuple(names))
    DATASETS.register(f"cifar{n}")(DatasetEntry(load=lambda root: load(root), **common))  # type: ignore[arg-type]
    DATASETS.register(f"cifar{n}_lt")(DatasetEntry(load=load_lt, **common))  # type: ignore[arg-type]


_register_cifar(10)
_register_cifar(100)


# The other loaders register themselves on import.
from . import folders, multilabel, standins  # noqa: E402,F401
