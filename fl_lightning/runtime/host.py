"""`ClientHost`: holds some clients' data shards and resident state, and runs their local
fits and evaluations.

It is the same code in both executors: `SerialExecutor` calls it in the driver process,
`RayExecutor` wraps it in an actor. Nothing here imports Ray. A client's state
(`ClientState`: personal weights, MOON's previous model, SCAFFOLD's variate, ...) lives
here between rounds; the driver only asks for it to checkpoint it, and gives it back on
resume.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import logging
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loops import _FitLoop, _TrainingEpochLoop
from torch.utils.data import DataLoader, TensorDataset

from ..core.augment import Augment, augment_batch, step_seed
from ..core.batched import model_refusal
from ..core.bn_stats import BNStats, collect_bn_stats
from ..core.centralized import torch_threads as torch_threads  # here since the runtime began with it
from ..core.errors import ConfigError
from ..core.messages import Broadcast, ClientEval, ClientPayload, ClientUpdate
from ..core.metrics import EvalSpec
from ..core.objective import ClientObjective, Phase, Rows, evaluate, trainable_only
from ..core.optim import OptimConfig
from ..core.params import to_cpu
from ..core.privacy.dp_sgd import attach_per_sample_hooks, dp_optimizer
from ..core.strategy import client_seed
from ..core.types import ClientId, ClientState, StateDict
from ..data.registry import ArrayDataset, StoredImages
from ..methods import METHODS, import_methods
from ..models import MODELS, architecture, build_client_model
from .batched import Shard, train_stacked

#: runtime.precision: the values config.py accepts, a subset of what `L.Trainer(precision=)` takes
Precision = Literal["32", "bf16-mixed", "16-mixed"]
_PRECISIONS: dict[str, Precision] = {"32": "32", "bf16-mixed": "bf16-mixed", "16-mixed": "16-mixed"}


def precision_of(value: object) -> Precision:
    """`runtime.precision` (already checked by config.py) as Lightning's literal type."""
    return _PRECISIONS[str(value)]


#: a shard's images: a float tensor (training) or `StoredImages` (test splits)
R = TypeVar("R", bound=Rows)


@runtime_checkable
class FrozenImageTower(Protocol):
    """A model with a frozen image tower whose features it takes as input (the CLIP prompt
    learner): `frozen_image_features` says whether to compute them once and keep them."""

    frozen_image_features: bool

    def encode_images(self, x: torch.Tensor) -> torch.Tensor: ...


def frozen_tower(model: object) -> FrozenImageTower | None:
    """`model` as a `FrozenImageTower` when it declares `frozen_image_features`; else None."""
    if isinstance(model, FrozenImageTower) and model.frozen_image_features:
        return model
    return None


#: images per `encode_images` call in `encode_batches`: the towers' own batch (their
#: `encode_images(batch_size=256)`), so every image is encoded in the same batch as when the
#: whole set went in at once: the same features, bit for bit
ENCODE_BATCH = 256


def encode_batches(tower: FrozenImageTower, x: Rows, device: torch.device) -> torch.Tensor:
    """The tower's features of `x` (CPU), `ENCODE_BATCH` images at a time: each batch is
    normalised (`StoredImages`), moved to `device` alone and its features brought back, so
    neither the host nor the device ever holds more than one batch of float images."""
    n = len(x)
    parts = [tower.encode_images(x[i : i + ENCODE_BATCH].to(device)).cpu() for i in range(0, n, ENCODE_BATCH)]
    return torch.cat(parts) if parts else tower.encode_images(x[0:0].to(device)).cpu()


@dataclass(frozen=True)
class ClientSpec:
    """Everything a host needs to build a client's objective and trainer (picklable, immutable;
    `threads` and `accelerator` are the placement's: `Placement.place`)."""

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
    eval_spec: EvalSpec | None = None  # what evaluations measure (None: accuracy over num_classes)
    bn_stats: str = "averaged"  # fl.bn_stats: local keeps batch-norm statistics with each client
    #: the initial weights: a client seen for the first time starts from them, whatever
    #: client the (reused) objective served before
    init_params: dict[str, torch.Tensor] | None = None
    #: without `init_params` (a model family: no one set of weights fits every client), a
    #: client seen for the first time starts from its own model initialised with a seed
    #: derived from (init_seed, client id): the same in every executor
    init_seed: int | None = None
    #: runtime.resident_shards: batches by index from the shard on the fit's device (no loader)
    resident_shards: bool = True
    precision: Precision = "32"  # runtime.precision, Lightning's
    #: the module of the method's strategy, imported by a host that has not registered the
    #: method (a package's own, named by the run's `methods=`): a worker then registers it too
    method_module: str = ""
    #: runtime.batched: train this many of a round's clients at a time, stacked (`fit_many`); 0: one by one
    batched: int = 0
    #: data.augment: what every training batch gets on the fit's device (None: nothing)
    augment: Augment | None = None
    #: privacy=dp_sgd: (noise multiplier σ, per-example clip C) of Opacus' DP-SGD; None: plain SGD
    dp_sgd: tuple[float, float] | None = None


class ResidentBatches:
    """A client's shard on the fit's device, batched by index: the same batches, in the same
    order, as `DataLoader(TensorDataset(x, y), batch_size, shuffle=True, generator=g,
    drop_last=...)` gives on the CPU (per epoch: one int64 drawn for the loader's base seed,
    `randperm(n)`, and RandomSampler's second, unused `randperm(n)` at the same point),
    without a per-sample collate or a host-to-device copy per step. `dataset` and
    `batch_size` are the loader's, for hooks that read them (FedProto)."""

    def __init__(
        self, x: torch.Tensor, y: torch.Tensor, batch_size: int, generator: torch.Generator,
        drop_last: bool, device: torch.device,
    ) -> None:  # fmt: skip
        self.dataset = TensorDataset(x, y)  # on the CPU, as the host holds it
        self.batch_size, self.generator, self.drop_last = batch_size, generator, drop_last
        self.x, self.y = x.to(device), y.to(device)  # once per fit

    def __len__(self) -> int:
        n = len(self.y)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n, bs, g = len(self.y), self.batch_size, self.generator
        torch.empty((), dtype=torch.int64).random_(generator=g)  # the loader's base seed
        order = torch.randperm(n, generator=g).to(self.x.device)
        for i in range(n // bs):
            idx = order[i * bs : (i + 1) * bs]
            yield self.x[idx], self.y[idx]
        # RandomSampler's second, unused randperm runs when its indices run out: before the
        # last, partial batch, or on the call after the last full one (as a lazy BatchSampler)
        torch.randperm(n, generator=g)
        if n % bs and not self.drop_last:
            idx = order[(n // bs) * bs :]
            yield self.x[idx], self.y[idx]


class AugmentedBatches:
    """The batches of `loader` (resident or a DataLoader's), the images augmented on `device`
    (`core/augment.py`), the n-th batch of the fit with draws seeded from (the fit's seed, n);
    `clean_view`: the un-augmented images too, third (`ClientObjective.clean_view`). `dataset`
    and `batch_size` are the loader's (FedProto's hook reads them: un-augmented)."""

    def __init__(
        self, loader: ResidentBatches | DataLoader[tuple[torch.Tensor, ...]], augment: Augment, seed: int,
        device: torch.device, clean_view: bool = False,
    ) -> None:  # fmt: skip
        self.loader, self.augment, self.seed, self.device = loader, augment, seed, device
        self.clean_view = clean_view
        self.dataset, self.batch_size = loader.dataset, loader.batch_size
        self.step = 0  # batches drawn so far in this fit, over its epochs and phases

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        for x, y in self.loader:
            seed = step_seed(self.seed, self.step)
            self.step += 1
            x = x.to(self.device)
            augmented = augment_batch(x, self.augment, seed)
            yield (augmented, y, x) if self.clean_view else (augmented, y)


#: what a fit draws its batches from
Loader = DataLoader[tuple[torch.Tensor, ...]] | ResidentBatches | AugmentedBatches


def drop_last(n: int, batch_size: int) -> bool:
    """Whether a fit drops its shard's last batch: only one of a single example (batch norm fails on it)."""
    return n % batch_size == 1 and n > 1


def fit_batches(n: int, batch_size: int, epochs: int | None, steps: int | None = None) -> list[int]:
    """The size of every batch of a fit over `n` examples, in order: what `batch_indices`
    draws (and a Lightning fit with `max_epochs` / `max_steps` runs), without the draws;
    `steps` (max_steps) wins over `epochs`."""
    whole, rest = divmod(n, batch_size)
    epoch = [batch_size] * whole + ([rest] if rest and not drop_last(n, batch_size) else [])
    if not epoch:
        return []
    if steps is None:
        return epoch * int(epochs or 0)
    return (epoch * -(-steps // len(epoch)))[:steps]


def batch_indices(
    n: int, batch_size: int, seed: int, epochs: int, steps: int | None = None
) -> list[tuple[int, torch.Tensor]]:
    """(epoch, example indices) of every step of a fit over `n` examples, in order: the batches
    `ResidentBatches` (and the DataLoader) draw from the fit's generator, over `epochs` epochs, or
    the first `steps` of as many epochs as they need (Lightning's max_steps). Like Lightning, an
    epoch takes `len(batches)` batches and asks for no more: when they come out even, the
    sampler's second randperm is never drawn."""
    g = torch.Generator().manual_seed(seed)
    order = torch.arange(n)
    batches = ResidentBatches(order, order, batch_size, g, drop_last(n, batch_size), torch.device("cpu"))
    out: list[tuple[int, torch.Tensor]] = []
    epoch = 0
    while len(batches) and (epoch < epochs if steps is None else len(out) < steps):
        for idx, _ in itertools.islice(batches, len(batches)):
            out.append((epoch, idx))
            if steps is not None and len(out) == steps:
                break
        epoch += 1
    return out


def build_objective(spec: ClientSpec, client_id: ClientId = 0) -> ClientObjective[Any]:
    """Client `client_id`'s objective (its architecture, when `spec.model` is a family).

    A mistake in the config (an argument the model or the method does not take) is a
    ConfigError naming the part; an error raised while building is a bug and propagates."""
    model_fn = MODELS.get(architecture(spec.model, client_id))
    _check_call(
        f"model {spec.model!r}", model_fn, spec.model_kwargs, ("num_classes", "in_channels", "image_size")
    )
    model = build_client_model(
        spec.model, client_id, spec.num_classes, spec.in_channels, spec.image_size, **spec.model_kwargs
    )
    if spec.method not in METHODS and spec.method_module:
        import_methods([spec.method_module], what="the method's module")
    strategy = METHODS.get(spec.method)
    _check_call(f"method {spec.method!r}", strategy.objective_cls, spec.objective_kwargs, ("model",))
    objective = strategy.build_objective(model, spec.optim, **spec.objective_kwargs)
    objective.eval_spec = spec.eval_spec or EvalSpec(num_classes=spec.num_classes)
    objective.local_bn_stats = spec.bn_stats == "local"
    return objective


def _check_call(part: str, fn: Any, kwargs: dict[str, Any], given: tuple[str, ...]) -> None:
    """ConfigError naming `part` when `fn` does not take `kwargs` (checked by signature,
    before calling, so errors raised inside `fn` are never mistaken for config errors)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    params = sig.parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        valid = ", ".join(k for k in params if k not in given and k != "self") or "(none)"
        raise ConfigError(f"{part} takes no argument {unknown[0]!r}; valid: {valid}")


def initial_params(spec: ClientSpec, client_id: ClientId) -> StateDict:
    """The weights a client starts from: `spec.init_params`, else its own model built under
    a seed derived from (spec.init_seed, client id). Leaves the global RNG untouched."""
    if spec.init_params is not None:
        return spec.init_params
    if spec.init_seed is None:
        raise ValueError("ClientSpec needs init_params or init_seed")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(client_seed(spec.init_seed, 0, client_id))
        return to_cpu(build_objective(spec, client_id).model_state())


def quiet_lightning() -> None:
    """No banners or per-fit info lines: a host runs thousands of tiny fits."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*`training_step` returns.*")
    warnings.filterwarnings("ignore", module=r"lightning(_utilities)?\..*")


def _fit(trainer: L.Trainer, obj: ClientObjective[Any], loader: Loader) -> None:
    """`trainer.fit`, with Ctrl-C kept a Ctrl-C: Lightning answers a KeyboardInterrupt in a fit
    by ignoring SIGINT from then on and calling `sys.exit(1)`, so a serial run would end
    "failed" with exit 1 instead of "interrupted" (exit 130, resumable), and every process it
    starts afterwards would inherit an ignored SIGINT."""
    handler = signal.getsignal(signal.SIGINT)
    try:
        trainer.fit(obj, loader)
    except SystemExit as e:
        interrupt = e.__context__
        if not isinstance(interrupt, KeyboardInterrupt):
            raise
        if threading.current_thread() is threading.main_thread() and handler is not None:
            signal.signal(signal.SIGINT, handler)
        raise interrupt from None  # a Ctrl-C, or a SIGTERM (`Terminated`)


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
        self.train = {
            c: dataset.tensors(dataset.train_x[i], dataset.train_y[i]) for c, i in train_indices.items()
        }
        self.class_counts = {
            c: torch.bincount(y, minlength=spec.num_classes)
            for c, (_, y) in self.train.items()
            if y.dim() == 1
        }
        # Test splits stay uint8 and are normalised a batch at a time as they are scored
        # (`StoredImages`): a quarter of the float copy's memory, the same numbers.
        self.test: dict[ClientId, tuple[StoredImages, torch.Tensor]] = {
            c: dataset.stored(dataset.train_x[i], dataset.train_y[i]) for c, i in (test_indices or {}).items()
        }
        self._objectives: dict[Any, ClientObjective[Any]] = {}
        #: ("train" | "test", client) -> image features of a frozen tower (`_frozen_features`)
        self.features: dict[tuple[str, ClientId], torch.Tensor] = {}
        #: each hosted client's resident state; a client without an entry has not trained yet
        #: (or keeps nothing), and starts from the initial weights
        self.states: dict[ClientId, ClientState] = {}
        #: privacy=dp_sgd: Opacus' hooks on each objective's model, by the objective's id
        self._dp_hooks: dict[int, Any] = {}
        #: (thread, epochs, steps, clip) -> a Trainer reused for every fit with those limits
        #: (`_trainer`): building one costs ~10 ms, more than a tiny client's whole fit
        self._trainers: dict[tuple[int, int | None, int | None, float | None], L.Trainer] = {}

    @property
    def client_ids(self) -> list[ClientId]:
        return sorted(self.train)

    def objective(self, client_id: ClientId) -> ClientObjective[Any]:
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

    def _begin(
        self, broadcast: Broadcast, payload: ClientPayload, state: ClientState
    ) -> ClientObjective[Any]:
        obj = self.objective(payload.client_id)
        if payload.client_id not in self.states and (
            self.spec.init_params is not None or self.spec.init_seed is not None
        ):
            obj.load_params(initial_params(self.spec, payload.client_id))
        obj.client_state = state
        obj.begin_round(broadcast, payload)
        return obj

    def _trainer(self, phase: Phase) -> L.Trainer:
        """The Trainer for a fit of `phase`: one per (thread, limits), built once and reused.

        A finished Trainer's `fit` returns at once (its loops' progress says max_epochs or
        max_steps was reached), so a reused one gets fresh fit loops, built as `L.Trainer`
        builds them; everything else a fit needs (strategy setup, optimizers, data, logger
        results, signal handlers) Lightning sets up anew in every `fit`, as for a new Trainer.
        The exception is 16-mixed's GradScaler, whose scale carries over from fit to fit: that
        precision gets a new Trainer a fit, as before."""
        s = self.spec
        epochs, steps = (
            (phase.epochs, phase.steps)
            if (phase.epochs, phase.steps) != (None, None)
            else (s.local_epochs, s.local_steps)
        )
        clip = phase.grad_clip if phase.grad_clip is not None else (phase.optim or s.optim).grad_clip
        max_epochs, max_steps = (epochs if steps is None else -1), (steps if steps is not None else -1)
        key = (threading.get_ident(), epochs, steps, clip)
        trainer = self._trainers.get(key)
        if trainer is not None:
            trainer.fit_loop = _FitLoop(trainer, min_epochs=None, max_epochs=max_epochs)
            trainer.fit_loop.epoch_loop = _TrainingEpochLoop(trainer, min_steps=None, max_steps=max_steps)
            return trainer
        trainer = L.Trainer(
            accelerator=s.accelerator,
            devices=1,
            max_epochs=max_epochs,
            max_steps=max_steps,
            gradient_clip_val=clip,
            gradient_clip_algorithm="norm" if clip is not None else None,
            precision=s.precision,
            logger=False,
            enable_progress_bar=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
        )
        if s.precision != "16-mixed":
            self._trainers[key] = trainer
        return trainer

    def _device(self) -> torch.device:
        return torch.device("cuda" if self.spec.accelerator == "gpu" else "cpu")

    def _per_sample_hooks(self, obj: ClientObjective[Any]) -> None:
        """Opacus' per-example gradient hooks on `obj`'s model, once per objective (kept with it)."""
        if id(obj) not in self._dp_hooks:
            self._dp_hooks[id(obj)] = attach_per_sample_hooks(obj.model)

    def _loader(self, x: torch.Tensor, y: torch.Tensor, seed: int, clean_view: bool = False) -> Loader:
        bs, g = self.spec.batch_size, torch.Generator().manual_seed(seed)
        drop = drop_last(len(y), bs)
        loader: ResidentBatches | DataLoader[tuple[torch.Tensor, ...]] = (
            ResidentBatches(x, y, bs, g, drop, self._device())
            if self.spec.resident_shards
            else DataLoader(TensorDataset(x, y), batch_size=bs, shuffle=True, generator=g, drop_last=drop)
        )
        if self.spec.augment is not None and self.spec.augment.names:
            return AugmentedBatches(loader, self.spec.augment, seed, self._device(), clean_view)
        return loader

    def _state_copy(self, cid: ClientId) -> ClientState:
        """A deep copy of client `cid`'s resident state for one fit or evaluation: whatever the
        objective does to it, in place included (a tensor's `add_`), reaches the resident state
        only through a fit that completes."""
        return copy.deepcopy(self.states.get(cid, {}))

    def fit(self, broadcast: Broadcast, payload: ClientPayload) -> ClientUpdate:
        cid = payload.client_id
        x, y = self.train[cid]
        start = time.perf_counter()
        # the objective works on a copy: a fit that fails leaves the resident state as it was
        state = self._state_copy(cid)
        with torch_threads(self.spec.threads):
            torch.manual_seed(payload.seed)
            obj = self._begin(broadcast, payload, state)
            phases = obj.phases()
            if phases:
                x = self._frozen_features(obj, ("train", cid), x)
            loader = self._loader(x, y, payload.seed, obj.clean_view)
            if self.spec.dp_sgd is not None:  # per-example clipping and noise, seeded by the fit's seed
                self._per_sample_hooks(obj)
                sigma, clip = self.spec.dp_sgd
                obj.optimizer_wrapper = dp_optimizer(sigma, clip, self.spec.batch_size, payload.seed)
            if type(obj).before_fit is not ClientObjective.before_fit:
                obj.to(self._device())
                obj.before_fit(x, y)
            for phase in phases:
                obj.phase = phase
                with trainable_only(obj.model, phase.trainable):
                    try:
                        _fit(self._trainer(phase), obj, loader)
                    except BaseException:  # a failed fit leaves its Trainer half torn down: build anew
                        self._trainers.clear()
                        raise
            # eval.timing=trained: the model as local training left it, before it uploads
            evaluation = self._evaluate(obj, cid) if payload.evaluate and cid in self.test else None
            update = obj.end_round(payload, num_examples=len(y))
        if state or cid in self.states:
            self.states[cid] = state
        update.metrics["fit_time_s"] = time.perf_counter() - start
        update.evaluation = evaluation
        return update

    def fit_many(self, broadcast: Broadcast, payloads: list[ClientPayload]) -> list[ClientUpdate]:
        """`fit` for each payload, the clients trained together with stacked weights
        (`runtime.batched`, `batched.py`): each sees the batches and steps it would see alone,
        so the updates are `fit`'s to float rounding. `fit_time_s` is each one's share of the
        time. Only for objectives that declare `batched_step` (checked before the run starts)."""
        start = time.perf_counter()
        s, device = self.spec, self._device()
        with torch_threads(s.threads):
            starts, shards = [], []
            for p in payloads:
                torch.manual_seed(p.seed)
                obj = self._begin(broadcast, p, self._state_copy(p.client_id))
                obj.to(device)
                starts.append({n: t.detach().clone() for n, t in obj.named_parameters()})
                x, y = self.train[p.client_id]
                steps = batch_indices(len(y), s.batch_size, p.seed, s.local_epochs, s.local_steps)
                shards.append(Shard(x, y, steps))
            reason = model_refusal(obj) or (
                f"{type(obj).__name__} trains in phases or before_fit"
                if obj.phases() != [Phase()] or type(obj).before_fit is not ClientObjective.before_fit
                else None
            )
            if reason:  # the config checks refuse these before the run; a new method can still get here
                raise ConfigError(f"runtime.batched: {reason}")
            obj.on_train_start()  # the round's state every client shares (FedProto's prototypes)
            obj.train()
            trained = train_stacked(obj, starts, shards, s.optim, s.batch_size, device)
            share = (time.perf_counter() - start) / len(payloads)
            updates = []
            for k, p in enumerate(payloads):
                cid, state = p.client_id, self._state_copy(p.client_id)
                obj = self._begin(broadcast, p, state)
                with torch.no_grad():
                    for n, t in obj.named_parameters():
                        if n in trained.params:
                            t.copy_(trained.params[n][k])
                obj.end_batched(*trained.client(k))
                evaluation = self._evaluate(obj, cid) if p.evaluate and cid in self.test else None
                update = obj.end_round(p, num_examples=len(shards[k].y))
                if state or cid in self.states:
                    self.states[cid] = state
                update.metrics["fit_time_s"] = share
                update.evaluation = evaluation
                updates.append(update)
        return updates

    def evaluate(self, broadcast: Broadcast, payload: ClientPayload) -> ClientEval:
        cid = payload.client_id
        with torch_threads(self.spec.threads):
            return self._evaluate(self._begin(broadcast, payload, self._state_copy(cid)), cid)

    def _frozen_features(
        self, obj: ClientObjective[Any], key: tuple[str, ClientId], x: R
    ) -> R | torch.Tensor:
        """`x` as the model's frozen image tower sees it, computed once per run and kept with
        the shard, for a model that declares `frozen_image_features` (the CLIP prompt learner:
        it takes 2-d inputs as its own features) and un-augmented data; else `x`."""
        tower = frozen_tower(obj.model)
        if tower is None or (self.spec.augment and self.spec.augment.names):
            return x
        if key not in self.features:
            obj.to(self._device())
            self.features[key] = encode_batches(tower, x, self._device())
        return self.features[key]

    def _evaluate(self, obj: ClientObjective[Any], cid: ClientId) -> ClientEval:
        images, y = self.test[cid]
        if len(y) == 0:  # no test images of its own: no metrics (`client_*` leaves it out)
            return ClientEval(cid, 0)
        x = self._frozen_features(obj, ("test", cid), images)
        spec = obj.eval_spec or EvalSpec(num_classes=self.spec.num_classes)
        return ClientEval(cid, len(y), evaluate(obj, x, y, spec, self.spec.eval_batch_size))

    def bn_stats(self, broadcast: Broadcast, payload: ClientPayload) -> BNStats:
        """Sums of the batch-norm layers' inputs over this client's training data under the
        broadcast weights (`fl.bn_stats=recompute`); the client's state is untouched."""
        cid = payload.client_id
        x, _ = self.train[cid]
        with torch_threads(self.spec.threads):
            obj = self._begin(broadcast, payload, self._state_copy(cid))
            obj.to(self._device())
            return collect_bn_stats(obj.model, obj.forward, x, self.spec.batch_size, cid)

    # --- resident state: what checkpoints collect and resume gives back -----------------
    def get_states(self, client_ids: list[ClientId]) -> dict[ClientId, ClientState]:
        """The resident state of those clients that have one (CPU tensors)."""
        return {c: self.states[c] for c in client_ids if c in self.states}

    def set_states(self, states: dict[ClientId, ClientState]) -> None:
        for c, st in states.items():
            if c not in self.train:
                raise KeyError(f"client {c} is not hosted here")
            self.states[c] = st
