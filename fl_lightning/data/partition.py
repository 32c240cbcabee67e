"""Partitioners: split training indices over clients. All seeded; same inputs, same split.

Each partitioner takes (labels, num_clients, rng, **options) and returns one sorted index
array per client. Together they cover every sample exactly once, except `longtail`, which
first keeps a long-tailed subset of the training set (the protocol) and covers exactly that.
Options a partitioner does not use are ignored, so callers may pass all of them
(alpha, min_size, classes_per_client, imbalance_factor, domains, groups).

| name | heterogeneity | protocol |
|---|---|---|
| iid | none (equal sizes); works for single- and multi-label data | FedLGT's COCO/VOC split |
| dirichlet | label skew, per-class Dir(alpha), min-size guard | NIID-Bench / PFLlib / FedGLCL |
| dirichlet_balanced | label skew, equal client sizes | CReFF `clients_indices` + `partition_balance` |
| shards | pathological: exactly C classes per client, equal sizes | FedGLCL sharding, PFLlib `pat` |
| class_blocks | C consecutive classes per client, disjoint (no randomness) | FedTPG `num_cls_per_client` |
| longtail | global long tail (IF) then `dirichlet_balanced` | CReFF / CLIP2FL |
| domain | feature skew: one domain per client (or several clients per domain) | FedBN / FedGLCL / FedDTR |
| multilabel_dirichlet | multi-hot label skew (Dirichlet over each image's rarest label) | FedLGT note 8 |
| natural | the dataset's own users (FLAIR); merged whole when fewer clients | FLAIR / FedLGT |
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..core.errors import ConfigError
from ..core.progress import progress
from ..core.registry import Registry
from .longtail import longtail_indices

Partitioner = Callable[..., list[np.ndarray]]
PARTITIONERS: Registry[Partitioner] = Registry("partition")


def _single_label(labels: np.ndarray, name: str) -> np.ndarray:
    if labels.ndim != 1:
        raise ConfigError(
            f"data.partition={name} needs single-label data; "
            "for multi-label data use iid or multilabel_dirichlet"
        )
    return labels


@PARTITIONERS.register("iid")
def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator, **_: object) -> list[np.ndarray]:
    """Uniformly random, equal-size (±1) shards. Labels may be single- or multi-label."""
    return [np.sort(p) for p in np.array_split(rng.permutation(len(labels)), num_clients)]


@PARTITIONERS.register("dirichlet")
def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha: float = 0.5,
    min_size: int = 10,
    max_tries: int = 1000,
    **_: object,
) -> list[np.ndarray]:
    """Label skew (Hsu et al. 2019; NIID-Bench, Li et al. 2022): for every class, client
    shares ~ Dir(alpha). Small alpha concentrates each client on few classes.

    Redraws until every client has at least `min_size` samples, at most `max_tries` times,
    then fails clearly instead of looping forever. Like NIID-Bench, a client already holding
    more than N/K samples gets no share of later classes, which keeps sizes bounded.
    """
    labels = _single_label(labels, "dirichlet")
    n = len(labels)
    if alpha <= 0:
        raise ConfigError(f"data.alpha must be > 0 (got {alpha})")
    if num_clients * min_size > n:
        raise ConfigError(
            f"cannot give {num_clients} clients at least data.min_size={min_size} samples "
            f"each from {n} samples"
        )
    classes = np.unique(labels)
    by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    # redraws (min_size) on a large dataset can take minutes: shown, with the most left
    with progress(f"dirichlet partition ({n} samples, {num_clients} clients)", max_tries, "draw") as bar:
        for _try in range(max_tries):
            parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
            sizes = np.zeros(num_clients, dtype=np.int64)
            for idx in by_class:
                p = rng.dirichlet(np.full(num_clients, alpha))
                p = p * (sizes < n / num_clients)
                p = p / p.sum() if p.sum() > 0 else np.full(num_clients, 1.0 / num_clients)
                cuts = (np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
                for k, chunk in enumerate(np.split(idx, cuts)):
                    parts[k].append(chunk)
                    sizes[k] += len(chunk)
            bar.update(smallest_client=int(sizes.min()))
            if sizes.min() >= min_size:
                return [np.sort(np.concatenate(p)) for p in parts]
    raise ConfigError(
        f"dirichlet partition with alpha={alpha} gave some client fewer than "
        f"data.min_size={min_size} samples in {max_tries} draws; lower data.min_size, "
        "raise data.alpha or use fewer clients"
    )


@PARTITIONERS.register("dirichlet_balanced")
def dirichlet_balanced(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha: float = 0.5,
    max_tries: int = 1000,
    **_: object,
) -> list[np.ndarray]:
    """CReFF's `clients_indices` (Shang et al. 2022, reused by CLIP2FL): shuffle, cut into
    chunks of 10 "auxiliary workers", Dirichlet per class inside each chunk (workers already
    above the chunk average get no more) until every worker has >= half the average, then
    concatenate the workers and re-split into `num_clients` equal contiguous parts. Sizes
    are equal (±1); label skew comes from the Dirichlet ordering."""
    labels = _single_label(labels, "dirichlet_balanced")
    if alpha <= 0:
        raise ConfigError(f"data.alpha must be > 0 (got {alpha})")
    n = len(labels)
    if num_clients > n:
        raise ConfigError(f"cannot split {n} samples over {num_clients} clients")
    order = rng.permutation(n)
    aux = min(10, num_clients)
    num_chunks = math.ceil(num_clients / aux)
    chunk_workers = [aux] * (num_chunks - 1) + [num_clients - aux * (num_chunks - 1)]
    step = int(aux / num_clients * n)
    classes = np.unique(labels)
    workers: list[np.ndarray] = []
    bar = progress(f"dirichlet_balanced partition ({n} samples, {num_clients} clients)", num_chunks, "chunk")
    with bar:
        for i, w in enumerate(chunk_workers):
            chunk = order[i * step : (i + 1) * step] if i < num_chunks - 1 else order[i * step :]
            by_class = [chunk[labels[chunk] == c] for c in classes]
            target = len(chunk) / w
            for _try in range(max_tries):
                batches: list[list[np.ndarray]] = [[] for _ in range(w)]
                sizes = np.zeros(w, dtype=np.int64)
                for idx in by_class:
                    p = rng.dirichlet(np.full(w, alpha)) * (sizes < target)
                    p = p / p.sum() if p.sum() > 0 else np.full(w, 1.0 / w)
                    cuts = (np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
                    for k, part in enumerate(np.split(idx, cuts)):
                        batches[k].append(part)
                        sizes[k] += len(part)
                if sizes.min() >= int(0.5 * target):
                    break
            else:
                raise ConfigError(
                    f"dirichlet_balanced with alpha={alpha} could not give every worker half its share "
                    f"in {max_tries} draws; raise data.alpha or use fewer clients"
                )
            workers += [np.concatenate(b) for b in batches]
            bar.update()
    flat = np.concatenate(workers)
    return [np.sort(p) for p in np.array_split(flat, num_clients)]  # CReFF's partition_balance


@PARTITIONERS.register("longtail")
def longtail(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    imbalance_factor: float = 100.0,
    alpha: float = 0.5,
    **options: object,
) -> list[np.ndarray]:
    """The CLIP2FL / CReFF protocol: make the global training set long-tailed (Cui et al.
    2019, n_c = n_max * IF^(-c/(C-1)), class 0 the head, random samples kept per class),
    then `dirichlet_balanced` over the clients (equal client sizes). On a dataset already
    long-tailed by the same factor (cifar10_lt, cifar100_lt) every sample is kept."""
    labels = _single_label(labels, "longtail")
    keep = longtail_indices(labels, imbalance_factor, rng)
    if num_clients > len(keep):
        raise ConfigError(
            f"the long-tailed training set has {len(keep)} samples, fewer than {num_clients} clients"
        )
    extra = {k: v for k, v in options.items() if k == "max_tries"}
    parts = dirichlet_balanced(labels[keep], num_clients, rng, alpha=alpha, **extra)
    return [np.sort(keep[p]) for p in parts]


@PARTITIONERS.register("shards")
def shards(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, classes_per_client: int = 2, **_: object
) -> list[np.ndarray]:
    """Pathological split: every client gets exactly `classes_per_client` distinct classes,
    drawn at random so that each class goes to as many clients as possible equally often;
    a class's samples are cut into equal shards among its clients. With balanced classes
    and num_classes dividing num_clients * C, client sizes are equal; otherwise as equal as
    the class counts allow."""
    labels = _single_label(labels, "shards")
    classes, counts = np.unique(labels, return_counts=True)
    nc, c = len(classes), int(classes_per_client)
    if not 1 <= c <= nc:
        raise ConfigError(
            f"data.classes_per_client must be in [1, {nc}] for {nc} classes (got {classes_per_client})"
        )
    if num_clients * c < nc:
        raise ConfigError(
            f"shards: fl.num_clients * data.classes_per_client = {num_clients * c} is less than the {nc} "
            "classes, so some classes would have no client; use more clients or classes per client"
        )
    base, extra = divmod(num_clients * c, nc)
    uses = np.full(nc, base, dtype=np.int64)
    uses[rng.permutation(nc)[:extra]] += 1
    short = np.flatnonzero(counts < uses)
    if len(short):
        raise ConfigError(
            f"shards: class {classes[short[0]]} has {counts[short[0]]} samples but must be split over "
            f"{uses[short[0]]} clients; use fewer clients or fewer data.classes_per_client"
        )
    # Give each client the C classes with the most uses left (random among ties): this
    # always succeeds (no class needs more clients than remain) and keeps classes distinct.
    remaining = uses.copy()
    holders: list[list[int]] = [[] for _ in range(nc)]
    for k in range(num_clients):
        pick = np.lexsort((rng.random(nc), -remaining))[:c]
        remaining[pick] -= 1
        for j in pick:
            holders[j].append(k)
    assert remaining.min() == 0 and remaining.max() == 0
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for j, cls in enumerate(classes):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        for k, shard in zip(holders[j], np.array_split(idx, len(holders[j])), strict=True):
            parts[k].append(shard)
    return [np.sort(np.concatenate(p)) for p in parts]


def class_block_clients(num_classes: int, classes_per_client: int) -> int:
    """FedTPG's client count for one dataset: round(m / C) (numpy's half-to-even), at least 1."""
    return max(1, int(np.around(num_classes / classes_per_client)))


@PARTITIONERS.register("class_blocks")
def class_blocks(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    classes_per_client: int = 20,
    class_sets: tuple[int, ...] | None = None,
    **_: object,
) -> list[np.ndarray]:
    """FedTPG's classes-per-client split (`federated/server.py:init_server`): the m classes
    present, in label order, cut into consecutive blocks of C = `classes_per_client`; client k
    holds every training image of block k, and the last client also the classes left over, so
    there are round(m / C) clients (half to even, at least 1: 50 classes at C=20 make 2 clients,
    of 20 and 30). With `data.base_new` the classes are the base half, as FedTPG's cross-class
    protocol; `fl.num_clients` must be that count. `class_sets`: a composite's member datasets'
    class counts, in label order (`data=coop_multi`, passed by `make_split`): each member is cut
    on its own, in turn (no block spans two datasets), and the clients are the members' counts
    added up, as the authors' loop over their datasets."""
    labels = _single_label(labels, "class_blocks")
    c = int(classes_per_client)
    if c < 1:
        raise ConfigError(f"data.classes_per_client must be >= 1 (got {classes_per_client})")
    present = np.unique(labels)
    ends = np.cumsum([0, *class_sets]) if class_sets else np.asarray([0, int(present.max(initial=-1)) + 1])
    per_set = [present[(present >= a) & (present < b)] for a, b in zip(ends[:-1], ends[1:], strict=True)]
    per_set = [classes for classes in per_set if len(classes)]  # a member without training classes: none
    wants = [class_block_clients(len(classes), c) for classes in per_set]
    if num_clients != sum(wants):
        count = " + ".join(f"round({len(classes)}/{c})" for classes in per_set)
        raise ConfigError(
            f"data.partition=class_blocks with data.classes_per_client={c} over {len(present)} classes "
            f"makes {sum(wants)} clients (FedTPG: {count}); set fl.num_clients={sum(wants)}"
        )
    blocks = [
        block
        for classes, want in zip(per_set, wants, strict=True)
        for block in [classes[k * c : (k + 1) * c] for k in range(want - 1)] + [classes[(want - 1) * c :]]
    ]
    return [np.flatnonzero(np.isin(labels, b)) for b in blocks]


@PARTITIONERS.register("domain")
def domain(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    domains: np.ndarray | None = None,
    **_: object,
) -> list[np.ndarray]:
    """Feature skew (FedBN protocol): client k holds only domain k mod D. With as many
    clients as domains that is one domain per client; with more, each domain's samples are
    split uniformly at random over its clients."""
    if domains is None:
        raise ConfigError(
            "data.partition=domain needs a dataset with domain ids: office_caltech, domainnet, pacs "
            "or the stand-in fmnist_domains"
        )
    domains = np.asarray(domains)
    ids = np.unique(domains)
    if num_clients < len(ids):
        raise ConfigError(
            f"data.partition=domain needs fl.num_clients >= the {len(ids)} domains (got {num_clients}); "
            "pick fewer domains with data.domains=[...]"
        )
    parts: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * num_clients
    for j, d in enumerate(ids):
        clients = list(range(j, num_clients, len(ids)))
        idx = rng.permutation(np.flatnonzero(domains == d))
        for k, p in zip(clients, np.array_split(idx, len(clients)), strict=True):
            parts[k] = np.sort(p)
    return parts


def primary_labels(multi_hot: np.ndarray) -> np.ndarray:
    """Each sample's rarest positive class (ties: lowest id); C for samples with no label."""
    freq = multi_hot.sum(axis=0)
    score = np.where(multi_hot > 0, freq[None, :], np.inf)
    prim = np.argmin(score, axis=1).astype(np.int64)
    prim[~(multi_hot > 0).any(axis=1)] = multi_hot.shape[1]
    return prim


@PARTITIONERS.register("multilabel_dirichlet")
def multilabel_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha: float = 0.5,
    min_size: int = 10,
    **_: object,
) -> list[np.ndarray]:
    """Label skew for multi-hot labels: `dirichlet` over each image's rarest positive label
    (so rare classes, not just "person", drive the skew). For IID use `iid`."""
    if labels.ndim != 2:
        raise ConfigError("data.partition=multilabel_dirichlet needs multi-label data; use dirichlet")
    return dirichlet(primary_labels(labels), num_clients, rng, alpha=alpha, min_size=min_size)


@PARTITIONERS.register("natural")
def natural(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    groups: np.ndarray | None = None,
    **_: object,
) -> list[np.ndarray]:
    """The dataset's own per-user split (FLAIR). With as many clients as users, client k is
    user k; with fewer, whole users are merged (largest first, onto the client with the
    fewest samples, random among ties) so no user's data is split."""
    if groups is None:
        raise ConfigError("data.partition=natural needs a dataset with a natural per-user split (flair)")
    groups = np.asarray(groups)
    ids, inverse, sizes = np.unique(groups, return_inverse=True, return_counts=True)
    if num_clients > len(ids):
        raise ConfigError(
            f"data.partition=natural: the data has {len(ids)} users, fewer than fl.num_clients={num_clients}"
        )
    order = np.argsort(inverse, kind="stable")
    members = np.split(order, np.cumsum(sizes)[:-1])  # sorted indices of each user
    if num_clients == len(ids):
        return members
    owner = np.empty(len(ids), dtype=np.int64)
    load = np.zeros(num_clients, dtype=np.int64)
    for g in np.lexsort((rng.random(len(ids)), -sizes)):
        k = int(np.lexsort((rng.random(num_clients), load))[0])
        owner[g] = k
        load[k] += sizes[g]
    return [
        np.sort(np.concatenate([members[g] for g in np.flatnonzero(owner == k)])) for k in range(num_clients)
    ]


def split_train_test(
    parts: list[np.ndarray], fraction: float, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-client train/test split (e.g. 75/25 for personalised protocols)."""
    train, test = [], []
    for idx in parts:
        perm = rng.permutation(idx)
        k = int(round(fraction * len(idx)))
        test.append(np.sort(perm[:k]))
        train.append(np.sort(perm[k:]))
    return train, test


def class_histogram(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """[num_clients, num_classes] sample counts (for multi-hot labels: samples per label)."""
    if labels.ndim == 2:
        return np.stack([labels[p].sum(axis=0).round().astype(np.int64) for p in parts])
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])
