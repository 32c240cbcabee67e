"""`FederatedSplit`: which training (and test) samples each client holds.

`make_split` runs a partitioner (seeded by the run seed) and, given a `cache_dir`, caches
the result in `<cache_dir>/<hash>.npz`, keyed by a hash of everything that decides it:
the dataset's name and labels (content hash), the partitioner and its options, the number
of clients, the seed and the per-client test fraction. Any change gives a new key (a miss);
files are written atomically. A cache hit is checked like a fresh split (every index in
range, none twice, every client present): an unreadable or inconsistent file is rebuilt,
with a warning, and overwritten, so a broken cache never stops a run.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import ConfigError
from .cache import atomic_savez, load_npz
from .partition import PARTITIONERS, class_histogram, split_train_test
from .protocols import assign_personal
from .registry import ArrayDataset, load_from_config

if TYPE_CHECKING:
    from ..core.run_config import DataConfig, RootConfig

log = logging.getLogger("fl_lightning")
PARTITION_CACHE_VERSION = 1


@dataclass
class FederatedSplit:
    train: list[np.ndarray]  # per client, indices into dataset.train_x
    test: list[np.ndarray] = field(default_factory=list)  # per client, also into train_x
    partition: str = ""
    options: dict[str, Any] = field(default_factory=dict)  # scalar options that made it
    key: str = ""  # the cache key (hash of the partition config)
    from_cache: bool = False

    @property
    def num_clients(self) -> int:
        return len(self.train)

    def client_domains(self, dataset: ArrayDataset) -> list[int] | None:
        """Each client's (majority) domain id, for datasets with domains."""
        if dataset.train_domains is None:
            return None
        out = []
        for p in self.train:
            d = dataset.train_domains[p]
            out.append(int(np.bincount(d).argmax()) if len(d) else -1)
        return out

    def stats(self, dataset: ArrayDataset) -> dict:
        hist = class_histogram(dataset.train_y, self.train, dataset.num_classes)
        out: dict[str, Any] = {
            "dataset": dataset.name,
            "partition": self.partition,
            "options": self.options,
            "num_clients": self.num_clients,
            "class_names": dataset.class_names,
            "multilabel": dataset.multilabel,
            "train_sizes": [int(len(p)) for p in self.train],
            "train_class_histogram": hist.tolist(),
        }
        if self.test:
            out["test_sizes"] = [int(len(p)) for p in self.test]
        assigned = sum(len(p) for p in self.train) + sum(len(p) for p in self.test)
        out["unassigned"] = int(len(dataset.train_y) - assigned)  # > 0 only for `longtail`
        if dataset.train_domains is not None:
            out["domain_names"] = dataset.domain_names
            out["client_domains"] = self.client_domains(dataset)
            n_dom = max(
                len(dataset.domain_names),
                int(dataset.train_domains.max()) + 1 if len(dataset.train_domains) else 0,
            )
            out["train_domain_histogram"] = [
                np.bincount(dataset.train_domains[p], minlength=n_dom).tolist() for p in self.train
            ]
        if dataset.class_sets:  # a composite (`data=coop_multi`): each client's images per member
            out["class_sets"] = [[name, int(c)] for name, c in dataset.class_sets]
            ends = np.cumsum([c for _, c in dataset.class_sets])
            out["train_sizes_per_dataset"] = [
                [int(n) for n in np.add.reduceat(row, np.r_[0, ends[:-1]])] for row in hist
            ]
        if dataset.standin:
            out["standin"] = dataset.standin
        return out


def _digest(a: np.ndarray) -> str:
    a = np.ascontiguousarray(a)
    return hashlib.sha256(f"{a.dtype}|{a.shape}|".encode() + a.tobytes()).hexdigest()[:20]


def partition_key(
    dataset: ArrayDataset,
    partition: str,
    num_clients: int,
    seed: int,
    client_test_fraction: float,
    options: dict,
) -> str:
    """A hash of everything that decides a split."""
    opts = {
        k: ({"sha256": _digest(v)} if isinstance(v, np.ndarray) else v) for k, v in sorted(options.items())
    }
    desc = {
        "version": PARTITION_CACHE_VERSION,
        "dataset": dataset.name,
        "labels": _digest(dataset.train_y),
        "partition": partition,
        "num_clients": int(num_clients),
        "seed": int(seed),
        "client_test_fraction": float(client_test_fraction),
        "options": opts,
    }
    return hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _check(parts: list[np.ndarray], n: int, partition: str) -> None:
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if len(flat) and (flat.min() < 0 or flat.max() >= n or len(np.unique(flat)) != len(flat)):
        raise RuntimeError(f"partition {partition!r} assigned a sample twice or out of range (a bug)")


def _cache_problem(
    z: dict[str, np.ndarray], key: str, num_clients: int, n: int, with_test: bool
) -> str | None:
    """Why a cached split cannot be used as it is (None: it can): another key, clients
    missing, arrays that are not 1-D integer indices, indices out of range or repeated."""
    if "key" not in z or z["key"].shape != () or str(z["key"]) != key:
        return "holds another split (key mismatch)"
    names = [f"train_{k}" for k in range(num_clients)]
    names += [f"test_{k}" for k in range(num_clients)] if with_test else []
    absent = [m for m in names if m not in z]
    if absent:
        return f"has no {absent[0]}"
    arrays = [z[m] for m in names]
    if any(a.ndim != 1 or not np.issubdtype(a.dtype, np.integer) for a in arrays):
        return "holds arrays that are not 1-D integer indices"
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
    if len(flat) and (int(flat.min()) < 0 or int(flat.max()) >= n):
        return f"holds indices outside [0, {n})"
    if len(np.unique(flat)) != len(flat):
        return "assigns a sample twice"
    return None


def _load_cached(
    path: Path, key: str, num_clients: int, n: int, with_test: bool
) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """The cached split at `path`, checked as a fresh one is (`_check`); None (rebuild) when
    the file is absent, unreadable or inconsistent, with a warning for the latter two."""
    z = load_npz(path)  # warns itself when unreadable
    if z is None:
        return None
    why = _cache_problem(z, key, num_clients, n, with_test)
    if why is not None:
        log.warning("partition cache %s %s; rebuilding it", path, why)
        return None
    train = [z[f"train_{k}"].astype(np.int64) for k in range(num_clients)]
    test = [z[f"test_{k}"].astype(np.int64) for k in range(num_clients)] if with_test else []
    return train, test


def make_split(
    dataset: ArrayDataset,
    partition: str,
    num_clients: int,
    seed: int,
    client_test_fraction: float = 0.0,
    cache_dir: str | Path | None = None,
    **options: object,
) -> FederatedSplit:
    """Partition `dataset`'s training set over `num_clients` clients. Domain ids and natural
    users of the dataset are passed to the partitioner as `domains=` / `groups=`."""
    if num_clients > len(dataset.train_y):
        raise ConfigError(f"fl.num_clients={num_clients} exceeds the {len(dataset.train_y)} training samples")
    fn = PARTITIONERS.get(partition)
    personal = dataset.train_personal  # the clients' own test pool (data.personal_*)
    if personal is not None and client_test_fraction > 0:
        raise ConfigError(
            "data.personal_shots / personal_from_test give the clients their own test images already; "
            "set data.client_test_fraction=0"
        )
    # the partitioner sees the training images only; its indices are mapped back below
    pick = np.flatnonzero(~personal) if personal is not None else np.arange(len(dataset.train_y))
    opts: dict[str, Any] = dict(options)
    if dataset.train_domains is not None:
        opts.setdefault("domains", dataset.train_domains[pick])
    if dataset.train_groups is not None:
        opts.setdefault("groups", dataset.train_groups[pick])
    if dataset.class_sets:  # a composite's members: a class partition cuts each on its own
        opts.setdefault("class_sets", tuple(n for _, n in dataset.class_sets))
    named = inspect.signature(fn).parameters
    scalars = {k: v for k, v in sorted(options.items()) if k in named and not isinstance(v, np.ndarray)}
    keyed = opts if personal is None else {**opts, "personal": personal.astype(np.uint8)}
    key = partition_key(dataset, partition, num_clients, seed, client_test_fraction, keyed)
    path = Path(cache_dir).expanduser() / f"{key}.npz" if cache_dir is not None else None
    with_test = client_test_fraction > 0 or personal is not None
    if path is not None:
        hit = _load_cached(path, key, num_clients, len(dataset.train_y), with_test)
        if hit is not None:
            return FederatedSplit(hit[0], hit[1], partition, scalars, key, from_cache=True)
    rng = np.random.default_rng([seed, 0xDA7A])
    parts = [pick[np.asarray(p, dtype=np.int64)] for p in fn(dataset.train_y[pick], num_clients, rng, **opts)]
    if len(parts) != num_clients:
        raise RuntimeError(
            f"partition {partition!r} returned {len(parts)} clients, not {num_clients} (a bug)"
        )
    _check(parts, len(dataset.train_y), partition)
    if personal is not None:
        train, test = parts, assign_personal(dataset.train_y, parts, np.flatnonzero(personal), rng)
        _check(train + test, len(dataset.train_y), partition)
    elif client_test_fraction > 0:
        train, test = split_train_test(parts, client_test_fraction, rng)
    else:
        train, test = parts, []
    if path is not None:
        arrays = {f"train_{k}": p for k, p in enumerate(train)}
        arrays.update({f"test_{k}": p for k, p in enumerate(test)})
        arrays["key"] = np.asarray(key)
        atomic_savez(path, arrays)
    return FederatedSplit(train, test, partition, scalars, key)


def partition_options(data: DataConfig) -> dict[str, Any]:
    """The partitioner options a `data` config section carries."""
    return {
        "alpha": float(data.alpha),
        "min_size": int(data.min_size),
        "classes_per_client": int(data.classes_per_client),
        "imbalance_factor": float(data.imbalance_factor),
    }


def partition_cache_dir(data: DataConfig) -> Path | None:
    """Where splits (and their plots) are cached; None with `data.cache_partitions=false`."""
    if not data.cache_partitions:
        return None
    return Path(str(data.root)).expanduser() / ".partitions"


def split_from_config(dataset: ArrayDataset, cfg: RootConfig) -> FederatedSplit:
    """The split a run config asks for (cached under `<data.root>/.partitions/`)."""
    d = cfg.data
    return make_split(
        dataset, d.partition, int(cfg.fl.num_clients), int(cfg.seed),
        client_test_fraction=float(d.client_test_fraction), cache_dir=partition_cache_dir(d),
        **partition_options(d),
    )  # fmt: skip


def prepare_data(cfg: RootConfig) -> tuple[ArrayDataset, FederatedSplit]:
    """Load the dataset and split it, as `fl-lightning run` does."""
    dataset = load_from_config(cfg.data)
    return dataset, split_from_config(dataset, cfg)
