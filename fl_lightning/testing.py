"""The golden-test kit: test a method against its formulas written out, independently of the
code under test, over two rounds with partial participation, in float32 and in float64.

- data: `three_clients()` (scikit-learn's digits, real and tiny: 3 clients of 70, 50 and 40
  examples, `SIZES3`), `two_clients()` (2 clients of 70 and 50);
- the engine's side: `two_rounds(name, data, model="toy", sampler=None, **method_kwargs)` runs
  a registered method through the run's own loop (`runtime.runner.run_rounds` on a
  `SerialExecutor`: a real `ClientHost`, the worker's code, Lightning's Trainer, the global
  evaluation) on `Toy` (64 → 8 with batch norm → 10) or any registered model, 2 clients a
  round; with the three clients and FedAvg's draw, round 1 trains clients 0 and 1, round 2
  clients 0 and 2 (client 0 brings its state, client 2 starts fresh, client 1 sits out);
  `loop(...)` is the same with every choice open (rounds, clients per round, the task, the
  optimiser, clients' own test splits) and returns all it ran (`Rounds`);
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

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from .core.aggregation import Aggregator
from .core.messages import ClientUpdate, RoundPlan, ServerState
from .core.method import MethodConfig
from .core.objective import ClientObjective
from .core.optim import OptimConfig
from .core.params import to_cpu
from .core.strategy import ServerContext, Strategy, TaskInfo, server_rng
from .core.types import ClientId
from .data.federated import FederatedSplit
from .data.registry import DATASETS, ArrayDataset, load_dataset
from .methods import METHODS
from .models import MODELS, build_client_model
from .runtime.callbacks import Callback
from .runtime.executor import SerialExecutor
from .runtime.host import ClientHost, ClientSpec, build_objective, torch_threads
from .runtime.record import RoundRecord
from .runtime.runner import Prepared, RoundSteps, run_rounds
from .runtime.steps import ClientEval, GlobalEval, WallClock

__all__ = [
    "BS", "EPS32", "LR", "MOM", "SIZES3", "Rounds", "Sampler", "Toy", "cast", "ce", "check", "client_data",
    "ctx", "example_mean", "f32_tolerances", "loop", "manual_fit", "match", "sd", "serial_rounds",
    "three_clients", "toy_spec", "train", "twin", "two_clients", "two_rounds", "rounds_1_and_2",
    "written_mean",
]  # fmt: skip

#: the local training of every golden test: SGD at this learning rate (momentum MOM where a
#: test uses momentum, 0 in `two_rounds`), batches of BS
LR, MOM, BS = 0.1, 0.9, 16
EPS32 = torch.finfo(torch.float32).eps  # 2^-23
#: the clients of `three_clients`, by size
SIZES3 = {0: 70, 1: 50, 2: 40}

Params = dict[str, torch.Tensor]
Shards = dict[int, np.ndarray]
#: (dataset, {client: training indices})
Data = tuple[ArrayDataset, Shards]
#: `Data`, or with {client: indices of its own test split} too (`loop`)
SplitData = Data | tuple[ArrayDataset, Shards, Shards]
#: a draw of the round's clients in place of the strategy's: (round, the round's rng) -> ids
Sampler = Callable[[int, np.random.Generator], list[ClientId]]
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


@dataclass
class Rounds:
    """What `loop` / `serial_rounds` ran, round by round (index 0: round 1).

    Attributes:
        strategy: the method's strategy (its hyperparameters, `task`).
        init: the initial global weights.
        plans: each round's plan (the clients drawn, their payloads' seeds).
        updates: each round's updates, sorted by client id as the loop aggregates them.
        states: the server state after each round (`round` set by the loop).
        records: each round's line (`server` metrics, the global `evaluation`, `bytes_down`).
        host: the clients' host; its `.states` hold their resident state.
        objective: the driver's objective (the global evaluation's).
        initial: the server state before round 1 (`init_state`).
    """

    strategy: Strategy[Any, Any, Any]
    init: Params
    host: ClientHost
    objective: ClientObjective[Any]
    initial: ServerState
    plans: list[RoundPlan] = field(default_factory=list)
    updates: list[list[ClientUpdate]] = field(default_factory=list)
    states: list[ServerState] = field(default_factory=list)
    records: list[RoundRecord] = field(default_factory=list)

    @property
    def state(self) -> ServerState:
        """The state after the last round."""
        return self.states[-1]

    @property
    def metrics(self) -> list[dict[str, float]]:
        """Each round's server metrics (`aggregate`'s and `server_update`'s)."""
        return [r.server for r in self.records]


class _Kept(Callback):
    """Keeps what each round of the loop ran, for the test to read."""

    def __init__(self, rounds: Rounds) -> None:
        self.rounds = rounds

    def on_round_start(self, plan: RoundPlan) -> None:
        self.rounds.plans.append(plan)

    def on_updates(self, record: RoundRecord, updates: Any) -> None:
        self.rounds.updates.append(list(updates))

    def on_round_end(self, state: ServerState, record: RoundRecord) -> None:
        self.rounds.states.append(state)
        self.rounds.records.append(record)


def serial_rounds(
    strategy: Strategy[Any, Any, Any],
    host: ClientHost,
    init: Params | None,
    rounds: int = 2,
    dataset: ArrayDataset | None = None,
    objective: ClientObjective[Any] | None = None,
    evaluate: bool = False,
    unlabeled: torch.Tensor | None = None,
    split: FederatedSplit | None = None,
    sum_on_arrival: bool = False,
) -> Rounds:
    """Rounds 1 to `rounds` of `strategy` through the run's own loop (`run_rounds`) on a
    `SerialExecutor` over `host`, from the weights `init`: the same configure, fit, sort,
    aggregate, server update, `state.round` and global evaluation as a run, without a run
    directory or checkpoints. `dataset`: the one `host` was built on (its test set is the
    global evaluation's; default: scikit-learn's digits); `objective`: the driver's (default:
    built from `host.spec`); `evaluate`: each client evaluates its trained model on its own
    test split before it uploads (`eval.timing=trained`); `unlabeled`: the server's images
    (`ServerContext.unlabeled`); `split`: the clients' indices into `dataset` (what `client_*`'s
    majority-class reference reads; default: none known); `sum_on_arrival`: the driver sums
    each update as it arrives and drops its params, as a run does (`runtime/summing.py`);
    default off, so that `Rounds.updates` holds every update whole for the test to read."""
    from .config import compose

    spec = host.spec
    ds = dataset if dataset is not None else load_dataset("digits", "")
    if objective is None:
        with torch.random.fork_rng(devices=[]):  # the global RNG as the caller left it
            objective = build_objective(spec)
    if split is None:
        none = [np.arange(0)] * strategy.num_clients
        split = FederatedSplit(none, none if evaluate else [])  # ClientEval: on where test splits are
    cfg = compose(
        [f"fl.num_clients={strategy.num_clients}", f"fl.clients_per_round={strategy.clients_per_round}",
         f"fl.rounds={rounds}", f"seed={strategy.seed}", "eval.overlap=false", "eval.device=cpu",
         f"eval.clients={str(evaluate).lower()}", f"eval.timing={'trained' if evaluate else 'received'}",
         "runtime=serial"]
    )  # fmt: skip
    p = Prepared(cfg, ds, split, strategy, spec, init, objective, strategy.eval_spec())
    clock = WallClock()
    # no run directory: the global evaluation writes to it only with eval.save_predictions (off)
    steps = RoundSteps(GlobalEval(p, Path(), clock), ClientEval(p), sum_on_arrival=sum_on_arrival)
    state = strategy.init_state(init)
    out = Rounds(strategy, init or {}, host, objective, state)

    def context(rnd: int) -> ServerContext:
        def build_model() -> nn.Module:
            return build_client_model(
                spec.model, 0, spec.num_classes, spec.in_channels, spec.image_size, **spec.model_kwargs
            )

        rng, cpu, task = server_rng(strategy.seed, rnd), torch.device("cpu"), strategy.task
        return ServerContext(rnd, cpu, rng, task, build_model, unlabeled=unlabeled, seed=strategy.seed)

    executor = SerialExecutor(host)
    try:
        run_rounds(state, rounds, strategy, executor, strategy.seed, context, steps, _Kept(out), clock)
    finally:
        steps.global_eval.close()
    return out


def loop(
    name: str,
    data: SplitData,
    model: str = "toy",
    sampler: Sampler | None = None,
    *,
    method: Mapping[str, Any] | None = None,
    rounds: int = 2,
    clients_per_round: int = 2,
    task: TaskInfo | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
    optim: OptimConfig | None = None,
    batch_size: int = BS,
    evaluate: bool = False,
    unlabeled: torch.Tensor | None = None,
    aggregator: Aggregator | None = None,
    sum_on_arrival: bool = False,
) -> Rounds:
    """`rounds` rounds of method `name` (its config: `method`) through the run's own loop
    (`serial_rounds`), `clients_per_round` of `data`'s clients a round, on `model` (a
    registered model; `Toy` by default) built under seed 0, one thread, CPU. `data`: (dataset,
    training shards) or (dataset, training shards, each client's own test shard); `sampler`:
    draws each round's clients in place of the strategy's `sample_clients`; `task`: default
    the dataset's classes and names; `optim`: default plain SGD at `LR`; `evaluate`: clients
    evaluate their trained models on their own test splits before they upload; `aggregator`: the
    run's aggregation chain (default: the example-weighted mean); `sum_on_arrival`: as a run, the
    driver sums the updates as they arrive and drops their params (`serial_rounds`)."""
    ds, train = data[0], data[1]
    test = data[2] if len(data) == 3 else None
    cls = METHODS.get(name)
    if sampler is not None:  # the draw the test asks for, the rest of the method as it is
        draw = sampler

        def sample_clients(self: Any, rnd: int, rng: np.random.Generator) -> list[ClientId]:
            return [int(c) for c in draw(rnd, rng)]

        cls = type(cls.__name__, (cls,), {"sample_clients": sample_clients})
    if task is None:
        task = TaskInfo(
            num_classes=ds.num_classes, class_names=tuple(ds.class_names), dataset=ds.name,
            has_client_test_split=test is not None, rounds=rounds,
            coarse_groups=DATASETS.get(ds.name).coarse_groups if ds.name in DATASETS else None,
        )  # fmt: skip
    config = cls.config_cls(**dict(method or {}))
    strategy = cls(config, len(train), clients_per_round, seed=0, task=task, aggregator=aggregator)
    optim = optim or OptimConfig(lr=LR, momentum=0.0)
    kwargs = strategy.model_kwargs(model, dict(model_kwargs or {}))
    spec = ClientSpec(
        method=name, method_module=cls.__module__, objective_kwargs=strategy.objective_kwargs(), model=model,
        model_kwargs=kwargs, optim=optim, num_classes=ds.num_classes, in_channels=ds.in_channels,
        image_size=ds.image_size, batch_size=batch_size, threads=1, accelerator="cpu",
    )  # fmt: skip
    torch.manual_seed(0)
    objective = build_objective(spec)  # the driver's: the initial weights, the global evaluation
    strategy.check_model(objective.model)  # as a run does, before its first round
    init = to_cpu(objective.model_state())  # as a run's: the model without its frozen entries
    spec = dataclasses.replace(spec, init_params=init)
    host = ClientHost(spec, ds, train, test)
    ids = range(len(train))
    split = FederatedSplit([train[c] for c in ids], [test[c] for c in ids] if test is not None else [])
    return serial_rounds(
        strategy, host, init, rounds, ds, objective, evaluate, unlabeled, split, sum_on_arrival=sum_on_arrival
    )


def two_rounds(
    name: str,
    data: SplitData,
    model: str = "toy",
    sampler: Sampler | None = None,
    aggregator: Aggregator | None = None,
    **method_kwargs: Any,
) -> tuple[Params, list[RoundPlan], list[ServerState], ClientHost]:
    """Two rounds of method `name` on `data`'s clients (the three of `three_clients()`: |S| = 2
    < N = 3), 2 a round, through the run's own loop (`loop`), plain SGD: (initial weights,
    each round's plan, the state after each round, the host, which keeps the clients' resident
    state in `.states`). Which clients trained is in the plans: a test asserts the draw it
    expects. `aggregator`: the run's aggregation chain (default: the example-weighted mean). The
    driver sums the updates as they arrive and drops them, as a run does (`runtime/summing.py`):
    the golden tests built on this check that path against their references."""
    r = loop(name, data, model, sampler, method=method_kwargs, aggregator=aggregator, sum_on_arrival=True)
    return r.init, r.plans, r.states, r.host


def rounds_1_and_2(
    strategy: Strategy[Any, Any, Any], host: ClientHost, init: Params
) -> tuple[list[RoundPlan], list[ServerState]]:
    """Rounds 1 and 2 of `strategy` (3 clients, 2 a round, FedAvg's draw) through `host` and
    the run's own loop (`serial_rounds`), from the weights `init`: each round's plan and the
    state after it."""
    r = serial_rounds(strategy, host, init)
    assert [p.client_ids for p in r.plans] == [[0, 1], [0, 2]]  # partial: client 1 sits out round 2
    return r.plans, r.states


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
