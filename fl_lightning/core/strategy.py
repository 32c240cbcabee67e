"""`Strategy`: the driver side of a method (Flower's configure/aggregate split over
fedjax-style explicit state). Instance attributes are hyperparameters only; everything
that changes during a run lives in `ServerState`, so resuming means loading it.

The base class is FedAvg: uniform client sampling, example-weighted averaging of every
parameter and buffer. Methods override the smallest hook and call `super()`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np
from torch import nn

from .errors import ConfigError
from .messages import Broadcast, ClientPayload, ClientUpdate, RoundPlan, ServerState
from .objective import ClientObjective
from .optim import OptimConfig
from .params import weighted_mean
from .types import ClientId, StateDict


@dataclass
class MethodConfig:
    """Hyperparameters of a method (`conf/method/<name>.yaml` is validated against it)."""

    name: str = "fedavg"


@dataclass(frozen=True)
class TaskInfo:
    """What a strategy may know about the task, besides its own hyperparameters.

    Attributes:
        num_classes: number of classes.
        class_names: text-ready class names (for class-text features).
        dataset: dataset registry name.
        text: the text-encoder config (`{"name": "none"}` when none is chosen).
        has_client_test_split: whether clients hold their own test splits.
    """

    num_classes: int
    class_names: tuple[str, ...] = ()
    dataset: str = ""
    text: dict[str, Any] = dataclasses.field(default_factory=lambda: {"name": "none"})
    has_client_test_split: bool = False


def client_seed(run_seed: int, rnd: int, client_id: ClientId) -> int:
    """A seed for one client's local training that depends only on (seed, round, client)."""
    return int(np.random.SeedSequence([run_seed, rnd, client_id]).generate_state(1)[0])


def round_rng(run_seed: int, rnd: int) -> np.random.Generator:
    """The driver's randomness for one round; stateless, so a resumed run repeats it."""
    return np.random.default_rng([run_seed, rnd, 0x5EED])


class Strategy:
    name: ClassVar[str] = "fedavg"
    config_cls: ClassVar[type[MethodConfig]] = MethodConfig
    objective_cls: ClassVar[type[ClientObjective]] = ClientObjective
    #: True for methods without one global model (personal weights): they are evaluated
    #: on each client's own test split, so the data must have one.
    personalised: ClassVar[bool] = False

    def __init__(
        self,
        config: MethodConfig,
        num_clients: int,
        clients_per_round: int,
        seed: int,
        task: TaskInfo | None = None,
    ) -> None:
        self.config = config
        self.num_clients = num_clients
        self.clients_per_round = clients_per_round
        self.seed = seed
        self.task = task or TaskInfo(num_classes=0)
        if self.personalised and task is not None and not task.has_client_test_split:
            raise ConfigError(
                f"{self.name} keeps personal models, evaluated on each client's own test split: "
                "set data.client_test_fraction (e.g. 0.25)"
            )

    # --- client side, built inside hosts ---------------------------------------------
    def objective_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the client objective (picklable; shipped to hosts once).
        Default: the method config's fields, by name."""
        kwargs = {f.name: getattr(self.config, f.name) for f in dataclasses.fields(self.config)}
        kwargs.pop("name")
        return kwargs

    def model_kwargs(self, model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The backbone's keyword arguments (`model.*` of the config) for model `model`; a
        method may set some (FedTSP: the feature dimension = the text dimension)."""
        return kwargs

    @classmethod
    def build_objective(cls, model: nn.Module, optim: OptimConfig, **kwargs: Any) -> ClientObjective:
        """The client's LightningModule, built inside hosts (and once on the driver)."""
        return cls.objective_cls(
            model,
            lr=optim.lr,
            momentum=optim.momentum,
            weight_decay=optim.weight_decay,
            optimizer=optim.name,
            **kwargs,
        )

    # --- driver side ---------------------------------------------------------------
    def init_state(self, global_params: StateDict) -> ServerState:
        return ServerState(round=0, global_params=global_params)

    def sample_clients(self, rnd: int, rng: np.random.Generator) -> list[ClientId]:
        chosen = rng.choice(self.num_clients, size=self.clients_per_round, replace=False)
        return sorted(int(c) for c in chosen)

    def broadcast(self, state: ServerState, rnd: int) -> Broadcast:
        return Broadcast(round=rnd, global_params=state.global_params)

    def payload(self, state: ServerState, rnd: int, client_id: ClientId) -> ClientPayload:
        return ClientPayload(
            client_id=client_id,
            round=rnd,
            seed=client_seed(self.seed, rnd, client_id),
            client_state=state.client_states.get(client_id),
        )

    def configure_round(self, state: ServerState, rnd: int, rng: np.random.Generator) -> RoundPlan:
        ids = self.sample_clients(rnd, rng)
        return RoundPlan(rnd, self.broadcast(state, rnd), [self.payload(state, rnd, c) for c in ids])

    def aggregate(self, state: ServerState, updates: Sequence[ClientUpdate]) -> ServerState:
        """Example-weighted mean of the shared parameters; keep each client's new state."""
        client_states = dict(state.client_states)
        for u in updates:
            if u.client_state is not None:
                client_states[u.client_id] = u.client_state
        with_params = [u for u in updates if u.params]
        params = state.global_params
        if with_params and params is not None:
            params = {
                **params,
                **weighted_mean([u.params for u in with_params], [u.num_examples for u in with_params]),  # type: ignore[misc]
            }
        return dataclasses.replace(state, global_params=params, client_states=client_states)

    def server_update(self, state: ServerState, updates: Sequence[ClientUpdate]) -> ServerState:
        """Server-side work after aggregation (prompt tuning, prototypes, ...). FedAvg: none."""
        return state

    def eval_broadcast(self, state: ServerState) -> Broadcast | None:
        """What the global model needs for evaluation on the server; None if there is none."""
        if self.personalised:
            return None
        return self.broadcast(state, state.round)

    def configure_evaluate(self, state: ServerState, client_ids: Sequence[ClientId]) -> RoundPlan:
        """Plan for evaluating each client's model on its own test split."""
        return RoundPlan(
            state.round,
            self.broadcast(state, state.round),
            [self.payload(state, state.round, c) for c in client_ids],
        )

    def summary(self) -> dict[str, Any]:
        """Effective hyperparameters, logged at start."""
        return {
            "method": self.name,
            **dataclasses.asdict(self.config),
            "num_clients": self.num_clients,
            "clients_per_round": self.clients_per_round,
        }

    def warnings(self) -> list[str]:
        """Degenerate settings worth telling the user about."""
        return []
