"""FedPGP: Cui et al., "Harmonizing Generalization and Personalization in Federated Prompt
Learning", ICML 2024, https://arxiv.org/abs/2405.09771.

Each client's CoOp context is a global part σ, averaged by the server, plus a low-rank
personal part U V (U: n_ctx × r, V: r × width, both N(0, 0.02²)) that never leaves the
client. Clients classify with the personalised prompt σ + U V and train on

    CE(scale · cos(image, text(σ + U V)), y)
    + mu · mean_c CE([cos(h0_c, hσ_c), cos(hσ_c, hp_c)] / temp, 0),

the second, prompt-wise contrastive term pulling the global prompt's class features hσ_c
toward those of the prompt as written, h0_c (nothing learnt: CLIP's own knowledge), and
pushing them from the personalised prompt's, hp_c. All features are L2-normalised.

Authors' code (github:TianyuCuiOvO/FedPGP @ba16025): `trainers/fedpgp.py` (`PromptLearner`:
`sigma`, `U`, `V` from N(0, 0.02²), ctx = U V + sigma; `CustomCLIP.forward`: the three text
features, `text_features_0` from the buffer `embedding`, the tokenised "X X ... X {class}.";
`FedPGP.forward_backward`: the loss above, `posi`/`nega` through `CosineSimilarity`, target 0),
`federated_main.py` (`--model FedPGP`: `prompt_learner.sigma` averaged by
`fed_utils.py::average_weights`, weighted by the clients' examples; `U`, `V` kept per client
and loaded with the new σ in every client's next round and evaluation; defaults `--temp 0.5`,
`--num_prompt 1`), `scripts/plot_ours_cifar100.sh`, `plot_few_shot.sh`,
`plot_basetonew_base.sh` (bottleneck 8, mu 0.5, lr 0.001, n_ctx 16: our defaults; the
argparse default of `--mu` is 1, that of `--bottleneck` 4). With `model.ctx_init` set, σ
starts from those words and h0 is the handwritten prompt (the paper's "hand-crafted prompt";
the authors' code builds no U, V in that branch). Where we differ: their round 0 trains every
client (here `fl.fraction` in every round); `--num_prompt 2` (one script: a second set of C
prompts scored as extra classes) is not supported; fp16 and Dassl's schedule are left out, as
for PromptFL. Under `data.base_new` clients train on the base classes' prompts only, as their
`plot_basetonew_base.sh` (`SUBSAMPLE_CLASSES base`) does. Evaluation: `""` the personalised
prompt, `global` σ alone (same images).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.messages import Broadcast, ClientPayload, ServerState
from ..core.objective import on_shared_features
from .configs.fedpgp import FedPGPConfig
from .prompting import PromptObjective, PromptStrategy

#: the model's client-kept parameters (models/clip_prompt.py, `low_rank`)
PERSONAL_KEYS = ("lowrank_u", "lowrank_v")


def contrastive(written: Tensor, glob: Tensor, personal: Tensor, temp: float) -> Tensor:
    """The prompt-wise contrastive loss over classes: positive cos(h0, hσ), negative
    cos(hσ, hp), each row's target the positive. Features [C, d], L2-normalised."""
    posi, nega = (written * glob).sum(-1), (glob * personal).sum(-1)
    logits = torch.stack([posi, nega], dim=1) / temp
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))


class FedPGPObjective(PromptObjective[Broadcast]):
    def __init__(self, model: torch.nn.Module, mu: float = 0.5, temp: float = 0.5, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.mu, self.temp = float(mu), float(temp)
        self._written: Tensor | None = None  # h0: fixed, computed once per device

    def is_personal(self, key: str) -> bool:
        return key in PERSONAL_KEYS  # U and V never leave their client

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        self._written = None  # (the objective may have moved since)

    def written(self) -> Tensor:
        m: Any = self.model
        if self._written is None or self._written.device != m.prompt.ctx.device:
            self._written = m.written_text_features()
        return self._written

    def loss_terms(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        """Under `data.base_new` both terms see the base classes only (the authors'
        `SUBSAMPLE_CLASSES base` leaves the new class names out of training)."""
        x, y = batch
        m: Any = self.model
        z = self.represent(x)
        k = self.trained_classes
        held = None if k is None else torch.tensor(k, dtype=torch.long, device=y.device)
        personal, glob = m.text_features(held), m.text_features(held, low_rank=False)
        target = y if held is None else torch.searchsorted(held, y)  # the labels among the held
        terms = {"ce": F.cross_entropy(m.logit_scale * z @ personal.T, target)}
        if self.mu:
            written = self.written() if held is None else self.written()[held]
            terms["con"] = self.mu * contrastive(written, glob, personal, self.temp)
        return terms

    def eval_heads(self) -> dict[str, Callable[[Tensor], Tensor]]:
        """`""`: the personalised prompt σ + U V; `"global"`: σ alone, on the same images."""
        m: Any = self.model
        return on_shared_features(
            self.represent,
            {"": self.classify, "global": lambda z: m.logit_scale * z @ m.text_features(low_rank=False).T},
        )


class FedPGP(PromptStrategy[FedPGPConfig, ServerState, Broadcast]):
    objective_cls = FedPGPObjective

    def objective_kwargs(self) -> dict[str, Any]:
        return {"mu": self.config.mu, "temp": self.config.temp, "trained_classes": self.trained_classes()}

    def model_kwargs(self, model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        return super().model_kwargs(model, {**kwargs, "low_rank": self.config.rank})
