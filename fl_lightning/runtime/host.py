"""`ClientHost`: holds some clients' data shards and runs their local fits and evaluations.

It is the same code in both executors: `SerialExecutor` calls it in the driver process,
`RayExecutor` wraps it in an actor. Nothing here imports Ray.
"""
from __future__ import annotations

import contextlib
import logging
import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from ..core.messages import Broadcast, ClientEval, ClientPayload, ClientUpdate
from ..core.objective import ClientObjective, evaluate_model
from ..core.params import to_cpu
from ..core.strategy import OptimConfig, client_seed
from ..core.types import ClientId, StateDict
from ..data.datasets import ArrayDataset
from ..methods import METHODS
from ..models import architecture, build_client_model


@dataclass
class ClientSpec:
    """Everything a host needs to build a client's objective and trainer (picklable)."""

    method: str
    objective_kwargs: dict[str, Any]
    model: str
    model_kwargs: dict[str, Any]
    optim: OptimConfig
    num_classes: int
    in_channels: int
    image_size: int
    local_epochs: int = 1
    local_steps: int | None = None
    batch_size: int = 64
    accelerator: str = "cpu"
    threads: int | None = None  # torch intra-op threads during a fit; None: leave as is
    eval_batch_size: int = 1000
    #: the initial weights: a client seen for the first time starts from them, whatever
    #: client the (reused) objective served before
    init_params: dict[str, torch.Tensor] | None = None
    #: without `init_params` (a model family: no one set of weights fits every client), a
    #: client seen for the first time starts from its own model initialised with a seed
    #: derived from (init_seed, client id): the same in every executor
    init_seed: int | None = None


def build_objective(spec: ClientSpec, client_id: ClientId = 0) -> ClientObjective:
    """Client `client_id`'s objective (its architecture, when `spec.model` is a family)."""
    model = build_client_model(
        spec.model, client_id, spec.num_classes, spec.in_channels, spec.image_size, **spec.model_kwargs
    )
    return METHODS.get(spec.method).build_objective(model, spec.optim, **spec.objective_kwargs)


def initial_params(spec: ClientSpec, client_id: ClientId) -> StateDict:
    """The weights a client starts from: `spec.init_params`, else its own model built under
    a seed derived from (spec.init_seed, client id). Leaves the global RNG untouched."""
    if spec.init_params is not None:
        return spec.init_params
    if spec.init_seed is None:
        raise ValueError("ClientSpec needs init_params or init_seed")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(client_seed(spec.init_seed, 0, client_id))
        return to_cpu(build_objective(spec, client_id).model.state_dict())


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with `n` intra-op threads (same count in every executor: same numbers)."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def quiet_lightning() -> None:
    """No banners or per-fit info lines: a host runs thousands of tiny fits."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*`training_step` returns.*")
    warnings.filterwarnings("ignore", module=r"lightning(_utilities)?\..*")


class ClientHost:
    def __init__(
        self,
        spec: ClientSpec,
        dataset: ArrayDataset,
        train_indices: dict[ClientId, np.ndarray],
        test_indices: dict[ClientId, np.ndarray] | None = None,
    ) -> None:
        quiet_lightning()
        self.spec = spec
        # Shards are materialised once and stay resident between rounds.
        self.train = {c: dataset.tensors(dataset.train_x[i], dataset.train_y[i]) for c, i in train_indices.items()}
        self.class_counts = {
            c: torch.bincount(y, minlength=spec.num_classes) for c, (_, y) in self.train.items() if y.dim() == 1
        }
        self.test = {c: dataset.tensors(dataset.train_x[i], dataset.train_y[i]) for c, i in (test_indices or {}).items()}
        self._objectives: dict[Any, ClientObjective] = {}

    @property
    def client_ids(self) -> list[ClientId]:
        return sorted(self.train)

    def objective(self, client_id: ClientId) -> ClientObjective:
        """One objective per architecture (a model family has several), reused across
        rounds and clients (begin_round resets all state), so a host with 1,000 clients
        keeps one model per architecture in memory. Built without touching the global RNG,
        so a client's training does not depend on which host built what before."""
        key = architecture(self.spec.model, client_id)
        if key not in self._objectives:
            with torch.random.fork_rng(devices=[]):
                self._objectives[key] = build_objective(self.spec, client_id)
        obj = self._objectives[key]
        obj.class_counts = self.class_counts.get(client_id)
        return obj

    def _begin(self, broadcast: Broadcast, payload: ClientPayload) -> ClientObjective:
        obj = self.objective(payload.client_id)
        if payload.client_state is None and (self.spec.init_params is not None or self.spec.init_seed is not None):
            obj.load_params(initial_params(self.spec, payload.client_id))
        obj.begin_round(broadcast, payload)
        return obj

    def _trainer(self) -> L.Trainer:
        s = self.spec
        return L.Trainer(
            accelerator=s.accelerator,
            devices=1,
            max_epochs=s.local_epochs if s.local_steps is None else -1,
            max_steps=s.local_steps if s.local_steps is not None else -1,
            logger=False,
            enable_progress_bar=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
        )

    def fit(self, broadcast: Broadcast, payload: ClientPayload) -> ClientUpdate:
        cid = payload.client_id
        x, y = self.train[cid]
        start = time.perf_counter()
        with torch_threads(self.spec.threads):
            torch.manual_seed(payload.seed)
            obj = self._begin(broadcast, payload)
            loader = DataLoader(
                TensorDataset(x, y),
                batch_size=self.spec.batch_size,
                shuffle=True,
                generator=torch.Generator().manual_seed(payload.seed),
                # a last batch of one sample breaks batch norm in training mode; drop it
                drop_last=len(y) % self.spec.batch_size == 1 and len(y) > 1,
            )
            self._trainer().fit(obj, loader)
            update = obj.end_round(payload, num_examples=len(y))
        update.metrics["fit_time_s"] = time.perf_counter() - start
        return update

    def evaluate(self, broadcast: Broadcast, payload: ClientPayload) -> ClientEval:
        cid = payload.client_id
        x, y = self.test[cid]
        with torch_threads(self.spec.threads):
            obj = self._begin(broadcast, payload)
            metrics = evaluate_model(obj, x, y, self.spec.eval_batch_size)
        return ClientEval(client_id=cid, num_examples=len(y), metrics=metrics)
