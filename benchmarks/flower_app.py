"""The Flower side of `vs_flower.py`: the benchmark workload as a Flower 1.41 app, run by
Flower's simulation engine (Ray backend) in a process of its own.

Same as fl_lightning's run: the data (fl_lightning's own loader and IID split, so the same
shards), the model class (fl_lightning's FedAvg CNN, the same initial weights for the same
seed), SGD with the config's lr/momentum/weight decay, batch size, local epochs, and the server
evaluation (accuracy of the aggregated model on the same test images, batches of
`eval.batch_size`, on the GPU when there is one), written the way a Flower user writes them:
a `ClientApp` whose train function loads its partition once per actor process (as
`flwr-datasets` does) and trains a plain PyTorch loop; a `ServerApp` running Flower's `FedAvg`
(every client every round, or `spec["per_round"]` of them sampled by Flower; no federated
evaluation) with a centralised `evaluate_fn`. Each actor keeps its shard resident (on its GPU
where it has one) and draws batches through a DataLoader or by index on the device
(`spec["batches"]`, see `_batches`).

Ray actors import this module by name (the benchmarks folder is on the driver's sys.path,
which Flower hands to its workers), so its top-level imports are only what a client needs.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

# Per process: the dataset and split, each partition's tensors per device, the model.
_CACHE: dict[Any, Any] = {}
# Filled by the ServerApp (a thread of the driver process): what vs_flower.py reports.
STAMPS: dict[str, list[float]] = {"round_start": [], "round_end": [], "eval_s": [], "accuracy": []}


def _data(spec: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(config, dataset, split) through fl_lightning's loader: the same shards as its run."""
    if "data" not in _CACHE:
        from fl_lightning.config import compose
        from fl_lightning.data.federated import prepare_data

        cfg = compose(spec["overrides"])
        _CACHE["data"] = (cfg, *prepare_data(cfg))
    return _CACHE["data"]


def _model(spec: dict[str, Any], device: torch.device) -> torch.nn.Module:
    """fl_lightning's model for the config (FedAvg's CNN), built from its registry."""
    from fl_lightning.models import build_model
    from fl_lightning.models.weights import MODEL_GENERIC_KEYS

    cfg, ds, _ = _data(spec)
    kwargs = dict(cfg.model)
    name = kwargs.pop("name")
    kwargs = {k: v for k, v in kwargs.items() if k not in MODEL_GENERIC_KEYS}  # `weights`: not the builder's
    return build_model(name, ds.num_classes, ds.in_channels, ds.image_size, **kwargs).to(device)


def _shard(spec: dict[str, Any], cid: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    key = ("shard", cid, str(device))
    if key not in _CACHE:
        _, ds, split = _data(spec)
        idx = split.train[cid]
        x, y = ds.tensors(ds.train_x[idx], ds.train_y[idx])
        _CACHE[key] = (x.to(device), y.to(device))
    return _CACHE[key]


def _batches(
    x: torch.Tensor, y: torch.Tensor, bs: int, gen: torch.Generator, how: str
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of shuffled batches: `dataloader`, a torch DataLoader over the shard (as
    fl_lightning's clients and engine_overhead's plain loop draw them); `index`, slices of the
    resident shard by a random permutation, on its device (no loader, no host copies)."""
    if how == "dataloader":
        from torch.utils.data import DataLoader, TensorDataset

        yield from DataLoader(TensorDataset(x, y), batch_size=bs, shuffle=True, generator=gen)
        return
    perm = torch.randperm(len(y), generator=gen).to(x.device)
    for i in range(0, len(y), bs):
        idx = perm[i : i + bs]
        yield x[idx], y[idx]


def _device() -> torch.device:
    # Ray gives an actor without `num_gpus` CUDA_VISIBLE_DEVICES="": it trains on the CPU.
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    spec = json.loads(str(config["spec"]))
    cfg = _data(spec)[0]
    cid, rnd = int(context.node_config["partition-id"]), int(config["server-round"])
    device = _device()
    torch.set_num_threads(int(spec["threads"]))
    x, y = _shard(spec, cid, device)
    key = ("model", str(device))
    if key not in _CACHE:
        _CACHE[key] = _model(spec, device)
    model = _CACHE[key]
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    seed = (int(spec["seed"]) * 1_000_003 + rnd * 10_007 + cid) % 2**31
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(
        model.parameters(), lr=cfg.optim.lr, momentum=cfg.optim.momentum, weight_decay=cfg.optim.weight_decay
    )
    model.train()
    n, bs = len(y), int(cfg.fl.batch_size)
    loss_sum, steps = 0.0, 0
    for _ in range(int(cfg.fl.local_epochs)):
        for xb, yb in _batches(x, y, bs, gen, spec["batches"]):
            if len(yb) < 2 <= n:  # as fl_lightning: a last batch of one sample is dropped
                continue
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            loss_sum += float(loss.detach())
            steps += 1
    reply = RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"num-examples": n, "train_loss": loss_sum / max(steps, 1)}),
        }
    )
    return Message(content=reply, reply_to=msg)


class TimedFedAvg(FedAvg):
    """Flower's FedAvg; records when each round's training is configured (the round starts)."""

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        STAMPS["round_start"].append(time.time())
        return super().configure_train(server_round, arrays, config, grid)


def server_app_for(spec: dict[str, Any]) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        cfg, ds, _ = _data(spec)
        ev = cfg.eval.device
        device = torch.device("cuda" if ev != "cpu" and torch.cuda.is_available() else "cpu")
        torch.manual_seed(int(cfg.seed))  # as fl_lightning: the same initial weights
        model = _model(spec, torch.device("cpu"))
        initial = ArrayRecord(model.state_dict())
        model = model.to(device)
        test_x, test_y = (t.to(device) for t in ds.tensors(ds.test_x, ds.test_y))
        eval_bs = int(cfg.eval.batch_size)

        @torch.no_grad()
        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            if server_round == 0:  # fl_lightning does not evaluate the initial model
                return None
            t0 = time.time()
            model.load_state_dict(arrays.to_torch_state_dict())
            model.eval()
            correct = 0
            for i in range(0, len(test_y), eval_bs):
                correct += int((model(test_x[i : i + eval_bs]).argmax(1) == test_y[i : i + eval_bs]).sum())
            acc = correct / len(test_y)
            t1 = time.time()
            STAMPS["eval_s"].append(t1 - t0)
            STAMPS["accuracy"].append(acc)
            STAMPS["round_end"].append(t1)
            return MetricRecord({"accuracy": acc})

        n = int(cfg.fl.num_clients)
        k = int(spec.get("per_round") or n)  # Flower's FedAvg samples k of the n nodes each round
        strategy = TimedFedAvg(
            fraction_train=k / n, fraction_evaluate=0.0, min_train_nodes=k, min_available_nodes=n
        )
        strategy.start(
            grid=grid,
            initial_arrays=initial,
            num_rounds=int(cfg.fl.rounds),
            train_config=ConfigRecord({"spec": json.dumps(spec)}),
            evaluate_fn=evaluate,
        )

    return app


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the workload through `flwr.simulation.run_simulation` on a local Ray that stays on
    loopback (the caller set the loopback variables and HOME in this process's environment
    before Ray was imported). Returns the stamps."""
    from flwr.simulation import run_simulation

    from fl_lightning.runtime import local_ray

    # Flower starts Ray itself (ray.init with the init_args below, since none is running);
    # mark its processes for fl_lightning's watchdog so none outlives this process.
    watchdog = local_ray.Watchdog()
    mark = watchdog.start()
    if mark:
        os.environ[local_ray.OWNER_ENV] = mark
    gpu = spec["device"] == "gpu"
    init_args = {
        "address": "local",  # never join another Ray found on the machine
        "num_cpus": os.cpu_count() or 1,
        "num_gpus": torch.cuda.device_count() if gpu else 0,
    }
    resources = {"num_cpus": 1, "num_gpus": float(spec["gpus_per_client"]) if gpu else 0.0}
    try:
        run_simulation(
            server_app=server_app_for(spec),
            client_app=client_app,
            num_supernodes=int(spec["clients"]),
            backend_config={"init_args": init_args, "client_resources": resources},
        )
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        watchdog.stop()
    return {"stamps": STAMPS, "ray_init_args": init_args, "client_resources": resources}
