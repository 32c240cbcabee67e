"""What a pretrained trunk costs on CPUs: one training step (forward, backward, Adam) per
image, on one thread, for the trunks a FedLGT or CLIP2FL run can use, and what that makes
of one round of the FedLGT mini setting (2,000 mosaics, 2 local epochs) on one core.

  ctran/cnn            C-Tran on 7x7 patch tokens of a random 3-stage conv trunk (56x56)
  ctran/tiles          C-Tran on 4 tile tokens of the 28x28 `cnn` (the FedLGT mini setting)
  ctran/efficientnet   C-Tran on EfficientNet-Lite0's last map (56x56 mosaics at --effnet-size)
  tilenet              the same tile trunk, max over tiles, a linear head (its FedAvg row)
  cnn                  the 28x28 FedAvg CNN (CLIP2FL's mini student and teacher tower)
  resnet8              CReFF's ResNet-8 at width 2 (CLIP2FL's default teacher tower)
  efficientnet_lite0   EfficientNet-Lite0 on a 28x28 image enlarged to --effnet-size

Run: `python benchmarks/trunk_cost.py --out benchmarks/results/trunk_cost.json`
(the median of --repeats timed steps after two warm-up steps; no other work on the machine
for numbers worth comparing).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from bench_workload import emit  # benchmarks/bench_workload.py

from fl_lightning.models import build_model
from fl_lightning.runtime.summary import cpu_model


def cases(effnet_size: int) -> dict[str, tuple[str, int, dict]]:
    """name -> (model, image size, kwargs)."""
    ctran = {"d_model": 384, "layers": 3, "heads": 4}
    return {
        "ctran/cnn": ("ctran", 56, {**ctran, "trunk": "cnn"}),
        "ctran/tiles": ("ctran", 56, {**ctran, "trunk": "tiles"}),
        "ctran/efficientnet": (
            "ctran",
            56,
            {**ctran, "trunk": "efficientnet_lite0", "input_size": effnet_size},
        ),
        "tilenet": ("tilenet", 56, {}),
        "cnn": ("cnn", 28, {"hidden": 384}),
        "resnet8": ("resnet8", 28, {"scaling": 2, "feature_dim": 384}),
        "efficientnet_lite0": ("efficientnet_lite0", 28, {"input_size": effnet_size}),
    }


def step_ms(model: str, size: int, kwargs: dict, batch: int, repeats: int) -> float:
    torch.manual_seed(0)
    m = build_model(model, 10, 1, size, **kwargs)
    m.train()
    opt = torch.optim.Adam(m.parameters(), 1e-4)
    x, y = torch.randn(batch, 1, size, size), (torch.rand(batch, 10) < 0.3).float()
    times = []
    for i in range(repeats + 2):
        t = time.perf_counter()
        loss = F.binary_cross_entropy_with_logits(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t)
    return statistics.median(times) / batch * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--effnet-size", type=int, default=64)
    ap.add_argument("--only", default=None, help="comma-separated case names")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    chosen = cases(args.effnet_size)
    if args.only:
        chosen = {k: v for k, v in chosen.items() if k in args.only.split(",")}
    out: dict = {
        "machine": cpu_model(), "python": platform.python_version(), "torch": torch.__version__,
        "threads": 1, "batch": args.batch, "repeats": args.repeats, "effnet_size": args.effnet_size,
        "load_average_before": os.getloadavg()[0], "ms_per_image": {}, "fedlgt_mini_round_s": {},
    }  # fmt: skip
    for name, (model, size, kwargs) in chosen.items():
        ms = step_ms(model, size, kwargs, args.batch, args.repeats)
        out["ms_per_image"][name] = round(ms, 3)
        if size == 56:  # 2,000 mosaics x 2 local epochs per round, one core
            out["fedlgt_mini_round_s"][name] = round(ms * 2000 * 2 / 1000, 1)
        print(f"{name:20s} {ms:8.2f} ms per image per step", flush=True)
    out["load_average_after"] = os.getloadavg()[0]  # other work on the machine inflates the times
    emit(out, args.out)


if __name__ == "__main__":
    main()
