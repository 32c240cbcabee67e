"""`Strategy`: the driver side of a method (Flower's configure/aggregate split over
fedjax-style explicit state). Instance attributes are hyperparameters only; everything
that changes during a run lives in `ServerState` (the driver's) or in each client's
resident `ClientState` (its host's), so resuming means loading them.

The base class is FedAvg: uniform client sampling, example-weighted averaging of every
parameter and buffer. Methods override the smallest hook and call `super()`. A method
is generic over its config, server state and broadcast types, so hooks see the fields
of its own dataclasses, typed.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import torch
from torch import nn

from .aggregation import Aggregator, Summed, aggregate_chain
from .errors import ConfigError
from .messages import Broadcast, ClientPayload, ClientUpdate, RoundPlan, ServerState
from .method import METHODS, MethodConfig, needs_test_split_error
from .metrics import EvalSpec
from .objective import ClientObjective
from .optim import OptimConfig
from .sampling import Sampling
from .state_classes import register_state_classes
from .types import ClientId, Metrics, StateDict

__all__ = ["MethodConfig", "Sampling", "ServerContext", "Strategy", "TaskInfo", "FedAvgStrategy"]


@dataclass(frozen=True)
class TaskInfo:
    """What a strategy may know about the task, besides its own hyperparameters.

    Attributes:
        num_classes: number of classes (labels, for multi-label data).
        class_names: text-ready class names (for class-text features).
        dataset: dataset registry name.
        text: the text-encoder config (`{"name": "none"}` when none is chosen).
        has_client_test_split: whether clients hold their own test splits.
        multilabel: targets are multi-hot label sets.
        train_class_counts: training examples per class over all clients (long-tail groups).
        data: the data config (`cfg.data` as a plain mapping; empty when unknown), for methods
            that read the dataset themselves (CLIP2FL's aligned teacher, on held-out images).
        rounds: the run's planned rounds (`fl.rounds`; 0 when unknown), for schedules over
            the run (FedPHP's inheritance weight).
        image_mean, image_std: the images' normalisation, per channel (empty when unknown),
            for a model that re-normalises them (CLIP's towers).
        class_sets: a composite's member datasets (`data=coop_multi`), (name, class count) in
            label order, each member's labels after the previous one's; empty: one dataset.
        coarse_groups: the dataset's coarse group of each class (`DatasetEntry.coarse_groups`:
            fmnist_digits20's clothing and digits), for the controls that keep or break them;
            None: the dataset has none.
    """

    num_classes: int
    class_names: tuple[str, ...] = ()
    dataset: str = ""
    text: dict[str, Any] = dataclasses.field(default_factory=lambda: {"name": "none"})
    has_client_test_split: bool = False
    multilabel: bool = False
    train_class_counts: tuple[int, ...] = ()
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    rounds: int = 0
    image_mean: tuple[float, ...] = ()
    image_std: tuple[float, ...] = ()
    class_sets: tuple[tuple[str, int], ...] = ()
    coarse_groups: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ServerContext:
    """What a server step may use besides the state and the updates.

    Attributes:
        round: the round being completed.
        device: where server-side computation should run (the eval device).
        rng: randomness for this round's server step, derived from (seed, round) only, so a
            resumed run repeats it.
        task: the task.
        build_model: a fresh backbone of client 0's architecture (random weights; seed the
            global RNG or load weights yourself).
        unlabeled: the server's unlabeled images (`data.server_subset`, held out of every
            client's data), normalised, on the CPU; None without one.
        seed: the run's seed (`generator` derives from it).
        staleness: each update's staleness (server versions since the version it started
            from) in an asynchronous server step (`system.mode=fedbuff|fedasync`); empty in
            synchronous rounds, where every update is fresh.
        summed: the round's updates, already in the aggregation chain's running sum (the
            driver added each as it arrived and dropped its params: `runtime/summing.py`);
            `average` finishes it. None: `average` sums the updates it is given.
    """

    round: int
    device: torch.device
    rng: np.random.Generator
    task: TaskInfo
    build_model: Callable[[], nn.Module]
    unlabeled: torch.Tensor | None = None
    seed: int = 0
    staleness: Mapping[ClientId, int] = dataclasses.field(default_factory=dict)
    summed: Summed | None = None

    def generator(self, *tag: int) -> torch.Generator:
        """A CPU torch generator seeded by (seed, round, *tag) alone: an aggregation step's
        noise (tag: the step, and the client where it is per client) is then the same on every
        executor and after a resume. A deployment would draw from a cryptographic source
        instead (docs/privacy.md); a simulation needs it repeatable."""
        seed = np.random.SeedSequence([self.seed, self.round, *tag]).generate_state(2, np.uint64)[0]
        return torch.Generator().manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)


def client_seed(run_seed: int, rnd: int, client_id: ClientId) -> int:
    """A seed for one client's local training that depends only on (seed, round, client)."""
    return int(np.random.SeedSequence([run_seed, rnd, client_id]).generate_state(1)[0])


def round_rng(run_seed: int, rnd: int) -> np.random.Generator:
    """The driver's randomness for one round; stateless, so a resumed run repeats it."""
    return np.random.default_rng([run_seed, rnd, 0x5EED])


def server_rng(run_seed: int, rnd: int) -> np.random.Generator:
    """The server step's randomness for one round (apart from client sampling's)."""
    return np.random.default_rng([run_seed, rnd, 0x5E4F])


ConfigT = TypeVar("ConfigT", bound=MethodConfig)
StateT = TypeVar("StateT", bound=ServerState)
BroadcastT = TypeVar("BroadcastT", bound=Broadcast)


#: the class attributes a strategy's generic arguments (config, state, broadcast) give
GENERIC_ATTRS = ("config_cls", "state_cls", "broadcast_cls")


def _generic_args(cls: type) -> dict[str, type]:
    """What `cls`'s bases say `Strategy`'s three type parameters are, where they are classes:
    `Strategy[C, S, B]` directly, or through a generic subclass (`ServerDistillation[C]`, whose
    own base is `Strategy[ConfigT, ServerState, Broadcast]`)."""

    def resolve(base: Any, env: dict[Any, Any]) -> dict[str, type]:
        origin = typing.get_origin(base) or base
        if not (isinstance(origin, type) and issubclass(origin, Strategy)):
            return {}
        args = [env.get(a, a) for a in typing.get_args(base)]
        params = getattr(origin, "__parameters__", ())
        if origin is Strategy:
            return {k: a for k, a in zip(GENERIC_ATTRS, args, strict=False) if isinstance(a, type)}
        inner = dict(zip(params, args, strict=False)) if len(params) == len(args) else {}
        for b in origin.__dict__.get("__orig_bases__", ()):
            found = resolve(b, inner)
            if found:
                return found
        return {}

    for base in cls.__dict__.get("__orig_bases__", ()):
        found = resolve(base, {})
        if found:
            return found
    return {}


def init_keywords(cls: type) -> frozenset[str] | None:
    """The keyword arguments `cls(...)` accepts, following `**kwargs` up the bases' `__init__`s
    (an objective hands them on to `ClientObjective`'s); None where any is accepted."""
    names: set[str] = set()
    for base in cls.__mro__:
        init = base.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):  # a builtin's: nothing to read
            return None
        names.update(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return frozenset(names - {"self"})
    return None


class Strategy(Generic[ConfigT, StateT, BroadcastT]):
    """The driver side of a method. `config_cls`, `state_cls` and `broadcast_cls` come from the
    generic arguments (`class FedFoo(Strategy[FedFooConfig, FedFooState, Broadcast])`); a class
    may still set one, to a subclass of its generic argument (TypeError otherwise). The config
    class names the method (`METHODS.register` on it): `name` is its registered name, and the
    strategy declaring a registered config is the one `METHODS.get(name)` returns."""

    name: ClassVar[str] = "fedavg"
    config_cls: ClassVar[type[MethodConfig]] = MethodConfig
    objective_cls: ClassVar[type[ClientObjective[Any]]] = ClientObjective
    #: the server state and broadcast classes `init_state` and `broadcast` build
    state_cls: type[StateT]
    broadcast_cls: type[BroadcastT]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for attr, arg in _generic_args(cls).items():
            declared = cls.__dict__.get(attr)
            if declared is None:
                setattr(cls, attr, arg)
            elif not (isinstance(declared, type) and issubclass(declared, arg)):
                raise TypeError(
                    f"{cls.__qualname__}.{attr} = {getattr(declared, '__qualname__', declared)} is not "
                    f"its generic argument {arg.__qualname__} (or a subclass of it)"
                )
        config = cls.__dict__.get("config_cls")
        if config is not None:
            cls.name = config.name  # the registered name (one place)
            if METHODS.is_registered(config):  # this is its method's strategy
                METHODS.add_strategy(config, cls)

    #: no global model (personal weights): evaluated on each client's own test split. From
    #: the config (`MethodConfig.personalised`), or the run's sampling (`fl.bn_stats=local`).
    personalised: bool
    #: True when `payload` carries what only training needs (other clients' models: FedFomo,
    #: FedAMP): evaluation then gets the plain payload
    plain_eval_payloads: bool = False
    #: the method's new global params come from `average` (the run's aggregation chain), so a
    #: chain step (clipping, noise, staleness weights) applies to it; False for a method that
    #: keeps each client's model or computes its weights from the raw updates (the chain would
    #: be ignored: such a run is refused), with the reason in `..._why`
    aggregates_through_chain: ClassVar[bool] = True
    aggregates_through_chain_why: ClassVar[str] = ""
    #: what the server reads of each client's upload beyond the sum of its params (prototypes,
    #: control variates, logits); secure aggregation, which gives the server only the sum,
    #: refuses the method naming it; the driver keeps such a round's updates whole (others
    #: it sums as they arrive and drops: `runtime/summing.py`). "": nothing (or
    #: `aggregates_through_chain_why`)
    reads_each_update: ClassVar[str] = ""
    #: (fewest, most) clients per round for unstable participation (`fl.fraction_range`);
    #: None: always `clients_per_round`
    participation: tuple[int, int] | None = None
    #: each client's probability of being drawn (`fl.sampling=size`: its share of the training
    #: examples, FedLGT's FLAIR protocol); None: uniform
    sample_weights: np.ndarray | None = None
    #: each client's own probability of joining a round (`fl.sampling=poisson`: the cohort's
    #: size varies, as the add/remove-one privacy accountants assume); None: a fixed number
    poisson_rate: float | None = None

    def __init__(
        self,
        config: ConfigT,
        num_clients: int,
        clients_per_round: int,
        seed: int,
        task: TaskInfo | None = None,
        aggregator: Aggregator | None = None,
        sampling: Sampling | None = None,
    ) -> None:
        self.config = config
        #: how `average` turns the round's updates into the new global params: the run's
        #: `aggregator.steps` chain (clipping, noise, ...); default the example-weighted mean
        self.aggregator = aggregator if aggregator is not None else Aggregator()
        self.num_clients = num_clients
        self.clients_per_round = clients_per_round
        self.seed = seed
        self.task = task or TaskInfo(num_classes=0)
        self.personalised = config.keeps_personal_models()
        if self.personalised and task is not None and not task.has_client_test_split:
            raise ConfigError(needs_test_split_error(self.name))
        s = sampling or Sampling()  # how the run draws its clients, given once
        self.participation = s.participation
        self.sample_weights = None if s.weights is None else np.asarray(s.weights, dtype=np.float64)
        self.poisson_rate = s.poisson_rate
        self.personalised = self.personalised or s.local_bn

    # --- client side, built inside hosts ---------------------------------------------
    def objective_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the client objective (picklable; shipped to hosts once).
        Default: the method config's fields that the objective's `__init__` takes, by name (a
        server's key, FedBuff's `concurrency`, stays with the server); none for a method whose
        clients train FedAvg's objective (`objective_cls` is `ClientObjective`: a server-side
        method)."""
        if self.objective_cls is ClientObjective:
            return {}
        takes = init_keywords(self.objective_cls)
        fields = (f.name for f in dataclasses.fields(self.config))
        return {k: getattr(self.config, k) for k in fields if takes is None or k in takes}

    def model_kwargs(self, model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The backbone's keyword arguments (`model.*` of the config) for model `model`; a
        method may set some (FedTSP: the feature dimension = the text dimension)."""
        return kwargs

    @classmethod
    def build_objective(cls, model: nn.Module, optim: OptimConfig, **kwargs: Any) -> ClientObjective[Any]:
        """The client's LightningModule, built inside hosts (and once on the driver)."""
        return cls.objective_cls(
            model,
            lr=optim.lr,
            momentum=optim.momentum,
            weight_decay=optim.weight_decay,
            optimizer=optim.name,
            grad_clip=optim.grad_clip,
            **kwargs,
        )

    # --- evaluation -------------------------------------------------------------------
    def eval_spec(
        self, per_class: bool = False, longtail: Sequence[int] | None = None, threshold: float = 0.5
    ) -> EvalSpec:
        """What evaluations measure for this task (the `eval.*` options applied)."""
        from .metrics import base_class_count, base_new_sets, longtail_groups

        groups = None
        if longtail is not None and self.task.train_class_counts:
            groups = longtail_groups(self.task.train_class_counts, int(longtail[0]), int(longtail[1]))
        # data.base_new: trained on the base half, scored on base, new and their harmonic mean;
        # a composite's members each on their own halves
        base: int | None = None
        sets: tuple[tuple[str, int, int, int], ...] = ()
        if self.task.data.get("base_new"):
            if self.task.class_sets:
                sets = base_new_sets(self.task.num_classes, self.task.class_sets)
            else:
                base = base_class_count(self.task.num_classes)
        return EvalSpec(
            num_classes=self.task.num_classes, multilabel=self.task.multilabel, threshold=threshold,
            per_class=per_class, class_groups=groups, base_classes=base, base_new_sets=sets,
        )  # fmt: skip

    def primary_metric(self) -> str:
        """The metric `summary.json`'s final_/best_, the console, `compare` and `sweep`
        report: `accuracy` (multi-label: `c_ap`), or its `client_` form for personalised
        methods, evaluated on the clients' own test splits."""
        base = "c_ap" if self.task.multilabel else "accuracy"
        return f"client_{base}" if self.personalised else base

    # --- driver side ---------------------------------------------------------------
    def init_state(self, global_params: StateDict | None) -> StateT:
        return self.state_cls(round=0, global_params=global_params)

    def sample_clients(self, rnd: int, rng: np.random.Generator) -> list[ClientId]:
        if self.poisson_rate is not None:  # one coin per client, from the same (seed, round) stream
            return [int(c) for c in np.flatnonzero(rng.random(self.num_clients) < self.poisson_rate)]
        k = self.clients_per_round
        if self.participation is not None:  # drawn first, from the same (seed, round) stream
            k = int(rng.integers(self.participation[0], self.participation[1] + 1))
        chosen = rng.choice(self.num_clients, size=k, replace=False, p=self.sample_weights)
        return sorted(int(c) for c in chosen)

    def broadcast(self, state: StateT, rnd: int) -> BroadcastT:
        return self.broadcast_cls(round=rnd, global_params=state.global_params)

    def payload(self, state: StateT, rnd: int, client_id: ClientId) -> ClientPayload:
        return ClientPayload(client_id=client_id, round=rnd, seed=client_seed(self.seed, rnd, client_id))

    def configure_round(self, state: StateT, rnd: int, rng: np.random.Generator) -> RoundPlan:
        ids = self.sample_clients(rnd, rng)
        return RoundPlan(rnd, self.broadcast(state, rnd), [self.payload(state, rnd, c) for c in ids])

    def aggregate(
        self, state: StateT, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> StateT | tuple[StateT, Metrics]:
        """The new state from the round's updates, optionally with metrics (logged as
        `server/<name>`, beside `server_update`'s). Default: `average`. A method that
        overrides it calls `self.average(state, updates, ctx)` first and takes its server step
        on the result, so the run's aggregation chain (clipping, noise, ...) composes with it."""
        return self.average(state, updates, ctx)

    def average(
        self, state: StateT, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> StateT:
        """The shared parameters through the run's aggregation chain (`core/aggregation.py`):
        FedAvg's example-weighted mean, with whatever steps the run configured (`ctx`, the
        round's context, seeds their noise; a chain without random steps runs without it)."""
        return aggregate_chain(self.aggregator, state, updates, ctx)

    def server_update(
        self, state: StateT, updates: Sequence[ClientUpdate], ctx: ServerContext
    ) -> tuple[StateT, Metrics]:
        """Server-side work after aggregation (prompt tuning, prototypes, classifier
        re-training, ...) and its metrics, logged as `server/<name>`. FedAvg: none."""
        return state, {}

    def eval_broadcast(self, state: StateT) -> BroadcastT | None:
        """What the global model needs for evaluation on the server; None if there is none."""
        if self.personalised:
            return None
        return self.broadcast(state, state.round)

    def configure_evaluate(self, state: StateT, client_ids: Sequence[ClientId]) -> RoundPlan:
        """Plan for evaluating each client's model on its own test split (payloads without a
        method's per-client extras when `plain_eval_payloads`)."""
        payload = Strategy.payload if self.plain_eval_payloads else type(self).payload
        return RoundPlan(
            state.round,
            self.broadcast(state, state.round),
            [payload(self, state, state.round, c) for c in client_ids],
        )

    def summary(self) -> dict[str, Any]:
        """Effective hyperparameters, logged at start."""
        return {
            "method": self.name,
            **dataclasses.asdict(self.config),
            "num_clients": self.num_clients,
            "clients_per_round": self.clients_per_round,
            **({"participation": list(self.participation)} if self.participation else {}),
            **({"sampling": "size"} if self.sample_weights is not None else {}),
            **({"sampling": "poisson"} if self.poisson_rate is not None else {}),
        }

    def run_summary(self) -> dict[str, Any]:
        """What `summary.json` records of the method beside the metrics (JSON values; e.g.
        CLIP2FL's teacher accuracy), so a report can show how strong a control was."""
        return {}

    def warnings(self) -> list[str]:
        """Degenerate settings worth telling the user about."""
        return []

    def check_model(self, model: nn.Module) -> None:
        """Refuse the driver's built model with one ConfigError line, before the run directory
        exists (`runtime/build.py::prepare`). Default: the config's `check_model`; a strategy
        overrides it only for what its own construction decided (CLIP2FL: the class text's
        dimension)."""
        self.config.check_model(model, self.task)

    def resolved(self, model: nn.Module) -> dict[str, Any]:
        """The choices this method made where the run's config left them open (`auto`, `none`),
        as config values (`{"text": {...}, "method": {...}}`): config.yaml and W&B record them
        as what ran. `model`: the driver's built model. Default: the text encoder a text method
        fell back to (MiniLM when `text=none`), as its `summary()` names it."""
        encoder = self.summary().get("text_encoder")
        if encoder and encoder != "none" and self.task.text.get("name", "none") == "none":
            return {"text": {"name": str(encoder)}}
        return {}


def aggregated(out: StateT | tuple[StateT, Metrics]) -> tuple[StateT, Metrics]:
    """`Strategy.aggregate`'s result as (state, metrics)."""
    return out if isinstance(out, tuple) else (out, {})


def aggregate_with(
    strategy: Strategy[Any, StateT, Any], state: StateT, updates: Sequence[ClientUpdate], ctx: ServerContext
) -> StateT | tuple[StateT, Metrics]:
    """`strategy.aggregate` with the round's context; a method of another package written before
    `aggregate` took one (`aggregate(self, state, updates)`) is called as it was (a run with a
    chain step that needs the context refuses it up front: `runtime/build.py`)."""
    if "ctx" in inspect.signature(type(strategy).aggregate).parameters:
        return strategy.aggregate(state, updates, ctx)
    return strategy.aggregate(state, updates)


def chain_metrics_of(state: StateT) -> tuple[StateT, Metrics]:
    """The aggregation chain's metrics of this round, taken out of the state (they are the
    round's line, not state to checkpoint)."""
    if "metrics" not in state.aggregation:
        return state, {}
    rest = {k: v for k, v in state.aggregation.items() if k != "metrics"}
    return dataclasses.replace(state, aggregation=rest), dict(state.aggregation["metrics"])


METHODS.on_strategy = register_state_classes


class FedAvgStrategy(Strategy[ConfigT, ServerState, Broadcast]):
    """The base with FedAvg's own types: what a method without new state or messages extends
    (`class FedBN(FedAvgStrategy[FedBNConfig])`)."""

    state_cls = ServerState
    broadcast_cls = Broadcast
