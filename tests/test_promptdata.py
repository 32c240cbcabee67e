"""The CoOp few-shot suite and the prompt-learning protocols: every loader on a tiny tree in
the released layout, built from real image files (foolbox's CIFAR-10 samples, written as JPEGs),
and its one-line refusal when missing; CoOp's k-shot draw, FLiP's personal pool, FedTPG's
classes-per-client partition, base/new and dual metrics, each against values worked out here
independently; one serial run of the whole protocol on scikit-learn's digits."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.core.errors import ConfigError
from fl_lightning.core.metrics import EvalSpec, TaskMetrics, base_new_sets, dual_metrics, harmonic_mean
from fl_lightning.core.strategy import TaskInfo
from fl_lightning.data.coop import SPLIT_FILE_SETS
from fl_lightning.data.federated import make_split
from fl_lightning.data.partition import PARTITIONERS
from fl_lightning.data.protocols import few_shot_indices, personal_indices
from fl_lightning.data.registry import DATASETS, check_dataset, load_dataset, load_from_config
from fl_lightning.methods import METHODS
from fl_lightning.runtime.runner import start_run

from .real_images import foolbox_images

SIZE = 16  # decoded size in these tests
NAMES = ["accordion", "air plane", "anchor"]  # three classes, CoOp-style text names


@pytest.fixture(scope="module")
def images() -> list[Image.Image]:
    x, _ = foolbox_images("cifar10")  # 20 real 32x32 photographs
    return [Image.fromarray(a.transpose(1, 2, 0)) for a in x]


ASPECTS = [(32, 32), (40, 24), (24, 44), (37, 29)]  # wide, tall, odd: the crop's arithmetic


def _write(path: Path, im: Image.Image) -> None:
    """A real photograph as JPEG, at one of several aspect ratios (by its name)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    im.resize(ASPECTS[sum(path.name.encode()) % len(ASPECTS)]).save(path, quality=95)


def expected(paths: list[Path]) -> np.ndarray:
    """CLIP's preprocessing before normalisation, by torchvision (as CLIP's `_transform`):
    Resize(SIZE, bicubic) of the short side, CenterCrop(SIZE)."""
    from torchvision import transforms as T

    clip = T.Compose([T.Resize(SIZE, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(SIZE)])
    out = []
    for p in paths:
        with Image.open(p) as im:
            out.append(np.asarray(clip(im.convert("RGB"))).transpose(2, 0, 1))
    return np.stack(out) if out else np.zeros((0, 3, SIZE, SIZE), np.uint8)


def split_tree(root: Path, folder: str, split_file: str, image_dir: str, images) -> dict:
    """CoOp's layout: `<folder>/<image_dir>/<class>/<file>.jpg` and the split JSON of
    [relative path, label, class name] rows; 4 train, 1 val and 2 test images per class."""
    base = root / folder / image_dir if image_dir else root / folder
    split: dict[str, list] = {"train": [], "val": [], "test": []}
    k = 0
    for label, name in enumerate(NAMES):
        for part, n in (("train", 4), ("val", 1), ("test", 2)):
            for _ in range(n):
                rel = f"{name.replace(' ', '_')}/image_{k:04d}.jpg"
                _write(base / rel, images[k % len(images)])
                split[part].append([rel, label, name])
                k += 1
    (root / folder / split_file).write_text(json.dumps(split))
    return {p: [(base / r, y) for r, y, _ in rows] for p, rows in split.items()}


def check(ds, items: dict, names: list[str]) -> None:
    assert ds.class_names == names
    for part, x, y in (("train", ds.train_x, ds.train_y), ("test", ds.test_x, ds.test_y)):
        paths, labels = zip(*items[part], strict=True) if items[part] else ((), ())
        assert np.array_equal(y, np.asarray(labels, dtype=np.int64)), part
        assert np.array_equal(x, expected(list(paths))), part


@pytest.mark.parametrize(
    "name,title,folder,split_file,image_dir,source", SPLIT_FILE_SETS, ids=[s[0] for s in SPLIT_FILE_SETS]
)
def test_split_file_datasets_read_coops_layout(
    name, title, folder, split_file, image_dir, source, images, tmp_path
):
    root = tmp_path / "data"
    with pytest.raises(ConfigError) as missing:
        check_dataset(name, str(root), download=False)
    line = str(missing.value)
    assert "\n" not in line and str(root / folder / split_file) in line and "DATASETS.md" in line
    assert source in line and title in line
    assert compose([f"data={name}"]).data.name == name  # conf/data/<name>.yaml
    items = split_tree(root, folder, split_file, image_dir, images)
    ds = load_dataset(name, str(root), image_size=SIZE)
    check(ds, items, NAMES)
    assert ds.mean == (0.48145466, 0.4578275, 0.40821073)  # CLIP's, as CoOp's configs
    # an image its split lists but the folder lacks: one line naming it
    items["test"][0][0].unlink()
    with pytest.raises(ConfigError, match=re.escape(str(items["test"][0][0]))):
        load_dataset(name, str(root), image_size=SIZE)


@pytest.mark.parametrize("hostile", ["deep", "huge_label", "bomb"])
def test_a_hostile_coop_tree_is_one_line(hostile, images, tmp_path):
    """A data root is untrusted: a split file nested 100,000 deep (RecursionError after a
    minute), a label of 10^12 (a list of every missing label: MemoryError) and a 20000x10000
    PNG of a few hundred KB (PIL's DecompressionBombError) are each one ConfigError."""
    root = tmp_path / "data"
    folder, split_file, image_dir = "caltech-101", "split_zhou_Caltech101.json", "101_ObjectCategories"
    items = split_tree(root, folder, split_file, image_dir, images)
    path = root / folder / split_file
    if hostile == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif hostile == "huge_label":
        split = json.loads(path.read_text())
        split["test"][0][1] = 10**12
        path.write_text(json.dumps(split))
    else:
        Image.new("1", (20000, 10000)).save(items["train"][0][0].with_suffix(".png"))
        items["train"][0][0].with_suffix(".png").replace(items["train"][0][0])  # named as the split names it
    with pytest.raises(ConfigError) as e:
        load_dataset("caltech101", str(root), image_size=SIZE)
    assert "\n" not in str(e.value)


def test_fgvc_aircraft_reads_its_variant_lists(images, tmp_path):
    root, d = tmp_path, tmp_path / "fgvc_aircraft"
    with pytest.raises(ConfigError, match=r"FGVCAircraft not found: .*variants.txt.*fgvc-aircraft-2013b"):
        check_dataset("fgvc_aircraft", str(root), download=False)
    variants = ["707-320", "A300B4", "DC-3"]  # multi-word names with spaces and dashes
    d.mkdir()
    (d / "variants.txt").write_text("\n".join(variants) + "\n")
    items: dict[str, list] = {}
    k = 0
    for part in ("train", "val", "test"):
        lines, items[part] = [], []
        for y in (2, 0, 1, 0):  # labels follow variants.txt, not the order of the lines
            _write(d / "images" / f"{1000 + k}.jpg", images[k])
            lines.append(f"{1000 + k} {variants[y]}")
            items[part].append((d / "images" / f"{1000 + k}.jpg", y))
            k += 1
        (d / f"images_variant_{part}.txt").write_text("\n".join(lines) + "\n")
    check(load_dataset("fgvc_aircraft", str(root), image_size=SIZE), items, variants)


WNIDS = ["n01440764", "n01443537", "n01484850"]
WORDS = ["tench", "goldfish", "great white shark"]


def _classnames(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "classnames.txt").write_text("".join(f"{w} {n}\n" for w, n in zip(WNIDS, WORDS, strict=True)))


def test_imagenet_and_its_variants(images, tmp_path):
    root = tmp_path
    for name in ("imagenet", "imagenet_v2", "imagenet_sketch", "imagenet_a", "imagenet_r"):
        with pytest.raises(ConfigError, match=r"classnames.txt.*DATASETS.md"):
            check_dataset(name, str(root), download=False)
    # ImageNet: images/train/<wnid>/, images/val/<wnid>/ (val is the test set)
    _classnames(root / "imagenet")
    items: dict[str, list] = {"train": [], "test": []}
    k = 0
    for part, folder in (("train", "train"), ("test", "val")):
        for y, w in enumerate(WNIDS):
            for j in range(3 if part == "train" else 1):
                p = root / "imagenet" / "images" / folder / w / f"{w}_{j}.JPEG"
                _write(p, images[k])
                items[part].append((p, y))
                k += 1
    check(load_dataset("imagenet", str(root), image_size=SIZE), items, WORDS)
    # -Sketch: images/<wnid>/; -A and -R: 200 of the classes, labelled in sorted-wnid order
    for name, folder, sub, wnids in (
        ("imagenet_sketch", "imagenet-sketch", "images", WNIDS),
        ("imagenet_a", "imagenet-adversarial", "imagenet-a", WNIDS[1:]),
        ("imagenet_r", "imagenet-rendition", "imagenet-r", WNIDS[::2]),
    ):
        _classnames(root / folder)
        test = []
        for y, w in enumerate(wnids):
            p = root / folder / sub / w / f"{k}.jpg"
            _write(p, images[k % 20])
            test.append((p, y))
            k += 1
        (root / folder / sub / "README.txt").write_text("ignored")
        ds = load_dataset(name, str(root), image_size=SIZE)
        check(ds, {"train": [], "test": test}, [WORDS[WNIDS.index(w)] for w in wnids])
    # -V2: folder <label> holds the class of line <label> of classnames.txt
    _classnames(root / "imagenetv2")
    test = []
    for y in (0, 2):
        p = root / "imagenetv2" / "imagenetv2-matched-frequency-format-val" / str(y) / "a.jpeg"
        _write(p, images[y])
        test.append((p, y))
    check(load_dataset("imagenet_v2", str(root), image_size=SIZE), {"train": [], "test": test}, WORDS)
    with pytest.raises(ConfigError, match="test-only"):
        load_dataset("imagenet_v2", str(root), image_size=SIZE, shots=1)


# --- the protocols, against values worked out independently -----------------------------------
def test_few_shot_draw_is_coops():
    labels = [2, 0, 2, 1, 0, 2, 2, 1, 0, 0, 2, 1]  # class 1 has 3 items: all kept at k=4
    for seed in (1, 2, 3):
        # Dassl's generate_fewshot_dataset after set_random_seed(seed), written out here
        random.seed(seed)
        tracker: dict[int, list[int]] = {}
        for i, y in enumerate(labels):
            tracker.setdefault(y, []).append(i)
        want = []
        for items in tracker.values():
            want += random.sample(items, 4) if len(items) >= 4 else items
        assert few_shot_indices(labels, 4, seed).tolist() == sorted(want)
    got = few_shot_indices(labels, 2, 1)
    assert np.bincount(np.asarray(labels)[got]).tolist() == [2, 2, 2]
    taken = few_shot_indices(labels, 2, 1)
    pool = personal_indices(labels, taken, 2, seed=1)
    assert not set(pool) & set(taken) and np.bincount(np.asarray(labels)[pool]).tolist() == [2, 1, 2]


@pytest.mark.parametrize(
    "classes,per,blocks",
    [
        (50, 20, [range(0, 20), range(20, 50)]),  # round(2.5) = 2: half to even, as numpy's
        (51, 20, [range(0, 20), range(20, 40), range(40, 51)]),
        (70, 20, [range(0, 20), range(20, 40), range(40, 60), range(60, 70)]),  # round(3.5) = 4
        (10, 20, [range(0, 10)]),  # at least one client
    ],
)
def test_class_blocks_is_fedtpgs_assignment(classes, per, blocks):
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(classes), 3))
    parts = PARTITIONERS.get("class_blocks")(
        labels, len(blocks), np.random.default_rng(0), classes_per_client=per
    )
    for part, block in zip(parts, blocks, strict=True):
        assert part.tolist() == [i for i, y in enumerate(labels) if y in block]
    with pytest.raises(ConfigError, match=f"set fl.num_clients={len(blocks)}"):
        PARTITIONERS.get("class_blocks")(
            labels, len(blocks) + 1, np.random.default_rng(0), classes_per_client=per
        )


def test_class_blocks_cut_each_dataset_of_a_composite_on_its_own():
    """data=coop_multi: members of 5, 3 and 7 classes (labels 0-4, 5-7, 8-14) in blocks of 2:
    round(5/2) + round(3/2) + round(7/2) = 2 + 2 + 4 clients, no block across two members (over
    the 15 classes at once, block [4, 5] would hold two datasets' classes)."""
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(15), 2))
    blocks = [[0, 1], [2, 3, 4], [5, 6], [7], [8, 9], [10, 11], [12, 13], [14]]
    fn = PARTITIONERS.get("class_blocks")
    parts = fn(labels, 8, np.random.default_rng(0), classes_per_client=2, class_sets=(5, 3, 7))
    assert [sorted(set(labels[p].tolist())) for p in parts] == blocks
    assert sorted(np.concatenate(parts).tolist()) == list(range(30))
    whole = fn(labels, 8, np.random.default_rng(0), classes_per_client=2)  # one dataset: crosses
    assert sorted(set(labels[whole[2]].tolist())) == [4, 5]
    counts = "round(5/2) + round(3/2) + round(7/2)); set fl.num_clients=8"
    with pytest.raises(ConfigError, match=re.escape(counts)):
        fn(labels, 7, np.random.default_rng(0), classes_per_client=2, class_sets=(5, 3, 7))


def test_a_composite_scores_each_dataset_on_its_own_classes():
    """Datasets a (classes 0-3: base 0-1, new 2-3) and b (4-6: base 4-5, new 6), logits chosen so
    that an argmax over every class, or over a dataset's classes, would pick another's: each
    half is scored among its own dataset's half only. Worked out by hand: a base 1/2, a new 2/3,
    b base 1/2, b new 1/1; averages base 1/2, new 5/6, HM of the two 5/8; pooled accuracy 0."""
    rows = [  # (target, scores over the 7 classes)
        (0, [2, 1, 9, 0, 10, 0.5, 0.2]),  # right among {0, 1}; 4 (b) over all, 2 (a new) over a
        (1, [3, 1, 0, 0.5, 0.2, 0.1, 0.3]),  # wrong: 0
        (2, [9, 8.5, 1, 2, 0, 0, 8]),  # wrong among {2, 3}: 3
        (3, [9, 0, 1, 2, 0.5, 0.3, 0.1]),  # right
        (3, [0, 0, 5, 6, 9, 8.5, 8]),  # right among {2, 3}; 4 (b) over all
        (4, [9, 8, 7, 6, 1, 0, 5]),  # right among {4, 5}
        (5, [0, 0.1, 0.2, 0.3, 5, 1, 9]),  # wrong: 4
        (6, [9, 8, 7, 6, 5, 4, 0]),  # b's one new class: right whatever its score
    ]
    target = torch.tensor([t for t, _ in rows])
    scores = torch.tensor([s for _, s in rows], dtype=torch.float64)
    sets = base_new_sets(7, (("a", 4), ("b", 3)))
    assert sets == (("a", 0, 2, 4), ("b", 4, 6, 7))
    m = TaskMetrics(EvalSpec(num_classes=7, base_new_sets=sets))
    m.update(scores[:3], target[:3])  # two batches: counts, not per-batch means
    m.update(scores[3:], target[3:])
    out = m.compute()
    want = {"base_accuracy_a": 1 / 2, "new_accuracy_a": 2 / 3, "base_new_hm_a": 4 / 7,
            "base_accuracy_b": 1 / 2, "new_accuracy_b": 1.0, "base_new_hm_b": 2 / 3,
            "base_accuracy": 1 / 2, "new_accuracy": 5 / 6, "base_new_hm": 5 / 8, "accuracy": 0.0}  # fmt: skip
    assert {k: out[k] for k in want} == pytest.approx(want, abs=1e-12)
    with pytest.raises(ConfigError, match="base_new_sets"):  # sets that leave a class out
        EvalSpec(num_classes=8, base_new_sets=sets)
    # a strategy reads the members from the task: its evaluation, the clients' softmax (each
    # member's base half), FedTPG's generator groups (each member's base and new apart)
    task = TaskInfo(num_classes=7, class_sets=(("a", 4), ("b", 3)), data={"base_new": True})
    fedtpg = METHODS.get("fedtpg")
    strategy = fedtpg(fedtpg.config_cls(), 2, 2, 0, task)
    assert strategy.eval_spec().base_new_sets == sets and strategy.eval_spec().base_classes is None
    assert strategy.trained_classes() == (0, 1, 4, 5)
    assert strategy.model_kwargs("clip_prompt", {})["generator"]["cuts"] == [0, 2, 4, 6, 7]


def test_coop_multi_federates_datasets_in_one_label_space(images, tmp_path, capsys):
    """DTD and OxfordPets (3 classes each) as one: labels 0-2 and 3-5, each member's k-shot draw
    its own and its own base half trained on (classes 0-1 and 3-4); FedTPG's blocks of 3 make
    one client a member (over the 4 base classes at once: one client of both). Bad input: one
    line, exit 2, nothing written."""
    root = tmp_path / "data"
    a = split_tree(root, "dtd", "split_zhou_DescribableTextures.json", "images", images)
    b = split_tree(root, "oxford_pets", "split_zhou_OxfordPets.json", "images", images)
    given = ["data=coop_multi", "data.datasets=[dtd,oxford_pets]", f"data.root={root}", "data.image_size=16",
             "data.shots=2", "data.classes_per_client=3", "fl.num_clients=2"]  # fmt: skip
    cfg = compose(given)
    ds = load_from_config(cfg.data)
    assert ds.class_names == NAMES + NAMES and ds.class_sets == (("dtd", 3), ("oxford_pets", 3))
    picked = []
    for items, offset in ((a, 0), (b, 3)):
        labels = [y for _, y in items["train"]]
        kept = [i for i in few_shot_indices(labels, 2, 1) if labels[i] < 2]  # the base half: 0-1
        picked += [(items["train"][i][0], labels[i] + offset) for i in kept]
    assert ds.train_y.tolist() == [y for _, y in picked]
    assert np.array_equal(ds.train_x, expected([p for p, _ in picked]))
    assert ds.test_y.tolist() == [y for _, y in a["test"]] + [y + 3 for _, y in b["test"]]
    assert np.array_equal(ds.test_x, expected([p for p, _ in a["test"] + b["test"]]))
    split = make_split(ds, "class_blocks", 2, seed=0, classes_per_client=3)  # the members from ds
    assert [sorted(set(ds.train_y[p].tolist())) for p in split.train] == [[0, 1], [3, 4]]
    stats = split.stats(ds)  # partition.json: each client's images per member dataset
    assert stats["class_sets"] == [["dtd", 3], ["oxford_pets", 3]]
    assert stats["train_sizes_per_dataset"] == [[len(split.train[0]), 0], [0, len(split.train[1])]]
    out = tmp_path / "runs"
    bad = {
        "data.datasets=[dtd,oxford_pet]": "unknown CoOp dataset 'oxford_pet'; valid: ",
        "data.datasets=[dtd,dtd]": "each once",
        "data.datasets=[dtd,caltech101]": f"Caltech101 not found: expected {root / 'caltech-101'}",
        "data.classes_per_client=5": "is more than twice dtd's 2 base classes: round(2/5) = 0",
    }
    for override, message in bad.items():
        args = [g for g in given if g.split("=")[0] != override.split("=")[0]] + [override]
        rc = main(["run", *args, "runtime=serial", "logger=none", f"output_dir={out}"])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and "\n" not in err and err.startswith("fl-lightning: error: "), (override, err)
        assert message in err and "DTD not found" not in err, (override, err)
        assert not out.exists(), override
    with pytest.raises(ConfigError, match="data.datasets names a composite's datasets"):
        check_dataset("dtd", str(root), False, ["dtd"])


def test_base_new_and_dual_metrics():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(200, 7, generator=g, dtype=torch.float64)
    target = torch.randint(0, 7, (200,), generator=g)
    spec = EvalSpec(num_classes=7, base_classes=4)  # ceil(7/2)
    m = TaskMetrics(spec)
    for i in range(0, 200, 64):  # batches: the counts do not depend on them
        m.update(scores[i : i + 64], target[i : i + 64])
    out = m.compute()
    s, t = scores.numpy(), target.numpy()
    base, new = t < 4, t >= 4
    b = float((s[base][:, :4].argmax(1) == t[base]).mean())
    n = float((s[new][:, 4:].argmax(1) + 4 == t[new]).mean())
    assert out["base_accuracy"] == pytest.approx(b, abs=1e-12)
    assert out["new_accuracy"] == pytest.approx(n, abs=1e-12)
    assert out["base_new_hm"] == pytest.approx(2 * b * n / (b + n), abs=1e-12)
    assert out["accuracy"] == pytest.approx(float((s.argmax(1) == t).mean()), abs=1e-12)
    assert harmonic_mean(0.8, 0.0) == 0.0 and harmonic_mean(0.5, 0.5) == 0.5
    assert dual_metrics({"accuracy": 0.6, "client_accuracy": 0.9}) == {"dual_hm": pytest.approx(0.72)}
    assert dual_metrics({"accuracy": 0.6}) == {}
    with pytest.raises(ConfigError, match="base_classes"):
        EvalSpec(num_classes=7, base_classes=7)
    # a strategy's evaluation reads data.base_new from the task
    strategy = METHODS.get("fedavg")(
        METHODS.get("fedavg").config_cls(), 2, 2, 0, TaskInfo(num_classes=7, data={"base_new": True})
    )
    assert strategy.eval_spec().base_classes == 4


def test_protocols_on_a_coop_tree_with_personal_splits(images, tmp_path):
    """k-shot (by the loader, before decoding), base half, personal pool and FedTPG's blocks
    together: every client tests on held-out images of exactly the classes it trains on."""
    root = tmp_path / "data"
    items = split_tree(root, "dtd", "split_zhou_DescribableTextures.json", "images", images)
    data = compose(["data.name=dtd", f"data.root={root}", "data.image_size=16", "data.shots=2",
                    "data.personal_shots=1", "data.shots_seed=3"]).data  # fmt: skip
    ds = load_from_config(data)
    train_labels = [y for _, y in items["train"]]
    shots = few_shot_indices(train_labels, 2, 3)
    pool = personal_indices(train_labels, shots, 1, 3)
    both = np.union1d(shots, pool)
    assert np.array_equal(ds.train_x, expected([items["train"][i][0] for i in both]))
    assert ds.train_personal is not None and ds.train_personal.tolist() == np.isin(both, pool).tolist()
    split = make_split(ds, "class_blocks", 3, seed=0, cache_dir=tmp_path / "cache", classes_per_client=1)
    for k in range(3):
        assert set(ds.train_y[split.train[k]].tolist()) == {k} == set(ds.train_y[split.test[k]].tolist())
        assert not ds.train_personal[split.train[k]].any() and ds.train_personal[split.test[k]].all()
    again = make_split(ds, "class_blocks", 3, seed=0, cache_dir=tmp_path / "cache", classes_per_client=1)
    assert again.from_cache and all(np.array_equal(a, b) for a, b in zip(again.test, split.test, strict=True))
    # base half (ceil(3/2) = 2 classes): training images of class 2 are gone, its test images stay
    given = [f"data.{k}={v}" for k, v in dataclasses.asdict(data).items() if v is not None and k != "augment"]
    base = load_from_config(compose([*given, "data.base_new=true"]).data)
    assert set(base.train_y.tolist()) == {0, 1} and set(base.test_y.tolist()) == {0, 1, 2}
    # PromptFL / FedOTP: each client tests on the test split's images of its own classes
    fed = load_from_config(compose([*given, "data.personal_shots=null", "data.personal_from_test=true"]).data)
    split = make_split(fed, "class_blocks", 3, seed=0, classes_per_client=1)
    for k in range(3):
        assert set(fed.train_y[split.train[k]].tolist()) == {k} and len(split.train[k]) == 2
        assert np.array_equal(fed.train_x[split.test[k]], fed.test_x[fed.test_y == k])
    with pytest.raises(ConfigError, match="set one of"):
        compose(["data.shots=2", "data.personal_shots=2", "data.personal_from_test=true"])
    with pytest.raises(ConfigError, match="data.personal_shots needs data.shots"):
        compose(["data.personal_shots=2"])
    with pytest.raises(ConfigError, match="set one of"):
        compose(["data.shots=2", "data.personal_shots=2", "data.client_test_fraction=0.2"])


def test_a_run_reports_base_new_and_personal(tmp_path):
    """Digits (ships in scikit-learn): 8 shots, base half (5 classes), FedTPG blocks of 2
    (round(5/2) = 2 clients), 4 personal images per class: one serial round writes base, new,
    their harmonic mean, the global and the personal accuracy and theirs (dual)."""
    cfg = compose(["data=digits", "data.shots=8", "data.base_new=true", "data.personal_shots=4",
                   "data.partition=class_blocks", "data.classes_per_client=2", "fl.num_clients=2",
                   "fl.rounds=1", "fl.batch_size=8", "model=mlp", "runtime=serial", "logger=none",
                   "data.cache_partitions=false", f"output_dir={tmp_path}"])  # fmt: skip
    _, run_dir = start_run(cfg, console=False)
    line = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    for k in ("accuracy", "base_accuracy", "new_accuracy", "base_new_hm", "client_accuracy"):
        assert 0.0 <= line[k] <= 1.0, k
    assert line["base_new_hm"] == pytest.approx(harmonic_mean(line["base_accuracy"], line["new_accuracy"]))
    a, c = line["accuracy"], line["client_accuracy"]  # FLiP's dual: global and personal
    assert line["dual_hm"] == pytest.approx(0.0 if a + c == 0 else 2 * a * c / (a + c))
    stats = json.loads((run_dir / "partition.json").read_text())
    assert stats["train_sizes"] == [16, 24] and stats["test_sizes"] == [8, 12]
    assert DATASETS.get("digits").class_names is not None


def test_personal_from_test_with_subsets_gives_each_client_its_classes_test_images(tmp_path):
    """data.train_subset cut the appended test pool away (every client's own split empty, or
    of the wrong images): the pool is the first data.test_subset test images, each client's
    those of its own classes. Digits, 4 shots, FedTPG blocks of 2 classes (5 clients), one
    serial round."""
    given = ["data=digits", "data.shots=4", "data.train_subset=40", "data.test_subset=25",
             "data.personal_from_test=true", "data.partition=class_blocks", "data.classes_per_client=2",
             "fl.num_clients=5", "data.cache_partitions=false"]  # fmt: skip
    test_y = load_dataset("digits", str(tmp_path)).test_y[:25]  # the labels, without the protocols
    blocks = [np.isin(test_y, [2 * k, 2 * k + 1]) for k in range(5)]
    fed = load_from_config(compose(given).data)
    split = make_split(fed, "class_blocks", 5, seed=0, classes_per_client=2)
    for k in range(5):
        assert np.array_equal(fed.train_x[split.test[k]], fed.test_x[blocks[k]])
    assert len(fed.train_y) == 40 + 25 and len(fed.test_y) == 25
    cfg = compose([*given, "fl.rounds=1", "fl.batch_size=8", "model=mlp", "runtime=serial", "logger=none",
                   f"output_dir={tmp_path}"])  # fmt: skip
    summary, run_dir = start_run(cfg, console=False)
    part = json.loads((run_dir / "partition.json").read_text())
    assert part["test_sizes"] == [int(b.sum()) for b in blocks] and part["unassigned"] == 0
    line = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert line["clients_evaluated"] == sum(b.any() for b in blocks) and 0.0 <= line["client_accuracy"] <= 1.0
