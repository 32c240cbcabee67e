"""`fmnist_digits20_mosaic`: 2x2 mosaics of `fmnist_digits20`'s images whose labels co-occur by
theme, some with a tile blanked but still labelled (issue 37, experiment E4 of the science
review: does FedLGT's label table carry *meaning* where labels really co-occur?).

Each mosaic is one theme (half and half):
- an outfit: one top (T-shirt, pullover, coat or shirt), one of trouser / dress, one of sandal /
  sneaker / ankle boot, and a bag half the time (3-4 tiles);
- a digit family: 2 or 3 different digits of one of {0, 6, 8, 9}, {1, 4, 7}, {2, 3, 5}.
Within a slot a class is drawn with weight IF^(-c/19) (class 0 the head, 19 the tail; IF 20)
for the training mosaics, uniformly for the test mosaics: a tail where clients train, though
a mild one (the themes' slots hold 2-4 classes each: label counts 212 to 874 of 3,000
mosaics), and every label tested (~20 blanked test pairs a label). Tiles take random positions; an
empty tile is black. In `BLANK_SHARE` of the mosaics one tile is blanked (black) but keeps its
label: that label is recoverable only from what co-occurs with it. `ArrayDataset.test_blank`
marks those (mosaic, label) pairs of the test mosaics; the global evaluation reads out the AP
on them (`core.metrics.blanked_ap`: `blank_c_ap`, per coarse group `blank_clothing_ap` and
`blank_digit_ap`: text groups align with co-occurrence for clothing, not for digits).

Built from the 8,000 client images of `fmnist_digits20` (the training mosaics) and its 2,000
test images (the test mosaics); its held-out images (8,000..) stay out, for a tile trunk
(`fl-lightning pretrain data=fmnist_digits20 model=cnn`). Deterministic, independent of the
run seed; cached like the other decoded arrays. `draw_test` draws other test sets by the same
recipe (a fresh set of blanked pairs per draw: test sampling in a seed-to-seed interval).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .cache import cached_arrays
from .fetch import fmnist_dir
from .fmnist_digits20 import CLASSES, CLIENT_IMAGES, COARSE, COARSE_GROUPS, mnist5k_path, present, where
from .fmnist_digits20 import fetch as fetch_digits20
from .fmnist_digits20 import load as load_digits20
from .registry import DATASETS, ArrayDataset, DatasetEntry

if TYPE_CHECKING:
    import torch

NAME = "fmnist_digits20_mosaic"
TOPS, BOTTOMS, SHOES, BAG = (0, 2, 4, 6), (1, 3), (5, 7, 9), 8
DIGIT_FAMILIES = ((10, 16, 18, 19), (11, 14, 17), (12, 13, 15))  # digits 0,6,8,9 | 1,4,7 | 2,3,5
BLANK_SHARE = 0.2
IMBALANCE = 20.0  # training mosaics: class c drawn with weight IMBALANCE^(-c/19) within its slot
TRAIN_MOSAICS, TEST_MOSAICS = 3000, 2000
LAYOUT = "1"  # in the cache key: a change of `build` must not read an older layout
COARSE_GROUPS[NAME] = COARSE_GROUPS["fmnist_digits20"]  # clothing 0-9, digits 10-19


def _pick(options: Sequence[int], weights: np.ndarray, rng: np.random.Generator, k: int = 1) -> list[int]:
    w = weights[list(options)]
    return [int(c) for c in rng.choice(options, size=k, replace=False, p=w / w.sum())]


def themes(m: int, weights: np.ndarray, rng: np.random.Generator) -> list[list[int]]:
    """`m` mosaics' classes: outfits and digit families, half and half (see the module)."""
    out = []
    family_w = np.array([weights[list(f)].sum() for f in DIGIT_FAMILIES])
    for _ in range(m):
        if rng.random() < 0.5:
            labels = [*_pick(TOPS, weights, rng), *_pick(BOTTOMS, weights, rng), *_pick(SHOES, weights, rng)]
            if rng.random() < 0.5:
                labels.append(BAG)
        else:
            fam = DIGIT_FAMILIES[int(rng.choice(len(DIGIT_FAMILIES), p=family_w / family_w.sum()))]
            labels = _pick(fam, weights, rng, k=int(rng.integers(2, 4)))
        out.append(labels)
    return out


def compose(
    x: np.ndarray, y: np.ndarray, labels: list[list[int]], rng: np.random.Generator, num_classes: int = 20
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mosaics of `labels`' classes, each tile an image of its class (every class's images in
    turn, reshuffled when used up), one tile blanked in `BLANK_SHARE` of them. Returns uint8
    images [M, C, 2H, 2W], float32 multi-hot [M, num_classes] and bool blanked pairs
    [M, num_classes]."""
    m, (_, c, h, w) = len(labels), x.shape
    pools = {k: rng.permutation(np.flatnonzero(y == k)) for k in range(num_classes)}
    used = dict.fromkeys(pools, 0)
    images = np.zeros((m, c, 2 * h, 2 * w), dtype=x.dtype)
    multi_hot = np.zeros((m, num_classes), dtype=np.float32)
    blank = np.zeros((m, num_classes), dtype=bool)
    blanked = rng.random(m) < BLANK_SHARE
    for i, classes in enumerate(labels):
        gone = int(rng.integers(len(classes))) if blanked[i] else -1
        for slot, (k, pos) in enumerate(zip(classes, rng.permutation(4), strict=False)):
            multi_hot[i, k] = 1.0
            if slot == gone:
                blank[i, k] = True
                continue
            if used[k] == len(pools[k]):
                pools[k], used[k] = rng.permutation(pools[k]), 0
            r0, c0 = (pos // 2) * h, (pos % 2) * w
            images[i, :, r0 : r0 + h, c0 : c0 + w] = x[pools[k][used[k]]]
            used[k] += 1
    return images, multi_hot, blank


def build(root: str) -> dict[str, np.ndarray]:
    src = load_digits20(root)
    tx, ty = src.train_x[:CLIENT_IMAGES], src.train_y[:CLIENT_IMAGES]
    classes = np.arange(len(CLASSES))
    rng = np.random.default_rng(0xE4)
    train = compose(tx, ty, themes(TRAIN_MOSAICS, IMBALANCE ** (-classes / classes[-1]), rng), rng)
    test = compose(src.test_x, src.test_y, themes(TEST_MOSAICS, np.ones(len(classes)), rng), rng)
    return {
        "train_x": train[0],
        "train_y": train[1],
        "test_x": test[0],
        "test_y": test[1],
        "test_blank": test[2],
    }


def draw_test(root: str, draw: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Another 2,000 test mosaics, `build`'s test recipe (uniform themes, then `compose`) over the
    same 2,000 test images, with an rng of their own: child `draw` of the fixed set's seed
    (`SeedSequence(0xE4, spawn_key=(draw,))`), a stream independent of the one `build` draws
    from. `build` draws its test mosaics once, so every run seed is read on the same 416 blanked
    (mosaic, label) pairs and the seed-to-seed intervals leave test sampling out; a run read on
    the draw of its own seed puts it in (issue 55, the groups controls' redraw). Returns
    (images, multi-hot, blanked pairs) as `build`'s test_x, test_y, test_blank; not cached, and
    `build`, `load` and the cache are untouched (committed runs read the same data)."""
    src = load_digits20(root)
    rng = np.random.default_rng(np.random.SeedSequence(0xE4, spawn_key=(int(draw),)))
    return compose(src.test_x, src.test_y, themes(TEST_MOSAICS, np.ones(len(CLASSES)), rng), rng)


def load(root: str) -> ArrayDataset:
    paths = [fmnist_dir(root) / "train-images-idx3-ubyte.gz", mnist5k_path(root)]
    a = cached_arrays(root, NAME, paths, lambda: build(root), salt=LAYOUT)
    x = a["train_x"]
    mean, std = float(x.mean(dtype=np.float64) / 255.0), float(x.std(dtype=np.float64) / 255.0)
    return ArrayDataset(
        NAME, x, a["train_y"], a["test_x"], a["test_y"], list(CLASSES), mean, std, multilabel=True,
        test_blank=a["test_blank"],
    )  # fmt: skip


def blanked_metrics(ds: ArrayDataset, scores: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """The global evaluation's AP on the blanked (image, label) pairs (`core.metrics.blanked_ap`),
    overall and per coarse group; none where a protocol changed the test set's rows."""
    import torch  # here: registering and loading data needs no torch

    from ..core.metrics import blanked_ap

    blank = ds.test_blank
    if blank is None or len(blank) != len(targets):
        return {}
    mask = torch.from_numpy(np.asarray(blank, dtype=bool))
    return blanked_ap(scores, targets, mask, COARSE_GROUPS[NAME], COARSE)


DATASETS.register(NAME)(
    DatasetEntry(
        load=load,
        present=present,
        where=where,
        download=fetch_digits20,
        class_names=tuple(CLASSES),
        multilabel=True,
        coarse_groups=COARSE_GROUPS[NAME],
        coarse_names=COARSE,
        extra_metrics=blanked_metrics,
    )  # fmt: skip
)
