"""Themed mosaics (`fmnist_digits20_mosaic`, issue 37 E4): labels that co-occur by theme, some
blanked out of the image but kept, and the AP read out on those blanked labels."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from fl_lightning.cli.main import main
from fl_lightning.core.metrics import blanked_ap
from fl_lightning.data import fmnist_digits20 as fd
from fl_lightning.data import themed_mosaics as tm
from fl_lightning.data.registry import load_dataset

from .conftest import small

OUTFIT_SLOTS = (set(tm.TOPS), set(tm.BOTTOMS), set(tm.SHOES))


@pytest.fixture(scope="module")
def mosaics(data_root):
    if not fd.present(data_root):
        fd.fetch(data_root)
    return load_dataset(tm.NAME, data_root)


def _one_theme(labels: set[int]) -> bool:
    if labels & set(range(10, 20)):  # digits: 2-3 of one family, nothing else
        return 2 <= len(labels) <= 3 and any(labels <= set(f) for f in tm.DIGIT_FAMILIES)
    rest = labels - {tm.BAG}  # an outfit: one top, one bottom, one pair of shoes, maybe a bag
    return len(rest) == 3 and all(len(rest & slot) == 1 for slot in OUTFIT_SLOTS)


def test_every_mosaic_is_one_theme_and_a_blanked_tile_keeps_its_label(mosaics, data_root):
    ds = mosaics
    assert ds.multilabel and ds.num_classes == 20 and ds.train_x.shape == (tm.TRAIN_MOSAICS, 1, 56, 56)
    assert ds.test_x.shape == (tm.TEST_MOSAICS, 1, 56, 56) and ds.test_blank.shape == (tm.TEST_MOSAICS, 20)
    for y in (ds.train_y, ds.test_y):
        assert all(_one_theme(set(np.flatnonzero(row).tolist())) for row in y)
    blank = ds.test_blank
    assert not (blank & (ds.test_y == 0)).any()  # only labelled pairs are blanked
    per_mosaic = blank.sum(1)
    assert set(per_mosaic.tolist()) == {0, 1}  # one tile at most
    share = per_mosaic.mean()  # BLANK_SHARE = 0.2 over 2,000 mosaics: 3 standard deviations
    assert abs(share - tm.BLANK_SHARE) < 3 * (0.2 * 0.8 / tm.TEST_MOSAICS) ** 0.5
    # the image shows one tile per visible label, and black where a label was blanked
    tiles = ds.test_x.reshape(-1, 2, 28, 2, 28).transpose(0, 1, 3, 2, 4).reshape(-1, 4, 28 * 28)
    shown = (tiles.max(axis=2) > 0).sum(1)
    assert (shown == ds.test_y.sum(1) - per_mosaic).all()
    # every blanked label has ~20 test pairs, both groups; the training labels have a tail
    assert blank.sum(0).min() >= 8
    counts = ds.train_y.sum(0)
    assert counts.max() / counts.min() > 3
    # the tiles are fmnist_digits20's images: each visible tile is one of its test images
    src = load_dataset(fd.NAME, data_root)
    known = {img.tobytes() for img in src.test_x[:, 0]}
    first = ds.test_x[0, 0]
    for r, c in ((0, 0), (0, 28), (28, 0), (28, 28)):
        tile = first[r : r + 28, c : c + 28]
        assert tile.max() == 0 or tile.tobytes() in known


def test_the_mosaics_are_the_same_every_build(data_root):
    a, b = tm.build(data_root), tm.build(data_root)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_blanked_ap_is_sklearns_ap_over_absent_and_blanked_images():
    """Written out independently: for each label with a blanked positive, sklearn's AP over the
    rows where it is absent or blanked; the visible rows left out; means per group."""
    g = torch.Generator().manual_seed(0)
    n, c = 300, 6
    target = (torch.rand(n, c, generator=g) < 0.4).float()
    blank = (torch.rand(n, c, generator=g) < 0.3) & (target > 0)
    blank[:, 5] = False  # a label never blanked: not in the means
    scores = torch.randn(n, c, generator=g) * 3 + blank.float()  # blanked pairs score higher
    scores[:20, 0] = 0.25  # ties
    groups = (0, 0, 1, 1, 1, 0)
    got = blanked_ap(scores, target, blank, groups, ("a", "b"))
    want = {}
    for k in range(5):
        rows = (target[:, k] == 0) | blank[:, k]
        want[k] = average_precision_score(blank[rows, k].numpy(), scores[rows, k].numpy())
    # torchmetrics sums precision x recall steps in float32: ~1e-7 relative per step, <= 300 steps
    tol = 300 * 2**-23
    assert got["blank_c_ap"] == pytest.approx(np.mean(list(want.values())), abs=tol)
    assert got["blank_a_ap"] == pytest.approx(np.mean([want[0], want[1]]), abs=tol)
    assert got["blank_b_ap"] == pytest.approx(np.mean([want[2], want[3], want[4]]), abs=tol)
    # the visible rows matter nowhere: scoring them anything changes nothing
    moved = scores.clone()
    moved[(target > 0) & ~blank] = 100.0
    assert blanked_ap(moved, target, blank, groups, ("a", "b")) == got
    assert blanked_ap(scores, target, torch.zeros_like(blank)) == {}


def test_a_run_on_the_mosaics_logs_the_ap_on_blanked_labels(tmp_path, data_root, mosaics):
    args = small(tmp_path, "method=fedlgt", f"data={tm.NAME}", "data.train_subset=100",
                 "data.test_subset=400", "fl.rounds=1", "runtime=serial", "run_id=m")  # fmt: skip
    assert main(["run", *args, "--quiet"]) == 0
    (line,) = [json.loads(x) for x in (tmp_path / "default" / "m" / "metrics.jsonl").read_text().splitlines()]
    for key in ("blank_c_ap", "blank_clothing_ap", "blank_digit_ap", "c_ap"):
        assert 0.0 <= line[key] <= 1.0, key
