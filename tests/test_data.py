"""Datasets: the real Fashion-MNIST and digits, the offline stand-ins built from them, the
missing-data messages, and each standard dataset's loader read from a tiny copy of its
real on-disk format written here (CIFAR pickles, MNIST idx, image folders, FedBN split
files, VOC XML, COCO JSON, FLAIR HDF5). Plus `fl-lightning partition`."""

from __future__ import annotations

import gzip
import json
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.core.errors import ConfigError
from fl_lightning.data.datasets import CIFAR100_CLASSES, FMNIST_CLASSES, load_fmnist_arrays
from fl_lightning.data.federated import make_split
from fl_lightning.data.longtail import longtail_counts
from fl_lightning.data.registry import DATASETS, check_dataset, load_dataset

EXPECTED = {
    "fmnist", "digits", "mnist", "cifar10", "cifar100", "cifar10_lt", "cifar100_lt", "tiny_imagenet",
    "imagenet_lt", "office_caltech", "domainnet", "pacs", "voc2007", "coco", "flair", "fmnist_domains",
    "fmnist_multilabel",
}  # fmt: skip


def test_registry_and_text_ready_class_names():
    assert EXPECTED <= set(DATASETS.names())
    for name in DATASETS.names():
        names = DATASETS.get(name).class_names
        if names is not None:
            assert all("_" not in n and n == n.strip() for n in names), name
    assert len(CIFAR100_CLASSES) == 100 and len(set(CIFAR100_CLASSES)) == 100
    assert CIFAR100_CLASSES[1] == "aquarium fish" and "maple tree" in CIFAR100_CLASSES
    assert DATASETS.get("office_caltech").class_names[0] == "backpack"
    assert DATASETS.get("domainnet").class_names[3] == "ice cream"
    assert DATASETS.get("voc2007").multilabel and DATASETS.get("flair").multilabel
    assert DATASETS.get("pacs").domains == ("art_painting", "cartoon", "photo", "sketch")
    assert "stand-in" not in DATASETS.get("fmnist").standin and DATASETS.get("fmnist_domains").standin


BAD_DATA = [
    (["data.classes_per_client=0"], "data.classes_per_client must be > 0"),
    (["data.imbalance_factor=0.5"], "data.imbalance_factor must be >= 1"),
    (["data.partition=longtail"], "data.partition=longtail needs data.imbalance_factor > 1"),
    (["data.image_size=-8"], "data.image_size must be > 0"),
    (["data.max_users=0"], "data.max_users must be > 0"),
    (["data.domainz=[a]"], "unknown config key 'data.domainz'"),
]


@pytest.mark.parametrize("overrides,message", BAD_DATA, ids=[b[0][0] for b in BAD_DATA])
def test_bad_data_config_values(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        compose(overrides)


def test_data_config_groups_and_options(data_root):
    cfg = compose(["data=office_caltech", "data.domains=[amazon,dslr]", "data.image_size=64"])
    assert cfg.data.partition == "domain" and list(cfg.data.domains) == ["amazon", "dslr"]
    assert compose(["data=cifar10_lt"]).data.imbalance_factor == 100
    with pytest.raises(ConfigError, match="data.domains does not apply to dataset 'fmnist'"):
        load_dataset("fmnist", data_root, domains=["rotated"])


# --- missing data: one clear line saying which files are expected where ----------------------
MISSING = {
    "mnist": "train-images-idx3-ubyte",
    "cifar10": "data_batch_1",
    "cifar100": "cifar-100-python",
    "cifar10_lt": "cifar-10-batches-py",
    "cifar100_lt": "cifar-100-python",
    "tiny_imagenet": "tiny-imagenet-200/wnids.txt",
    "imagenet_lt": "ImageNet_LT/ImageNet_LT_train.txt",
    "office_caltech": "office_caltech_10/<domain>_train.pkl",
    "domainnet": "DomainNet/<domain>/<class>",
    "pacs": "art_painting, cartoon, photo, sketch",
    "voc2007": "VOCdevkit/VOC2007/ImageSets/Main/trainval.txt",
    "coco": "coco/annotations/instances_train2014.json",
    "flair": "flair/flair_federated.hdf5",
    "fmnist": "train-images-idx3-ubyte.gz",
    "fmnist_domains": "train-images-idx3-ubyte.gz",
}
DOWNLOADABLE = {
    "mnist",
    "cifar10",
    "cifar100",
    "cifar10_lt",
    "cifar100_lt",
    "voc2007",
    "fmnist",
    "fmnist_domains",
    "fmnist_multilabel",
}


@pytest.mark.parametrize("name", sorted(MISSING))
def test_missing_dataset_message(name, tmp_path):
    with pytest.raises(ConfigError) as e:
        load_dataset(name, str(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path) in msg and MISSING[name] in msg, msg
    assert "not found" in msg
    if name not in DOWNLOADABLE:
        with pytest.raises(ConfigError, match="cannot be downloaded automatically"):
            check_dataset(name, str(tmp_path), download=True)
    else:
        check_dataset(name, str(tmp_path), download=True)  # allowed: torchvision/apt would fetch it


def test_missing_dataset_from_the_cli_is_one_line(tmp_path, capsys):
    code = main(
        ["run", "data=cifar100", f"data.root={tmp_path}", f"output_dir={tmp_path / 'runs'}", "logger=none"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "CIFAR-100 not found" in err
    assert not (tmp_path / "runs").exists()


# --- tiny copies of the real on-disk formats ------------------------------------------------
def _write_idx(path: Path, arr: np.ndarray) -> None:
    header = bytes([0, 0, 8, arr.ndim]) + b"".join(struct.pack(">I", s) for s in arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def _image(path: Path, color: tuple[int, int, int], size=(12, 9)) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


def test_mnist_idx_files(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    _write_idx(raw / "train-images-idx3-ubyte", rng.integers(0, 255, (20, 28, 28)))
    _write_idx(raw / "train-labels-idx1-ubyte", np.arange(20) % 10)
    _write_idx(raw / "t10k-images-idx3-ubyte.gz", rng.integers(0, 255, (5, 28, 28)))
    _write_idx(raw / "t10k-labels-idx1-ubyte.gz", np.arange(5))
    ds = load_dataset("mnist", str(tmp_path))
    assert ds.train_x.shape == (20, 1, 28, 28) and ds.test_y.tolist() == [0, 1, 2, 3, 4]
    assert ds.class_names[3] == "three"


def _cifar(tmp_path: Path, n_per_class: int = 30) -> np.ndarray:
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), n_per_class)
    rng.shuffle(labels)
    chunks = np.array_split(labels, 5)
    for i, ys in enumerate(chunks, 1):
        data = rng.integers(0, 255, (len(ys), 3072), dtype=np.uint8)
        with open(d / f"data_batch_{i}", "wb") as f:
            pickle.dump({"data": data, "labels": ys.tolist(), "batch_label": f"batch {i}"}, f)
    with open(d / "test_batch", "wb") as f:
        pickle.dump({"data": rng.integers(0, 255, (10, 3072), dtype=np.uint8), "labels": list(range(10))}, f)
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({"label_names": ["airplane"]}, f)
    return np.concatenate(chunks)


def test_cifar10_pickles_and_long_tail(tmp_path):
    labels = _cifar(tmp_path)
    ds = load_dataset("cifar10", str(tmp_path))
    assert ds.train_x.shape == (300, 3, 32, 32) and np.array_equal(ds.train_y, labels)
    assert ds.class_names[0] == "airplane" and len(ds.mean) == 3
    x, _ = ds.tensors(ds.train_x[:4], ds.train_y[:4])
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32
    lt = load_dataset("cifar10_lt", str(tmp_path), imbalance_factor=10.0)
    counts = np.bincount(lt.train_y, minlength=10)
    assert (
        counts.tolist() == longtail_counts([30] * 10, 10.0).tolist() and counts[0] == 30 and counts[-1] == 3
    )
    assert len(lt.test_y) == 10  # the test set stays balanced
    split = make_split(lt, "longtail", 3, 0, imbalance_factor=10.0, alpha=0.5)
    assert sum(len(p) for p in split.train) == len(lt.train_y)  # already long-tailed: all kept
    with pytest.raises(ConfigError, match="imbalance_factor > 1"):
        load_dataset("cifar10_lt", str(tmp_path), imbalance_factor=1.0)


def test_cifar100_pickles(tmp_path):
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 200), ("test", 50)):
        with open(d / split, "wb") as f:
            batch = {
                "data": rng.integers(0, 255, (n, 3072), dtype=np.uint8),
                "fine_labels": (np.arange(n) % 100).tolist(),
                "coarse_labels": [0] * n,
            }
            pickle.dump(batch, f)
    ds = load_dataset("cifar100", str(tmp_path))
    assert ds.num_classes == 100 and ds.train_y.max() == 99 and ds.test_x.shape == (50, 3, 32, 32)


def test_tiny_imagenet_folder(tmp_path):
    d = tmp_path / "tiny-imagenet-200"
    wnids = ["n01443537", "n01629819"]
    d.mkdir()
    (d / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (d / "words.txt").write_text(
        "n01443537\tgoldfish, Carassius auratus\nn01629819\tEuropean fire salamander\n"
    )
    for i, w in enumerate(wnids):
        for j in range(3):
            _image(d / "train" / w / "images" / f"{w}_{j}.JPEG", (200 * i, 10 * j, 50))
    _image(d / "val" / "images" / "val_0.JPEG", (0, 0, 0))
    _image(d / "val" / "images" / "val_1.JPEG", (255, 0, 0))
    (d / "val" / "val_annotations.txt").write_text(
        f"val_0.JPEG\t{wnids[1]}\t0\t0\t10\t10\nval_1.JPEG\t{wnids[0]}\t0\t0\t5\t5\n"
    )
    ds = load_dataset("tiny_imagenet", str(tmp_path), image_size=16)
    assert ds.class_names == ["goldfish", "European fire salamander"]
    assert ds.train_x.shape == (6, 3, 16, 16) and ds.train_y.tolist() == [0, 0, 0, 1, 1, 1]
    assert ds.test_y.tolist() == [1, 0] and ds.test_x[1, 0].min() >= 250  # red stays red (JPEG)
    assert list((tmp_path / ".cache").glob("tiny_imagenet-train-16px-*.npz"))  # decoded once
    again = load_dataset("tiny_imagenet", str(tmp_path), image_size=16)
    assert np.array_equal(again.train_x, ds.train_x)


def test_imagenet_lt_split_files(tmp_path):
    """OLTR's split files name images relative to the ImageNet root; labels are ImageNet's
    sorted-wnid indices, so the class texts are the CLIP/open_clip ImageNet names."""
    lt, img = tmp_path / "ImageNet_LT", tmp_path / "imagenet"
    lt.mkdir()
    train = [("train/n01440764/a.JPEG", 0, (250, 0, 0)), ("train/n01440764/b.JPEG", 0, (240, 0, 0)),
             ("train/n01443537/c.JPEG", 1, (0, 0, 250))]  # fmt: skip
    for rel, _, color in train:
        _image(img / rel, color)
    _image(lt / "val/n01443537/v.JPEG", (0, 250, 0))  # the images may sit beside the split files too
    (lt / "ImageNet_LT_train.txt").write_text("".join(f"{r} {y}\n" for r, y, _ in train))
    (lt / "ImageNet_LT_test.txt").write_text("val/n01443537/v.JPEG 1\n")
    ds = load_dataset("imagenet_lt", str(tmp_path), image_size=8)
    assert ds.num_classes == 1000 and ds.class_names[:2] == ["tench", "goldfish"]
    assert ds.train_x.shape == (3, 3, 8, 8) and ds.train_y.tolist() == [0, 0, 1]
    assert ds.test_y.tolist() == [1] and ds.test_x[0, 1].min() >= 240  # green stays green
    (lt / "ImageNet_LT_test.txt").write_text("val/n01443537/missing.JPEG 1\n")
    with pytest.raises(ConfigError, match="missing val/n01443537/missing.JPEG"):
        load_dataset("imagenet_lt", str(tmp_path), image_size=8)


def test_office_caltech_folders_and_fedbn_split_files(tmp_path):
    base = tmp_path / "office_caltech_10"
    for k, dom in enumerate(("amazon", "caltech", "dslr", "webcam")):
        for cls in ("back_pack", "laptop_computer"):
            for j in range(5):
                _image(base / dom / cls / f"frame_{j}.jpg", (60 * k, 100 if cls == "back_pack" else 200, j))
    ds = load_dataset("office_caltech", str(tmp_path), image_size=8)
    assert ds.train_x.shape == (32, 3, 8, 8) and len(ds.test_y) == 8  # fixed 80/20 per domain
    assert ds.domain_names == ["amazon", "caltech", "dslr", "webcam"]
    assert (
        np.bincount(ds.train_domains).tolist() == [8, 8, 8, 8]
        and np.bincount(ds.test_domains).tolist() == [2] * 4
    )
    assert set(ds.train_y.tolist()) == {0, 5} and ds.class_names[5] == "laptop computer"
    split = make_split(ds, "domain", 4, 0)
    assert split.client_domains(ds) == [0, 1, 2, 3]
    # FedBN split files (pickled paths relative to the data root + raw class names) win.
    paths = [f"office_caltech_10/dslr/back_pack/frame_{j}.jpg" for j in range(3)]
    with open(base / "dslr_train.pkl", "wb") as f:
        pickle.dump((np.array(paths), np.array(["back_pack"] * 3)), f)
    with open(base / "dslr_test.pkl", "wb") as f:
        pickle.dump(
            (np.array(["office_caltech_10/dslr/laptop_computer/frame_0.jpg"]), np.array(["laptop_computer"])),
            f,
        )
    only = load_dataset("office_caltech", str(tmp_path), image_size=8, domains=["dslr"])
    assert (
        only.train_y.tolist() == [0, 0, 0] and only.test_y.tolist() == [5] and only.domain_names == ["dslr"]
    )
    with pytest.raises(ConfigError, match="unknown office_caltech domain 'dlsr'"):
        load_dataset("office_caltech", str(tmp_path), domains=["dlsr"])


def test_pacs_kfold_files_and_domainnet_subset(tmp_path):
    data = tmp_path / "pacs" / "pacs_data"
    for dom in ("photo", "sketch"):
        for cls in ("dog", "house"):
            for j in range(2):
                _image(data / dom / cls / f"{j}.png", (j, 0, 0))
    labels = tmp_path / "pacs" / "pacs_label"
    labels.mkdir()
    for dom in ("photo", "sketch"):
        (labels / f"{dom}_train_kfold.txt").write_text(
            f"{dom}/dog/0.png 1\n{dom}/house/0.png 6\n{dom}/house/1.png 6\n"
        )
        (labels / f"{dom}_test_kfold.txt").write_text(f"{dom}/dog/1.png 1\n")
    ds = load_dataset("pacs", str(tmp_path), image_size=8, domains=["photo", "sketch"])
    assert ds.train_y.tolist() == [0, 5, 5, 0, 5, 5] and ds.train_domains.tolist() == [0, 0, 0, 1, 1, 1]
    assert ds.test_y.tolist() == [0, 0]
    with pytest.raises(ConfigError, match="PACS: domain 'art_painting' not found"):
        load_dataset("pacs", str(tmp_path), image_size=8)  # all four asked for, two present
    # DomainNet: only the 10-class subset is read from the full class folders.
    for cls in ("bird", "wine_glass", "aircraft_carrier"):
        for j in range(5):
            _image(tmp_path / "DomainNet" / "real" / cls / f"real_{j}.jpg", (j, j, j))
    dn = load_dataset("domainnet", str(tmp_path), image_size=8, domains=["real"])
    assert sorted(set(dn.train_y.tolist()) | set(dn.test_y.tolist())) == [0, 8]
    assert len(dn.train_y) + len(dn.test_y) == 10 and dn.class_names[8] == "wine glass"


def test_voc2007_multilabel_xml(tmp_path):
    d = tmp_path / "VOCdevkit" / "VOC2007"
    (d / "ImageSets" / "Main").mkdir(parents=True)
    (d / "Annotations").mkdir()
    objs = {"000001": ["dog", "person"], "000002": ["diningtable"], "000003": ["cat", "cat", "sofa"]}
    for i, names in objs.items():
        xml = "".join(f"<object><name>{n}</name><difficult>0</difficult></object>" for n in names)
        (d / "Annotations" / f"{i}.xml").write_text(
            f"<annotation><filename>{i}.jpg</filename>{xml}</annotation>"
        )
        _image(d / "JPEGImages" / f"{i}.jpg", (10, 20, 30))
    (d / "ImageSets" / "Main" / "trainval.txt").write_text("000001\n000002\n")
    (d / "ImageSets" / "Main" / "test.txt").write_text("000003\n")
    ds = load_dataset("voc2007", str(tmp_path), image_size=16)
    assert ds.multilabel and ds.train_y.dtype == np.float32 and ds.train_y.shape == (2, 20)
    assert [ds.class_names[j] for j in np.flatnonzero(ds.train_y[0])] == ["dog", "person"]
    assert [ds.class_names[j] for j in np.flatnonzero(ds.train_y[1])] == ["dining table"]
    assert ds.test_y[0].sum() == 2
    _, y = ds.tensors(ds.train_x, ds.train_y)
    assert y.dtype == torch.float32 and y.shape == (2, 20)


def test_coco_instances_json(tmp_path):
    d = tmp_path / "coco"
    cats = [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}, {"id": 10, "name": "traffic light"}]
    for split, imgs in (("train2014", [1, 2, 3]), ("val2014", [7])):
        images = [{"id": i, "file_name": f"COCO_{split}_{i:012d}.jpg"} for i in imgs]
        anns = [{"image_id": imgs[0], "category_id": 10}, {"image_id": imgs[0], "category_id": 1}]
        if len(imgs) > 1:
            anns.append({"image_id": imgs[1], "category_id": 3})
        (d / "annotations").mkdir(parents=True, exist_ok=True)
        (d / "annotations" / f"instances_{split}.json").write_text(
            json.dumps({"images": images, "annotations": anns, "categories": cats})
        )
        for im in images:
            _image(d / split / im["file_name"], (5, 5, 5))
    ds = load_dataset("coco", str(tmp_path), image_size=8)
    assert ds.class_names == ["person", "car", "traffic light"]
    assert ds.train_y.tolist() == [[1, 0, 1], [0, 1, 0], [0, 0, 0]] and ds.test_y.tolist() == [[1, 0, 1]]


def test_flair_hdf5_natural_users(tmp_path):
    h5py = pytest.importorskip("h5py")
    (tmp_path / "flair").mkdir()
    rng = np.random.default_rng(0)
    with h5py.File(tmp_path / "flair" / "flair_federated.hdf5", "w") as f:
        users = {
            "train": {
                "u1": ["animal|plant", "food"],
                "u2": ["animal"],
                "u3": ["structure|art", "art", "food"],
            },
            "test": {"t1": ["plant|food"]},
        }
        for part, us in users.items():
            for u, labs in us.items():
                f[f"/{part}/{u}/images"] = rng.integers(0, 255, (len(labs), 16, 16, 3), dtype=np.uint8)
                f[f"/{part}/{u}/labels"] = np.asarray(labs, dtype="S")
                f[f"/{part}/{u}/fine_grained_labels"] = np.asarray(["x_y"] * len(labs), dtype="S")
        f["/metadata/label_counter"] = json.dumps(
            {"animal": 2, "plant": 2, "food": 3, "structure": 1, "art": 2}
        )
    ds = load_dataset("flair", str(tmp_path), image_size=8)
    assert ds.multilabel and ds.class_names == ["animal", "art", "food", "plant", "structure"]
    assert ds.train_x.shape == (6, 3, 8, 8) and ds.train_y.shape == (6, 5) and len(ds.test_y) == 1
    assert ds.train_groups.tolist() == [0, 0, 1, 2, 2, 2] and ds.group_names == ["u1", "u2", "u3"]
    assert ds.train_y[0].tolist() == [1, 0, 0, 1, 0]
    split = make_split(ds, "natural", 3, 0)
    assert [p.tolist() for p in split.train] == [[0, 1], [2], [3, 4, 5]]
    fine = load_dataset("flair", str(tmp_path), image_size=8, fine_grained=True, max_users=2)
    assert fine.class_names == ["x y"] and len(fine.train_y) == 3


def test_flair_coarse_labels_named_by_their_fine_labels(tmp_path, data_root):
    """data.coarse_prompts (FedLGT's "Concat. prompt"): each coarse label's text is its fine
    labels, most frequent first, comma-joined, each fine label under the coarse label it always
    comes with most (here "dog" also meets "plant", twice in four: still an animal); a coarse label without
    fine labels keeps its name; the labels themselves are unchanged."""
    h5py = pytest.importorskip("h5py")
    (tmp_path / "flair").mkdir()
    images = {  # user -> [(coarse, fine)] per image
        "train/u1": [("animal", "dog|cat"), ("animal|plant", "dog|fern")],
        "train/u2": [("animal", "dog"), ("plant", "fern|moss"), ("art", "")],
        "test/t1": [("plant|animal", "moss|cat|dog")],
    }
    with h5py.File(tmp_path / "flair" / "flair_federated.hdf5", "w") as f:
        for where, rows in images.items():
            f[f"/{where}/images"] = np.zeros((len(rows), 4, 4, 3), dtype=np.uint8)
            f[f"/{where}/labels"] = np.asarray([c for c, _ in rows], dtype="S")
            f[f"/{where}/fine_grained_labels"] = np.asarray([x for _, x in rows], dtype="S")
        f["/metadata/label_counter"] = json.dumps({"animal": 4, "plant": 3, "art": 1})
    named = load_dataset("flair", str(tmp_path), image_size=4)
    ds = load_dataset("flair", str(tmp_path), image_size=4, coarse_prompts=True)
    # dog 4 images, cat 2; fern 2, moss 2 (a tie: the later name first, as the authors' sort)
    assert ds.class_names == ["dog,cat", "art", "moss,fern"]
    assert named.class_names == ["animal", "art", "plant"]
    assert np.array_equal(ds.train_y, named.train_y) and np.array_equal(ds.test_y, named.test_y)
    with pytest.raises(ConfigError, match="not with data.fine_grained=true"):
        load_dataset("flair", str(tmp_path), image_size=4, coarse_prompts=True, fine_grained=True)
    with pytest.raises(ConfigError, match="data.coarse_prompts does not apply to dataset 'fmnist'"):
        load_dataset("fmnist", data_root, coarse_prompts=True)


# --- the offline stand-ins --------------------------------------------------------------------
def test_fmnist_domains_standin(data_root):
    ds = load_dataset("fmnist_domains", data_root)
    raw_x, raw_y, _, _ = load_fmnist_arrays(data_root)
    assert ds.standin and ds.train_x.shape == (60000, 1, 28, 28) and np.array_equal(ds.train_y, raw_y)
    assert ds.domain_names == ["original", "rotated", "inverted", "noisy", "blurred"]
    assert np.bincount(ds.train_domains).tolist() == [12000] * 5 and len(ds.test_domains) == 10000
    d = ds.train_domains
    assert np.array_equal(ds.train_x[d == 0], raw_x[d == 0])
    assert np.array_equal(ds.train_x[d == 1], np.rot90(raw_x[d == 1], 1, axes=(-2, -1)))
    assert np.array_equal(ds.train_x[d == 2], 255 - raw_x[d == 2])
    assert not np.array_equal(ds.train_x[d == 4], raw_x[d == 4])
    split = make_split(ds, "domain", 5, 0)
    assert split.client_domains(ds) == [0, 1, 2, 3, 4]
    assert split.stats(ds)["standin"]
    sub = load_dataset("fmnist_domains", data_root, domains=["original", "inverted"]).subset(1000, 100)
    assert sub.domain_names == ["original", "inverted"] and set(sub.train_domains.tolist()) == {0, 1}
    assert len(sub.train_domains) == 1000 and len(sub.test_domains) == 100


def test_fmnist_multilabel_standin(data_root):
    ds = load_dataset("fmnist_multilabel", data_root)
    assert ds.standin and ds.multilabel and ds.class_names == FMNIST_CLASSES
    n = len(ds.train_y)
    assert (
        ds.train_x.shape == (n, 1, 56, 56) and ds.train_y.shape == (n, 10) and ds.train_y.dtype == np.float32
    )
    tiles = ds.train_x.reshape(n, 2, 28, 2, 28).transpose(0, 1, 3, 2, 4).reshape(n, 4, -1)
    filled = (tiles.max(axis=2) > 0).sum(axis=1)
    assert filled.sum() == 60000 and filled.min() >= 1 and filled.max() == 4  # every image used once
    positives = ds.train_y.sum(axis=1)
    assert np.all(positives >= 1) and np.all(positives <= filled)
    assert 20000 < n < 28000 and ds.test_x.shape[1:] == (1, 56, 56)
    _, y = ds.tensors(ds.test_x[:8], ds.test_y[:8])
    assert y.dtype == torch.float32 and y.shape == (8, 10)
    split = make_split(ds, "multilabel_dirichlet", 10, 0, alpha=0.3, min_size=10)
    assert sum(len(p) for p in split.train) == n
    hist = np.array(split.stats(ds)["train_class_histogram"])
    assert hist.sum() == ds.train_y.sum()


# --- fl-lightning partition --------------------------------------------------------------------
def test_partition_command_prints_table_and_writes_png(data_root, tmp_path, capsys):
    args = ["partition", "data=fmnist", "data.partition=shards", "data.classes_per_client=2",
            "fl.num_clients=10", f"output_dir={tmp_path}"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "partition=shards (classes_per_client=2)" in lines[0]
    rows = [
        ln.split() for ln in lines if ln.split() and all(t.replace(".", "").isdigit() for t in ln.split())
    ]
    assert len(rows) == 10 and all(r[1] == "6000" and r[2] == "2" for r in rows)
    (png,) = tmp_path.glob("partitions/*/partition.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    stats = json.loads((png.parent / "partition.json").read_text())
    assert stats["num_clients"] == 10 and stats["train_sizes"] == [6000] * 10
    assert main(args) == 0 and "from cache" in capsys.readouterr().out  # cached under data.root


def test_partition_command_bad_request_is_one_line(data_root, tmp_path, capsys):
    code = main(
        ["partition", "data.partition=shards", "data.classes_per_client=11", f"output_dir={tmp_path}"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "classes_per_client must be in [1, 10]" in err
    code = main(["partition", "data.partition=longtail", f"output_dir={tmp_path}"])
    assert code == 2 and "needs data.imbalance_factor > 1" in capsys.readouterr().err


def test_a_partition_plot_is_drawn_once_per_split_then_copied(data_root, tmp_path):
    """A sweep over methods or seeds of one split draws its plot once (`<cache>/plot-*.png`) and
    copies it after; another split draws its own; without a cache folder every call draws. To
    tell a copy from a drawing, the cached file is swapped for another split's picture."""
    from fl_lightning.data.stats import draw_partition_plot, save_partition_plot

    ds = load_dataset("fmnist", data_root).subset(600, 100)
    one, other = (make_split(ds, p, 6, 0).stats(ds) for p in ("iid", "dirichlet"))
    cache = tmp_path / "cache"
    first = save_partition_plot(one, tmp_path / "a" / "partition.png", cache).read_bytes()
    (cached,) = cache.glob("plot-*.png")
    assert cached.read_bytes() == first and first[:8] == b"\x89PNG\r\n\x1a\n"
    foreign = draw_partition_plot(other, tmp_path / "other.png").read_bytes()
    assert foreign != first
    cached.write_bytes(foreign)  # what `one` would never draw: seen again only if copied
    assert save_partition_plot(one, tmp_path / "b" / "partition.png", cache).read_bytes() == foreign
    assert save_partition_plot(one, tmp_path / "d" / "partition.png").read_bytes() != foreign  # drawn
    assert save_partition_plot(other, tmp_path / "c" / "partition.png", cache).read_bytes() == foreign
    assert len(list(cache.glob("plot-*.png"))) == 2  # the other split drew and cached its own


def test_fmnist_is_inflated_once_then_read_from_its_cache_until_a_file_changes(data_root, tmp_path, caplog):
    """The four gzipped files are read and checked once; later loads read `.cache/fmnist-*.npz`.
    A file replaced after that (here by a truncated copy) is read again, and refused: the cache
    never hides a changed file. A cache file of garbage is rebuilt."""
    import gzip as gz
    import logging
    import os

    from fl_lightning.data.fetch import FMNIST_FILES, fmnist_dir, read_fmnist_file

    root = tmp_path / "data"
    fmnist_dir(root).mkdir(parents=True)
    for f in FMNIST_FILES:
        (fmnist_dir(root) / f).write_bytes((fmnist_dir(data_root) / f).read_bytes())
    want = load_fmnist_arrays(data_root)
    first = load_fmnist_arrays(str(root))
    (cached,) = (root / ".cache").glob("fmnist-*.npz")
    assert all(np.array_equal(a, b) for a, b in zip(first, want, strict=True))
    assert np.array_equal(first[1], read_fmnist_file(root, FMNIST_FILES[1]))
    cached.write_bytes(b"not an npz")
    with caplog.at_level(logging.WARNING, logger="fl_lightning"):
        again = load_fmnist_arrays(str(root))
    assert "rebuilding" in caplog.text and all(np.array_equal(a, b) for a, b in zip(again, want, strict=True))
    planted = {f: read_fmnist_file(data_root, f).copy() for f in FMNIST_FILES}  # well-formed, but
    planted["train-labels-idx1-ubyte.gz"][0] = 200  # a label out of range: rebuilt, not served
    with open(cached, "wb") as out:
        np.savez(out, **planted)
    assert all(np.array_equal(a, b) for a, b in zip(load_fmnist_arrays(str(root)), want, strict=True))
    labels = fmnist_dir(root) / "train-labels-idx1-ubyte.gz"
    stamp = labels.stat().st_mtime_ns
    labels.write_bytes(gz.compress(gz.decompress(labels.read_bytes())[:-10]))  # 10 labels short
    os.utime(labels, ns=(stamp + 2_000_000_000, stamp + 2_000_000_000))  # a later file, as any write
    with pytest.raises(ConfigError, match="train-labels-idx1-ubyte.gz is corrupt"):
        load_fmnist_arrays(str(root))


def test_fmnist_subset_declared_by_its_folder_loads_and_only_then(data_root, tmp_path):
    """benchmarks/gpu_prepare.py's subset (the first images of each split, IDX, with subset.json)
    loads as those images; the same files without subset.json are refused as the wrong shape,
    and a subset.json that declares nothing is one clear error."""
    import importlib.util

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    spec = importlib.util.spec_from_file_location("gpu_prepare", bench / "gpu_prepare.py")
    assert spec is not None and spec.loader is not None
    prep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prep)
    from fl_lightning.data.fetch import fmnist_dir

    root = tmp_path / "data"
    prep.write_fmnist_subset(data_root, root, 300, 100)
    got, full = load_fmnist_arrays(str(root)), load_fmnist_arrays(data_root)
    for a, b, n in zip(got, full, (300, 300, 100, 100), strict=True):
        assert len(a) == n and np.array_equal(a, b[:n])
    marker = fmnist_dir(root) / "subset.json"
    marker.unlink()
    with pytest.raises(ConfigError, match=r"holds an array of shape \(300, 28, 28\), expected \(60000"):
        load_fmnist_arrays(str(root))
    marker.write_text('{"images": 3}')
    with pytest.raises(ConfigError, match="does not declare a subset"):
        load_fmnist_arrays(str(root))


def test_partition_plot_of_thousands_of_clients(data_root, tmp_path):
    """Past 200 clients the sizes are one filled step curve, not a bar per client (10,000
    bars took ~5 s and ~100 MB of the driver's memory before round 1)."""
    from fl_lightning.data.stats import save_partition_plot

    ds = load_dataset("fmnist", data_root).subset(6000, 100)
    stats = make_split(ds, "iid", 3000, 0).stats(ds)
    assert len(stats["train_sizes"]) == 3000 and sum(stats["train_sizes"]) == 6000
    png = save_partition_plot(stats, tmp_path / "partition.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
