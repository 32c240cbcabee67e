"""The BlazeFL side of `peers.py`: the workload as BlazeFL's own FedAvg (`blazefl.contrib`), in a
process of BlazeFL's own virtualenv (BlazeFL 2.x needs Python >= 3.12, 3.0 >= 3.14; this
project's venv is older), so it imports nothing of fl_lightning: only torch and blazefl.

Run by `peers.py` as `<blazefl venv>/bin/python benchmarks/blazefl_app.py SPEC RESULT`. The
spec names a file that `peers.py` wrote with fl_lightning's data (the same images, IID split
and initial weights as the other systems; the images as uint8 with the normalisation, done
here as `ArrayDataset.tensors` does) and the mode:

  thread   `FedAvgThreadPoolClientTrainer`: `num_parallels` threads in this process; on a
           GIL build of CPython (pyenv's 3.13) the threads overlap only inside torch's
           kernels (BlazeFL's own benchmark asserts a free-threaded build for this mode)
  process  `FedAvgProcessPoolClientTrainer` (shared-memory IPC), spawn start method, as
           BlazeFL's benchmark (`benchmarks/blazefl-case/main.py`) sets it

The round loop is BlazeFL's benchmark pipeline: sample, downlink, `local_process`, uplink,
`load` (aggregation), `get_summary` (server accuracy on the test images). Clients draw their
batches through a DataLoader with BlazeFL's per-client generators; SGD(lr) without momentum is
BlazeFL's FedAvg client. The model is fl_lightning's `cnn` rebuilt here layer for layer (the
same parameter names, so its initial weights load).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

T_IMPORT = time.time()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402


class CNN(nn.Module):
    """fl_lightning's `cnn` (models/cnn.py, `SmallCNN` without batch norm): the same modules
    at the same indices, so `state_dict` keys match."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2), nn.Identity(), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.Identity(), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Flatten(),
        )  # fmt: skip
        side = ((image_size + 4 - 4) // 2 + 4 - 4) // 2
        self.neck = nn.Sequential(nn.Linear(64 * side**2, 512), nn.Identity(), nn.ReLU(inplace=True))
        self.head = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.neck(self.features(x)))


class Selector:
    """BlazeFL's `ModelSelector`: every client's model starts as the run's initial weights."""

    def __init__(self, init: dict[str, torch.Tensor]) -> None:
        self.init = init

    def select_model(self, model_name: str) -> nn.Module:
        model = CNN()
        model.load_state_dict(self.init)
        return model


class Partitioned:
    """BlazeFL's `PartitionedDataset` over the shards `peers.py` exported."""

    def __init__(self, data: dict[str, Any]) -> None:
        mean, std = float(data["mean"]), float(data["std"])
        x = (data["train_x"].float() / 255.0 - mean) / std
        y = data["train_y"].long()
        self.train: dict[int, Dataset] = {
            c: TensorDataset(x[idx], y[idx]) for c, idx in enumerate(data["split"])
        }
        self.test = TensorDataset((data["test_x"].float() / 255.0 - mean) / std, data["test_y"].long())

    def get_dataset(self, type_: str, cid: int | None) -> Dataset:
        return self.test if str(type_) == "test" else self.train[int(cid or 0)]

    def set_dataset(self, type_: str, cid: int | None, dataset: Dataset) -> None:
        if str(type_) != "test":
            self.train[int(cid or 0)] = dataset

    def get_dataloader(
        self, type_: str, cid: int | None, batch_size: int | None, generator: torch.Generator | None
    ) -> DataLoader:
        if str(type_) == "test":
            return DataLoader(self.test, batch_size=batch_size)
        return DataLoader(
            self.get_dataset(type_, cid), batch_size=batch_size, shuffle=True, generator=generator
        )


def main(spec_file: str, result_file: str) -> None:
    spec = json.loads(Path(spec_file).read_text())
    from blazefl.contrib import (
        FedAvgBaseServerHandler,
        FedAvgProcessPoolClientTrainer,
        FedAvgThreadPoolClientTrainer,
    )
    from blazefl.core import IPCMode
    from blazefl.reproducibility import setup_reproducibility

    t_imported = time.time()
    torch.set_num_threads(int(spec["threads"]))
    setup_reproducibility(int(spec["seed"]))
    data = torch.load(spec["data"], weights_only=True)
    dataset = Partitioned(data)
    selector = Selector(data["init"])
    n, k = int(spec["clients"]), int(spec["per_round"])
    handler = FedAvgBaseServerHandler(
        model_selector=selector, model_name="cnn", dataset=dataset,  # type: ignore[arg-type]
        global_round=int(spec["rounds"]), num_clients=n, sample_ratio=k / n, device="cpu",
        batch_size=int(spec["eval_batch_size"]), seed=int(spec["seed"]),
    )  # fmt: skip
    common = dict(
        model_selector=selector, model_name="cnn", dataset=dataset, device="cpu", num_clients=n,
        epochs=int(spec["epochs"]), batch_size=int(spec["batch_size"]), lr=float(spec["lr"]),
        seed=int(spec["seed"]), num_parallels=int(spec["parallels"]),
    )  # fmt: skip
    if spec["mode"] == "process":
        import torch.multiprocessing as mp

        mp.set_start_method("spawn", force=True)  # as BlazeFL's benchmark: before its Manager starts
        tmp = Path(spec["tmp"])
        trainer: Any = FedAvgProcessPoolClientTrainer(
            share_dir=tmp / "share", state_dir=tmp / "state", ipc_mode=IPCMode.SHARED_MEMORY, **common
        )
    else:
        trainer = FedAvgThreadPoolClientTrainer(**common)
    trainer.progress_fn = lambda it: it  # no tqdm bars in the log (contrib's default draws them)
    stamps: dict[str, list[float]] = {"round_start": [], "round_end": [], "eval_s": [], "accuracy": []}
    while not handler.if_stop():  # BlazeFL's benchmark pipeline (benchmarks/blazefl-case/main.py)
        stamps["round_start"].append(time.time())
        sampled = handler.sample_clients()
        broadcast = handler.downlink_package()
        trainer.local_process(broadcast, sampled)
        for pack in trainer.uplink_package():
            handler.load(pack)
        t0 = time.time()
        summary = handler.get_summary()
        t1 = time.time()
        stamps["eval_s"].append(t1 - t0)
        stamps["accuracy"].append(float(summary["server_acc"]))
        stamps["round_end"].append(t1)
    import blazefl

    gil = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
    result = {
        "stamps": stamps,
        "blazefl": getattr(blazefl, "__version__", None) or _version("blazefl"),
        "python": sys.version.split()[0],
        "gil_enabled": gil,
        "mode": spec["mode"]
        + (" (GIL build: no free threading)" if spec["mode"] == "thread" and gil else ""),
        "import_s": t_imported - T_IMPORT,
        "torch": torch.__version__,
    }
    Path(result_file).write_text(json.dumps(result))


def _version(name: str) -> str | None:
    from importlib.metadata import version

    try:
        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    os.environ.setdefault("TQDM_DISABLE", "1")
    main(sys.argv[1], sys.argv[2])
