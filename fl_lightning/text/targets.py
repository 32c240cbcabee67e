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

Inside coarse groups (`GROUP_TARGETS`, given the classes' groups; FedLGT's E4 controls):
- `permuted_within`: the text under a seeded derangement inside each group (the group-level
  structure kept, meaning inside a group gone).
- `group_only`: unit vectors a·w + b_g·u_g + c_g·e_c over orthonormal w (shared by all), u_g (one
  a group) and e_c (one a class), with a^2 the text's mean cosine between groups and a^2 + b_g^2
  its mean cosine inside group g: the text's block structure on average, nothing inside a group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..core.checks import GROUP_TARGETS, TARGETS, check_targets
from ..core.errors import ConfigError

__all__ = ["GROUP_TARGETS", "TARGETS", "check_targets", "class_targets", "derangement", "group_targets"]


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


def within_group_derangement(groups: Sequence[int], seed: int) -> torch.Tensor:
    """A permutation of range(len(groups)) that moves every class to another class of its own
    group (a seeded derangement inside each group); one ConfigError line when a group has a
    single class."""
    g = torch.tensor(list(groups))
    perm = torch.arange(len(g))
    for k, group in enumerate(sorted(set(g.tolist()))):
        members = torch.nonzero(g == group).flatten()
        if len(members) < 2:
            raise ConfigError(f"coarse group {group} has one class: no permutation inside it moves it")
        perm[members] = members[derangement(len(members), seed * 1000 + k)]
    return perm


def group_targets(kind: str, text: torch.Tensor, seed: int, groups: Sequence[int] | None) -> torch.Tensor:
    """`permuted_within` or `group_only` (module doc) from the text [C, d] and each class's
    coarse group; unit-norm rows for `group_only`."""
    check_targets(kind, extra=GROUP_TARGETS)
    c, d = text.shape
    if groups is None or len(groups) != c:
        raise ConfigError(f"method.targets={kind} needs the classes' coarse groups (fmnist_digits20's)")
    if kind == "permuted_within":
        return text[within_group_derangement(groups, seed)].clone()
    ids = sorted(set(groups))
    if d < 1 + len(ids) + c:
        raise ConfigError(f"method.targets=group_only needs dimension >= {1 + len(ids) + c} (text: {d})")
    u = F.normalize(text.double(), dim=-1)
    cos = u @ u.T
    g = torch.tensor(list(groups))
    same = g[:, None] == g[None, :]
    off = ~torch.eye(c, dtype=torch.bool)
    between = float(cos[~same].mean()) if bool((~same).any()) else 0.0
    a2 = max(between, 0.0)
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, 1 + len(ids) + c, generator=gen, dtype=torch.float64))
    w, us, es = q[:, 0], q[:, 1 : 1 + len(ids)], q[:, 1 + len(ids) :]
    out = torch.empty(c, d, dtype=torch.float64)
    for k, group in enumerate(ids):
        inside = (g == group)[:, None] & (g == group)[None, :] & off
        within = float(cos[inside].mean()) if bool(inside.any()) else a2
        b2 = min(max(within - a2, 0.0), 1.0 - a2)
        for i in torch.nonzero(g == group).flatten().tolist():
            out[i] = a2**0.5 * w + b2**0.5 * us[:, k] + (1.0 - a2 - b2) ** 0.5 * es[:, i]
    return out.to(text.dtype)


def unit_norm(x: torch.Tensor) -> bool:
    """Whether every row of `x` has norm 1 (to float32 precision)."""
    return bool(torch.allclose(x.float().norm(dim=-1), torch.ones(x.shape[0]), atol=1e-4))


def class_targets(
    kind: str, text: torch.Tensor, seed: int, groups: Sequence[int] | None = None
) -> torch.Tensor:
    """The class targets [C, d] for the switch `kind`, from the text features `text` [C, d].
    `seed` draws the permutation and the random vectors (the run's seed: a resumed run gets
    the same). Unit-norm text gives unit-norm targets for every kind. `groups`: each class's
    coarse group, for the kinds inside groups (`GROUP_TARGETS`)."""
    if kind in GROUP_TARGETS:
        return group_targets(kind, text, seed, groups)
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
