"""Oracle class targets: vectors whose image alignment is known, the positive control for the
text-target methods (experiment E6 of the science review, `conf/reproduce/controls_fedglcl_oracle.yaml`).

The oracle of class c is the mean of the model's own inputs (for `fmnist_digits20_eff`: the
frozen EfficientNet-Lite0 features, standardised as the model sees them) over HELD-OUT training
images, the indices from `holdout_from` on that no client holds (Fashion-MNIST's 55,000+ and
scikit-learn's digits there). The 20 means are centred and written in their own principal axes,
padded with zeros to the text dimension: PCA to `dim`, which keeps the Gram matrix of the
centred means exactly (they span at most C - 1 dimensions). What any encoder, CLIP included,
could add through the geometry of the targets is bounded by what this one adds.

Kinds (`method.targets`):
- `oracle`: those vectors.
- `oracle_permuted`: the same vectors under the run seed's derangement, the one `permuted` uses
  on text (so `oracle - oracle_permuted` and `text - permuted` share their permutation).
- `oracle_permuted_within`: a derangement inside each coarse group (clothing, digits): the
  group-level alignment stays, the alignment inside a group is gone.
- `oracle_half`: 1/2 normalised oracle + 1/2 orthonormal vectors orthogonal to the oracle's
  span, renormalised: every cosine of the oracle halved (the dose-response's middle point).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..core.checks import ORACLE_TARGETS
from ..core.errors import ConfigError
from .targets import derangement, within_group_derangement

__all__ = [
    "ORACLE_TARGETS",
    "held_out_class_means",
    "oracle_targets",
    "pca_keep_gram",
    "within_group_derangement",
]


def held_out_class_means(ds: Any, holdout_from: int) -> tuple[torch.Tensor, list[int]]:
    """Each class's mean input (normalised, flattened; float64 [C, D]) over the training images
    of `ds` (a `data.registry.ArrayDataset` with every training image) from `holdout_from` on,
    and the number of images per class. One ConfigError line when the hold-out is empty or
    misses a class."""
    n, c = len(ds.train_y), ds.num_classes
    if ds.multilabel:
        raise ConfigError(f"method.targets=oracle needs single-label data ({ds.name} is multi-label)")
    if not 0 <= holdout_from < n:
        raise ConfigError(
            f"method.oracle_holdout_from={holdout_from}: {ds.name} has {n} training images, "
            "none held out there"
        )
    y = np.asarray(ds.train_y[holdout_from:])
    counts = np.bincount(y, minlength=c).tolist()
    if min(counts) == 0:
        missing = [k for k in range(c) if counts[k] == 0]
        raise ConfigError(
            f"the oracle's hold-out (training images {holdout_from}+) has no image of classes {missing}"
        )
    sums = torch.zeros(c, 0, dtype=torch.float64)
    for i in range(holdout_from, n, 2000):  # in chunks: float32 images of a large hold-out
        x, yb = ds.tensors(ds.train_x[i : i + 2000], ds.train_y[i : i + 2000])
        x = x.flatten(1).double()
        if sums.shape[1] == 0:
            sums = torch.zeros(c, x.shape[1], dtype=torch.float64)
        sums.index_add_(0, yb, x)
    return sums / torch.tensor(counts, dtype=torch.float64)[:, None], counts


def pca_keep_gram(means: torch.Tensor, dim: int) -> torch.Tensor:
    """The centred rows of `means` [C, D] in their principal axes, zero-padded or cut to `dim`
    columns: float64 [C, dim] whose Gram matrix is the centred means' (exactly, to rounding)
    when their rank (<= C - 1) fits in `dim`."""
    centred = means.double() - means.double().mean(0, keepdim=True)
    u, s, _ = torch.linalg.svd(centred, full_matrices=False)
    rank = int((s > s[0] * 1e-10).sum()) if len(s) and s[0] > 0 else 0
    if rank > dim:
        raise ConfigError(
            f"the {means.shape[0]} centred class means span {rank} dimensions; the text has {dim}"
        )
    coords = u[:, :rank] * s[:rank]  # = centred @ V: the same Gram matrix
    out = torch.zeros(means.shape[0], dim, dtype=torch.float64)
    out[:, :rank] = coords
    return out


def oracle_targets(
    kind: str, oracle: torch.Tensor, seed: int, groups: Sequence[int] | None = None
) -> torch.Tensor:
    """The class targets [C, d] float32 for the oracle `kind` (module doc) from the oracle
    vectors `oracle` [C, d] (`pca_keep_gram`'s). `groups`: each class's coarse group
    (`oracle_permuted_within` needs them)."""
    if kind not in ORACLE_TARGETS:
        raise ConfigError(f"method.targets={kind!r} is not one of: {', '.join(ORACLE_TARGETS)}")
    c, d = oracle.shape
    if kind == "oracle":
        out = oracle
    elif kind == "oracle_permuted":
        out = oracle[derangement(c, seed)]
    elif kind == "oracle_permuted_within":
        if groups is None or len(groups) != c:
            raise ConfigError(
                "method.targets=oracle_permuted_within needs the classes' coarse groups (fmnist_digits20's)"
            )
        out = oracle[within_group_derangement(groups, seed)]
    else:  # oracle_half: orthonormal vectors in the orthogonal complement of the oracle's span
        u, s, _ = torch.linalg.svd(oracle.double().T, full_matrices=False)  # [d, C]: the span's basis
        basis = u[:, : int((s > s[0] * 1e-10).sum())]
        if d - basis.shape[1] < c:
            need = c + basis.shape[1]
            raise ConfigError(f"{c} vectors orthogonal to the oracle need dimension >= {need} (got {d})")
        gen = torch.Generator().manual_seed(seed)
        r = torch.randn(d, c, generator=gen, dtype=torch.float64)
        q, _ = torch.linalg.qr(r - basis @ (basis.T @ r))
        out = F.normalize(0.5 * F.normalize(oracle.double(), dim=-1) + 0.5 * q.T, dim=-1)
    return out.float().contiguous()
