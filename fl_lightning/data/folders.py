"""Image-folder datasets: Tiny-ImageNet, ImageNet-LT, and the feature-skew sets Office-Caltech-10,
DomainNet (10-class subset) and PACS, one domain id per sample.

Images are decoded once with PIL, resized to `image_size` x `image_size` (squashed, as the
Office/DomainNet reference code's `Resize((256, 256))` does) and kept in memory as uint8
[N, 3, S, S]. The decoded arrays are cached in `<root>/.cache/` keyed by the file list and
size, so later runs skip decoding (`cache.py`). Memory is N * 3 * S^2 bytes: Office at 256 is ~0.75 GB,
the DomainNet subset at 128 ~1.5 GB, Tiny-ImageNet at 64 ~1.3 GB; lower `data.image_size`
for bigger sets (models see the stored size; crops/augmentation belong to the objective).

Domain datasets read either layout, per domain:
  * FedBN split files `<dir>/<domain>_train.pkl` / `<domain>_test.pkl`: a pickled
    (image paths, labels) pair, paths relative to `data.root` (or to `<dir>`), labels the
    raw class names; PACS's `<domain>_{train,test}_kfold.txt` ("path label" lines) too;
  * plain folders `<dir>/<domain>/<class>/<image>`: a fixed (seed 0) 80/20 split per domain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from .cache import cached_images
from .registry import DATASETS, ArrayDataset, DatasetEntry, text_name
from .safe_pickle import load_data_pickle

IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTS)


# --- Tiny-ImageNet ------------------------------------------------------------------------
TINY_DIR = "tiny-imagenet-200"


def _tiny_where(root: str) -> str:
    d = Path(root) / TINY_DIR
    return (
        f"Tiny-ImageNet not found: expected {d}/wnids.txt, {d}/words.txt, "
        f"{d}/train/<wnid>/images/*.JPEG and {d}/val/val_annotations.txt + {d}/val/images/*.JPEG "
        f"(unzip tiny-imagenet-200.zip from cs231n.stanford.edu into {root}); not downloaded automatically"
    )


def _tiny_present(root: str) -> bool:
    d = Path(root) / TINY_DIR
    return all(p.exists() for p in (d / "wnids.txt", d / "train", d / "val" / "val_annotations.txt"))


def _load_tiny(root: str, image_size: int | None = None) -> ArrayDataset:
    d = Path(root) / TINY_DIR
    size = image_size or 64
    wnids = [w.strip() for w in (d / "wnids.txt").read_text().split() if w.strip()]
    words: dict[str, str] = {}
    if (d / "words.txt").is_file():
        for line in (d / "words.txt").read_text().splitlines():
            if "\t" in line:
                k, v = line.split("\t", 1)
                words[k] = v
    names = [text_name(words.get(w, w).split(",")[0]) for w in wnids]
    index = {w: i for i, w in enumerate(wnids)}
    train_paths, train_y = [], []
    for w in wnids:
        folder = d / "train" / w / "images"
        if not folder.is_dir():
            folder = d / "train" / w
        files = _files(folder) if folder.is_dir() else []
        train_paths += files
        train_y += [index[w]] * len(files)
    test_paths, test_y = [], []
    for line in (d / "val" / "val_annotations.txt").read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[1] in index:
            test_paths.append(d / "val" / "images" / parts[0])
            test_y.append(index[parts[1]])
    if not train_paths or not test_paths:
        raise ConfigError(_tiny_where(root) + " (found no images)")
    return ArrayDataset(
        "tiny_imagenet",
        cached_images(root, "tiny_imagenet-train", train_paths, size), np.asarray(train_y, dtype=np.int64),
        cached_images(root, "tiny_imagenet-test", test_paths, size), np.asarray(test_y, dtype=np.int64),
        names, mean=IMAGENET_MEAN, std=IMAGENET_STD,
    )  # fmt: skip


DATASETS.register("tiny_imagenet")(DatasetEntry(load=_load_tiny, present=_tiny_present, where=_tiny_where))


# --- ImageNet-LT (Liu et al. 2019, OLTR's split files) ----------------------------------
LT_DIR = "ImageNet_LT"


def _imagenet_lt_where(root: str) -> str:
    d = Path(root) / LT_DIR
    return (
        f"ImageNet-LT not found: expected {d}/ImageNet_LT_train.txt and {d}/ImageNet_LT_test.txt "
        f"(OLTR's split files, 'train/<wnid>/<file>.JPEG <label>' lines) with the ImageNet images they "
        f"name under {Path(root) / 'imagenet'} (or {d}); not downloaded automatically"
    )


def _imagenet_lt_present(root: str) -> bool:
    d = Path(root) / LT_DIR
    return (d / "ImageNet_LT_train.txt").is_file() and (d / "ImageNet_LT_test.txt").is_file()


def _imagenet_lt_split(root: str, name: str) -> tuple[list[Path], np.ndarray]:
    d = Path(root) / LT_DIR
    bases = [Path(root) / "imagenet", d]
    paths, labels = [], []
    for line in (d / name).read_text().splitlines():
        if not line.strip():
            continue
        rel, label = line.rsplit(maxsplit=1)
        hit = next((b / rel for b in bases if (b / rel).is_file()), None)
        if hit is None:
            raise ConfigError(f"{_imagenet_lt_where(root)} (missing {rel}, listed in {d / name})")
        paths.append(hit)
        labels.append(int(label))
    return paths, np.asarray(labels, dtype=np.int64)


def _load_imagenet_lt(root: str, image_size: int | None = None) -> ArrayDataset:
    """115,846 training images of 1,000 classes (1,280 down to 5 per class) and a balanced test
    set of 50 per class from ImageNet's validation images, decoded at `image_size` (default
    112: 4.4 GB for the training set). Labels are ImageNet's usual sorted-wnid indices, so
    the class texts are open_clip's ImageNet class names."""
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES  # the open_clip/CLIP wording

    size = image_size or 112
    train_paths, train_y = _imagenet_lt_split(root, "ImageNet_LT_train.txt")
    test_paths, test_y = _imagenet_lt_split(root, "ImageNet_LT_test.txt")
    if not train_paths or not test_paths:
        raise ConfigError(_imagenet_lt_where(root) + " (the split files list no images)")
    return ArrayDataset(
        "imagenet_lt",
        cached_images(root, "imagenet_lt-train", train_paths, size), train_y,
        cached_images(root, "imagenet_lt-test", test_paths, size), test_y,
        [text_name(n) for n in IMAGENET_CLASSNAMES], mean=IMAGENET_MEAN, std=IMAGENET_STD,
    )  # fmt: skip


DATASETS.register("imagenet_lt")(
    DatasetEntry(load=_load_imagenet_lt, present=_imagenet_lt_present, where=_imagenet_lt_where)
)


# --- domain datasets (feature skew): Office-Caltech-10, DomainNet, PACS --------------------
@dataclass(frozen=True)
class DomainSpec:
    name: str  # registry name
    title: str
    folder: str  # under data.root
    domains: tuple[str, ...]
    raw_classes: tuple[str, ...]  # class folder / label names as on disk, in label order
    class_names: tuple[str, ...]  # text-ready
    default_size: int
    source: str  # where to get it
    image_subdirs: tuple[str, ...] = ("",)  # where domain folders may sit inside `folder`
    split_subdirs: tuple[str, ...] = ("",)  # where split files may sit inside `folder`


def _split_files(spec: DomainSpec, base: Path, domain: str) -> tuple[Path, Path] | None:
    for sub in spec.split_subdirs:
        d = base / sub if sub else base
        for train, test in (
            (f"{domain}_train.pkl", f"{domain}_test.pkl"),
            (f"{domain}_train_kfold.txt", f"{domain}_test_kfold.txt"),
            (f"{domain}_train.txt", f"{domain}_test.txt"),
        ):
            if (d / train).is_file() and (d / test).is_file():
                return d / train, d / test
    return None


def _domain_folder(spec: DomainSpec, base: Path, domain: str) -> Path | None:
    for sub in spec.image_subdirs:
        d = (base / sub if sub else base) / domain
        if d.is_dir():
            return d
    return None


def _read_split(path: Path) -> tuple[list[str], list[object]]:
    if path.suffix == ".txt":
        rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
        return [r[0] for r in rows], [r[1] if len(r) > 1 else None for r in rows]
    with open(path, "rb") as f:
        npy = f.read(6) == b"\x93NUMPY"
    # FedBN: a pickled (paths, text labels) pair; a data root is untrusted: no code runs from it
    obj: Any = None if npy else load_data_pickle(path, "split", scalars=True)
    try:
        obj = np.load(path, allow_pickle=False) if npy else obj
        paths, labels = obj[0], obj[1]
        return [str(p) for p in paths], list(labels)
    except (TypeError, ValueError, IndexError, KeyError, OSError) as e:
        raise ConfigError(f"split file {path} is not a (paths, labels) pair ({e}); replace it") from None


def _resolve(spec: DomainSpec, root: Path, base: Path, rel: str) -> Path:
    rel_path = Path(rel)
    candidates = [root / rel_path, base / rel_path]
    candidates += [(base / sub if sub else base) / rel_path for sub in spec.image_subdirs]
    if len(rel_path.parts) > 1:
        candidates.append(base / Path(*rel_path.parts[1:]))
    for c in candidates:
        if c.is_file():
            return c
    raise ConfigError(
        f"{spec.title}: image {rel!r} listed in a split file was not found under {root} or {base}"
    )


def _label_of(spec: DomainSpec, rel: str, label: object) -> int | None:
    if isinstance(label, (str, np.str_)) and str(label) in spec.raw_classes:
        return spec.raw_classes.index(str(label))
    for part in reversed(Path(rel).parts[:-1]):  # .../<class>/<image>
        if part in spec.raw_classes:
            return spec.raw_classes.index(part)
    return None  # a class outside the subset (e.g. DomainNet's other 335)


def _domain_items(
    spec: DomainSpec, root: str, domain: str
) -> tuple[list[Path], list[int], list[Path], list[int]]:
    base = Path(root) / spec.folder
    files = _split_files(spec, base, domain)
    if files is not None:
        out: list[list] = []
        for f in files:
            rels, labels = _read_split(f)
            paths, ys = [], []
            for rel, lab in zip(rels, labels, strict=True):
                y = _label_of(spec, rel, lab)
                if y is not None:
                    paths.append(_resolve(spec, Path(root), base, rel))
                    ys.append(y)
            out += [paths, ys]
        return out[0], out[1], out[2], out[3]
    folder = _domain_folder(spec, base, domain)
    if folder is None:
        raise ConfigError(f"{spec.title}: domain {domain!r} not found. " + _domain_where(spec, root))
    paths, ys = [], []
    for y, cls in enumerate(spec.raw_classes):
        if (folder / cls).is_dir():
            files_ = _files(folder / cls)
            paths += files_
            ys += [y] * len(files_)
    order = np.random.default_rng(0).permutation(len(paths))  # fixed 80/20 split
    cut = int(round(0.8 * len(paths)))
    tr, te = order[:cut], order[cut:]
    return [paths[i] for i in tr], [ys[i] for i in tr], [paths[i] for i in te], [ys[i] for i in te]


def _domain_where(spec: DomainSpec, root: str) -> str:
    base = Path(root) / spec.folder
    return (
        f"{spec.title} not found: for each domain ({', '.join(spec.domains)}) expected either split files "
        f"{base}/<domain>_train.pkl and <domain>_test.pkl (FedBN format: pickled (image paths relative "
        f"to {root}, class names)) or images in {base}/<domain>/<class>/*.jpg with classes "
        f"{', '.join(spec.raw_classes)}; get it from {spec.source}; not downloaded automatically"
    )


def _domain_present(spec: DomainSpec, root: str) -> bool:
    base = Path(root) / spec.folder
    return base.is_dir() and any(
        _split_files(spec, base, d) is not None or _domain_folder(spec, base, d) is not None
        for d in spec.domains
    )


def _select_domains(spec: DomainSpec, domains: Sequence[str] | None) -> list[str]:
    if not domains:
        return list(spec.domains)
    bad = [d for d in domains if d not in spec.domains]
    if bad:
        raise ConfigError(
            f"unknown {spec.name} domain {bad[0]!r} in data.domains; valid: {', '.join(spec.domains)}"
        )
    return list(domains)


def _domain_loader(spec: DomainSpec) -> Callable[..., ArrayDataset]:
    def load(root: str, image_size: int | None = None, domains: Sequence[str] | None = None) -> ArrayDataset:
        size = image_size or spec.default_size
        chosen = _select_domains(spec, domains)
        parts: dict[str, list] = {"tp": [], "ty": [], "td": [], "vp": [], "vy": [], "vd": []}
        for k, dom in enumerate(chosen):
            tp, ty, vp, vy = _domain_items(spec, root, dom)
            if not tp:
                raise ConfigError(
                    f"{spec.title}: no training images for domain {dom!r}. " + _domain_where(spec, root)
                )
            parts["tp"] += tp
            parts["ty"] += ty
            parts["td"] += [k] * len(tp)
            parts["vp"] += vp
            parts["vy"] += vy
            parts["vd"] += [k] * len(vp)
        i64 = lambda a: np.asarray(a, dtype=np.int64)  # noqa: E731
        return ArrayDataset(
            spec.name,
            cached_images(root, f"{spec.name}-train", parts["tp"], size), i64(parts["ty"]),
            cached_images(root, f"{spec.name}-test", parts["vp"], size), i64(parts["vy"]),
            list(spec.class_names), mean=IMAGENET_MEAN, std=IMAGENET_STD,
            train_domains=i64(parts["td"]), test_domains=i64(parts["vd"]), domain_names=chosen,
        )  # fmt: skip

    return load


OFFICE = DomainSpec(
    name="office_caltech",
    title="Office-Caltech-10",
    folder="office_caltech_10",
    domains=("amazon", "caltech", "dslr", "webcam"),
    raw_classes=(
        "back_pack",
        "bike",
        "calculator",
        "headphones",
        "keyboard",
        "laptop_computer",
        "monitor",
        "mouse",
        "mug",
        "projector",
    ),  # fmt: skip
    class_names=(
        "backpack",
        "bike",
        "calculator",
        "headphones",
        "keyboard",
        "laptop computer",
        "monitor",
        "mouse",
        "mug",
        "projector",
    ),  # fmt: skip  (FedGLCL's strings)
    default_size=256,
    source="the FedBN repository (office_caltech_10 with its split files)",
)
DOMAINNET = DomainSpec(
    name="domainnet",
    title="DomainNet (10-class subset)",
    folder="DomainNet",
    domains=("clipart", "infograph", "painting", "quickdraw", "real", "sketch"),
    raw_classes=(
        "bird",
        "feather",
        "headphones",
        "ice_cream",
        "teapot",
        "tiger",
        "whale",
        "windmill",
        "wine_glass",
        "zebra",
    ),  # fmt: skip
    class_names=(
        "bird",
        "feather",
        "headphones",
        "ice cream",
        "teapot",
        "tiger",
        "whale",
        "windmill",
        "wine glass",
        "zebra",
    ),  # fmt: skip
    default_size=128,
    source="ai.bu.edu/M3SDA (FedBN's split files select the 10-class subset)",
)
PACS = DomainSpec(
    name="pacs",
    title="PACS",
    folder="pacs",
    domains=("art_painting", "cartoon", "photo", "sketch"),
    raw_classes=("dog", "elephant", "giraffe", "guitar", "horse", "house", "person"),
    class_names=("dog", "elephant", "giraffe", "guitar", "horse", "house", "person"),
    default_size=224,
    source="domaingeneralization.github.io (pacs_data/ and pacs_label/*_kfold.txt)",
    image_subdirs=("", "pacs_data"),
    split_subdirs=("", "pacs_label"),
)

for _spec in (OFFICE, DOMAINNET, PACS):
    DATASETS.register(_spec.name)(
        DatasetEntry(
            load=_domain_loader(_spec),
            present=partial(_domain_present, _spec),
            where=partial(_domain_where, _spec),
            class_names=_spec.class_names,
            domains=_spec.domains,
        )
    )
