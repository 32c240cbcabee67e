"""Multi-label datasets: PASCAL VOC 2007, MS-COCO 2014 and FLAIR (real per-user split).

Labels are float32 multi-hot [N, num_classes] and `ArrayDataset.multilabel` is True.
Images are resized to `data.image_size` and held in memory as uint8 (decoded arrays are
cached under `<data.root>/.cache/`); at 128 px COCO takes ~6 GB, so lower the size or use a
subset for quick studies. FLAIR also records each training image's user
(`train_groups`), which the `natural` partitioner turns into clients.
"""

from __future__ import annotations

import hashlib
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from ..core.errors import ConfigError
from .cache import atomic_savez, cached_images, load_npz
from .folders import IMAGENET_MEAN, IMAGENET_STD
from .registry import DATASETS, ArrayDataset, DatasetEntry, text_name


def multi_hot(label_lists: list[list[int]], num_classes: int) -> np.ndarray:
    y = np.zeros((len(label_lists), num_classes), dtype=np.float32)
    for i, labs in enumerate(label_lists):
        y[i, labs] = 1.0
    return y


# --- PASCAL VOC 2007 -----------------------------------------------------------------------
VOC_CLASSES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
    "tvmonitor",
)  # fmt: skip
VOC_TEXT = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "dining table", "dog", "horse", "motorbike", "person", "potted plant", "sheep", "sofa", "train",
    "tv monitor",
)  # fmt: skip


def _voc_dir(root: str) -> Path:
    return Path(root) / "VOCdevkit" / "VOC2007"


def _voc_where(root: str) -> str:
    d = _voc_dir(root)
    return (
        f"PASCAL VOC 2007 not found: expected {d}/ImageSets/Main/trainval.txt and test.txt, "
        f"{d}/Annotations/<id>.xml and {d}/JPEGImages/<id>.jpg (trainval and test tars extracted into "
        f"{root}); add data.download=true to fetch them with torchvision"
    )


def _voc_present(root: str) -> bool:
    d = _voc_dir(root)
    return (
        all((d / "ImageSets" / "Main" / f).is_file() for f in ("trainval.txt", "test.txt"))
        and (d / "Annotations").is_dir()
    )


def _voc_download(root: str) -> None:
    from torchvision.datasets import VOCDetection

    VOCDetection(root, year="2007", image_set="trainval", download=True)
    VOCDetection(root, year="2007", image_set="test", download=True)


def _voc_split(root: str, split: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """An image's labels are every class with an object in its annotation (difficult included)."""
    d = _voc_dir(root)
    ids = [s.strip() for s in (d / "ImageSets" / "Main" / f"{split}.txt").read_text().split() if s.strip()]
    labels = []
    for i in ids:
        tree = ET.parse(d / "Annotations" / f"{i}.xml")
        names = {o.findtext("name", "").strip() for o in tree.getroot().iter("object")}
        labels.append(sorted(VOC_CLASSES.index(n) for n in names if n in VOC_CLASSES))
    x = cached_images(root, f"voc2007-{split}", [d / "JPEGImages" / f"{i}.jpg" for i in ids], size)
    return x, multi_hot(labels, len(VOC_CLASSES))


def _load_voc(root: str, image_size: int | None = None) -> ArrayDataset:
    size = image_size or 128
    tx, ty = _voc_split(root, "trainval", size)
    vx, vy = _voc_split(root, "test", size)
    return ArrayDataset(
        "voc2007", tx, ty, vx, vy, list(VOC_TEXT), IMAGENET_MEAN, IMAGENET_STD, multilabel=True
    )


DATASETS.register("voc2007")(
    DatasetEntry(
        load=_load_voc,
        present=_voc_present,
        where=_voc_where,
        download=_voc_download,
        class_names=VOC_TEXT,
        multilabel=True,
    )  # fmt: skip
)


# --- MS-COCO (2014 splits: 82,081 train / 40,137 val, as in C-Tran and FedLGT) --------------
COCO_CLASSES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard",
    "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase",
    "scissors", "teddy bear", "hair drier", "toothbrush",
)  # fmt: skip
assert len(COCO_CLASSES) == 80
COCO_SPLITS = (("train2014", "val2014"), ("train2017", "val2017"))


def _coco_splits(root: str) -> tuple[str, str] | None:
    d = Path(root) / "coco"
    for tr, te in COCO_SPLITS:
        if all((d / "annotations" / f"instances_{s}.json").is_file() and (d / s).is_dir() for s in (tr, te)):
            return tr, te
    return None


def _coco_where(root: str) -> str:
    d = Path(root) / "coco"
    return (
        f"MS-COCO not found: expected {d}/train2014/ and {d}/val2014/ (images) with "
        f"{d}/annotations/instances_train2014.json and instances_val2014.json (2017 splits also read); "
        f"get them from cocodataset.org; not downloaded automatically"
    )


def _coco_split(root: str, split: str, size: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    d = Path(root) / "coco"
    meta = json.loads((d / "annotations" / f"instances_{split}.json").read_text())
    cats = sorted(meta["categories"], key=lambda c: c["id"])
    cat_index = {c["id"]: i for i, c in enumerate(cats)}
    images = sorted(meta["images"], key=lambda im: im["id"])
    row = {im["id"]: i for i, im in enumerate(images)}
    labels: list[set[int]] = [set() for _ in images]
    for a in meta.get("annotations", []):
        if a["image_id"] in row and a["category_id"] in cat_index:
            labels[row[a["image_id"]]].add(cat_index[a["category_id"]])
    x = cached_images(root, f"coco-{split}", [d / split / im["file_name"] for im in images], size)
    return x, multi_hot([sorted(s) for s in labels], len(cats)), [text_name(c["name"]) for c in cats]


def _load_coco(root: str, image_size: int | None = None) -> ArrayDataset:
    splits = _coco_splits(root)
    if splits is None:
        raise ConfigError(_coco_where(root))
    size = image_size or 128
    tx, ty, names = _coco_split(root, splits[0], size)
    vx, vy, _ = _coco_split(root, splits[1], size)
    return ArrayDataset("coco", tx, ty, vx, vy, names, IMAGENET_MEAN, IMAGENET_STD, multilabel=True)


DATASETS.register("coco")(
    DatasetEntry(
        load=_load_coco,
        present=lambda root: _coco_splits(root) is not None,
        where=_coco_where,
        class_names=COCO_CLASSES,
        multilabel=True,
    )  # fmt: skip
)


# --- FLAIR (Song et al. 2022; apple/ml-flair `prepare_dataset.py` HDF5) ---------------------
# Layout: /<partition>/<user_id>/{images [n,256,256,3] uint8, labels, fine_grained_labels,
# image_ids} with labels "a|b|c" byte strings; /metadata/label_counter (JSON). Partitions
# train / val / test, users disjoint.
FLAIR_FILES = ("flair_federated.hdf5", "flair.hdf5")
FLAIR_COARSE = (
    "animal",
    "art",
    "celebration",
    "equipment",
    "fire",
    "food",
    "games",
    "interior_room",
    "light",
    "liquid",
    "material",
    "music",
    "outdoor",
    "plant",
    "recreation",
    "religion",
    "structure",
)  # fmt: skip  (sorted, as ml-flair/pfl-research map them to indices)


def _flair_file(root: str) -> Path | None:
    for f in FLAIR_FILES:
        p = Path(root) / "flair" / f
        if p.is_file():
            return p
    return None


def _flair_where(root: str) -> str:
    d = Path(root) / "flair"
    return (
        f"FLAIR not found: expected {d}/{FLAIR_FILES[0]}, the federated HDF5 that apple/ml-flair's "
        f"`download_dataset.py` + `prepare_dataset.py --output_file {d}/{FLAIR_FILES[0]}` produce "
        f"(~80 GB); not downloaded automatically"
    )


def _resize_nhwc(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 [n, H, W, 3] -> [n, 3, size, size]."""
    from PIL import Image

    if images.shape[1:3] == (size, size):
        return np.ascontiguousarray(images.transpose(0, 3, 1, 2))
    out = np.empty((len(images), 3, size, size), dtype=np.uint8)
    for i, im in enumerate(images):
        resized = Image.fromarray(im).resize((size, size), Image.Resampling.BILINEAR)
        out[i] = np.asarray(resized).transpose(2, 0, 1)
    return out


def _flair_users(
    f, partition: str, key: str, size: int, users: list[str]
) -> tuple[np.ndarray, list[list[str]], np.ndarray]:
    xs, labels, groups = [], [], []
    for g, u in enumerate(users):
        grp = f[partition][u]
        xs.append(_resize_nhwc(np.asarray(grp["images"][()]), size))
        for s in grp[key][()]:
            s = s.decode() if isinstance(s, bytes) else str(s)
            labels.append([t for t in s.split("|") if t])
        groups += [g] * len(xs[-1])
    x = np.concatenate(xs) if xs else np.zeros((0, 3, size, size), dtype=np.uint8)
    return x, labels, np.asarray(groups, dtype=np.int64)


#: FedLGT's concat prompt: how many of a coarse label's fine labels it names (the authors' fed_main.py)
FINE_PER_COARSE = 20


def coarse_prompts_of(pairs: list[tuple[list[str], list[str]]], names: list[str]) -> list[str]:
    """Each coarse label's text as FedLGT builds it for FLAIR's abstract coarse labels (its
    "Concat. prompt", Table A3): its fine labels, most frequent first (ties: the later name first,
    as the authors' `sort(reverse=True)` over (count, name)), the first FINE_PER_COARSE joined by
    ",". `pairs`: each image's (coarse labels, fine labels). The authors read the fine -> coarse
    map from FLAIR's label_relationship.txt, which the federated HDF5 does not hold: here a fine
    label's coarse label is the one it co-occurs with most (in FLAIR, every image with a fine
    label carries its coarse label). A coarse label with no fine label keeps its name."""
    from collections import Counter

    count: Counter[str] = Counter()
    together: dict[str, Counter[str]] = {}
    for coarse, fine in pairs:
        for f in set(fine):
            count[f] += 1
            together.setdefault(f, Counter()).update(set(coarse))
    children: dict[str, list[tuple[int, str]]] = {n: [] for n in names}
    for f, co in together.items():
        parent = max(co.items(), key=lambda kv: (kv[1], kv[0]))[0] if co else None
        if parent in children:
            children[parent].append((count[f], f))
    out = []
    for n in names:
        kids = [f for _, f in sorted(children[n], reverse=True)][:FINE_PER_COARSE]
        out.append(",".join(kids) if kids else n)
    return out


def _flair_pairs(f, partition: str, users: list[str]) -> list[tuple[list[str], list[str]]]:
    """Each image's (coarse labels, fine labels), read without its pixels."""
    out = []
    for u in users:
        grp = f[partition][u]
        for a, b in zip(grp["labels"][()], grp["fine_grained_labels"][()], strict=True):
            a, b = (x.decode() if isinstance(x, bytes) else str(x) for x in (a, b))
            out.append(([t for t in a.split("|") if t], [t for t in b.split("|") if t]))
    return out


def _load_flair(
    root: str,
    image_size: int | None = None,
    fine_grained: bool = False,
    max_users: int | None = None,
    coarse_prompts: bool = False,
) -> ArrayDataset:
    try:
        import h5py
    except ImportError:
        raise ConfigError("FLAIR is stored as HDF5: install h5py (`pip install h5py`)") from None
    path = _flair_file(root)
    if path is None:
        raise ConfigError(_flair_where(root))
    size = image_size or 64
    key = "fine_grained_labels" if fine_grained else "labels"
    if coarse_prompts and fine_grained:
        raise ConfigError(
            "data.coarse_prompts=true names the coarse labels by their fine ones: "
            "not with data.fine_grained=true"
        )
    st = path.stat()
    tag = hashlib.sha1(
        f"{path}|{st.st_size}|{int(st.st_mtime)}|{size}|{key}|{max_users}"
        f"{'|prompts' if coarse_prompts else ''}".encode()
    ).hexdigest()[:16]
    cache = Path(root) / ".cache" / f"flair-{tag}.npz"
    hit = load_npz(cache)
    if hit is None:
        with h5py.File(path, "r") as f:
            if "train" not in f or "test" not in f:
                raise ConfigError(
                    f"{path} has no /train and /test groups: not a federated FLAIR HDF5. "
                    + _flair_where(root)
                )
            train_users = sorted(f["train"].keys())[: max_users or None]
            test_users = sorted(f["test"].keys())
            counter_key = f"metadata/{'fine_grained_label_counter' if fine_grained else 'label_counter'}"
            if counter_key in f:
                raw = f[counter_key][()]
                names = sorted(json.loads(raw.decode() if isinstance(raw, bytes) else raw))
            else:
                names = []
            tx, tl, tg = _flair_users(f, "train", key, size, train_users)
            vx, vl, _ = _flair_users(f, "test", key, size, test_users)
            if not names:
                names = sorted({t for labs in tl + vl for t in labs})
            texts = (
                coarse_prompts_of(
                    _flair_pairs(f, "train", train_users) + _flair_pairs(f, "test", test_users), names
                )
                if coarse_prompts
                else [text_name(str(n)) for n in names]
            )
        index = {n: i for i, n in enumerate(names)}
        hit = {
            "tx": tx, "vx": vx, "tg": tg,
            "ty": multi_hot([[index[t] for t in labs if t in index] for labs in tl], len(names)),
            "vy": multi_hot([[index[t] for t in labs if t in index] for labs in vl], len(names)),
            "names": np.asarray(names), "users": np.asarray(train_users), "texts": np.asarray(texts),
        }  # fmt: skip
        atomic_savez(cache, hit)
    # a cache written before class texts were kept holds the names only
    texts = [str(t) for t in hit["texts"]] if "texts" in hit else [text_name(str(n)) for n in hit["names"]]
    return ArrayDataset(
        "flair", hit["tx"], hit["ty"], hit["vx"], hit["vy"], texts,
        IMAGENET_MEAN, IMAGENET_STD, multilabel=True,
        train_groups=hit["tg"], group_names=[str(u) for u in hit["users"]],
    )  # fmt: skip


DATASETS.register("flair")(
    DatasetEntry(
        load=_load_flair,
        present=lambda root: _flair_file(root) is not None,
        where=_flair_where,
        class_names=tuple(text_name(n) for n in FLAIR_COARSE),
        multilabel=True,
    )  # fmt: skip
)
