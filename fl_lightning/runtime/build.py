"""Building a run before its first round: validate against the registries, load and
partition the data, build the strategy, the client spec and the initial model, and decide
where the clients run when they run on this machine (`Prepared.placement`; on a cluster, the
session decides it on joining: `Session.placement`). Nothing here starts Ray or writes a file
(`runner.py` runs what this builds).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import RootConfig, clients_per_round, participation, resolved_config, validate_registered
from ..core import secagg
from ..core.aggregation import AGGREGATION_STEPS, Aggregator, make_aggregator
from ..core.augment import Augment, black
from ..core.batched import model_refusal
from ..core.errors import ConfigError
from ..core.metrics import EvalSpec
from ..core.objective import ClientObjective
from ..core.params import to_cpu
from ..core.privacy.dp_sgd import DpSgdLedger
from ..core.privacy.dp_sgd import model_refusal as dp_sgd_model_refusal
from ..core.privacy.plan import PrivacyPlan, releases_of
from ..core.privacy.steps import DpFedAvgStep
from ..core.sampling import Sampling
from ..core.staleness import Staleness
from ..core.strategy import Strategy, TaskInfo
from ..data.federated import FederatedSplit, split_from_config
from ..data.registry import DATASETS, ArrayDataset, check_data, load_from_config
from ..methods import METHODS
from ..models import check_image_size, family, traits
from ..models.weights import MODEL_GENERIC_KEYS, load_trunk
from .host import ClientSpec, build_objective, precision_of
from .placement import Placement, local_resources, placement_for
from .system import read_arrivals


@dataclass
class Prepared:
    """Everything a run needs before its first round (built without starting Ray)."""

    cfg: RootConfig  # typed, as config.yaml records it (the method's resolved choices written in)
    dataset: ArrayDataset
    split: FederatedSplit
    strategy: Strategy[Any, Any, Any]
    spec: ClientSpec
    init_params: dict[str, torch.Tensor] | None  # the initial global weights (None: nothing shared)
    objective: ClientObjective[Any]  # the driver's copy: initial weights, global evaluation
    eval_spec: EvalSpec
    server_x: np.ndarray | None = None  # `data.server_subset`: unlabeled images for the server
    weights_info: dict[str, Any] | None = None  # `model.weights`: the pretrained trunk loaded
    # where its clients run, decided once: on this machine's resources (`runtime=serial`, a
    # private local Ray) or `early_start`'s; None: a cluster's, known once joined
    placement: Placement | None = None
    #: `privacy=dp_fedavg`: the mechanism, σ calibrated (docs/privacy.md); None: no privacy
    privacy: PrivacyPlan | None = None


def prepare(
    cfg: RootConfig, trunk: str | None = None, first_round: int = 1, placement: Placement | None = None
) -> Prepared:
    """Validate against the registries, decide the placement, load data, partition, build the
    initial model. `trunk`: the file `model.weights` is read from (a resumed run's own copy of
    it); `placement`: one already decided (`early_start`'s, on the Ray it started)."""
    method_cfg = validate_registered(cfg, trunk)  # checked before any data
    privacy = None  # σ calibrated for the planned rounds (a one-line error before any data)
    if cfg.privacy.name != "none":
        releases = releases_of(type(method_cfg).name, method_cfg)  # prototypes: releases of their own
        privacy = PrivacyPlan.of(cfg.privacy, cfg.fl, clients_per_round(cfg), releases)
    if placement is None and not _on_cluster(cfg):
        placement = placement_for(cfg, *local_resources(cfg))  # this machine cannot hold it: one line now
    if cfg.runtime.executor == "ray" and not _on_cluster(cfg):
        from .local_ray import private_ray_tmpdir

        private_ray_tmpdir()  # a Ray temp folder that is not this user's alone: one line now
    d, model = cfg.data, str(cfg.model["name"])
    check_data(d)
    dataset = load_from_config(d)  # with data.image_size, domains, ... and train/test subsets
    server_x = None
    if d.server_subset:  # the server's unlabeled images: out of the training set, before the split
        dataset, server_x = dataset.hold_out(int(d.server_subset))
    model_kwargs = {k: v for k, v in cfg.model.items() if k not in MODEL_GENERIC_KEYS}
    if d.image_size is None:  # the native size, known now (a configured one was checked before the data)
        size = dataset.image_size
        check_image_size(model, dataset.num_classes, dataset.in_channels, size, **model_kwargs)
    split = split_from_config(dataset, cfg)  # cached under <data.root>/.partitions/
    strategy_cls = METHODS.get(type(method_cfg).name)
    used = np.concatenate([np.asarray(t) for t in split.train]) if split.train else np.zeros(0, np.int64)
    if dataset.multilabel:  # per label: the training samples that carry it
        train_counts = tuple(int(c) for c in np.asarray(dataset.train_y[used]).sum(axis=0).round())
    else:
        counts = np.bincount(dataset.train_y[used], minlength=dataset.num_classes)
        train_counts = tuple(int(c) for c in counts)
    task = TaskInfo(
        num_classes=dataset.num_classes,
        class_names=tuple(dataset.class_names),
        dataset=cfg.data.name,
        text=dict(cfg.text),
        has_client_test_split=bool(split.test),
        multilabel=bool(dataset.multilabel),
        train_class_counts=train_counts,
        data=dataclasses.asdict(d),
        rounds=int(cfg.fl.rounds),
        image_mean=tuple(np.atleast_1d(np.asarray(dataset.mean, np.float64)).tolist()),
        image_std=tuple(np.atleast_1d(np.asarray(dataset.std, np.float64)).tolist()),
        class_sets=dataset.class_sets,
        coarse_groups=DATASETS.get(cfg.data.name).coarse_groups,
    )
    weights = None
    if cfg.fl.sampling == "size":  # a client is drawn with probability its share of the examples
        sizes = np.asarray([len(t) for t in split.train], dtype=np.float64)
        if np.count_nonzero(sizes) < clients_per_round(cfg):
            raise ConfigError(
                f"fl.sampling=size draws {clients_per_round(cfg)} clients a round, but only "
                f"{np.count_nonzero(sizes)} hold training examples"
            )
        weights = tuple((sizes / sizes.sum()).tolist())
    # fl.bn_stats=local: no one set of statistics, so each client's own model is evaluated
    # fl.sampling=poisson: each client joins with probability m/N, cohorts of m on average
    rate = clients_per_round(cfg) / cfg.fl.num_clients if cfg.fl.sampling == "poisson" else None
    sampling = Sampling(participation(cfg), weights, local_bn=cfg.fl.bn_stats == "local", poisson_rate=rate)
    aggregator = build_aggregator(cfg, max(len(t) for t in split.train) if split.train else 1, privacy)
    if privacy is not None and privacy.ledger is not None:  # dp_sgd: each client's accounting
        shards = [len(t) for t in split.train if len(t)]
        ledger = dataclasses.replace(privacy.ledger, smallest_shard=min(shards) if shards else 0)
        privacy = dataclasses.replace(privacy, ledger=ledger)
        aggregator = dp_sgd_chain(ledger, aggregator)
    strategy = strategy_cls(
        method_cfg,
        cfg.fl.num_clients,
        sampled_per_round(cfg),
        cfg.seed,
        task,
        aggregator=aggregator,
        sampling=sampling,
    )
    # the asynchronous modes' refusal first: their staleness step is in the chain, and a method
    # that skips the chain should hear about system.mode, not about a step it never set
    check_system(cfg, strategy)
    check_aggregation(strategy)
    ev = cfg.eval
    eval_spec = strategy.eval_spec(
        ev.per_class, list(ev.longtail) if ev.longtail is not None else None, ev.threshold
    )
    coarse = DATASETS.get(cfg.data.name).coarse_groups  # the dataset's own (`DatasetEntry`)
    if coarse is not None and not dataset.multilabel:  # the within-group error share
        eval_spec = dataclasses.replace(eval_spec, coarse_groups=coarse)
    spec = ClientSpec(
        method=type(method_cfg).name,
        method_module=strategy_cls.__module__,
        objective_kwargs=strategy.objective_kwargs(),
        model=model,
        model_kwargs=strategy.model_kwargs(model, model_kwargs),
        optim=cfg.optim,
        num_classes=dataset.num_classes,
        in_channels=dataset.in_channels,
        image_size=dataset.image_size,
        local_epochs=cfg.fl.local_epochs,
        local_steps=cfg.fl.local_steps,
        batch_size=cfg.fl.batch_size,
        eval_batch_size=cfg.eval.batch_size,
        eval_spec=eval_spec,
        bn_stats=cfg.fl.bn_stats,
        resident_shards=bool(cfg.runtime.resident_shards),
        precision=precision_of(cfg.runtime.precision),
        batched=int(cfg.runtime.batched),
        dp_sgd=(privacy.noise_multiplier, privacy.clip) if privacy is not None and privacy.ledger else None,
        augment=Augment(
            tuple(d.augment),
            int(d.augment_padding),
            float(d.augment_degrees),
            black(dataset.mean, dataset.std),
        )
        if d.augment
        else None,  # fmt: skip
    )
    torch.manual_seed(cfg.seed)
    objective = build_objective(spec)  # the driver's copy: initial weights, global evaluation
    # what only the built model shows (`MethodConfig.check_model`), before Ray or any file
    strategy.check_model(objective.model)
    if spec.batched and (why := model_refusal(objective)):  # before Ray or any file
        raise ConfigError(f"runtime.batched={spec.batched}: {why}; use runtime.batched=0")
    if privacy is not None and privacy.ledger is not None:  # what Opacus cannot take: one line
        if (why := dp_sgd_model_refusal(objective.model, spec.model)) is not None:
            raise ConfigError(why)
    elif privacy is not None:  # integer buffers are averaged as they are: a count the noise misses
        ints = [k for k, v in objective.shared_params().items() if not v.is_floating_point()]
        if ints:
            raise ConfigError(
                f"privacy=dp_fedavg noises floating tensors only; model {spec.model} uploads integer "
                f"buffers ({ints[0]}: batch norm's step count) that would be averaged without noise: "
                "use a model without batch norm (model=cnn) or with GroupNorm"
            )
    weights_info = None
    weights = cfg.model.get("weights")
    if weights:  # the pretrained trunk: in the initial global weights every client gets
        weights_info = load_trunk(objective.model, trunk or str(weights))
        weights_info["path"] = str(Path(str(weights)).expanduser())  # the file named, as it started
    if family(spec.model) is None:
        init_params: dict[str, torch.Tensor] | None = to_cpu(objective.model_state())
        spec = dataclasses.replace(spec, init_params=init_params)
    else:
        # Heterogeneous clients: each starts from its own seeded model; only weights every
        # architecture has alike (e.g. LG-FedAvg's head) can be global.
        init_params = _family_shared_params(spec, objective) or None
        spec = dataclasses.replace(spec, init_seed=int(cfg.seed))
    kwargs = traits(spec.model).recorded(dict(spec.model_kwargs))  # the model's own (C-Tran's `pretrained`)
    resolved = resolved_config(cfg, strategy.resolved(objective.model), spec.model, kwargs)
    prepared = Prepared(
        resolved,
        dataset,
        split,
        strategy,
        spec,
        init_params,
        objective,
        eval_spec,
        server_x,
        weights_info,
        placement,
        privacy,
    )
    if on_cpu(cfg):  # a model with a slow step says how long the rounds will take, before they start
        from .plan import announce_client_training

        announce_client_training(prepared, first_round)
    return prepared


def _family_shared_params(spec: ClientSpec, objective: ClientObjective[Any]) -> dict[str, torch.Tensor]:
    """The shared (averaged) weights of a model family's members, which must agree in names
    and shapes; the driver's objective (client 0's architecture) gives their initial values."""
    shared = to_cpu(objective.shared_params())
    shapes = {k: tuple(v.shape) for k, v in shared.items()}
    fam = family(spec.model)
    assert fam is not None
    for cid, arch in enumerate(fam.members[1:], start=1):
        with torch.random.fork_rng(devices=[]):
            other = {k: tuple(v.shape) for k, v in build_objective(spec, cid).shared_params().items()}
        if other != shapes:
            diff = sorted(set(other) ^ set(shapes)) or sorted(k for k in shapes if shapes[k] != other[k])
            raise ConfigError(
                f"method {spec.method!r} averages weights that differ across the architectures of model "
                f"family {spec.model!r} ({fam.members[0]} vs {arch}: {', '.join(diff[:3])}); with "
                "heterogeneous clients use a method that shares no weights (local, fedproto, fedtgp, "
                "feddistill, fedtsp) or only the head (lg_fedavg)"
            )
    return shared


def _on_cluster(cfg: RootConfig) -> bool:
    """The clients run on a cluster's nodes, not this machine (`runtime.address`, `$RAY_ADDRESS`)."""
    from .local_ray import cluster_address

    rt = cfg.runtime
    return rt.executor != "serial" and bool(cluster_address(getattr(rt, "address", None)))


def on_cpu(cfg: RootConfig) -> bool:
    """The clients will train on this machine's CPU (not a GPU, not a cluster's nodes)."""
    rt = cfg.runtime
    if _on_cluster(cfg):
        return False  # a cluster's nodes: not this machine's speed
    return rt.accelerator == "cpu" or (rt.accelerator == "auto" and local_resources(cfg)[1] == 0)


def dp_sgd_chain(ledger: DpSgdLedger, chain: Aggregator) -> Aggregator:
    """`chain` with DP-SGD's record of each client's steps first (it reads the example counts
    before any step reweights them)."""
    return make_aggregator([ledger, *chain.steps])


def build_aggregator(
    cfg: RootConfig, largest_client: int = 1, privacy: PrivacyPlan | None = None
) -> Aggregator:
    """The run's aggregation chain, `aggregator.steps` in order (`core/aggregation.py`); an
    asynchronous server mode puts its staleness weights first (`core/staleness.py`).
    `largest_client`: the most training examples a client has (secagg_plus's default bound
    on a weight, so w/max_weight ≤ 1); `privacy=dp_fedavg`: its own step (clip, uniform
    weights, noise), alone."""
    if privacy is not None and privacy.ledger is None:
        # its synchronous rounds and an empty `aggregator.steps`: `RootConfig.check` refused the rest
        return Aggregator([DpFedAvgStep(privacy)])
    steps = [AGGREGATION_STEPS[name](cfg) for name in cfg.aggregator.steps]
    for i, s in enumerate(steps):
        if isinstance(s, secagg.SecAggPlus) and s.params.max_weight is None:
            bound = dataclasses.replace(s.params, max_weight=float(largest_client))
            steps[i] = dataclasses.replace(s, params=bound)
        if isinstance(s, secagg.DistributedGaussian):  # each client's share: σ²C²/m of the sum's
            steps[i] = dataclasses.replace(s, cohort=clients_per_round(cfg))
    if cfg.system.mode != "sync":
        if any(isinstance(s, secagg.SecAggPlus) for s in steps):
            raise ConfigError(
                f"aggregator.steps=[...,secagg_plus] unmasks the sum of a round's cohort, whose clients "
                f"share their mask seeds with each other; system.mode={cfg.system.mode} steps on K "
                "updates from different rounds: use system.mode=sync"
            )
        steps.insert(0, Staleness.from_config(cfg))
    return make_aggregator(steps)


def sampled_per_round(cfg: RootConfig) -> int:
    """Clients a round samples: `clients_per_round`, times `system.over_select` (the first K of
    them to arrive are kept)."""
    return int(math.ceil(clients_per_round(cfg) * float(cfg.system.over_select) - 1e-9))


def check_system(cfg: RootConfig, strategy: Strategy[Any, Any, Any]) -> None:
    """ConfigError for a `system=` the run's method or sampling cannot take, before any work.
    The asynchronous modes step the server on K updates that started from different versions:
    a method's server step must work on the chain's mean alone (FedAvg, FedProx, FedAvgM,
    FedAdam, FedGLCL, PromptFL, ...), not on a whole round of its clients."""
    s, fl = cfg.system, cfg.fl
    if s.clock == "wall" and cfg.runtime.executor != "ray":
        raise ConfigError(
            "system.clock=wall takes updates in the order Ray's workers finish them; runtime=serial trains "
            "one client at a time, in the order submitted (no order to measure): use runtime=ray, or "
            "system.replay=<a wall-clock run's arrivals.jsonl> to repeat one here"
        )
    if s.replay:
        read_arrivals(str(s.replay))  # a file that cannot be replayed: one line, before any work
    if s.over_select != 1.0 and fl.fraction_range is not None:
        raise ConfigError(
            "system.over_select keeps the first K of a fixed cohort: set fl.clients_per_round, "
            "not fl.fraction_range"
        )
    if s.mode == "sync":
        if s.availability != "always":
            raise ConfigError(
                "system.availability=fraction is modelled in the asynchronous modes "
                "(system.mode=fedbuff|fedasync)"
            )
        return
    why = ""
    if type(strategy).server_update is not Strategy.server_update:
        why = "its server step needs a whole round of its clients"
    elif not strategy.aggregates_through_chain or strategy.personalised:
        why = "it does not aggregate through the chain that weighs stale updates"
    elif "ctx" not in inspect.signature(type(strategy).aggregate).parameters:
        why = "its aggregate takes no ctx (the updates' staleness)"
    if why:
        raise ConfigError(
            f"method {strategy.name} cannot run in system.mode={s.mode}: {why}; use system.mode=sync"
        )
    if fl.sampling != "uniform" or fl.fraction_range is not None:
        raise ConfigError(
            f"system.mode={s.mode} dispatches each client uniformly among those free and online: "
            "fl.sampling=size and fl.fraction_range are for synchronous rounds"
        )
    buffer = 1 if s.mode == "fedasync" else int(s.buffer)
    if s.concurrency > fl.num_clients or buffer > fl.num_clients:
        raise ConfigError(
            f"system.concurrency (M={s.concurrency}) and the buffer (K={buffer}) must be at most "
            f"fl.num_clients={fl.num_clients}"
        )


def check_aggregation(strategy: Strategy[Any, Any, Any]) -> None:
    """ConfigError where the run's chain would be ignored or could not run: a method that does
    not aggregate through it (it keeps each client's model, or computes its weights from the
    raw updates), or an `aggregate` written before the chain received the round's context."""
    if not strategy.aggregator.steps:
        return
    names = ",".join(s.name for s in strategy.aggregator.steps)
    if isinstance(strategy.aggregator, secagg.SecureAggregator):
        reads = strategy.reads_each_update or (
            "" if strategy.aggregates_through_chain else strategy.aggregates_through_chain_why
        )
        if reads:
            raise ConfigError(
                f"method {strategy.name} cannot run under secagg_plus, which gives the server only the "
                f"cohort's sum: {reads}"
            )
    if not strategy.aggregates_through_chain:
        raise ConfigError(
            f"method {strategy.name} does not aggregate through the aggregation chain "
            f"({strategy.aggregates_through_chain_why or 'it reads each update itself'}): "
            f"aggregator.steps=[{names}] would not apply; use aggregator.steps=[]"
        )
    if "ctx" not in inspect.signature(type(strategy).aggregate).parameters:
        raise ConfigError(
            f"method {strategy.name}'s aggregate(state, updates) takes no ctx, so aggregator.steps=[{names}] "
            "cannot draw its noise: define aggregate(self, state, updates, ctx=None) and call "
            "self.average(state, updates, ctx)"
        )
