"""The few-shot protocols of CLIP prompt learning (CoOp / CoCoOp, and the federated ones built
on them: PromptFL, FedOTP, FedPGP, FedTPG, FLiP), on any single-label dataset:

* `data.shots=k`: k training images per class, CoOp's draw (`few_shot_indices`);
* `data.personal_shots=p`: p further training images per class held out as the clients' own
  test splits, each client testing on those of the classes it trains on (FLiP's `personal`
  split, where p = k; `personal_indices`, `federated.make_split`);
* `data.personal_from_test=true`: instead, the test split's images of each client's own classes
  (PromptFL / FedOTP's `federated_test_x`, by class);
* `data.base_new=true`: training on the base half of the classes only (CoOp's
  `subsample_classes`: the first ceil(C/2) labels; of a composite, `data=coop_multi`, each
  member's own first half), testing on all, with base, new and harmonic-mean accuracy
  (`core.metrics.EvalSpec.base_classes`, `base_new_sets`).

They act on label lists, so a loader can apply them before decoding a single image (the CoOp
loaders do: ImageNet's 1.28M training images are never read for a 16-shot run); `apply`
applies them to an already loaded dataset. Order, as CoOp's: the k-shot draw over all classes
first, then the base half kept.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..core.errors import ConfigError

if TYPE_CHECKING:  # registry.py applies these protocols
    from .registry import ArrayDataset

PERSONAL_STREAM = 0x9E25  # the personal pool's own random stream (the k-shot draw is untouched)


def few_shot_indices(labels: Sequence[int] | np.ndarray, shots: int, seed: int) -> np.ndarray:
    """CoOp's k-shot draw (Dassl `generate_fewshot_dataset`, repeat=False): one
    `random.Random(seed)` stream; classes in the order they first appear in the list; per class
    `random.sample(items, k)`, or every item when a class has fewer. CoOp seeds Python's
    `random` with the run seed right before it (`set_random_seed`), so the same (list, k, seed)
    picks the same images. Returns the picked positions, sorted."""
    if shots < 1:
        raise ConfigError(f"data.shots must be >= 1 (got {shots})")
    groups: dict[int, list[int]] = {}
    for i, y in enumerate(np.asarray(labels).tolist()):
        groups.setdefault(int(y), []).append(i)
    rng = random.Random(seed)
    picked: list[int] = []
    for items in groups.values():
        picked += rng.sample(items, shots) if len(items) >= shots else items
    return np.sort(np.asarray(picked, dtype=np.int64))


def personal_indices(
    labels: Sequence[int] | np.ndarray, taken: np.ndarray, per_class: int, seed: int
) -> np.ndarray:
    """`per_class` images of each class from those not in `taken` (the k-shot training ones),
    drawn from their own stream (FLiP's `split_fewshot_subset(..., 'personal')` takes the next k
    of the same shuffle); fewer when a class has fewer left. Sorted positions."""
    if per_class < 1:
        raise ConfigError(f"data.personal_shots must be >= 1 (got {per_class})")
    y = np.asarray(labels)
    free = np.ones(len(y), dtype=bool)
    free[taken] = False
    rng = np.random.default_rng([seed, PERSONAL_STREAM])
    out = [rng.permutation(np.flatnonzero(free & (y == c)))[:per_class] for c in np.unique(y)]
    return np.sort(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)


def select(
    labels: Sequence[int] | np.ndarray,
    num_classes: int,
    shots: int | None = None,
    seed: int = 1,
    personal_shots: int | None = None,
    base_new: bool = False,
    class_sets: Sequence[tuple[str, int]] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """The training positions to keep and, among them (as a boolean mask over the kept), the
    ones held out as the clients' personal test pool. `class_sets`: a composite's members
    (`ArrayDataset.class_sets`), whose base halves are their own."""
    y = np.asarray(labels)
    if personal_shots and not shots:
        raise ConfigError("data.personal_shots needs data.shots (the held-out images follow the k-shot draw)")
    keep = few_shot_indices(y, shots, seed) if shots else np.arange(len(y))
    pool = personal_indices(y, keep, personal_shots, seed) if personal_shots else np.zeros(0, np.int64)
    both = np.union1d(keep, pool)
    if base_new:  # (core.metrics imports torch: here, where a dataset is being loaded anyway)
        from ..core.metrics import base_class_ids

        both = both[np.isin(y[both], base_class_ids(num_classes, class_sets))]
    return both, np.isin(both, pool)


def apply(
    ds: ArrayDataset,
    shots: int | None,
    shots_seed: int,
    personal_shots: int | None,
    base_new: bool,
    personal_from_test: bool = False,
) -> ArrayDataset:
    """`select` on a loaded dataset's training set (the test set is left whole); with
    `personal_from_test`, the test images are appended to the training arrays as the personal
    pool (`append_test_pool`)."""
    if not (shots or personal_shots or base_new or personal_from_test):
        return ds
    if ds.multilabel:
        raise ConfigError("data.shots, data.personal_* and data.base_new need single-label data")
    keep, pool = select(
        ds.train_y, ds.num_classes, shots, shots_seed, personal_shots, base_new, ds.class_sets
    )
    if ds.train_personal is not None:  # a loader's own pool, selected along
        pool = pool | ds.train_personal[keep]

    def take(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[keep]

    ds = replace(
        ds, train_x=ds.train_x[keep], train_y=ds.train_y[keep], train_domains=take(ds.train_domains),
        train_groups=take(ds.train_groups), train_personal=pool if pool.any() else None,
    )  # fmt: skip
    return append_test_pool(ds) if personal_from_test else ds


def append_test_pool(ds: ArrayDataset) -> ArrayDataset:
    """The test images appended to the training arrays as the personal pool (PromptFL/FedOTP:
    each client tests on the test split's images of its own classes; the global test set is
    unchanged, so those images are held twice). After `data.train_subset`/`test_subset` are
    applied (`load_from_config`): a training cut would drop the appended pool."""
    if ds.multilabel:
        raise ConfigError("data.personal_from_test needs single-label data")
    if ds.train_personal is not None or ds.train_groups is not None:
        raise ConfigError(
            "data.personal_from_test takes the clients' own test images from the test split: leave "
            "data.personal_shots unset (and it needs a dataset without natural users)"
        )
    domains = None
    if ds.train_domains is not None and ds.test_domains is not None:
        domains = np.concatenate([ds.train_domains, ds.test_domains])
    return replace(
        ds, train_x=np.concatenate([ds.train_x, ds.test_x]), train_y=np.concatenate([ds.train_y, ds.test_y]),
        train_domains=domains, train_personal=np.arange(len(ds.train_y) + len(ds.test_y)) >= len(ds.train_y),
    )  # fmt: skip


def assign_personal(
    labels: np.ndarray, parts: list[np.ndarray], pool: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """Each client's own test split from the personal pool (positions into `labels`): the pool
    images of every class go to the clients that train on that class, in proportion to how many
    of its training images each holds (a class with one holder, as in a classes-per-client
    partition: all to it; the remainder of a cut to the earliest holders). Pool images of a class
    nobody trains on stay unassigned."""
    out: list[list[np.ndarray]] = [[] for _ in parts]
    for c in np.unique(labels[pool]):
        imgs = rng.permutation(pool[labels[pool] == c])
        counts = np.array([int(np.count_nonzero(labels[p] == c)) for p in parts], dtype=np.int64)
        if counts.sum() == 0:
            continue
        share = counts * len(imgs) // counts.sum()
        short = len(imgs) - int(share.sum())
        holders = np.flatnonzero(counts)
        share[holders[:short]] += 1  # largest remainder, simply: the earliest holders
        for k, chunk in enumerate(np.split(imgs, np.cumsum(share)[:-1])):
            if len(chunk):
                out[k].append(chunk)
    return [np.sort(np.concatenate(o)) if o else np.zeros(0, dtype=np.int64) for o in out]
