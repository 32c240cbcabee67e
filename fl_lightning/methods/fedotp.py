"""FedOTP: Li et al., "Global and Local Prompts Cooperation via Optimal Transport for Federated
Learning", CVPR 2024, https://arxiv.org/abs/2403.00041.

Each client holds two CoOp contexts on frozen CLIP: a global one, averaged by the server, and
a local one that never leaves the client. An image's patch tokens (M of them, projected into
the joint space) are matched to the two prompts' class text by unbalanced optimal transport:
for image b and class c, with sim[m, n] = cos(token m, text of class c under prompt n),

    T = diag(u) K diag(v),  K = exp(-(1 - sim) / eps),  from  u = min(1 / (K' v), 1),
        v = 1 / (K'' u)  with K' = M·K, K'' = (N / top_percent)·Kᵀ, iterated from u = v = 1
        until mean |Δv| < thresh (at most max_iter), without gradient;
    logit[b, c] = scale · Σ_mn T[m, n] sim[m, n].

Authors' code (github:HongxiaLee/FedOTP @9948611): `trainers/GLP_OT.py` (`CustomCLIP.forward`,
`entropic_COT_fast`: the iteration above, `OT=COT`), `federated_main.py` (the global context
`ctx[:avg_prompt]` averaged by `utils/fed_utils.py::average_weights`, weighted by the clients'
examples; `ctx[avg_prompt:]` kept per client), `scripts/fedotp_cifar100.sh` (N = 2 prompts of
4 vectors, top_percent 0.8, eps 0.1, thresh 1e-3, max_iter 100, lr 0.001). Where we differ:
their round 0 trains every client (here `fl.fraction` in every round); fp16 and Dassl's
schedule are left out, as for PromptFL. Needs a ViT image tower (its patch tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..core.messages import Broadcast, ServerState
from ..core.strategy import MethodConfig
from . import METHODS
from .prompting import PromptObjective, PromptStrategy


@dataclass
class FedOTPConfig(MethodConfig):
    name: str = "fedotp"
    top_percent: float = 0.8  # mass the prompts' side of the plan carries (COT)
    eps: float = 0.1  # entropic regularisation
    thresh: float = 1e-3  # stop when the mean change of v falls below
    max_iter: int = 100

    def __post_init__(self) -> None:
        if not 0 < self.top_percent <= 1 or self.eps <= 0 or self.max_iter < 1:
            raise ConfigError("method.top_percent must be in (0, 1], method.eps > 0, method.max_iter >= 1")


@torch.no_grad()
def cot_plan(sim: Tensor, top_percent: float, eps: float, thresh: float, max_iter: int) -> Tensor:
    """The unbalanced transport plan [..., M, N] between M tokens (mass 1/M each) and N prompts
    (mass top_percent/N each) for similarities `sim` [..., M, N] (`entropic_COT_fast`)."""
    m, n = sim.shape[-2], sim.shape[-1]
    k = torch.exp(-(1.0 - sim) / eps)
    kp, kq = k * m, k.transpose(-1, -2) * (n / top_percent)  # diag(1/a) K, diag(1/b) Kᵀ
    u, v = torch.ones_like(sim[..., 0]), torch.ones_like(sim[..., 0, :])
    for _ in range(max_iter):
        v0 = v
        u = torch.minimum(1.0 / (kp @ v.unsqueeze(-1)).squeeze(-1), torch.ones_like(u))
        v = 1.0 / (kq @ u.unsqueeze(-1)).squeeze(-1)
        if float((v - v0).abs().mean()) < thresh:
            break
    return u.unsqueeze(-1) * k * v.unsqueeze(-2)


class FedOTPObjective(PromptObjective[Broadcast]):
    def __init__(
        self, model: torch.nn.Module, top_percent: float = 0.8, eps: float = 0.1, thresh: float = 1e-3,
        max_iter: int = 100, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(model, **kwargs)
        self.ot = (float(top_percent), float(eps), float(thresh), int(max_iter))

    def is_personal(self, key: str) -> bool:
        return key.startswith("local_prompt.")  # the local context never leaves its client

    def classify(self, z: Tensor) -> Tensor:
        """OT logits [B, C] from patch tokens `z` [B, M, d]."""
        m: Any = self.model
        text = torch.stack([m.prompt()[:, 0], m.local_prompt()[:, 0]], dim=-1)  # [C, d, N]
        sim = torch.einsum("bmd,cdn->bcmn", z, text)
        plan = cot_plan(sim, *self.ot)
        return m.logit_scale * (plan * sim).sum(dim=(-2, -1))


@METHODS.register("fedotp")
class FedOTP(PromptStrategy[FedOTPConfig, ServerState, Broadcast]):
    name = "fedotp"
    objective_cls = FedOTPObjective
    personalised = True  # each client's (global, local) pair, on its own test split

    @classmethod
    def check_run(cls, config: FedOTPConfig, run: dict[str, Any]) -> None:
        super().check_run(config, run)
        import open_clip

        from ..text.encoders import _register_open_clip_configs

        arch = str((run.get("model") or {}).get("arch"))
        vision = (open_clip.get_model_config(_register_open_clip_configs(arch)) or {}).get("vision_cfg", {})
        if isinstance(vision.get("layers"), (list, tuple)) or vision.get("timm_model_name"):
            raise ConfigError(
                f"method=fedotp matches ViT patch tokens: model.arch={arch} is no open_clip ViT "
                "(use e.g. model.arch=ViT-B-16)"
            )

    def model_kwargs(self, model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        return super().model_kwargs(model, {**kwargs, "local_prompt": True, "image_tokens": True})
