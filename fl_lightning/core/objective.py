"""`ClientObjective`: the local objective of a method, as a LightningModule.

It defines the loss and nothing else: no loops, devices, sampling or Ray. The Trainer
owns the loop; the host (serial or Ray actor) owns data, the client's resident state and
the round protocol:

    objective.client_state = <the client's resident state>  # a dict the objective may update
    objective.begin_round(broadcast, payload)   # load global and personal weights
    objective.before_fit(x, y)                  # optional pass over the local data
    for phase in objective.phases():            # one Lightning fit per phase
        trainer(phase).fit(objective, loader)
    update = objective.end_round(payload, n)    # what leaves the client; may update client_state

Objectives are reused across rounds and across clients of the same architecture, so
`begin_round` must set every piece of state the round depends on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar, cast

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from .batched import MaskedStep
from .messages import Broadcast, ClientPayload, ClientUpdate
from .metrics import EvalSpec, TaskMetrics
from .optim import OptimConfig, OptimizerName
from .params import to_cpu
from .types import ClientState, StateDict

BroadcastT = TypeVar("BroadcastT", bound=Broadcast)

#: the component of `ClientState` holding the parameters that never leave the client
PERSONAL = "personal"
#: state-dict key endings of batch-norm running statistics
BN_STAT_KEYS = ("running_mean", "running_var", "num_batches_tracked")

#: a model state entry's part in the federation (`ClientObjective.role`)
Role = Literal["shared", "personal", "frozen"]


def is_weight(key: str, value: torch.Tensor) -> bool:
    """A learned weight: a floating tensor that is not a batch-norm statistic (what server
    momentum, mixing and sampling act on; the statistics take the plain average)."""
    return value.is_floating_point() and not key.endswith(BN_STAT_KEYS)


class Backbone(Protocol):
    """The backbone contract of `models/`: features, then the head on them."""

    def forward_features(self, x: torch.Tensor) -> torch.Tensor: ...

    def forward_head(self, z: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class Phase:
    """One Lightning fit of a client's local training.

    Attributes:
        name: shows in logs and in `ClientObjective.phase`.
        trainable: which parameters (by `model` parameter name) this phase updates; None:
            leave `requires_grad` as `begin_round` set it.
        optim: this phase's optimiser; None: the run's `optim.*`.
        epochs, steps: this phase's length; both None: the run's `fl.local_epochs` /
            `fl.local_steps`.
        grad_clip: max global L2 norm of the gradients; None: the optimiser's `grad_clip`.
    """

    name: str = "local"
    trainable: Callable[[str], bool] | None = None
    optim: OptimConfig | None = None
    epochs: int | None = None
    steps: int | None = None
    grad_clip: float | None = None


@contextlib.contextmanager
def trainable_only(model: nn.Module, keep: Callable[[str], bool] | None) -> Iterator[None]:
    """Within the block only parameters with `keep(name)` have requires_grad; restored after."""
    if keep is None:
        yield
        return
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.requires_grad_(before[n] and keep(n))
    try:
        yield
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(before[n])


def with_params(model: nn.Module, params: StateDict) -> Callable[[torch.Tensor], torch.Tensor]:
    """`model`'s forward with other weights (`params`, moved to the input's device), leaving
    the module's own untouched: a personalised method's "global" evaluation head."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.func.functional_call(
            model, {k: t.to(x.device) for k, t in params.items()}, (x,)
        )
        return out

    return forward


def on_shared_features(
    represent: Callable[[torch.Tensor], torch.Tensor],
    heads: dict[str, Callable[[torch.Tensor], torch.Tensor]],
) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Evaluation heads over one representation: `evaluate` calls every head on the same batch
    object in turn, so the backbone runs once per batch, not once per head (CReFF and CCVR
    score the FedAvg head and their re-trained one on the same features)."""
    last: list[torch.Tensor | None] = [None, None]

    def on(head: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        def scores(x: torch.Tensor) -> torch.Tensor:
            if last[0] is not x:
                last[0], last[1] = x, represent(x)
            z = last[1]
            assert z is not None
            return head(z)

        return scores

    return {name: on(head) for name, head in heads.items()}


def build_optimizer(params: list[nn.Parameter], optim: OptimConfig) -> torch.optim.Optimizer:
    if optim.name == "sgd":
        return torch.optim.SGD(params, lr=optim.lr, momentum=optim.momentum, weight_decay=optim.weight_decay)
    if optim.name == "adam":
        return torch.optim.Adam(params, lr=optim.lr, weight_decay=optim.weight_decay)
    if optim.name == "adamw":
        return torch.optim.AdamW(params, lr=optim.lr, weight_decay=optim.weight_decay)
    raise ValueError(f"unknown optimizer {optim.name!r}; valid: adam, adamw, sgd")


class ClientObjective(L.LightningModule, Generic[BroadcastT]):
    """Cross-entropy on a backbone's logits (FedAvg's objective); methods override hooks.

    Override `loss_terms` to change the loss, `is_personal` to keep parameters local,
    `on_before_optimizer_step` for gradient corrections, `step` for an optimiser step that
    needs more than one forward and backward pass (SAM), `phases` for several fits,
    `before_fit` for a pass over the local data, `end_round` to send more,
    `eval_heads` for several named evaluations of one model.
    """

    #: `runtime.batched`: this class's client step is `masked_terms` (and `epoch_sums`) under
    #: plain SGD. Read from the class's own body: a subclass that changes the step declares it anew.
    batched_step: ClassVar[bool] = True

    def __init__(
        self,
        model: nn.Module,
        lr: float = OptimConfig.lr,  # the optimiser's defaults are OptimConfig's (one source)
        momentum: float = OptimConfig.momentum,
        weight_decay: float = OptimConfig.weight_decay,
        optimizer: OptimizerName = OptimConfig.name,
        grad_clip: float | None = OptimConfig.grad_clip,
    ) -> None:
        super().__init__()
        self.model = model
        self.optim = OptimConfig(
            name=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay, grad_clip=grad_clip
        )
        self.phase = Phase()
        self._term_sums: dict[str, torch.Tensor] = {}
        self._loss_sum: torch.Tensor | None = None
        self._loss_count = 0
        self._first_pass = True  # `step`: only a step's first pass counts toward train_loss
        #: this client's training examples per class, set by the host before each round
        #: (FedLC's calibration, prototype counts); None where labels are not single-class.
        self.class_counts: torch.Tensor | None = None
        #: the running client's resident state, set by the host before `begin_round`;
        #: `end_round` writes what must survive to the next round into it.
        self.client_state: ClientState = {}
        #: what evaluations measure, set by the host (and the driver) from the task
        self.eval_spec: EvalSpec | None = None
        #: `fl.bn_stats=local`: batch-norm running statistics stay with their client
        self.local_bn_stats = False
        self.batch_features: torch.Tensor = torch.empty(0)
        #: with `data.augment`: training batches arrive as (augmented x, y, clean x), for a term
        #: that looks at the un-augmented image (CLIP2FL's teacher); else (augmented x, y)
        self.clean_view = False
        #: set by the host for one fit (`privacy=dp_sgd`): what the optimiser is wrapped in
        self.optimizer_wrapper: Callable[[torch.optim.Optimizer], torch.optim.Optimizer] | None = None

    # the run's optimiser settings, by their old names (objectives and tests read them)
    @property
    def lr(self) -> float:
        return self.optim.lr

    @property
    def momentum(self) -> float:
        return self.optim.momentum

    @property
    def optimizer_name(self) -> str:
        return self.optim.name

    def represent(self, x: torch.Tensor, model: nn.Module | None = None) -> torch.Tensor:
        """The representation a method aligns or compares (MOON, prototypes); `model`
        defaults to the client's own (MOON passes its frozen global/previous copies)."""
        m = cast(Backbone, model if model is not None else self.model)
        return m.forward_features(x)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """Class logits from a representation."""
        return cast(Backbone, self.model).forward_head(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores (logits); evaluation reads these."""
        return self.classify(self.represent(x))

    # --- round protocol -------------------------------------------------------------
    def is_personal(self, key: str) -> bool:
        """Parameters (by `model.state_dict()` key) that stay with their client."""
        return False

    def role(self, key: str) -> Role:
        """What the engine does with the model's state entry `key`: `shared` (uploaded, averaged,
        broadcast, in the global model's checkpoint), `personal` (kept in the client's resident
        state: `is_personal`, or batch-norm statistics under `fl.bn_stats=local`) or `frozen`
        (never trained, uploaded, broadcast or checkpointed: every copy of the model builds it
        the same way, from its weights file; a large pretrained tower). Frozen entries are
        those under the model's `frozen_prefixes` (a tuple of key prefixes, `()` by default),
        and those its `frozen_key(key)` says are (a model whose trained entries are scattered
        through frozen modules: LoRA adapters, `models/clip_lora.py`)."""
        if key.startswith(tuple(getattr(self.model, "frozen_prefixes", ()))):
            return "frozen"
        frozen_key = getattr(self.model, "frozen_key", None)
        if frozen_key is not None and frozen_key(key):
            return "frozen"
        return "personal" if self._kept(key) else "shared"

    def model_state(self) -> StateDict:
        """The model's state without its frozen entries: what the federation sees of a model
        (the global weights a run starts from, a client's own model kept between rounds)."""
        return {k: v for k, v in self.model.state_dict().items() if self.role(k) != "frozen"}

    def begin_round(self, broadcast: BroadcastT, payload: ClientPayload | None) -> None:
        if broadcast.global_params is not None:
            self.load_params(broadcast.global_params)
        personal = self.client_state.get(PERSONAL)
        if personal:
            self.load_params(personal)
        self._term_sums, self._loss_sum, self._loss_count = {}, None, 0
        self.phase = Phase()

    def load_params(self, params: StateDict) -> None:
        """Copy `params` into the model; keys absent from `params` keep their values."""
        missing = set(params) - set(self.model.state_dict())
        if missing:
            raise KeyError(f"unknown parameter keys: {sorted(missing)[:5]}")
        self.model.load_state_dict(params, strict=False)

    def _kept(self, key: str) -> bool:
        return self.is_personal(key) or (self.local_bn_stats and key.endswith(BN_STAT_KEYS))

    def shared_params(self) -> StateDict:
        return {k: v for k, v in self.model.state_dict().items() if self.role(k) == "shared"}

    def personal_params(self) -> StateDict:
        return {k: v for k, v in self.model.state_dict().items() if self.role(k) == "personal"}

    def phases(self) -> list[Phase]:
        """The local training, in order; one phase = one Lightning fit. Default: one."""
        return [Phase()]

    def before_fit(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """A pass over the client's local data before the first phase (e.g. per-class
        gradients); the objective is already on its device, `x`, `y` are on the CPU."""

    def train_metrics(self) -> dict[str, float]:
        """Local-training metrics: `train_loss` (sample-weighted over every step of every
        phase) and `loss/<term>` per named loss term."""
        n = max(self._loss_count, 1)
        out = {"train_loss": float(self._loss_sum) / n if self._loss_sum is not None else 0.0}
        out.update({f"loss/{k}": float(v) / n for k, v in self._term_sums.items()})
        return out

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        """The update to upload; personal parameters go to `client_state` instead."""
        personal = self.personal_params()
        shared = self.shared_params()
        if personal:
            self.client_state[PERSONAL] = to_cpu(personal)
        return ClientUpdate(
            client_id=payload.client_id,
            num_examples=num_examples,
            params=to_cpu(shared) if shared else None,
            metrics=self.train_metrics(),
        )

    # --- training -------------------------------------------------------------------
    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Named loss terms, summed by `training_step`. Mixins add terms after `super()`
        and may read `self.batch_features`, the batch's representation."""
        x, y = batch
        z = self.represent(x)
        self.batch_features = z
        return {"ce" if y.dim() == 1 else "bce": self.task_loss(self.classify(z), y)}

    def task_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy for class ids; binary cross-entropy per label for multi-hot targets."""
        if y.dim() == 2:
            return F.binary_cross_entropy_with_logits(logits, y.to(logits.dtype))
        return F.cross_entropy(logits, y)

    def eval_loss(self, scores: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Sum over the batch of each sample's task loss (evaluation's `loss` is its mean)."""
        if y.dim() == 2:
            return (
                F.binary_cross_entropy_with_logits(scores, y.to(scores.dtype), reduction="none").mean(1).sum()
            )
        return F.cross_entropy(scores, y, reduction="sum")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        terms = self.loss_terms(batch)
        loss = torch.stack(list(terms.values())).sum()
        if not self._first_pass:  # a further pass of `step` (SAM's at w + e): not the batch's loss
            return loss
        n = len(batch[1])
        # accumulated on the device, read once in end_round: no host sync per step
        step = loss.detach().double() * n
        self._loss_sum = step if self._loss_sum is None else self._loss_sum + step
        for k, v in terms.items():
            t = v.detach().double() * n
            self._term_sums[k] = self._term_sums[k] + t if k in self._term_sums else t
        self._loss_count += n
        return loss

    def step(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The gradients of one optimiser step. `closure()` zeroes the gradients, runs
        `training_step` on the step's batch at the current weights, back-propagates and returns
        the loss; the optimiser then steps on the gradients left when this returns (clipped
        first with `optim.grad_clip`). Default: one pass. A two-pass method (SAM) calls it,
        moves the weights, calls it again and moves them back; only the first pass counts
        toward `train_loss`. No manual optimisation: Lightning's loop, precision and
        clipping stay as they are."""
        return closure()

    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
    ) -> None:
        """Lightning's hook: the optimiser steps on what `step` leaves."""
        passes = 0

        def closure() -> torch.Tensor:
            nonlocal passes
            self._first_pass, passes = passes == 0, passes + 1
            try:
                out: torch.Tensor = optimizer_closure()
            finally:
                self._first_pass = True
            return out

        optimizer.step(closure=lambda: self.step(closure))

    # --- runtime.batched: the same step as a pure function of the weights ----------------
    def masked_terms(self, step: MaskedStep) -> dict[str, torch.Tensor]:
        """`loss_terms` on one client's padded batch, as masked means (`core/batched.py`). Pure:
        it runs under `vmap(grad(...))` over clients, so it reads from `self` only what is the
        same for every client of the round (the broadcast's, set by `begin_round`/`on_train_start`)."""
        y = step.y
        if y.dim() == 2:
            per = F.binary_cross_entropy_with_logits(step.logits, y.to(step.logits.dtype), reduction="none")
            return {"bce": step.mean(per.mean(1))}
        return {"ce": step.mean(F.cross_entropy(step.logits, y, reduction="none"))}

    def epoch_sums(self, step: MaskedStep) -> dict[str, torch.Tensor]:
        """Sums over a step's examples (padding weighs 0) that the host adds up over each local
        epoch, from zero at every epoch's start; `end_batched` gets the last epoch's. Default: none."""
        return {}

    def end_batched(
        self, loss_sum: torch.Tensor, term_sums: dict[str, torch.Tensor], count: int,
        epoch_sums: dict[str, torch.Tensor],
    ) -> None:  # fmt: skip
        """After batched training, with this client's trained weights loaded: what the fit's
        `training_step`s (and hooks) would have left for `end_round` to read."""
        self._loss_sum, self._term_sums, self._loss_count = loss_sum, dict(term_sums), count

    def batched_refusal(self) -> str | None:
        """Why this objective, as configured, cannot train batched (one line); None: it can."""
        return None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        optimizer = build_optimizer(params, self.phase.optim or self.optim)
        # privacy=dp_sgd: the host wraps it (Opacus' per-example clipping and noise) for one fit
        return optimizer if self.optimizer_wrapper is None else self.optimizer_wrapper(optimizer)

    # --- evaluation -------------------------------------------------------------------
    def eval_heads(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        """Named ways to score inputs; each is evaluated and logged under its name
        (`""`: the plain keys `accuracy`, `loss`; `"fedavg_head"`: `fedavg_head/accuracy`)."""
        return {"": self.forward}


class OwnModelObjective(ClientObjective[BroadcastT]):
    """A client that keeps its whole own model between rounds (`client_state[own_key]`) and
    blends in the received global one (FedPHP, FedALA). After `begin_round` the model holds
    the client's own weights (what its evaluation scores; a client seen for the first time:
    the global ones) and `global_params` the round's global model, evaluated beside it as the
    `global` head; `end_round` keeps the trained model as the client's own."""

    own_key = "own_model"  # the client_state entry; each method names its own

    def __init__(self, model: nn.Module, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.global_params: StateDict = {}

    def begin_round(self, broadcast: BroadcastT, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)  # the model holds the global weights
        self.global_params = {k: v.detach().clone() for k, v in self.model_state().items()}
        own = self.client_state.get(self.own_key)
        if own is not None:
            self.load_params(own)

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        self.client_state[self.own_key] = to_cpu(self.model_state())
        return super().end_round(payload, num_examples)

    def eval_heads(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        """`""`: the client's own model; `"global"`: the round's global model."""
        return {"": self.forward, "global": with_params(self.model, self.global_params)}


class Rows(Protocol):
    """What `evaluate` scores: a tensor, or images normalised a slice at a time as they are
    scored (`data.registry.StoredImages`: no float copy of a whole test set)."""

    def __len__(self) -> int: ...

    def __getitem__(self, rows: slice, /) -> torch.Tensor: ...


@torch.no_grad()
def evaluate(
    objective: ClientObjective[BroadcastT],
    x: Rows,
    y: torch.Tensor,
    spec: EvalSpec,
    batch_size: int = 1000,
    scores_out: list[torch.Tensor] | None = None,
) -> dict[str, float]:
    """Every named evaluation of `objective` on (x, y): the metrics of `spec` and the mean
    task loss. Restores the training mode. `scores_out`, if given, receives the main head's
    scores (CPU, one tensor per batch): what `eval.save_predictions` writes."""
    was_training = objective.training
    objective.eval()
    device = next(objective.parameters()).device
    heads = objective.eval_heads()
    metrics = {name: TaskMetrics(spec, device) for name in heads}
    loss_sums = dict.fromkeys(heads, 0.0)
    for i in range(0, len(y), batch_size):
        xb, yb = x[i : i + batch_size].to(device), y[i : i + batch_size].to(device)
        for name, head in heads.items():
            scores = head(xb)
            loss_sums[name] += float(objective.eval_loss(scores, yb))
            metrics[name].update(scores, yb)
            if scores_out is not None and name == "":
                scores_out.append(scores.detach().cpu())
    objective.train(was_training)
    out: dict[str, float] = {}
    n = max(len(y), 1)
    for name in heads:
        prefix = f"{name}/" if name else ""
        out.update({f"{prefix}{k}": v for k, v in metrics[name].compute().items()})
        out[f"{prefix}loss"] = loss_sums[name] / n
    return out
