"""Partitioners and the partition cache, on real labels: Fashion-MNIST's 60,000 training
labels (read from the real files in the data root) and scikit-learn's digits. Labels only,
no images, no training: the whole file runs in a few seconds."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fl_lightning.core.errors import ConfigError
from fl_lightning.data.datasets import read_idx
from fl_lightning.data.federated import make_split, partition_key
from fl_lightning.data.fetch import fmnist_dir
from fl_lightning.data.longtail import longtail_counts
from fl_lightning.data.partition import PARTITIONERS, class_histogram, primary_labels
from fl_lightning.data.registry import ArrayDataset, load_dataset
from fl_lightning.data.standins import mosaics
from fl_lightning.data.stats import label_entropy


@pytest.fixture(scope="module")
def fm_labels(data_root) -> np.ndarray:
    return read_idx(fmnist_dir(data_root) / "train-labels-idx1-ubyte.gz").astype(np.int64)


@pytest.fixture(scope="module")
def digit_labels() -> np.ndarray:
    return load_dataset("digits", "unused").train_y


@pytest.fixture(scope="module")
def fm_domains(fm_labels) -> np.ndarray:
    return (np.random.default_rng(0).permutation(len(fm_labels)) % 5).astype(np.int64)


@pytest.fixture(scope="module")
def fm_multihot(fm_labels) -> np.ndarray:
    """Label side of the fmnist_multilabel stand-in (2x2 mosaics of real labels)."""
    x = np.zeros((len(fm_labels), 1, 1, 1), dtype=np.uint8)
    return mosaics(x, fm_labels, 10, np.random.default_rng(0))[1]


def run(name: str, labels: np.ndarray, k: int, seed: int = 0, **opts) -> list[np.ndarray]:
    return PARTITIONERS.get(name)(labels, k, np.random.default_rng(seed), **opts)


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    flat = np.concatenate(parts)
    assert len(flat) == n and np.array_equal(np.sort(flat), np.arange(n))
    assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted, no repeats


CASES = [
    ("iid", {}),
    ("dirichlet", {"alpha": 0.3, "min_size": 10}),
    ("dirichlet_balanced", {"alpha": 0.5}),
    ("shards", {"classes_per_client": 2}),
    ("domain", {}),
    ("natural", {}),
]


@pytest.mark.parametrize("name,opts", CASES, ids=[c[0] for c in CASES])
def test_deterministic_by_seed_and_exact_cover(name, opts, fm_labels, fm_domains):
    extra = {"domains": fm_domains} if name == "domain" else {}
    if name == "natural":
        extra = {"groups": np.random.default_rng(1).integers(0, 40, len(fm_labels))}
    a = run(name, fm_labels, 10, seed=3, **opts, **extra)
    b = run(name, fm_labels, 10, seed=3, **opts, **extra)
    c = run(name, fm_labels, 10, seed=4, **opts, **extra)
    assert len(a) == 10 and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    assert_exact_cover(a, len(fm_labels))


def test_same_split_on_digits(digit_labels):
    for name, opts in CASES[:4]:
        parts = run(name, digit_labels, 7, **{**opts, "min_size": 5} if name == "dirichlet" else opts)
        assert_exact_cover(parts, len(digit_labels))


def test_dirichlet_min_size_guard(fm_labels):
    for seed in range(3):
        parts = run("dirichlet", fm_labels, 20, seed=seed, alpha=0.05, min_size=200)
        assert min(len(p) for p in parts) >= 200


def test_dirichlet_impossible_requests_fail_fast_and_clearly(fm_labels, digit_labels):
    with pytest.raises(ConfigError, match="cannot give 10 clients at least data.min_size=6001"):
        run("dirichlet", fm_labels, 10, alpha=0.5, min_size=6001)
    t = time.perf_counter()  # possible by count, not by any draw: bounded retries, then a message
    with pytest.raises(ConfigError, match=r"fewer than data.min_size=5999 samples in 1000 draws"):
        run("dirichlet", fm_labels, 10, alpha=1.0, min_size=5999)
    assert time.perf_counter() - t < 10
    with pytest.raises(ConfigError, match="data.alpha must be > 0"):
        run("dirichlet", digit_labels, 5, alpha=0.0)


def test_dirichlet_approaches_iid_as_alpha_grows(fm_labels):
    alphas = [0.05, 0.2, 1.0, 5.0, 100.0]

    def mean_entropy(alpha: float) -> float:
        splits = [run("dirichlet", fm_labels, 10, seed=s, alpha=alpha) for s in range(3)]
        hists = [class_histogram(fm_labels, parts, 10) for parts in splits]
        return float(np.mean([label_entropy(h).mean() for h in hists]))

    ent = [mean_entropy(a) for a in alphas]
    assert all(x < y for x, y in zip(ent, ent[1:], strict=False)), ent
    assert ent[0] < 0.4 * np.log(10) and ent[-1] > 0.98 * np.log(10)
    iid_ent = label_entropy(class_histogram(fm_labels, run("iid", fm_labels, 10), 10)).mean()
    assert iid_ent > ent[-1] - 0.01


@pytest.mark.parametrize("k,c", [(10, 1), (10, 2), (10, 3), (20, 2), (7, 3)])
def test_shards_exactly_c_classes_per_client(fm_labels, k, c):
    parts = run("shards", fm_labels, k, classes_per_client=c)
    assert_exact_cover(parts, len(fm_labels))
    assert all(len(np.unique(fm_labels[p])) == c for p in parts)
    sizes = [len(p) for p in parts]
    if (k * c) % 10 == 0:  # balanced classes, even class use: equal sizes
        assert max(sizes) - min(sizes) <= 1, sizes
    with pytest.raises(ConfigError, match=r"classes_per_client must be in \[1, 10\]"):
        run("shards", fm_labels, k, classes_per_client=11)
    with pytest.raises(ConfigError, match="some classes would have no client"):
        run("shards", fm_labels, 4, classes_per_client=2)


def test_longtail_matches_imbalance_factor_with_equal_clients(fm_labels):
    for imb in (10, 100):
        parts = run("longtail", fm_labels, 10, imbalance_factor=imb, alpha=0.5)
        flat = np.concatenate(parts)
        assert len(np.unique(flat)) == len(flat)  # no sample twice
        counts = np.bincount(fm_labels[flat], minlength=10)
        assert counts[0] == 6000 and np.all(np.diff(counts) < 0)  # class 0 is the head
        assert counts.max() / counts.min() == pytest.approx(imb, rel=0.02)
        assert np.array_equal(counts, longtail_counts(np.bincount(fm_labels), imb))
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1, sizes  # CReFF's partition_balance
        skew = label_entropy(class_histogram(fm_labels, parts, 10)).mean()
        assert skew < label_entropy(counts[None, :]).item() - 0.1  # Dirichlet label skew on top
    # On data already long-tailed by the same factor (cifar10_lt), every sample is kept.
    keep = np.concatenate(run("longtail", fm_labels, 10, imbalance_factor=50))
    lt = fm_labels[np.sort(keep)]
    assert_exact_cover(run("longtail", lt, 10, imbalance_factor=50), len(lt))


def test_dirichlet_balanced_equal_sizes_and_skewed(fm_labels):
    parts = run("dirichlet_balanced", fm_labels, 20, alpha=0.1)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert label_entropy(class_histogram(fm_labels, parts, 10)).mean() < 0.7 * np.log(10)


def test_domain_partition_one_domain_per_client(fm_labels, fm_domains):
    for k in (5, 10):
        parts = run("domain", fm_labels, k, domains=fm_domains)
        assert_exact_cover(parts, len(fm_labels))
        owners = [np.unique(fm_domains[p]) for p in parts]
        assert all(len(o) == 1 for o in owners)
        assert [int(o[0]) for o in owners] == [i % 5 for i in range(k)]
    with pytest.raises(ConfigError, match="needs fl.num_clients >= the 5 domains"):
        run("domain", fm_labels, 3, domains=fm_domains)
    with pytest.raises(ConfigError, match="needs a dataset with domain ids"):
        run("domain", fm_labels, 5)


def test_multilabel_partitions(fm_multihot, fm_labels):
    n = len(fm_multihot)
    assert_exact_cover(run("iid", fm_multihot, 10), n)
    parts = run("multilabel_dirichlet", fm_multihot, 10, alpha=0.1)
    assert_exact_cover(parts, n)
    prim = primary_labels(fm_multihot)
    assert np.all(fm_multihot[np.arange(n), prim] == 1)  # every mosaic has a label
    skew = label_entropy(class_histogram(prim, parts, 10)).mean()
    flat = label_entropy(class_histogram(prim, run("iid", fm_multihot, 10), 10)).mean()
    assert skew < 0.6 * flat
    with pytest.raises(ConfigError, match="needs single-label data"):
        run("dirichlet", fm_multihot, 10)
    with pytest.raises(ConfigError, match="needs multi-label data"):
        run("multilabel_dirichlet", fm_labels, 10)


def test_natural_partition_keeps_users_whole(fm_labels):
    users = np.random.default_rng(2).integers(0, 30, len(fm_labels))
    parts = run("natural", fm_labels, 30, groups=users)
    assert [set(np.unique(users[p])) for p in parts] == [{u} for u in range(30)]
    merged = run("natural", fm_labels, 7, groups=users)
    assert_exact_cover(merged, len(fm_labels))
    owner_sets = [set(np.unique(users[p])) for p in merged]
    assert sum(len(s) for s in owner_sets) == 30  # no user split over clients
    with pytest.raises(ConfigError, match="has 30 users, fewer than fl.num_clients=31"):
        run("natural", fm_labels, 31, groups=users)


# --- make_split and its cache -------------------------------------------------------------
def _labels_only(labels: np.ndarray, name: str = "fmnist") -> ArrayDataset:
    x = np.zeros((len(labels), 1, 1, 1), dtype=np.uint8)
    return ArrayDataset(name, x, labels, x[:10], labels[:10], [str(i) for i in range(10)], 0.5, 0.5)


def test_split_cache_hit_and_invalidation(fm_labels, tmp_path):
    ds = _labels_only(fm_labels)
    first = make_split(ds, "dirichlet", 10, 0, cache_dir=tmp_path, alpha=0.3, min_size=10)
    assert not first.from_cache and len(list(tmp_path.glob("*.npz"))) == 1
    again = make_split(ds, "dirichlet", 10, 0, cache_dir=tmp_path, alpha=0.3, min_size=10)
    assert again.from_cache and again.key == first.key
    assert all(np.array_equal(a, b) for a, b in zip(first.train, again.train, strict=True))
    assert not list(tmp_path.glob("*.part"))  # atomic: temp file renamed away
    # Any change to what decides the split is a miss.
    changes = [
        dict(partition="dirichlet", k=10, seed=0, alpha=0.5),
        dict(partition="dirichlet", k=10, seed=1, alpha=0.3),
        dict(partition="dirichlet", k=12, seed=0, alpha=0.3),
        dict(partition="iid", k=10, seed=0, alpha=0.3),
    ]
    for ch in changes:
        s = make_split(
            ds, ch["partition"], ch["k"], ch["seed"], cache_dir=tmp_path, alpha=ch["alpha"], min_size=10
        )
        assert not s.from_cache and s.key != first.key
    other = _labels_only(fm_labels[::-1].copy())
    assert partition_key(other, "dirichlet", 10, 0, 0.0, {"alpha": 0.3, "min_size": 10}) != first.key
    tf = make_split(
        ds, "dirichlet", 10, 0, client_test_fraction=0.25, cache_dir=tmp_path, alpha=0.3, min_size=10
    )
    assert not tf.from_cache and tf.test
    tf2 = make_split(
        ds, "dirichlet", 10, 0, client_test_fraction=0.25, cache_dir=tmp_path, alpha=0.3, min_size=10
    )
    assert tf2.from_cache and all(np.array_equal(a, b) for a, b in zip(tf.test, tf2.test, strict=True))
    assert_exact_cover(tf2.train + tf2.test, len(fm_labels))
    # A corrupt file is recomputed, not trusted.
    (tmp_path / f"{first.key}.npz").write_bytes(b"not an npz")
    fixed = make_split(ds, "dirichlet", 10, 0, cache_dir=tmp_path, alpha=0.3, min_size=10)
    assert not fixed.from_cache and all(
        np.array_equal(a, b) for a, b in zip(first.train, fixed.train, strict=True)
    )


def test_split_stats(fm_labels, fm_domains):
    ds = _labels_only(fm_labels)
    ds.train_domains, ds.domain_names = fm_domains, ["a", "b", "c", "d", "e"]
    split = make_split(ds, "domain", 5, 0)
    st = split.stats(ds)
    assert st["client_domains"] == [0, 1, 2, 3, 4] and st["partition"] == "domain"
    assert sum(st["train_sizes"]) == 60000 and st["unassigned"] == 0
    assert np.array(st["train_domain_histogram"]).trace() == 60000
    lt = make_split(ds, "longtail", 10, 0, imbalance_factor=10.0, alpha=0.5, min_size=10)
    assert lt.options == {"alpha": 0.5, "imbalance_factor": 10.0}
    assert lt.stats(ds)["unassigned"] == 60000 - sum(longtail_counts(np.bincount(fm_labels), 10))
