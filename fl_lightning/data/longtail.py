"""Long-tailed subsets (Cui et al. 2019 exponential profile), shared by the `*_lt`
datasets and the `longtail` partitioner."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ..core.errors import ConfigError


def longtail_counts(counts: ArrayLike, imbalance_factor: float) -> np.ndarray:
    """Cui et al. 2019 exponential profile: n_c = floor(n_max * (1/IF)^(c/(C-1))), class 0
    the head, n_max the largest class; never more than a class has. Applying it to data
    already long-tailed by the same factor keeps every sample."""
    n = np.asarray(counts, dtype=np.int64)
    c = len(n)
    if imbalance_factor < 1:
        raise ConfigError(f"data.imbalance_factor must be >= 1 (got {imbalance_factor})")
    if c < 2 or imbalance_factor == 1:
        return n.copy()
    n_max = int(n.max())
    target = np.array([int(n_max * (1.0 / imbalance_factor) ** (i / (c - 1.0))) for i in range(c)])
    return np.minimum(n, np.maximum(target, 1))


def longtail_indices(labels: np.ndarray, imbalance_factor: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of a long-tailed subset of `labels` (random samples within each class)."""
    num_classes = int(labels.max()) + 1 if len(labels) else 0
    counts = np.bincount(labels, minlength=num_classes)
    keep = longtail_counts(counts, imbalance_factor)
    chosen = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in enumerate(keep)]
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)
