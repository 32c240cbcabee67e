"""The round loop (Flower's `Strategy.start` analogue), in data:

    plan    = strategy.configure_round(state, rnd, rng)      # sample, broadcast, payloads
    updates = executor.fit(plan)                               # clients, completion order
    state   = strategy.aggregate(state, sorted(updates))       # then server_update
    metrics = evaluate(state)                                  # global and/or per client
    metrics.jsonl, checkpoint, loggers

All randomness is derived from (seed, round, client), and state is only `ServerState`, so
a run resumed from any checkpoint repeats exactly what the uninterrupted run would do.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ..config import clients_per_round, to_yaml, validate_registered
from ..core.errors import ConfigError
from ..core.messages import ClientEval, ServerState
from ..core.objective import ClientObjective, evaluate_model
from ..core.params import to_cpu
from ..core.strategy import OptimConfig, Strategy, TaskInfo, round_rng
from ..data.datasets import ArrayDataset, check_dataset, load_from_config
from ..data.federated import FederatedSplit, split_from_config
from ..data.stats import save_partition_plot
from ..methods import METHODS
from ..models import family
from . import checkpoint
from .executor import Executor, SerialExecutor
from .host import ClientHost, ClientSpec, build_objective
from .placement import Placement, plan_placement

log = logging.getLogger("fl_lightning")


@dataclass
class Prepared:
    """Everything a run needs before its first round (built without starting Ray)."""

    cfg: DictConfig
    dataset: ArrayDataset
    split: FederatedSplit
    strategy: Strategy
    spec: ClientSpec
    init_params: dict[str, torch.Tensor] | None  # the initial global weights (None: nothing shared)
    objective: ClientObjective


def new_run_dir(cfg: DictConfig) -> Path:
    run_id = cfg.run_id or (
        f"{cfg.method.name}_{cfg.data.name}_s{cfg.seed}_{time.strftime('%Y%m%d-%H%M%S')}_{secrets.token_hex(2)}"
    )
    return Path(cfg.output_dir).expanduser() / cfg.experiment / run_id


def prepare(cfg: DictConfig) -> Prepared:
    """Validate against the registries, load data, partition, build the initial model."""
    validate_registered(cfg)
    d = cfg.data
    check_dataset(d.name, d.root, d.download)
    dataset = load_from_config(d)  # with data.image_size, domains, ... and train/test subsets
    split = split_from_config(dataset, cfg)  # cached under <data.root>/.partitions/
    strategy_cls = METHODS.get(cfg.method.name)
    method_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(strategy_cls.config_cls), cfg.method))
    task = TaskInfo(
        num_classes=dataset.num_classes,
        class_names=tuple(dataset.class_names),
        dataset=cfg.data.name,
        text=OmegaConf.to_container(cfg.text, resolve=True),
        has_client_test_split=bool(split.test),
    )
    strategy = strategy_cls(method_cfg, cfg.fl.num_clients, clients_per_round(cfg), cfg.seed, task)
    model_kwargs = {k: (list(v) if OmegaConf.is_list(v) else v) for k, v in cfg.model.items() if k != "name"}
    spec = ClientSpec(
        method=cfg.method.name,
        objective_kwargs=strategy.objective_kwargs(),
        model=cfg.model.name,
        model_kwargs=strategy.model_kwargs(cfg.model.name, model_kwargs),
        optim=OptimConfig(**OmegaConf.to_container(cfg.optim)),
        num_classes=dataset.num_classes,
        in_channels=dataset.in_channels,
        image_size=dataset.image_size,
        local_epochs=cfg.fl.local_epochs,
        local_steps=cfg.fl.local_steps,
        batch_size=cfg.fl.batch_size,
        eval_batch_size=cfg.eval.batch_size,
    )
    torch.manual_seed(cfg.seed)
    try:
        objective = build_objective(spec)  # the driver's copy: initial weights, global evaluation
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model {spec.model!r}: {e}") from None
    if family(spec.model) is None:
        spec.init_params = to_cpu(objective.model.state_dict())
        init_params: dict[str, torch.Tensor] | None = spec.init_params
    else:
        # Heterogeneous clients: each starts from its own seeded model; only weights every
        # architecture has alike (e.g. LG-FedAvg's head) can be global.
        init_params = _family_shared_params(spec, objective) or None
        spec.init_seed = int(cfg.seed)
    return Prepared(cfg, dataset, split, strategy, spec, init_params, objective)


def _family_shared_params(spec: ClientSpec, objective: ClientObjective) -> dict[str, torch.Tensor]:
    """The shared (averaged) weights of a model family's members, which must agree in names
    and shapes; the driver's objective (client 0's architecture) gives their initial values."""
    shared = to_cpu(objective.shared_params())
    shapes = {k: tuple(v.shape) for k, v in shared.items()}
    fam = family(spec.model)
    for cid, arch in enumerate(fam.members[1:], start=1):  # type: ignore[union-attr]
        with torch.random.fork_rng(devices=[]):
            other = {k: tuple(v.shape) for k, v in build_objective(spec, cid).shared_params().items()}
        if other != shapes:
            diff = sorted(set(other) ^ set(shapes)) or sorted(k for k in shapes if shapes[k] != other[k])
            raise ConfigError(
                f"method {spec.method!r} averages weights that differ across the architectures of model "
                f"family {spec.model!r} ({fam.members[0]} vs {arch}: {', '.join(diff[:3])}); with "  # type: ignore[union-attr]
                "heterogeneous clients use a method that shares no weights (local, fedproto, fedtgp, "
                "feddistill, fedtsp) or only the head (lg_fedavg)"
            )
    return shared


def _placement(cfg: DictConfig, cpus: float, gpus: float) -> Placement:
    rt = cfg.runtime
    return plan_placement(
        cfg.fl.num_clients, cpus, gpus, rt.placement, rt.accelerator, rt.num_actors,
        rt.cpus_per_client, rt.gpus_per_client, rt.threads_per_client,
    )  # fmt: skip


def _local_resources(cfg: DictConfig) -> tuple[float, float]:
    gpus = cfg.runtime.num_gpus if cfg.runtime.num_gpus is not None else torch.cuda.device_count()
    return float(cfg.runtime.num_cpus or os.cpu_count() or 1), float(gpus)


def client_metrics(evals: Sequence[ClientEval]) -> dict[str, float]:
    """Personalised metrics over clients' own test splits."""
    acc = np.array([e.metrics["accuracy"] for e in evals])
    n = np.array([e.num_examples for e in evals], dtype=float)
    worst = np.sort(acc)[: max(1, int(np.ceil(0.1 * len(acc))))]
    return {
        "client_accuracy": float((acc * n).sum() / n.sum()),
        "client_accuracy_mean": float(acc.mean()),
        "client_accuracy_std": float(acc.std()),
        "client_accuracy_worst10": float(worst.mean()),
    }


class Run:
    """One federated run in a run directory: start, resume, or continue."""

    def __init__(self, prepared: Prepared, run_dir: Path, resume: bool = False, console: bool = True) -> None:
        self.p = prepared
        self.cfg = prepared.cfg
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.console = console
        self._test = prepared.dataset.tensors(prepared.dataset.test_x, prepared.dataset.test_y)

    # --- setup -------------------------------------------------------------------------
    def _initial_state(self) -> tuple[ServerState, dict[str, Any]]:
        path = checkpoint.latest(self.run_dir) if self.resume else None
        if path is not None:
            return checkpoint.load(path)
        return self.p.strategy.init_state(self.p.init_params), {}  # new, or killed before round 1

    def _executor(self) -> tuple[Executor, Placement, bool]:
        cfg = self.cfg
        if cfg.runtime.executor == "serial":
            placement = _placement(cfg, *_local_resources(cfg))
            self.p.spec.threads = placement.threads
            self.p.spec.accelerator = placement.accelerator
            host = ClientHost(self.p.spec, self.p.dataset, dict(enumerate(self.p.split.train)), dict(enumerate(self.p.split.test)))
            return SerialExecutor(host), placement, False
        from .local_ray import init_ray

        started = init_ray(cfg.runtime.address, cfg.runtime.num_cpus, cfg.runtime.num_gpus)
        import ray

        from .ray_executor import RayExecutor

        try:
            res = ray.cluster_resources()
            placement = _placement(cfg, res.get("CPU", 1.0), res.get("GPU", 0.0))
            self.p.spec.threads = placement.threads
            self.p.spec.accelerator = placement.accelerator
            ex = RayExecutor(
                self.p.spec, self.p.dataset, self.p.split.train, self.p.split.test,
                placement, cfg.fl.max_client_failures,
                cfg.runtime.placement_strategy, cfg.runtime.schedule_timeout_s,
            )  # fmt: skip
            ex.ready()
        except BaseException:
            if started:
                ray.shutdown()
            raise
        return ex, placement, started

    def _loggers(self, meta: dict[str, Any]) -> list[Any]:
        from ..tracking.loggers import WandbLogger

        lc = self.cfg.logger
        if lc.backend != "wandb" or lc.mode == "disabled":
            return []
        config = OmegaConf.to_container(self.cfg, resolve=True)
        config["strategy"] = self.p.strategy.summary()
        config["partition"] = {"train_sizes": [int(len(t)) for t in self.p.split.train]}
        wb = WandbLogger(
            self.run_dir, self.run_dir.name, lc.project, lc.entity, lc.group or self.cfg.experiment,
            [self.cfg.method.name, self.cfg.data.name, f"seed:{self.cfg.seed}", *lc.tags], lc.mode, config,
            meta.get("wandb_id"),
        )  # fmt: skip
        if not meta.get("wandb_id"):  # once per W&B run (a resumed run has it already)
            wb.log_partition(self.run_dir / "partition.json", self.run_dir / "partition.png")
        return [wb]

    # --- evaluation ----------------------------------------------------------------------
    def _global_eval(self, state: ServerState) -> dict[str, float]:
        broadcast = self.p.strategy.eval_broadcast(state)
        if broadcast is None:
            return {}
        device = self.cfg.eval.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        obj = self.p.objective.to(device)
        obj.begin_round(broadcast, None)
        return evaluate_model(obj, *self._test, batch_size=self.cfg.eval.batch_size)

    def _client_eval(self, executor: Executor, state: ServerState) -> dict[str, float]:
        if not (self.cfg.eval.clients and self.p.split.test):
            return {}
        plan = self.p.strategy.configure_evaluate(state, range(self.p.split.num_clients))
        return client_metrics(sorted(executor.evaluate(plan), key=lambda e: e.client_id))

    # --- the loop ---------------------------------------------------------------------------
    def execute(self) -> dict[str, Any]:
        from ..tracking.console import Progress, print_table
        from ..tracking.loggers import RunFiles

        cfg, strategy = self.cfg, self.p.strategy
        state, meta = self._initial_state()
        files = RunFiles(self.run_dir, keep_until_round=state.round if self.resume else None)
        prior = files.records()
        wall_offset = float(prior[-1].get("wall_time_s", 0.0)) if prior else 0.0
        stats = self.p.split.stats(self.p.dataset)
        (self.run_dir / "partition.json").write_text(json.dumps(stats) + "\n")
        save_partition_plot(stats, self.run_dir / "partition.png")
        for w in strategy.warnings():
            log.warning(w)
        executor, placement, started_ray = self._executor()
        loggers: list[Any] = []
        ok = False
        progress = Progress(cfg.fl.rounds, initial=state.round, enabled=self.console)
        try:
            loggers = self._loggers(meta)
            meta = {"wandb_id": loggers[0].id} if loggers else {}
            start = time.perf_counter()
            for rnd in range(state.round + 1, cfg.fl.rounds + 1):
                state, record = self._round(executor, state, rnd)
                record["wall_time_s"] = wall_offset + time.perf_counter() - start
                files.log_round(rnd, record)
                checkpoint.save(self.run_dir, state, meta)
                for lg in loggers:
                    lg.log_round(rnd, record)
                progress.update(rnd, record)
            ok = True
        finally:
            progress.close()
            executor.close()
            if started_ray:
                import ray

                ray.shutdown()
            summary = self._summary(files.records(), placement)
            files.log_summary(summary)
            for lg in loggers:
                lg.log_summary(summary)
                lg.close(ok)
        if self.console:
            print_table(files.records(), summary, self.run_dir)
        return summary

    def _round(self, executor: Executor, state: ServerState, rnd: int) -> tuple[ServerState, dict[str, Any]]:
        strategy = self.p.strategy
        t0 = time.perf_counter()
        plan = strategy.configure_round(state, rnd, round_rng(self.cfg.seed, rnd))
        updates = sorted(executor.fit(plan), key=lambda u: u.client_id)
        if not updates:
            raise RuntimeError(f"round {rnd}: every client failed")
        t1 = time.perf_counter()
        state = strategy.aggregate(state, updates)
        state = dataclasses.replace(strategy.server_update(state, updates), round=rnd)
        t2 = time.perf_counter()
        record: dict[str, Any] = {}
        if rnd % self.cfg.eval.every == 0 or rnd == self.cfg.fl.rounds:
            record.update(self._global_eval(state))
            record.update(self._client_eval(executor, state))
        t3 = time.perf_counter()
        n = sum(u.num_examples for u in updates)
        record.update(
            train_loss=sum(u.metrics.get("train_loss", 0.0) * u.num_examples for u in updates) / max(n, 1),
            clients=len(updates),
            clients_failed=len(plan.payloads) - len(updates),
            bytes_down=plan.broadcast.nbytes() * len(plan.payloads),
            bytes_up=sum(u.upload_nbytes() for u in updates),
            time_fit_s=t1 - t0,
            time_server_s=t2 - t1,
            time_eval_s=t3 - t2,
            round_time_s=t3 - t0,
        )
        return state, record

    def _summary(self, records: list[dict[str, Any]], placement: Placement) -> dict[str, Any]:
        evald = [r for r in records if "accuracy" in r or "client_accuracy" in r]
        key = "accuracy" if any("accuracy" in r for r in evald) else "client_accuracy"
        out: dict[str, Any] = {
            "method": self.cfg.method.name,
            "dataset": self.cfg.data.name,
            "model": self.cfg.model.name,
            "seed": int(self.cfg.seed),
            "experiment": self.cfg.experiment,
            "run_id": self.run_dir.name,
            "executor": self.cfg.runtime.executor,
            "num_clients": int(self.cfg.fl.num_clients),
            "rounds": int(self.cfg.fl.rounds),
            "rounds_completed": int(records[-1]["round"]) if records else 0,
            "accuracy_metric": key,
            "final_accuracy": None,
            "best_accuracy": None,
            "best_round": None,
            "wall_time_s": float(records[-1]["wall_time_s"]) if records else 0.0,
            "bytes_up_total": int(sum(r.get("bytes_up", 0) for r in records)),
            "bytes_down_total": int(sum(r.get("bytes_down", 0) for r in records)),
            "num_actors": placement.num_actors,
            "threads_per_client": placement.threads,
        }
        if evald:
            best = max(evald, key=lambda r: r[key])
            out.update(final_accuracy=evald[-1][key], best_accuracy=best[key], best_round=best["round"])
            for k in ("client_accuracy", "client_accuracy_mean", "client_accuracy_std", "client_accuracy_worst10"):
                if k in evald[-1] and k != key:
                    out[f"final_{k}"] = evald[-1][k]
        return out


def start_run(cfg: DictConfig, console: bool = True) -> tuple[dict[str, Any], Path]:
    """A new run: prepare (fails before writing anything), then create its directory."""
    prepared = prepare(cfg)
    from .local_ray import cluster_address

    if cfg.runtime.executor == "serial" or not cluster_address(cfg.runtime.address):
        _placement(cfg, *_local_resources(cfg))  # this machine cannot hold it: fail before any file
    run_dir = new_run_dir(cfg)
    if run_dir.exists():
        raise ConfigError(f"run directory {run_dir} exists; continue it with `fl-lightning resume {run_dir}`")
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    if console:
        print(f"run dir: {run_dir}", file=sys.stderr)
    return Run(prepared, run_dir, console=console).execute(), run_dir


def resume_run(run_dir: Path, cfg: DictConfig, console: bool = True) -> dict[str, Any]:
    prepared = prepare(cfg)
    return Run(prepared, Path(run_dir), resume=True, console=console).execute()
