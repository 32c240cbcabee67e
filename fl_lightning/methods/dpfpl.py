"""DP-FPL: Tran et al., "Privacy-Preserving Personalized Federated Prompt Learning for Multimodal
Large Language Models", ICLR 2025, https://arxiv.org/abs/2501.13904.

Each client's CoOp context is a global prompt G, shared, plus a local prompt L that never
leaves the client. Every step, L is factorised afresh into a low-rank part and a residual by
one power iteration from a random Gaussian V₀ [width, r]:

    U = orth(L V₀),  V = orth(Lᵀ U)ᵀ,  R = L − U V   (orth: Gram-Schmidt over the columns)

and the client classifies with G + U V + R (= G + L; R carries no gradient). With
`method.noise` > 0 the step then clips each of grad G, grad U and grad V to L2 norm C
(`method.norm_thresh`, one norm over the whole tensor, per batch) and adds N(0, s²) to grad U
and grad V (the authors' local DP), s = √(R_total · ln(1/δ)) / noise · C / B with δ = 1e-5,
R_total = `fl.rounds` and B the fit's batch size. L moves along the full gradient of the
factorisation, (g_U V + U g_V + U Uᵀ g_U V) with g = grad/10 (their `compute_full_grad`); G
along its own (clipped) gradient.

Authors' code (github:linhhtran/DP-FPL @cce8e7b): `trainers/DP_FPL.py` (`factorize_ctx`,
`orthogonalize`, `compute_full_grad`, `PromptLearner.forward` for `dpfpl`, `forward_pass`:
the clip and noise above, `build_model`: s), `federated_main.py` (every client, every batch:
the global gradients averaged over all clients, noise of std s/K added to the mean, each
client stepping on it; defaults rank 8, norm-thresh 10, lr 0.001, n_ctx 16).

Where we differ, on purpose, so that the global prompt's privacy is accounted: their server
averages one batch's global gradients and adds noise whose σ they set from the rounds alone
(each round's many batches are not composed: no accountant; their clip is per batch, so the
sensitivity to one example is not C/B). Here the global prompt trains locally for the fit and
goes through the aggregation chain: uniform mean of the uploads (their Σ/K), and under
`privacy=dp_fedavg` (required with `method.noise` > 0) each upload's delta clipped, Gaussian
noise on the mean and dp-accounting's user-level ε (docs/privacy.md). With `fl.local_steps=1`
and plain SGD a round is their batch step: the delta is −lr · the clipped gradient, so
`privacy.clip` = lr · C gives their clip. The local noise is theirs and has no ε here: the local
prompt is never released (docs/privacy.md). Their forward factorises in evaluation too (G + U V
+ R with a fresh V₀); here evaluation scores G + L, equal up to rounding. The factorisation's V₀
and the local noise come from a generator seeded by the fit's seed (theirs: the global RNG).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ..core.aggregation import Uniform
from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState
from ..core.objective import on_shared_features
from ..core.strategy import ServerContext
from .configs.dpfpl import DpFplConfig
from .prompting import PromptObjective, PromptStrategy

#: the authors' δ in the local noise's σ (`build_model`: `delta = 1e-5`)
LOCAL_DELTA = 1e-5
#: their `compute_full_grad` divides both factors' gradients by 10
FULL_GRAD_SCALE = 10.0


def gram_schmidt(a: Tensor) -> Tensor:
    """`a` with orthonormal columns, each normalised then projected out of the later ones
    (the authors' `orthogonalize`, on a copy)."""
    a = a.clone()
    for i in range(a.shape[1]):
        col = a[:, i : i + 1]
        col /= torch.sqrt(torch.sum(col**2))
        if i + 1 < a.shape[1]:
            rest = a[:, i + 1 :]
            rest -= torch.sum(col * rest, dim=0) * col
    return a


@torch.no_grad()
def factorise(local: Tensor, rank: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """(U [n_ctx, r], V [r, width], R = L − U V): one power iteration from N(0, 1) (`factorize_ctx`)."""
    v0 = torch.randn(local.shape[1], rank, generator=gen).to(local)
    u = gram_schmidt(local @ v0)
    v = gram_schmidt(local.T @ u).T
    return u, v, local - u @ v


def full_grad(u: Tensor, v: Tensor, gu: Tensor, gv: Tensor) -> Tensor:
    """The local prompt's gradient from its factors' (`compute_full_grad`)."""
    gu, gv = gu / FULL_GRAD_SCALE, gv / FULL_GRAD_SCALE
    gu_v = gu @ v
    return gu_v + u @ gv + u @ (u.T @ gu_v)


def clip_(g: Tensor, bound: float) -> None:
    """`g` scaled in place to L2 norm at most `bound` (the whole tensor's norm)."""
    norm = float(g.norm(2))
    if norm > bound:
        g.mul_(bound / norm)


def local_noise_std(noise: float, rounds: int, clip: float, batch: int) -> float:
    """The authors' s = √(rounds · ln(1/δ)) / noise · C / B (`build_model`; q = 1); 0 without noise."""
    if noise <= 0:
        return 0.0
    return math.sqrt(rounds * math.log(1 / LOCAL_DELTA)) / noise * clip / batch


class DpFplObjective(PromptObjective[Broadcast]):
    def __init__(
        self, model: torch.nn.Module, rank: int = 8, norm_thresh: float = 10.0, noise: float = 0.0,
        rounds: int = 1, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(model, **kwargs)
        self.rank, self.clip = int(rank), float(norm_thresh)
        self.noise, self.rounds = float(noise), int(rounds)
        self._gen = torch.Generator()
        self._factors: tuple[Tensor, Tensor, Tensor] | None = None  # (U, V, R) of the step running
        self._batch = 0  # the fit's batch size (its first, largest batch)
        self._last_batch = 0  # the size of the batch the step's closure ran on

    def is_personal(self, key: str) -> bool:
        return key.startswith("local_prompt.")  # the local prompt never leaves its client

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        self._gen.manual_seed(0 if payload is None else int(payload.seed))
        self._batch = 0

    def context(self, local: bool = True) -> Tensor:
        """The context the text tower reads: G + U V + R inside a step, G + L outside it;
        `local=False`: G alone."""
        m: Any = self.model
        if not local:
            return m.prompt.ctx
        if self._factors is not None:
            u, v, residual = self._factors
            return m.prompt.ctx + u @ v + residual
        return m.prompt.ctx + m.local_prompt.ctx

    def classify(self, z: Tensor, local: bool = True) -> Tensor:
        m: Any = self.model
        return m.logit_scale * z @ m.prompt(ctx=self.context(local))[:, 0].T

    def step(self, closure: Callable[[], Tensor]) -> Tensor:
        m: Any = self.model
        local = m.local_prompt.ctx
        u, v, residual = factorise(local.detach(), self.rank, self._gen)
        u.requires_grad_(True)
        v.requires_grad_(True)
        self._factors = (u, v, residual)
        try:
            loss = closure()
        finally:
            self._factors = None
        assert u.grad is not None and v.grad is not None
        if self.noise > 0:
            self._batch = self._batch or self._last_batch
            std = local_noise_std(self.noise, self.rounds, self.clip, self._batch)
            if m.prompt.ctx.grad is not None:
                clip_(m.prompt.ctx.grad, self.clip)
            for g in (u.grad, v.grad):
                clip_(g, self.clip)
                g += std * torch.randn(g.shape, generator=self._gen).to(g)
        local.grad = full_grad(u.detach(), v.detach(), u.grad, v.grad).to(local.dtype)
        return loss

    def loss_terms(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        self._last_batch = len(batch[1])
        return super().loss_terms(batch)

    def eval_heads(self) -> dict[str, Callable[[Tensor], Tensor]]:
        """`""`: the personalised prompt G + L; `"global"`: G alone, on the same images."""
        return on_shared_features(
            self.represent, {"": self.classify, "global": lambda z: self.classify(z, local=False)}
        )


class DpFpl(PromptStrategy[DpFplConfig, ServerState, Broadcast]):
    objective_cls = DpFplObjective

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # their server's Σ/K over the clients (set here, not per round: under secure aggregation
        # the clients weigh their own updates); privacy=dp_fedavg's chain weighs uniformly too
        self.aggregator = self.aggregator.after(Uniform())

    def objective_kwargs(self) -> dict[str, Any]:
        c, rounds = self.config, max(self.task.rounds, 1)  # the local noise's σ is set for the run's rounds
        return {"rank": c.rank, "norm_thresh": c.norm_thresh, "noise": c.noise, "rounds": rounds}

    def model_kwargs(self, model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        return super().model_kwargs(model, {**kwargs, "local_prompt": True})

    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> ServerState:
        return self.average(state, updates, ctx)
