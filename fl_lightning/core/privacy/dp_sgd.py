"""`privacy=dp_sgd`: sample-level DP-SGD inside each client through Opacus (Abadi et al. 2016):
per-example gradients from Opacus' hooks on the client's own model (`GradSampleHooks`: no
wrapper, so state-dict keys and the objective's hooks stay as they are), each clipped to L2
norm C, summed, N(0, (σC)²) added, divided by the batch size, then the client's optimiser step
(`DPOptimizer` around it). The noise comes from a generator seeded by the fit's seed (seed,
round, client), so serial == Ray and resume stay exact.

Accounting: Opacus' RDP accountant, per client (each example lives in one client's shard, and
only that client's steps touch it): a fit of s steps over n examples in batches of B composes
s subsampled Gaussians of rate q = B/n. The run reports the largest ε over the clients. The
batches are shuffled fixed-size batches (our resident shards), not Poisson draws, so the
accountant's Poisson model is the usual approximation (Opacus' own without `poisson_sampling`);
docs/privacy.md says so. Amplification by client sampling is not counted (conservative).

What Opacus cannot do is refused in one line: batch norm (its statistics mix examples), a
client objective other than FedAvg's (its extra terms have no per-example gradient here).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from ..aggregation import AggregationStep, Contribution
from ..chain import STEP_NAMES
from .accountant import SampleLevelAccountant

if TYPE_CHECKING:
    from ..strategy import ServerContext

__all__ = ["DpSgdLedger", "attach_per_sample_hooks", "dp_optimizer", "model_refusal", "steps_of_fit"]

NAME = "dp_sgd"
STEP_NAMES.add(NAME)


def model_refusal(model: nn.Module, name: str) -> str | None:
    """One line saying why Opacus cannot compute per-example gradients of `model`, or None."""
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if not errors:
        return None
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if norms:
        return (
            f"privacy=dp_sgd: model {name} has batch norm ({type(norms[0]).__name__}), whose statistics mix "
            "the examples of a batch, so per-example gradients do not exist: use model=cnn or a model "
            "with GroupNorm"
        )
    return f"privacy=dp_sgd: Opacus cannot take model {name}: {str(errors[0]).splitlines()[0]}"


def attach_per_sample_hooks(model: nn.Module) -> Any:
    """Opacus' per-example gradient hooks on `model` itself (each parameter gets `grad_sample`
    after a backward pass); returns the hooks' owner, which must stay alive while they are used."""
    from opacus.grad_sample import GradSampleHooks

    for m in model.modules():  # an in-place activation would overwrite what the hooks hold
        if isinstance(getattr(m, "inplace", None), bool):
            m.inplace = False  # type: ignore[assignment]  # nn.ReLU's flag; same numbers
    return GradSampleHooks(model, batch_first=True, loss_reduction="mean", strict=True)


def dp_optimizer(
    noise_multiplier: float, clip: float, batch_size: int, seed: int
) -> Callable[[torch.optim.Optimizer], torch.optim.Optimizer]:
    """Wraps a client's optimiser in Opacus' `DPOptimizer`: per-example clipping to `clip`,
    Gaussian noise σ·C on the sum, the mean over `batch_size` (the batch loss is a mean)."""
    from opacus.optimizers import DPOptimizer

    def wrap(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        wrapped: torch.optim.Optimizer = DPOptimizer(
            optimizer,
            noise_multiplier=noise_multiplier,
            max_grad_norm=clip,
            expected_batch_size=batch_size,
            loss_reduction="mean",
            generator=torch.Generator().manual_seed(seed),
        )
        return wrapped

    return wrap


def steps_of_fit(n: int, batch_size: int, epochs: int, steps: int | None) -> int:
    """Optimizer steps of one fit over `n` examples (the host's `fit_batches`, counted)."""
    whole, rest = divmod(n, batch_size)
    per_epoch = whole + (1 if rest and not (rest == 1 and n > 1) else 0)
    if per_epoch == 0:
        return 0
    return per_epoch * epochs if steps is None else steps


@functools.lru_cache(maxsize=4096)
def _epsilon(noise_multiplier: float, rate: float, steps: int, delta: float) -> float:
    acc = SampleLevelAccountant("rdp")
    acc.step(noise_multiplier, rate, steps)
    return acc.epsilon(delta)


@dataclass(frozen=True)
class DpSgdLedger(AggregationStep):
    """The chain's record of DP-SGD: each update's client and its fit's steps, in the step's
    memory (`{"steps": {client: steps so far}, "sizes": {client: n}}`), checkpointed. It
    changes nothing of the mean (the privacy happened in the clients)."""

    name: ClassVar[str] = NAME
    noise_multiplier: float
    batch_size: int
    epochs: int
    local_steps: int | None
    delta: float
    smallest_shard: int = 0  # the fewest examples any client holds (the budget check's fresh client)

    @property
    def needs_deltas(self) -> bool:
        return False

    def one(self, c: Contribution, memory: dict[str, Any], ctx: ServerContext | None) -> Contribution:
        n = int(c.weight)  # the example count, before any reweighting
        key = str(c.client_id)  # JSON keys in the checkpoint
        steps, sizes = memory.setdefault("steps", {}), memory.setdefault("sizes", {})
        steps[key] = int(steps.get(key, 0)) + self.fit_steps(n)
        sizes[key] = n
        return c

    def epsilon(self, memory: dict[str, Any], more: bool = False) -> float:
        """The largest ε over the clients that trained; `more`: as if each trained once more,
        and a client that never did (the smallest shard: the largest rate) trained once."""
        steps, sizes = memory.get("steps", {}), memory.get("sizes", {})
        runs = [(int(n), int(steps[key])) for key, n in sizes.items()]
        if more:
            runs = [(n, s + self.fit_steps(n)) for n, s in runs]
            if self.smallest_shard > 0:
                runs.append((self.smallest_shard, self.fit_steps(self.smallest_shard)))
        worst = 0.0
        for n, s in runs:
            rate = min(1.0, self.batch_size / max(n, 1))
            worst = max(worst, _epsilon(self.noise_multiplier, rate, s, self.delta))
        return worst

    def fit_steps(self, n: int) -> int:
        return steps_of_fit(n, self.batch_size, self.epochs, self.local_steps)

    def describe(self) -> dict[str, Any]:
        return {"name": NAME, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}
