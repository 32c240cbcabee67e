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


def _expected_blanked_pairs() -> np.ndarray:
    """Per label, the expected blanked test pairs of 2,000 uniform mosaics, from the recipe: half
    outfits (one of each slot's classes, a bag half the time: 3 or 4 tiles), half digit families
    (chosen by size, 2 or 3 of its digits); `BLANK_SHARE` of the mosaics blank one tile, each
    tile alike. A top: 0.5 x 1/4 x 0.2 x mean(1/3, 1/4) x 2,000 = 14.6; a digit: 20."""
    per = np.zeros(20)
    one_tile = tm.BLANK_SHARE * (1 / 3 + 1 / 4) / 2  # blanked and this tile, in a 3- or 4-tile outfit
    for slot in (tm.TOPS, tm.BOTTOMS, tm.SHOES):
        per[list(slot)] = 0.5 / len(slot) * one_tile
    per[tm.BAG] = 0.5 * 0.5 * tm.BLANK_SHARE / 4
    for fam in tm.DIGIT_FAMILIES:  # in the mosaic with chance k/size, blanked with 0.2/k
        per[list(fam)] = 0.5 * len(fam) / 10 * tm.BLANK_SHARE / len(fam)
    return per * tm.TEST_MOSAICS


def test_a_test_draw_is_the_fixed_sets_recipe_with_its_own_blanked_pairs(mosaics, data_root):
    """`draw_test`: deterministic per draw, other pairs for another draw and than the fixed set
    (draw 0 included: its rng is not the fixed set's), the same recipe (one theme a mosaic, at
    most one blanked tile, labelled), every label tested about as the recipe expects."""
    fixed = (mosaics.test_x, mosaics.test_y, mosaics.test_blank)
    draws = {d: tm.draw_test(data_root, d) for d in (0, 1, 2)}
    again = tm.draw_test(data_root, 1)
    assert all(np.array_equal(a, b) for a, b in zip(draws[1], again, strict=True))
    for x, y, blank in draws.values():
        for got, want in zip((x, y, blank), fixed, strict=True):
            assert got.shape == want.shape and got.dtype == want.dtype
        assert all(_one_theme(set(np.flatnonzero(row).tolist())) for row in y)
        assert not (blank & (y == 0)).any() and blank.sum(1).max() == 1
    sets = [fixed[2], *(b for _, _, b in draws.values())]
    for i, a in enumerate(sets):  # pairwise: each draw's blanked pairs are its own
        for b in sets[i + 1 :]:
            assert not np.array_equal(a, b) and (a & b).sum() < 0.1 * a.sum()
    assert not np.array_equal(draws[0][0], fixed[0])
    expected = _expected_blanked_pairs()
    assert expected.sum() == pytest.approx(400.0)  # the fixed set has 416
    for _, _, blank in draws.values():  # Poisson-like counts: 4 standard deviations
        counts = blank.sum(0)
        assert counts.min() >= 5
        assert (np.abs(counts - expected) <= 4 * np.sqrt(expected)).all(), counts
        assert abs(counts.sum() - expected.sum()) <= 4 * np.sqrt(expected.sum())
