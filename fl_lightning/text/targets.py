"""Controls for the class targets of the text-using methods (FedGLCL, FedTSP, FedLGT, CLIP2FL,
FedDTR): one switch, `method.targets`, tells fixed targets, text geometry and text meaning apart.

- `text`: the encoder's class features (the method as published).
- `permuted`: the same vectors, the class-to-vector assignment shuffled by a seeded derangement
  (no class keeps its own): the Gram matrix is unchanged, the meaning is gone.
- `orthogonal`: orthonormal vectors (no geometry).
- `uniform`: normalised `torch.rand` (mean cosine ~0.75: the papers' correlated "random tensors";
  normalised `randn` would be near-orthogonal in 384 dimensions).
- `centred`: text minus its class mean (the encoder's anisotropy removed), renormalised when the
  text was unit-norm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.checks import TARGETS, check_targets
from ..core.errors import ConfigError

__all__ = ["TARGETS", "check_targets", "class_targets", "derangement"]


def derangement(n: int, seed: int) -> torch.Tensor:
    """A seeded permutation of range(n) with no fixed point (n >= 2): drawn uniformly by
    rejection (about e tries on average), so every derangement is equally likely."""
    if n < 2:
        raise ConfigError(f"a permutation without fixed points needs >= 2 classes (got {n})")
    g = torch.Generator().manual_seed(seed)
    idx = torch.arange(n)
    while True:
        perm = torch.randperm(n, generator=g)
        if not bool((perm == idx).any()):
            return perm


def unit_norm(x: torch.Tensor) -> bool:
    """Whether every row of `x` has norm 1 (to float32 precision)."""
    return bool(torch.allclose(x.float().norm(dim=-1), torch.ones(x.shape[0]), atol=1e-4))


def class_targets(kind: str, text: torch.Tensor, seed: int) -> torch.Tensor:
    """The class targets [C, d] for the switch `kind`, from the text features `text` [C, d].
    `seed` draws the permutation and the random vectors (the run's seed: a resumed run gets
    the same). Unit-norm text gives unit-norm targets for every kind."""
    check_targets(kind)
    if kind == "text":
        return text
    if kind == "permuted":
        return text[derangement(text.shape[0], seed)].clone()
    if kind == "centred":
        out = text - text.mean(0, keepdim=True)
        return F.normalize(out, dim=-1) if unit_norm(text) else out
    g = torch.Generator().manual_seed(seed)
    if kind == "uniform":
        return F.normalize(torch.rand(text.shape, generator=g), dim=-1).to(text.dtype)
    c, d = text.shape  # orthogonal
    if c > d:
        raise ConfigError(f"{c} orthogonal class vectors need dimension >= classes (text dimension {d})")
    q, _ = torch.linalg.qr(torch.randn(d, c, generator=g))
    return q.T.contiguous().to(text.dtype)


def mean_cosine(x: torch.Tensor) -> float:
    """The mean off-diagonal cosine between the rows of `x`."""
    u = F.normalize(x.double(), dim=-1)
    c = u.shape[0]
    gram = u @ u.T
    return float((gram.sum() - gram.diagonal().sum()) / (c * (c - 1)))


def class_similarity_rsa(
    text: torch.Tensor, features: torch.Tensor, labels: torch.Tensor, classes: list[int] | None = None
) -> tuple[float, int]:
    """Spearman rank correlation, over class pairs (of `classes`, default all), between the
    cosine of the classes' text vectors and the cosine of their mean `features` [N, D]: the
    pre-check of whether text geometry mirrors visual geometry (about 0: expect text =
    permuted). Returns (rho, number of pairs)."""
    from scipy.stats import spearmanr

    keep = list(range(text.shape[0])) if classes is None else list(classes)
    means = torch.stack([features[labels == c].double().mean(0) for c in keep])
    t, v = F.normalize(text[keep].double(), dim=-1), F.normalize(means, dim=-1)
    iu = torch.triu_indices(len(keep), len(keep), 1)
    ts, vs = (t @ t.T)[iu[0], iu[1]], (v @ v.T)[iu[0], iu[1]]
    rho = spearmanr(ts.numpy(), vs.numpy()).statistic
    return float(rho), int(ts.numel())
