"""The golden-test kit: test a method against its formulas written out, independently of the
code under test, over two rounds with partial participation, in float32 and in float64.

- data: `three_clients()` (scikit-learn's digits, real and tiny: 3 clients of 70, 50 and 40
  examples, `SIZES3`), `two_clients()` (2 clients of 70 and 50);
- the engine's side: `two_rounds(name, data, **method_kwargs)` runs a registered method's
  strategy and a real `ClientHost` (the worker's code, Lightning's Trainer) on `Toy` (64 → 8
  with batch norm → 10), 2 clients a round: round 1 trains clients 0 and 1, round 2 clients 0
  and 2 (client 0 brings its state, client 2 starts fresh, client 1 sits out);
- the reference, written out: `train` / `manual_fit` (the same local SGD as a plain PyTorch
  loop, same seeds), `example_mean` and `written_mean` (the example-weighted mean by hand, in
  float64), `cast`, `ce`, `sd`;
- the comparison: `twin(fn)` runs a reference `fn(dtype)` in float32 and float64 on one thread
  (as the engine's fits run), and `match(got, twin_result)` checks the engine's tensors within
  `f32_tolerances`: 16× the float32 reference's own rounding error plus 4 ulps, from the
  arithmetic of this computation on the machine running it, never one machine's numbers.

Imports torch, Lightning and the package's core; never Ray or W&B. Importing it registers the
model `toy`. `docs/architecture.md` ("Golden-test it") shows a method's test written with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from .core.aggregation import Aggregator
from .core.messages import RoundPlan, ServerState
from .core.method import MethodConfig
from .core.optim import OptimConfig
from .core.params import to_cpu
from .core.strategy import (
    ServerContext,
    Strategy,
    TaskInfo,
    aggregate_with,
    aggregated,
    round_rng,
    server_rng,
)
from .data.registry import ArrayDataset, load_dataset
from .methods import METHODS
from .models import MODELS
from .runtime.host import ClientHost, ClientSpec, torch_threads

__all__ = [
    "BS", "EPS32", "LR", "MOM", "SIZES3", "Toy", "cast", "ce", "check", "client_data", "ctx", "example_mean",
    "f32_tolerances", "manual_fit", "match", "sd", "three_clients", "toy_spec", "train", "twin",
    "two_clients", "two_rounds", "rounds_1_and_2", "written_mean",
]  # fmt: skip

#: the local training of every golden test: SGD at this learning rate (momentum MOM where a
#: test uses momentum, 0 in `two_rounds`), batches of BS
LR, MOM, BS = 0.1, 0.9, 16
EPS32 = torch.finfo(torch.float32).eps  # 2^-23
#: the clients of `three_clients`, by size
SIZES3 = {0: 70, 1: 50, 2: 40}

Params = dict[str, torch.Tensor]
Data = tuple[ArrayDataset, dict[int, np.ndarray]]
T = TypeVar("T")


class Toy(nn.Module):
    """64 → 8 (BN, ReLU) → 10: small enough to check by hand, has BN for FedBN."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.feature_dim = 8
        self.head = nn.Linear(8, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def forward_head(self, f: torch.Tensor) -> torch.Tensor:
        return self.head(f)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


if "toy" not in MODELS:
    MODELS.register("toy")(Toy)


def two_clients() -> Data:
    """scikit-learn's digits as 2 clients with different label mixes and sizes (70, 50)."""
    ds = load_dataset("digits", "")
    return ds, {0: np.flatnonzero(ds.train_y < 6)[:70], 1: np.flatnonzero(ds.train_y >= 3)[:50]}


def three_clients() -> Data:
    """scikit-learn's digits as 3 clients of `SIZES3` examples (70, 50, 40), label mixes skewed."""
    ds, shards = two_clients()
    shards[2] = np.flatnonzero(ds.train_y % 2 == 0)[200:240]
    return ds, shards


def cast(params: Params, dt: torch.dtype) -> Params:
    """Floating tensors in `dt`, the rest as they are."""
    return {k: v.to(dt) if v.is_floating_point() else v.clone() for k, v in params.items()}


def example_mean(
    models: list[tuple[int, Params]], key: str, dt: torch.dtype, sizes: dict[int, int] = SIZES3
) -> torch.Tensor:
    """Σ n_k w_k / Σ n_k over (client, state) pairs, written out (integer buffers rounded back)."""
    total = sum(sizes[c] for c, _ in models)
    acc = sum(sizes[c] * m[key].to(torch.float64) for c, m in models) / total
    ref = models[0][1][key]
    assert isinstance(acc, torch.Tensor)
    return acc.to(dt) if ref.is_floating_point() else acc.round().to(ref.dtype)


def written_mean(states: list[Params], weights: list[int]) -> Params:
    """Σ n_k θ_k / Σ n_k key by key, written out in float64 (integer buffers rounded back): the
    references' average, never the engine's `weighted_mean` (a bug there would be in both)."""
    total = float(sum(weights))
    out = {}
    for key, ref in states[0].items():
        acc = torch.zeros(ref.shape, dtype=torch.float64)
        for state, n in zip(states, weights, strict=True):
            acc = acc + n * state[key].to(torch.float64)
        acc = acc / total
        out[key] = acc.to(ref.dtype) if ref.is_floating_point() else acc.round().to(ref.dtype)
    return out


def toy_spec(name: str, objective_kwargs: dict[str, Any], init: Params, momentum: float = MOM) -> ClientSpec:
    """The `ClientSpec` of method `name`'s clients on `Toy`, one thread, CPU."""
    return ClientSpec(method=name, objective_kwargs=objective_kwargs, model="toy", model_kwargs={},
                      optim=OptimConfig(lr=LR, momentum=momentum), num_classes=10, in_channels=1,
                      image_size=8, batch_size=BS, threads=1, init_params=init,
                      accelerator="cpu")  # fmt: skip


def ctx(strategy: Strategy[Any, Any, Any], rnd: int = 1) -> ServerContext:
    """The server context of round `rnd` (seed 0, CPU)."""
    return ServerContext(rnd, torch.device("cpu"), server_rng(0, rnd), strategy.task, Toy)


def check(name: str, *overrides: str) -> MethodConfig:
    """Method `name`'s config with `overrides` (`method.mu=-1`, `data=fmnist_multilabel`),
    checked as a run's is before anything starts (its keys, values, data needs and `check`);
    ConfigError, one line, when refused."""
    from .config import check_method, compose

    checked: MethodConfig = check_method(compose([f"method={name}", *overrides]))
    return checked


def two_rounds(
    name: str, data: Data, aggregator: Aggregator | None = None, **method_kwargs: Any
) -> tuple[Params, list[RoundPlan], list[ServerState], ClientHost]:
    """Two rounds of method `name` on the three clients of `three_clients()`, 2 a round
    (|S| = 2 < N = 3), through the strategy and one host as a run does them, plain SGD:
    (initial weights, each round's plan, the state after each round, the host, which keeps
    the clients' resident state in `.states`). `aggregator`: the run's aggregation chain
    (default: the example-weighted mean)."""
    ds, shards = data
    cls = METHODS.get(name)
    config = cls.config_cls(**method_kwargs)
    task = TaskInfo(num_classes=10)
    strategy = cls(config, num_clients=3, clients_per_round=2, seed=0, task=task, aggregator=aggregator)
    torch.manual_seed(0)
    obj = cls.build_objective(Toy(), OptimConfig(lr=LR, momentum=0.0), **strategy.objective_kwargs())
    init = to_cpu(obj.model.state_dict())
    host = ClientHost(toy_spec(name, strategy.objective_kwargs(), init, momentum=0.0), ds, shards)
    plans, states = rounds_1_and_2(strategy, host, init)
    return init, plans, states, host


def rounds_1_and_2(
    strategy: Strategy[Any, Any, Any], host: ClientHost, init: Params
) -> tuple[list[RoundPlan], list[ServerState]]:
    """Rounds 1 and 2 of `strategy` (3 clients, 2 a round) through `host`, as a run does them,
    from the weights `init`: each round's plan and the state after it."""
    state, plans, states = strategy.init_state(init), [], []
    for rnd in (1, 2):
        plan = strategy.configure_round(state, rnd, round_rng(0, rnd))
        updates = sorted((host.fit(plan.broadcast, p) for p in plan.payloads), key=lambda u: u.client_id)
        c = ctx(strategy, rnd)
        state, _ = aggregated(aggregate_with(strategy, state, updates, c))
        state, _ = strategy.server_update(state, updates, c)
        plans.append(plan)
        states.append(state)
    assert [p.client_ids for p in plans] == [[0, 1], [0, 2]]  # partial: client 1 sits out round 2
    return plans, states


Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def ce(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of `m` on a batch: the plain local loss."""
    return F.cross_entropy(m(x), y)


def manual_fit(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    seed: int,
    loss_fn: Loss,
    grad_hook: Callable[[nn.Module], None] | None = None,
    momentum: float = MOM,
    lr: float = LR,
) -> tuple[nn.Module, int]:
    """The same local training as the engine, written as a plain loop, in the model's dtype:
    (the model, the steps taken)."""
    torch.manual_seed(seed)
    x = x.to(next(model.parameters()).dtype)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loader = DataLoader(
        TensorDataset(x, y), batch_size=BS, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    model.train()
    steps = 0
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(model, xb, yb).backward()
        if grad_hook:
            grad_hook(model)
        opt.step()
        steps += 1
    return model, steps


def client_data(data: Data, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client `cid`'s training tensors."""
    ds, shards = data
    return ds.tensors(ds.train_x[shards[cid]], ds.train_y[shards[cid]])


def sd(m: nn.Module) -> Params:
    """A model's state, on the CPU."""
    return to_cpu(m.state_dict())


def train(data: Data, cid: int, seed: int, start: Params, dt: torch.dtype, loss: Loss = ce) -> Params:
    """Client `cid` of `two_rounds` written out: `Toy` in `dt` from `start`, plain SGD with the
    payload's `seed` on `loss`; its state after."""
    m = Toy().to(dt)
    m.load_state_dict(start)
    return sd(manual_fit(m, *client_data(data, cid), seed, loss, momentum=0.0)[0])


def twin(fn: Callable[[torch.dtype], T]) -> tuple[T, T]:
    """A reference computation `fn(dtype)` in float32 and in float64, on one thread (as
    the engine's fits run: `threads=1`, so the float32 one uses the engine's kernels)."""
    with torch_threads(1):
        return fn(torch.float32), fn(torch.float64)


def f32_tolerances(ref32: Params, ref64: Params, factor: float = 16.0, ulps: float = 4.0) -> dict[str, float]:
    """Absolute tolerances, key by key, for a float32 computation of `ref64` (float64) whose
    float32 twin is `ref32`: `factor` × the twin's own rounding error + `ulps` ulps, both
    relative to each tensor's largest element.

    The error is pooled over the state as a relative error, the largest over its tensors of
    max|ref32 - ref64| / max|ref64|: one tensor's error is a poor sample where its exact
    update is ~0 (a bias before batch norm moves by float32 noise alone, and that noise
    changed 10x when T was normalised once more). Tensors whose exact value is 0 have no
    relative error; check them through an identity instead (SCAFFOLD's variates). `ulps`
    covers the last arithmetic (an average) when the reference is that arithmetic alone
    (ref32 = ref64)."""
    mags = {k: float(v.double().abs().max()) for k, v in ref64.items() if v.is_floating_point() and v.numel()}
    rel = max(
        (float((ref32[k].double() - ref64[k].double()).abs().max()) / m for k, m in mags.items() if m > 0),
        default=0.0,
    )
    return {k: (factor * rel + ulps * EPS32) * m for k, m in mags.items()}


def match(got: Params, ref: tuple[Params, Params], factor: float = 16.0) -> None:
    """The engine's tensors `got` against the reference `(ref32, ref64)` of `twin`, within
    `f32_tolerances` of the float64 value; integer buffers (num_batches_tracked) exactly.
    The float32 error grows with the steps, the learning rate and the stiffness of the
    loss. A formula off by a factor or a sign moves a parameter by about lr × |gradient
    term| per step, 1e-3..1e-1 relative here, against tolerances of 3e-6..3e-4 relative."""
    ref32, ref64 = ref
    tols = f32_tolerances(ref32, ref64, factor)
    for k in ref64:
        if not ref64[k].is_floating_point():
            assert torch.equal(got[k].cpu(), ref64[k].cpu()), k
        elif ref64[k].numel():
            torch.testing.assert_close(got[k].double(), ref64[k].double(), atol=tols[k], rtol=0, msg=k)
