"""What a method file imports, in one place: `from fl_lightning.api import Strategy, ...`.

Each name is re-exported from the module that defines it (the same object), so a method
written against this facade and one importing the home modules see one class:

    config, its check     MethodConfig, METHODS, RootConfig, ConfigError,
                          positive, nonnegative, within, one_of, check_targets
    server side           Strategy, FedAvgStrategy, ServerContext, TaskInfo, ServerState,
                          Broadcast, ClientPayload, ClientUpdate, RoundPlan, extend
    client side           ClientObjective, OwnModelObjective, Phase, MaskedStep, is_weight,
                          with_params, on_shared_features, OptimConfig
    types and arithmetic  StateDict, Metrics, ClientId, weighted_mean, to_cpu

Methods inside the package import their home modules (relative imports, below `config` in
the layers); this is for methods outside it. It imports torch, never Ray or W&B.
"""

from __future__ import annotations

from .core.batched import MaskedStep
from .core.checks import check_targets, nonnegative, one_of, positive, within
from .core.errors import ConfigError
from .core.messages import Broadcast, ClientPayload, ClientUpdate, RoundPlan, ServerState, extend
from .core.method import METHODS, MethodConfig
from .core.objective import (
    ClientObjective,
    OwnModelObjective,
    Phase,
    is_weight,
    on_shared_features,
    with_params,
)
from .core.optim import OptimConfig
from .core.params import to_cpu, weighted_mean
from .core.run_config import RootConfig
from .core.strategy import FedAvgStrategy, ServerContext, Strategy, TaskInfo
from .core.types import ClientId, Metrics, StateDict

__all__ = [
    "METHODS", "Broadcast", "ClientId", "ClientObjective", "ClientPayload", "ClientUpdate", "ConfigError",
    "FedAvgStrategy", "MaskedStep", "MethodConfig", "Metrics", "OptimConfig", "OwnModelObjective", "Phase",
    "RootConfig", "RoundPlan", "ServerContext", "ServerState", "StateDict", "Strategy", "TaskInfo",
    "check_targets", "extend", "is_weight", "nonnegative", "on_shared_features", "one_of", "positive",
    "to_cpu", "weighted_mean", "with_params", "within",
]  # fmt: skip
