"""The dataset registry (`DATASETS`) and the in-memory dataset type every loader returns.

A dataset is a few numpy arrays: uint8 images [N, C, H, W] and labels for the train and
test sets (int64 [N] class ids, or float32 multi-hot [N, C] when `multilabel`), with
text-ready class names and the normalisation to apply. Feature-skew datasets also carry a
domain id per sample, and FLAIR a natural client (user) per training sample. The driver
loads them once; Ray shares them with actors through the object store.

Every entry says where its files are expected (`where`), so a missing dataset ends with
one clear message. The loaders (`datasets.py`, `folders.py`, `multilabel.py`,
`standins.py`) register into `DATASETS`; importing the `fl_lightning.data` package imports
all of them, so every name is registered whichever data module is imported first.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import ConfigError
from ..core.registry import Registry

if TYPE_CHECKING:
    import torch

    from ..core.run_config import DataConfig


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
    train_domains: np.ndarray | None = None  # int64 [N] domain id per sample (feature skew)
    test_domains: np.ndarray | None = None
    domain_names: list[str] = field(default_factory=list)
    train_groups: np.ndarray | None = None  # int64 [N] natural client (e.g. FLAIR user) per sample
    group_names: list[str] = field(default_factory=list)
    #: bool [N]: training images held out of every client's training as the clients' own test
    #: splits (`data.personal_shots`, `protocols.py`); None: none
    train_personal: np.ndarray | None = None
    standin: str = ""  # non-empty for an offline stand-in: what it stands in for
    #: bool [N_test, num_classes], multi-label: the (image, label) pairs whose object is blanked
    #: out of the image but still labelled (`themed_mosaics.py`); the global evaluation reads
    #: out the AP on them (`core.metrics.blanked_ap`). None: none
    test_blank: np.ndarray | None = None
    #: a composite of datasets (`data=coop_multi`): its members' (name, class count) in label
    #: order, each member's labels following the previous one's; empty: one dataset
    class_sets: tuple[tuple[str, int], ...] = ()

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
        return normalise(x, self.mean, self.std), self.labels(y)

    def labels(self, y: np.ndarray) -> torch.Tensor:
        """`y` as a tensor: long class ids, or float multi-hot (a copy)."""
        import torch  # here, not at module level: registering and loading data needs no torch

        return torch.from_numpy(np.array(y, dtype=np.float32 if self.multilabel else np.int64))

    def stored(self, x: np.ndarray, y: np.ndarray) -> tuple[StoredImages, torch.Tensor]:
        """`tensors` for evaluation: the images stay uint8 and are normalised a batch at a
        time when sliced (`StoredImages`), the same numbers as `tensors`' in a quarter of
        the memory (a 224 px test set is tens of GB as float)."""
        return StoredImages(x, self.mean, self.std), self.labels(y)

    def subset(self, train: int | None = None, test: int | None = None) -> ArrayDataset:
        """The first `train` training and `test` test samples (quick runs, tests)."""
        if train is None and test is None:
            return self

        def cut(a: np.ndarray | None, n: int | None) -> np.ndarray | None:
            return None if a is None else a[:n]

        return replace(
            self,
            train_x=self.train_x[:train], train_y=self.train_y[:train],
            test_x=self.test_x[:test], test_y=self.test_y[:test], test_blank=cut(self.test_blank, test),
            train_domains=cut(self.train_domains, train), test_domains=cut(self.test_domains, test),
            train_groups=cut(self.train_groups, train), train_personal=cut(self.train_personal, train),
        )  # fmt: skip

    def hold_out(self, n: int) -> tuple[ArrayDataset, np.ndarray]:
        """`n` training images taken out of the training set for the server (unlabeled; the
        same ones whatever the run's seed), and the dataset without them (`data.server_subset`)."""
        total = len(self.train_y)
        if not 0 < n < total:
            raise ConfigError(f"data.server_subset={n} must leave training images: 0 < n < {total}")
        pick = np.sort(np.random.default_rng(0x5E12FE12).choice(total, n, replace=False))
        keep = np.setdiff1d(np.arange(total), pick)

        def take(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[keep]

        rest = replace(
            self, train_x=self.train_x[keep], train_y=self.train_y[keep],
            train_domains=take(self.train_domains), train_groups=take(self.train_groups),
            train_personal=take(self.train_personal),
        )  # fmt: skip
        return rest, self.train_x[pick]


def normalise(x: np.ndarray, mean: float | tuple[float, ...], std: float | tuple[float, ...]) -> torch.Tensor:
    """uint8 images [N, C, H, W] as normalised float32, a copy (object-store arrays are
    read-only). The one definition: `tensors` applies it to a whole set and `StoredImages`
    to each batch, and the ops are elementwise, so a batch's numbers are bit-identical to
    its rows of the whole set's."""
    import torch  # here, not at module level: registering and loading data needs no torch

    m = torch.from_numpy(np.asarray(mean, dtype=np.float32).reshape(-1, 1, 1))
    s = torch.from_numpy(np.asarray(std, dtype=np.float32).reshape(-1, 1, 1))
    return (torch.from_numpy(np.array(x, dtype=np.float32)) / 255.0 - m) / s


@dataclass(frozen=True)
class StoredImages:
    """Images kept as stored (uint8 [N, C, H, W]) and normalised a slice at a time: what an
    evaluation scores, batch by batch (`core.objective.evaluate`), without a float copy of
    the whole set (4x the uint8: ~18 GB for Food101's test set at 224 px).

    `x`: the dataset's own array, or a client's rows of it (uint8)."""

    x: np.ndarray
    mean: float | tuple[float, ...]
    std: float | tuple[float, ...]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, rows: slice) -> torch.Tensor:
        return normalise(self.x[rows], self.mean, self.std)


#: `DatasetEntry.extra_metrics`: (the loaded dataset, test scores [N, C], test targets) -> metrics
ExtraMetrics = Callable[[ArrayDataset, "torch.Tensor", "torch.Tensor"], dict[str, float]]


@dataclass(frozen=True)
class DatasetEntry:
    """How to find, fetch and load one dataset. `load(root, **options)` receives only the
    options its signature names (image_size, imbalance_factor, domains, ...)."""

    load: Callable[..., ArrayDataset]
    present: Callable[[str], bool]
    where: Callable[[str], str]  # message: which files are expected where
    download: Callable[[str], Any] | None = None  # fetch into root (network); None: manual only
    class_names: tuple[str, ...] | None = None  # known without loading the data
    #: the side of its images where it is fixed and known without loading (1: feature vectors),
    #: so a model that cannot take them is refused before the data is built
    image_size: int | None = None
    multilabel: bool = False
    domains: tuple[str, ...] = ()
    standin: str = ""  # non-empty for an offline stand-in: what it stands in for
    #: the coarse group of each class, `coarse_groups[c]` indexing `coarse_names` (a label space
    #: with a semantic structure: fmnist_digits20's clothing and digits): a single-label global
    #: evaluation also reports the share of errors that stay within a group; None: no groups
    coarse_groups: tuple[int, ...] | None = None
    coarse_names: tuple[str, ...] = ()
    #: the global evaluation's metrics beyond the task's own, from the main head's scores on the
    #: test set, in its order: (dataset, scores, targets) -> {name: value} (the themed mosaics'
    #: AP on blanked labels). The dataset's own knowledge: the engine only calls it. None: none
    extra_metrics: ExtraMetrics | None = None
    #: the `data` section's checks that need the dataset's listing files but no image (a
    #: composite's block size against each member's classes), run by `check_data` before any
    #: work: (the section as a mapping, its root expanded) -> None, or a ConfigError
    check: Callable[[Mapping[str, Any]], None] | None = None
    #: what its samples are: "images" (pixels or feature vectors), or "sentences" (SST-2); a
    #: model for other inputs (`models.ModelTraits.inputs`) is refused before any data is read
    inputs: str = "images"
    #: a composite's member datasets from `data.datasets` (checked; None: its default list),
    #: for what is known of each member without loading (`estimate`'s image counts); None:
    #: one dataset, itself
    members: Callable[[Sequence[str] | None], tuple[str, ...]] | None = None


DATASETS: Registry[DatasetEntry] = Registry("dataset")


def _accepted(fn: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(options)
    return {k: v for k, v in options.items() if k in params}


def _members(fn: Callable[..., Any], datasets: Sequence[str] | None) -> dict[str, Any]:
    """A composite's `present`/`where` take its member list (`data.datasets`); others do not."""
    return {"datasets": datasets} if "datasets" in inspect.signature(fn).parameters else {}


def missing(name: str, root: str, datasets: Sequence[str] | None = None) -> str | None:
    """Which files of the dataset are expected where, when they are not all there; else None.
    `datasets`: a composite's members (`data.datasets`)."""
    entry = DATASETS.get(name)
    if datasets is not None and not _members(entry.present, datasets):
        raise ConfigError(f"data.datasets names a composite's datasets (data=coop_multi), not {name!r}'s")
    if entry.present(root, **_members(entry.present, datasets)):
        return None
    return entry.where(root, **_members(entry.where, datasets))


def check_dataset(name: str, root: str, download: bool, datasets: Sequence[str] | None = None) -> None:
    """Fail before any work starts when a dataset is missing and may not be downloaded."""
    where = missing(name, root, datasets)
    if where is None:
        return
    if not download:
        raise ConfigError(where)
    if DATASETS.get(name).download is None:
        raise ConfigError(f"{where}; {name} cannot be downloaded automatically")


def check_data(section: DataConfig | Mapping[str, Any]) -> None:
    """`check_dataset` for a `data` config section, and the dataset's own checks of it
    (`DatasetEntry.check`): every refusal before an image is read."""
    data = dict(section) if isinstance(section, Mapping) else asdict(section)
    data["root"] = str(Path(str(data["root"])).expanduser())
    datasets = data.get("datasets")
    members = None if datasets is None else [str(m) for m in datasets]
    check_dataset(str(data["name"]), data["root"], bool(data.get("download")), members)
    if data.get("partition") is not None:  # a name no partitioner has: one line before Ray starts
        from .partition import PARTITIONERS

        PARTITIONERS.get(str(data["partition"]))
    own = DATASETS.get(str(data["name"])).check
    if own is not None:
        own(data)


def load_dataset(name: str, root: str, download: bool = False, **options: Any) -> ArrayDataset:
    """Load a registered dataset from `root` (downloading first when allowed and possible)."""
    entry = DATASETS.get(name)
    root = str(Path(root).expanduser())
    check_dataset(name, root, download, options.get("datasets"))
    if entry.download is not None and not entry.present(root):  # (check_dataset: allowed, possible)
        try:
            entry.download(root)
        except Exception as e:  # network, disk, checksum: one clear line, no traceback
            cause = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise ConfigError(
                f"could not download {name} into {root} ({cause}); {entry.where(root)}"
            ) from None
        if not entry.present(root):
            raise ConfigError(entry.where(root))
    accepted = _accepted(entry.load, options)
    unused = [
        k
        for k, v in options.items()
        if k not in accepted and k not in ("imbalance_factor", "image_size") and v not in (None, False)
    ]
    if unused:  # imbalance_factor may be meant for the `longtail` partitioner instead
        raise ConfigError(f"data.{unused[0]} does not apply to dataset {name!r}")
    ds = entry.load(root, **accepted)
    if "image_size" in accepted:  # decoded at that size by the loader itself
        return ds
    from .resize import resized

    return resized(ds, options.get("image_size"), root)


def dataset_options(data: Mapping[str, Any]) -> dict[str, Any]:
    """The loader options a `data` config section carries."""
    domains = data.get("domains")
    return {
        "image_size": data.get("image_size"),
        "imbalance_factor": float(data.get("imbalance_factor", 1.0)),
        "domains": list(domains) if domains is not None else None,
        "fine_grained": bool(data.get("fine_grained", False)),
        "max_users": data.get("max_users"),
        "coarse_prompts": bool(data.get("coarse_prompts", False)),
        "source_subset": data.get("source_subset"),
        "datasets": list(data["datasets"]) if data.get("datasets") is not None else None,
    }


#: the few-shot protocol's options (`protocols.py`): taken by a loader that names `shots` in its
#: signature (it draws before decoding), else applied to the loaded training set
PROTOCOL_OPTIONS = ("shots", "shots_seed", "personal_shots")


def load_from_config(section: DataConfig | Mapping[str, Any]) -> ArrayDataset:
    """Load the dataset a `data` config section names, with its options, protocols and subsets;
    `section`: the typed one, or its keys as a mapping (a method's `TaskInfo.data`)."""
    from .protocols import append_test_pool, apply

    data = section if isinstance(section, Mapping) else asdict(section)
    options = dataset_options(data)
    proto: dict[str, Any] = {k: data.get(k) for k in PROTOCOL_OPTIONS}
    proto["shots_seed"] = int(proto["shots_seed"] if proto["shots_seed"] is not None else 1)
    load = DATASETS.get(str(data["name"])).load
    by_loader = "shots" in _accepted(load, proto)
    # a loader that decodes at a size takes it; the others' images are resized after the subset
    takes_size = "image_size" in _accepted(load, options)
    size = None if takes_size else options.pop("image_size")
    name, root = data["name"], data["root"]
    ds = load_dataset(name, root, bool(data.get("download")), **options, **(proto if by_loader else {}))
    rest = {"shots": None, "personal_shots": None} if by_loader else {}
    ds = apply(ds, **{**proto, **rest}, base_new=bool(data.get("base_new", False)))
    ds = ds.subset(data.get("train_subset"), data.get("test_subset"))
    if data.get("personal_from_test", False):  # the (cut) test split: after the subsets
        ds = append_test_pool(ds)
    from .resize import resized

    return resized(ds, size, root)
