"""The CoOp few-shot suite in its released layout: the 11 datasets of CoOp / CoCoOp and every
federated prompt-learning paper after them (PromptFL, FedOTP, FedPGP, FedTPG, FLiP), and
ImageNet's four test-only variants, read as CoOp's `DATASETS.md` lays them out under
`data.root` and split as its `datasets/*.py` split them (github.com/KaiyangZhou/CoOp):

| name | folder | split | images under |
|---|---|---|---|
| caltech101 | caltech-101/ | split_zhou_Caltech101.json | 101_ObjectCategories/ |
| oxford_pets | oxford_pets/ | split_zhou_OxfordPets.json | images/ |
| oxford_flowers | oxford_flowers/ | split_zhou_OxfordFlowers.json | jpg/ |
| food101 | food-101/ | split_zhou_Food101.json | images/ |
| dtd | dtd/ | split_zhou_DescribableTextures.json | images/ |
| eurosat | eurosat/ | split_zhou_EuroSAT.json | 2750/ |
| stanford_cars | stanford_cars/ | split_zhou_StanfordCars.json | (the folder: cars_train/, cars_test/) |
| sun397 | sun397/ | split_zhou_SUN397.json | SUN397/ |
| ucf101 | ucf101/ | split_zhou_UCF101.json | UCF-101-midframes/ |
| fgvc_aircraft | fgvc_aircraft/ | variants.txt + images_variant_{train,val,test}.txt | images/<id>.jpg |
| imagenet | imagenet/ | classnames.txt; images/val/ is the test set | images/{train,val}/<wnid>/ |
| imagenet_v2 | imagenetv2/ | classnames.txt (test only) | imagenetv2-matched-frequency-format-val/<0..999>/ |
| imagenet_sketch | imagenet-sketch/ | classnames.txt (test only) | images/<wnid>/ |
| imagenet_a | imagenet-adversarial/ | classnames.txt (test only, 200 classes) | imagenet-a/<wnid>/ |
| imagenet_r | imagenet-rendition/ | classnames.txt (test only, 200 classes) | imagenet-r/<wnid>/ |

A split file is CoOp's JSON: `{"train": [[relative path, label, class name], ...], "val": ...,
"test": ...}`, paths relative to the images folder. The class names (the text side's prompts)
are the split file's, by label. `val` is not used (the FL papers train on `train`, test on
`test`). ImageNet's validation set is its test set, as in CoOp. The variants are test-only: their
training set is empty (evaluate a model trained on `imagenet` on them); -A and -R hold 200 of
the 1,000 classes, labelled 0..199 in sorted-wnid order, as in CoOp.

`data.shots` is drawn here, from the split's training list, before any image is decoded (see
`protocols.py`); images are decoded as CLIP's preprocessing (and CoOp's test transform) does, at
`data.image_size` (default 224): the short side resized (bicubic), the centre cropped; cached in
`<root>/.cache/`. Normalisation is CLIP's (CoOp's configs). No training augmentation (CoOp's
random resized crop and flip): the images are fixed arrays, so a frozen tower's features can be
computed once. Nothing is downloaded: a missing dataset stops the run
with one line naming the folder and where to get it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from ..core import safe_json
from ..core.errors import ConfigError
from .cache import cached_images
from .folders import IMAGE_EXTS
from .protocols import select
from .registry import DATASETS, ArrayDataset, DatasetEntry

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # CoOp's INPUT.PIXEL_MEAN / PIXEL_STD
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
DEFAULT_SIZE = 224
GUIDE = "CoOp's DATASETS.md (github.com/KaiyangZhou/CoOp)"

Item = tuple[Path, int]  # image file, label
Listing = tuple[list[Item], list[Item], list[str]]  # train, test, class names by label


@dataclass(frozen=True)
class Suite:
    name: str  # registry name
    title: str  # CoOp's section in DATASETS.md
    folder: str  # under data.root
    expects: str  # the files that must be there, relative to the folder
    images: str  # where to get the images
    test_only: bool = False


def _where(s: Suite, root: str) -> str:
    d = Path(root) / s.folder
    return (
        f"{s.title} not found: expected {', '.join(str(d / e) for e in s.expects.split(' + '))} "
        f"(images from {s.images}; layout and split files: section {s.title} of {GUIDE}); "
        "not downloaded automatically"
    )


def _bad(s: Suite, root: str, why: str) -> ConfigError:
    where = Path(root) / s.folder
    return ConfigError(f"{s.title} in {where}: {why}; lay it out as section {s.title} of {GUIDE}")


def _present(s: Suite, root: str) -> bool:
    d = Path(root) / s.folder
    return all((d / e).exists() for e in s.expects.split(" + "))


def _decode(root: str, s: Suite, split: str, items: list[Item], size: int) -> np.ndarray:
    missing = next((p for p, _ in items if not p.is_file()), None)
    if missing is not None:
        raise _bad(s, root, f"image {missing} (listed in its {split} split) is missing")
    return cached_images(root, f"{s.name}-{split}", [p for p, _ in items], size, crop=True)


def _dataset(
    s: Suite,
    root: str,
    train: list[Item],
    test: list[Item],
    names: list[str],
    image_size: int | None,
    shots: int | None,
    shots_seed: int,
    personal_shots: int | None,
) -> ArrayDataset:
    """Draw the protocol's training images (before decoding), decode, assemble."""
    size = image_size or DEFAULT_SIZE
    if s.test_only and (shots or personal_shots):
        raise ConfigError(f"{s.name} is test-only (no training images): data.shots does not apply")
    keep, pool = select([y for _, y in train], len(names), shots, shots_seed, personal_shots)
    train = [train[i] for i in keep]
    y = lambda items: np.asarray([lab for _, lab in items], dtype=np.int64)  # noqa: E731
    tx = _decode(root, s, "train", train, size) if train else np.zeros((0, 3, size, size), np.uint8)
    return ArrayDataset(
        s.name, tx, y(train), _decode(root, s, "test", test, size), y(test), names,
        mean=CLIP_MEAN, std=CLIP_STD, train_personal=pool if pool.any() else None,
    )  # fmt: skip


# --- the split-file datasets (CoOp's OxfordPets.read_split) ------------------------------------
def _read_json_split(s: Suite, root: str, split_file: str) -> dict[str, list[tuple[str, int, str]]]:
    path = Path(root) / s.folder / split_file
    try:
        raw = safe_json.loads(path.read_text())  # nesting bounded (100,000 levels: RecursionError)
        return {k: [(str(r), int(lab), str(c)) for r, lab, c in raw[k]] for k in ("train", "val", "test")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _bad(s, root, f"{path} is not CoOp's split file ({type(e).__name__}: {e})") from None


def _names(s: Suite, root: str, rows: list[tuple[str, int, str]]) -> list[str]:
    """Class names by label, from the split's rows (every label 0..C-1 must be named)."""
    by_label: dict[int, str] = {}
    for _, lab, name in rows:
        by_label.setdefault(lab, name)
    # distinct labels are 0..C-1 exactly when the least is 0 and the greatest C-1 (a label of
    # 10^12 made a list of every missing one: a MemoryError)
    if not by_label or min(by_label) != 0 or max(by_label) != len(by_label) - 1:
        raise _bad(s, root, f"its split file names labels {sorted(by_label)[:3]}..., not 0..C-1")
    return [by_label[c] for c in range(len(by_label))]


def _read_split_set(s: Suite, split_file: str, image_dir: str, root: str) -> Listing:
    """CoOp's `OxfordPets.read_split`: paths relative to the images folder."""
    split = _read_json_split(s, root, split_file)
    base = Path(root) / s.folder / image_dir
    names = _names(s, root, split["train"] + split["val"] + split["test"])
    train, test = ([(base / r, lab) for r, lab, _ in split[k]] for k in ("train", "test"))
    return train, test, names


#: each registered dataset of the suite and what lists its items (no image read): the
#: composite of several (`coop_multi.py`) reads the class names from it before any work
LISTINGS: dict[str, tuple[Suite, Callable[[str], Listing]]] = {}


def _register(s: Suite, read: Callable[[str], Listing]) -> None:
    """One registry entry: `read` lists the items; the protocol's draw, decoding and assembly
    are the same for every dataset of the suite."""
    LISTINGS[s.name] = (s, read)

    def load(
        root: str,
        image_size: int | None = None,
        shots: int | None = None,
        shots_seed: int = 1,
        personal_shots: int | None = None,
    ) -> ArrayDataset:
        train, test, names = read(root)
        return _dataset(s, root, train, test, names, image_size, shots, shots_seed, personal_shots)

    DATASETS.register(s.name)(DatasetEntry(load=load, present=partial(_present, s), where=partial(_where, s)))


#: (name, DATASETS.md section, folder, split file, images folder inside it, where the images come from)
SPLIT_FILE_SETS = (
    ("caltech101", "Caltech101", "caltech-101", "split_zhou_Caltech101.json", "101_ObjectCategories",
     "www.vision.caltech.edu/Image_Datasets/Caltech101/101_ObjectCategories.tar.gz"),
    ("oxford_pets", "OxfordPets", "oxford_pets", "split_zhou_OxfordPets.json", "images",
     "www.robots.ox.ac.uk/~vgg/data/pets/data/images.tar.gz"),
    ("oxford_flowers", "Flowers102", "oxford_flowers", "split_zhou_OxfordFlowers.json", "jpg",
     "www.robots.ox.ac.uk/~vgg/data/flowers/102/102flowers.tgz"),
    ("food101", "Food101", "food-101", "split_zhou_Food101.json", "images",
     "data.vision.ee.ethz.ch/cvl/datasets_extra/food-101/"),
    ("dtd", "DTD", "dtd", "split_zhou_DescribableTextures.json", "images",
     "www.robots.ox.ac.uk/~vgg/data/dtd/download/dtd-r1.0.1.tar.gz"),
    ("eurosat", "EuroSAT", "eurosat", "split_zhou_EuroSAT.json", "2750",
     "madm.dfki.de/files/sentinel/EuroSAT.zip"),
    ("stanford_cars", "StanfordCars", "stanford_cars", "split_zhou_StanfordCars.json", "",
     "ai.stanford.edu/~jkrause/car196/ (cars_train.tgz, cars_test.tgz)"),
    ("sun397", "SUN397", "sun397", "split_zhou_SUN397.json", "SUN397",
     "vision.princeton.edu/projects/2010/SUN/SUN397.tar.gz"),
    ("ucf101", "UCF101", "ucf101", "split_zhou_UCF101.json", "UCF-101-midframes",
     "CoOp's UCF-101-midframes.zip (the middle frame of each video)"),
)  # fmt: skip

for _name, _title, _folder, _file, _images, _source in SPLIT_FILE_SETS:
    _suite = Suite(_name, _title, _folder, f"{_file} + {_images}" if _images else _file, _source)
    _register(_suite, partial(_read_split_set, _suite, _file, _images))


# --- FGVCAircraft (no split file: the dataset's own variant lists) ----------------------------
AIRCRAFT = Suite(
    "fgvc_aircraft", "FGVCAircraft", "fgvc_aircraft",
    "variants.txt + images_variant_train.txt + images_variant_test.txt + images",
    "www.robots.ox.ac.uk/~vgg/data/fgvc-aircraft/archives/fgvc-aircraft-2013b.tar.gz (its data/ folder)",
)  # fmt: skip


def _read_aircraft(root: str) -> Listing:
    """CoOp's FGVCAircraft: labels in `variants.txt` order; lines `<image id> <variant name>`."""
    d = Path(root) / AIRCRAFT.folder
    names = [line.strip() for line in (d / "variants.txt").read_text().splitlines() if line.strip()]
    label = {n: i for i, n in enumerate(names)}

    def read(split: str) -> list[Item]:
        items = []
        for line in (d / f"images_variant_{split}.txt").read_text().splitlines():
            image, _, variant = line.strip().partition(" ")
            if not image:
                continue
            if variant not in label:
                why = f"images_variant_{split}.txt names variant {variant!r}, not in variants.txt"
                raise _bad(AIRCRAFT, root, why)
            items.append((d / "images" / f"{image}.jpg", label[variant]))
        return items

    return read("train"), read("test"), names


_register(AIRCRAFT, _read_aircraft)


# --- ImageNet and its variants (class folders + CoOp's classnames.txt) ------------------------
def _classnames(s: Suite, root: str) -> dict[str, str]:
    """CoOp's `ImageNet.read_classnames`: `<wnid> <class name>` lines, in label order."""
    out: dict[str, str] = {}
    for line in (Path(root) / s.folder / "classnames.txt").read_text().splitlines():
        wnid, _, name = line.strip().partition(" ")
        if wnid:
            out[wnid] = name
    return out


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTS and p.name[0] != ".")


def _folder_items(folder: Path, wnids: list[str]) -> list[Item]:
    items: list[Item] = []
    for y, w in enumerate(wnids):
        items += [(p, y) for p in _images_in(folder / w)]
    return items


def _named(s: Suite, root: str, names: dict[str, str], wnids: list[str]) -> list[str]:
    unnamed = [w for w in wnids if w not in names]
    if unnamed:
        raise _bad(s, root, f"class folder {unnamed[0]} is not in classnames.txt")
    return [names[w] for w in wnids]


IMAGENET = Suite(
    "imagenet", "ImageNet", "imagenet", "classnames.txt + images/train + images/val",
    "image-net.org (train and val extracted to images/; classnames.txt from CoOp's link)",
)  # fmt: skip


def _read_imagenet(root: str) -> Listing:
    """CoOp's ImageNet: labels = sorted wnid folders of images/train; the val folder is the test
    set. (CoOp lists each folder's files in `os.listdir` order; sorted here, so a k-shot draw is
    the same on every file system.)"""
    d = Path(root) / IMAGENET.folder / "images"
    names = _classnames(IMAGENET, root)
    wnids = sorted(p.name for p in (d / "train").iterdir() if p.is_dir())
    class_names = _named(IMAGENET, root, names, wnids)
    train = _folder_items(d / "train", wnids)
    test = _folder_items(d / "val", [w for w in wnids if (d / "val" / w).is_dir()])
    return train, test, class_names


_register(IMAGENET, _read_imagenet)

#: (name, DATASETS.md section, folder, images folder inside it, where from)
VARIANTS = (
    ("imagenet_sketch", "ImageNet-Sketch", "imagenet-sketch", "images",
     "github.com/HaohanWang/ImageNet-Sketch"),
    ("imagenet_a", "ImageNet-A", "imagenet-adversarial", "imagenet-a",
     "github.com/hendrycks/natural-adv-examples"),
    ("imagenet_r", "ImageNet-R", "imagenet-rendition", "imagenet-r", "github.com/hendrycks/imagenet-r"),
)  # fmt: skip


def _read_variant(s: Suite, images: str, root: str) -> Listing:
    """The class folders present (sorted wnids; 200 for -A and -R) labelled in that order."""
    d = Path(root) / s.folder / images
    wnids = sorted(p.name for p in d.iterdir() if p.is_dir())
    return [], _folder_items(d, wnids), _named(s, root, _classnames(s, root), wnids)


for _name, _title, _folder, _images, _source in VARIANTS:
    _suite = Suite(_name, _title, _folder, f"classnames.txt + {_images}", _source, test_only=True)
    _register(_suite, partial(_read_variant, _suite, _images))

V2 = Suite(
    "imagenet_v2", "ImageNetV2", "imagenetv2", "classnames.txt + imagenetv2-matched-frequency-format-val",
    "s3-us-west-2.amazonaws.com/imagenetv2public/imagenetv2-matched-frequency.tar.gz", test_only=True,
)  # fmt: skip


def _read_v2(root: str) -> Listing:
    """CoOp's ImageNetV2: folder `<label>` holds class `label` (label = line of classnames.txt)."""
    d = Path(root) / V2.folder / "imagenetv2-matched-frequency-format-val"
    names = list(_classnames(V2, root).values())
    test: list[Item] = []
    for y in range(len(names)):
        if (d / str(y)).is_dir():
            test += [(p, y) for p in _images_in(d / str(y))]
    return [], test, names


_register(V2, _read_v2)
