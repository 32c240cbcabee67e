"""CReFF: Shang et al., "Federated Learning on Heterogeneous and Long-Tailed Data via
Classifier Re-Training with Federated Features", IJCAI 2022, https://arxiv.org/abs/2204.13399
(as CLIP2FL's code runs it).

Client, before local training, with the received FedAvg extractor (eval mode: BN running
statistics) and the server's re-trained classifier φ̂ = (W, b): for every class c it holds,
`grad_repeats` times, up to `grad_batch` images of c (DSA-augmented, `grad_augment=dsa`) give
∇_(W,b) CE(φ̂(f(x)), c); the mean over the repeats is g_c. Then plain local training of the
whole model (cross-entropy). Upload: weights, sample count, per-class counts and the g_c of
the classes present (`CReFFUpdate`).

Server: FedAvg; per class, the unweighted mean of the g_c of the clients holding c; the
persistent federated features V (m per class, N(0, 1) once) move by `match_steps` plain SGD
steps on Σ_c D(∇_(W,b) CE(φ̂(V_c), c), g_c) (CReFF's row-wise cosine distance, with φ̂ the
classifier the clients used); then a fresh Linear is trained on V (`retrain_epochs`) and
becomes φ̂. V and φ̂ are server state. The global model predicts with φ̂ on the FedAvg
extractor (`accuracy`); the FedAvg head is evaluated beside it (`fedavg_head/accuracy`).
Local training augments as `data.augment` says (CIFAR: `[random_crop, hflip]`; per image, where
the authors' code draws one crop and flip per batch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState, extend
from ..core.objective import ClientObjective, on_shared_features
from ..core.strategy import ServerContext, Strategy
from ..core.types import Metrics, StateDict
from ..data.dsa import dsa
from ..server_steps.federated_features import class_gradient, optimise_features, retrain_classifier
from .configs.creff import CReFFConfig


@dataclass
class CReFFState(ServerState):
    classifier_weight: Tensor | None = None  # φ̂: [C, d]
    classifier_bias: Tensor | None = None  # [C]
    features: Tensor | None = None  # V: [C·m, d], class c in rows c·m .. c·m + m − 1


@dataclass
class CReFFBroadcast(Broadcast):
    classifier_weight: Tensor | None = None  # φ̂, for the clients' gradients and for evaluation
    classifier_bias: Tensor | None = None


@dataclass
class CReFFUpdate(ClientUpdate):
    class_counts: Tensor | None = None  # [C] int64: local training examples per class
    grad_weight: Tensor | None = None  # [k, C, d]: g_c over W, for the k classes with count > 0
    grad_bias: Tensor | None = None  # [k, C]


def derived_generator(*seeds: int) -> torch.Generator:
    """A CPU generator seeded from a tuple of integers (independent streams by tag)."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence(list(seeds)).generate_state(1)[0]))


class CReFFObjective(ClientObjective[CReFFBroadcast]):
    def __init__(
        self,
        model: nn.Module,
        num_classes: int,
        grad_repeats: int = 10,
        grad_batch: int = 32,
        grad_augment: str = "dsa",
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.num_classes, self.grad_repeats, self.grad_batch = num_classes, grad_repeats, grad_batch
        self.grad_augment = grad_augment
        self._clf: tuple[Tensor, Tensor] | None = None
        self._grads: tuple[Tensor, Tensor, Tensor] | None = None
        self._seed = 0

    def begin_round(self, broadcast: CReFFBroadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        w, b = broadcast.classifier_weight, broadcast.classifier_bias
        self._clf = (w, b) if w is not None and b is not None else None
        self._grads = None
        self._seed = payload.seed if payload is not None else 0

    def before_fit(self, x: Tensor, y: Tensor) -> None:
        """Per-class classifier gradients on the received model, before local training."""
        if self._clf is None:
            raise ValueError("creff needs the server's classifier in the broadcast")
        self._grads = self.class_gradients(x, y)

    @torch.no_grad()
    def _features(self, x: Tensor) -> Tensor:
        return self.represent(x)

    def class_gradients(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(counts [C], grad_weight [k, C, d], grad_bias [k, C]) for the k classes present:
        the mean over `grad_repeats` draws of ∇_(W,b) CE(φ̂(f(x)), c), x up to `grad_batch`
        images of class c (augmented), the model in eval mode."""
        assert self._clf is not None
        dev = next(self.model.parameters()).device
        w, b = (t.to(dev) for t in self._clf)
        g = derived_generator(self._seed, 0xC4EF)
        counts = torch.bincount(y, minlength=self.num_classes)
        was_training = self.model.training
        self.model.eval()
        gws, gbs = [], []
        for c in torch.nonzero(counts).squeeze(1).tolist():
            idx = torch.nonzero(y == c).squeeze(1)
            acc_w, acc_b = torch.zeros_like(w), torch.zeros_like(b)
            for _ in range(self.grad_repeats):
                xb = x[idx[torch.randperm(len(idx), generator=g)[: self.grad_batch]]]
                if self.grad_augment == "dsa":
                    xb = dsa(xb, g)
                gw, gb = class_gradient(w, b, self._features(xb.to(dev)), c)
                acc_w, acc_b = acc_w + gw, acc_b + gb
            gws.append(acc_w / self.grad_repeats)
            gbs.append(acc_b / self.grad_repeats)
        self.model.train(was_training)
        d = w.shape[1]
        gw_all = torch.stack(gws).cpu() if gws else torch.zeros(0, self.num_classes, d)
        gb_all = torch.stack(gbs).cpu() if gbs else torch.zeros(0, self.num_classes)
        return counts, gw_all, gb_all

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        update = super().end_round(payload, num_examples)
        if self._grads is None:
            return update
        counts, gw, gb = self._grads
        return extend(update, CReFFUpdate, class_counts=counts, grad_weight=gw, grad_bias=gb)

    def retrained(self, z: Tensor) -> Tensor:
        """Logits of the server's re-trained classifier on the model's features `z`."""
        assert self._clf is not None
        w, b = self._clf
        return F.linear(z, w.to(z), b.to(z))

    def eval_heads(self) -> dict[str, Callable[[Tensor], Tensor]]:
        if self._clf is None:
            return super().eval_heads()
        return on_shared_features(self.represent, {"": self.retrained, "fedavg_head": self.classify})


def aggregate_class_gradients(
    updates: Sequence[ClientUpdate], num_classes: int, dim: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Per class, the unweighted mean of the uploaded g_c over the clients holding c:
    (present [C] bool, W-gradients [C, C, d], b-gradients [C, C]; zeros where absent)."""
    sum_w = torch.zeros(num_classes, num_classes, dim, dtype=torch.float64)
    sum_b = torch.zeros(num_classes, num_classes, dtype=torch.float64)
    holders = torch.zeros(num_classes, dtype=torch.float64)
    for u in updates:
        if not isinstance(u, CReFFUpdate) or u.class_counts is None or u.grad_weight is None:
            continue
        assert u.grad_bias is not None
        cls = torch.nonzero(u.class_counts).squeeze(1)
        sum_w[cls] += u.grad_weight.double()
        sum_b[cls] += u.grad_bias.double()
        holders[cls] += 1
    n = holders.clamp(min=1)
    return holders > 0, (sum_w / n[:, None, None]).float(), (sum_b / n[:, None]).float()


class CReFF(Strategy[CReFFConfig, CReFFState, CReFFBroadcast]):
    reads_each_update = "it reads each client's per-class classifier gradients"
    objective_cls: ClassVar[type[ClientObjective[Any]]] = CReFFObjective

    def objective_kwargs(self) -> dict[str, Any]:
        c = self.config
        return {
            "num_classes": self.task.num_classes,
            "grad_repeats": c.grad_repeats,
            "grad_batch": c.grad_batch,
            "grad_augment": c.grad_augment,
        }

    def init_state(self, global_params: StateDict | None) -> CReFFState:
        """φ̂ as PyTorch initialises a Linear(d, C), and V ~ N(0, 1), from the run seed."""
        # the model has a Linear `head` (`CReFFConfig.check_model` refused one without, before the run)
        assert global_params is not None and "head.weight" in global_params
        num_classes, d = global_params["head.weight"].shape
        g = derived_generator(self.seed, 0xFEA7)
        bound = 1.0 / float(d) ** 0.5
        w = (torch.rand(num_classes, d, generator=g) * 2 - 1) * bound
        b = (torch.rand(num_classes, generator=g) * 2 - 1) * bound
        v = torch.randn(num_classes * self.config.num_features, d, generator=g)
        return CReFFState(
            round=0, global_params=global_params, classifier_weight=w, classifier_bias=b, features=v
        )

    def broadcast(self, state: CReFFState, rnd: int) -> CReFFBroadcast:
        return CReFFBroadcast(
            round=rnd,
            global_params=state.global_params,
            classifier_weight=state.classifier_weight,
            classifier_bias=state.classifier_bias,
        )

    def contrastive(self) -> tuple[Tensor | None, float, float]:
        """(class-text prototypes [C, d], weight, temperature) of CLIP2FL's term; CReFF: none."""
        return None, 0.0, 0.1

    def server_update(
        self, state: CReFFState, updates: Sequence[ClientUpdate], ctx: ServerContext
    ) -> tuple[CReFFState, Metrics]:
        """Move the federated features (gradient matching with φ̂), re-train φ̂ on them.
        Metrics: the matching loss at the first step and with the final features, the
        classes matched, the re-training loss of the last epoch (CLIP2FL: the contrastive
        loss before/after too)."""
        c = self.config
        w, b, v = state.classifier_weight, state.classifier_bias, state.features
        assert w is not None and b is not None and v is not None
        dev = ctx.device
        present, real_w, real_b = aggregate_class_gradients(updates, w.shape[0], w.shape[1])
        text, pcl_weight, tau = self.contrastive()
        res = optimise_features(
            v.to(dev), w.to(dev), b.to(dev), real_w.to(dev), real_b.to(dev), present.to(dev),
            steps=c.match_steps, lr=c.feature_lr, with_bias=c.match_bias,
            text=text.to(dev) if text is not None else None, pcl_weight=pcl_weight, tau=tau,
        )  # fmt: skip
        g = derived_generator(int(ctx.rng.integers(2**62)), 0xC7F)
        new_w, new_b, crt_loss = retrain_classifier(
            res.features, w.shape[0], c.retrain_epochs, c.retrain_lr, c.retrain_batch_size, g
        )
        metrics: Metrics = {
            "match_loss_before": res.match_before,
            "match_loss_after": res.match_after,
            "classes_matched": int(present.sum()),
            "retrain_loss": crt_loss,
        }
        if pcl_weight > 0:
            metrics.update(contrastive_loss_before=res.pcl_before, contrastive_loss_after=res.pcl_after)
        new = dataclasses.replace(
            state, features=res.features.cpu(), classifier_weight=new_w.cpu(), classifier_bias=new_b.cpu()
        )
        return new, metrics

    def summary(self) -> dict[str, Any]:
        return super().summary() | {"federated_features": self.task.num_classes * self.config.num_features}
