"""How much CReFF's re-trained classifier could give on a run's FedAvg extractor, and how
much its federated features give (issue 37 item 7), from the last checkpoint of a CReFF or
CLIP2FL run (its FedAvg body, φ̂ and federated features V) or of a FedAvg run with CReFF's
settings (`method=fedavg`: the same FedAvg model as CReFF's, whose server state holds no V;
then V starts as CReFF's N(0, 1) and φ̂ is the real-feature classifier below). Usage:

    PYTHONPATH=. python scripts/creff_diagnose.py RUN_DIR [--steps 100,1000,3000] [--json OUT]
        [method.num_features=100 ...]   (CReFF's settings, for a FedAvg run: its defaults)

Rows (test accuracy, many/medium/few by the run's `eval.longtail`):
- fedavg_head: the FedAvg model as it is (reproduces the run's `fedavg_head/accuracy`, or a
  FedAvg run's `accuracy`);
- creff: a CReFF run's φ̂ on the FedAvg extractor (reproduces its `accuracy`);
- logit_adjusted: the FedAvg head minus the log of the clients' class prior (no training);
- real_balanced: CReFF's re-training (`retrain_classifier`, its epochs/lr/batch) on m real
  features per class drawn from the clients' images: what re-training on features can give;
- matched_K: V after K matching steps in all (cumulative over the list) towards the per-class
  gradients of the real features at φ̂ (pooled over the clients, CReFF's draws and DSA),
  with φ̂ fixed, then re-trained as CReFF does: how close converged federated features get.
Feature statistics: share of zero coordinates and mean norm of the real features, V's norm
and share of negative coordinates, and per class the cosine of V's mean to the real mean.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import Tensor

from fl_lightning import methods  # noqa: F401  (registers the state classes a checkpoint names)
from fl_lightning.data.dsa import dsa
from fl_lightning.data.federated import prepare_data
from fl_lightning.methods.creff import CReFFConfig, derived_generator
from fl_lightning.models import build_model
from fl_lightning.models.weights import MODEL_GENERIC_KEYS
from fl_lightning.runtime import checkpoint
from fl_lightning.server_steps.federated_features import class_gradient, optimise_features, retrain_classifier


def features(model: torch.nn.Module, x: torch.Tensor, batch: int = 1000) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model.forward_features(x[i : i + batch]) for i in range(0, len(x), batch)])


def accuracy(z: Tensor, y: Tensor, w: Tensor, b: Tensor, groups: dict[str, list[int]]) -> dict[str, float]:
    pred = (z @ w.T + b).argmax(1)
    out = {"accuracy": float((pred == y).float().mean())}
    for name, cls in groups.items():
        sel = torch.isin(y, torch.tensor(cls))
        out[f"{name}_accuracy"] = float((pred[sel] == y[sel]).float().mean()) if sel.any() else math.nan
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--steps", default="100,1000,3000", help="extra matching steps to try")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("overrides", nargs="*", help="method.<key>=value: CReFF's settings for a FedAvg run")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = OmegaConf.load(args.run_dir / "config.yaml")
    ck = checkpoint.latest(args.run_dir)
    if ck is None:
        raise SystemExit(f"{args.run_dir}: no checkpoint (run with checkpoint.every set)")
    state, _, _ = checkpoint.load(ck)
    dataset, split = prepare_data(cfg)
    kw = {k: v for k, v in OmegaConf.to_container(cfg.model).items() if k not in MODEL_GENERIC_KEYS}
    c_in, size = dataset.train_x.shape[1], dataset.train_x.shape[-1]
    model = build_model(cfg.model.name, dataset.num_classes, c_in, size, **kw)
    model.load_state_dict(state.global_params)
    model.eval()
    idx = np.concatenate(split.train)
    x_tr, y_tr = dataset.tensors(dataset.train_x[idx], dataset.train_y[idx])
    x_te, y_te = dataset.tensors(dataset.test_x, dataset.test_y)
    z_tr, z_te = features(model, x_tr), features(model, x_te)
    counts = torch.bincount(y_tr, minlength=dataset.num_classes)
    many, few = cfg.eval.longtail
    groups = {
        "many": [c for c in range(len(counts)) if counts[c] > many],
        "medium": [c for c in range(len(counts)) if few <= counts[c] <= many],
        "few": [c for c in range(len(counts)) if counts[c] < few],
    }
    known = {f.name for f in dataclasses.fields(CReFFConfig)}
    mc = OmegaConf.merge(
        OmegaConf.structured(CReFFConfig), {k: v for k, v in cfg.method.items() if k in known and k != "name"}
    )
    for o in args.overrides:
        key, _, value = o.removeprefix("method.").partition("=")
        OmegaConf.update(mc, key, OmegaConf.create({"v": value}).v if value else value)
    hw, hb = state.global_params["head.weight"], state.global_params["head.bias"]
    rows: dict[str, Any] = {}

    def add(name: str, row: dict[str, float]) -> None:
        """Record and print a row at once (the matching rows take minutes on a busy CPU)."""
        rows[name] = row
        extra = ""
        if "match_before" in row:
            extra = f"  match {row['match_before']:.2f} -> {row['match_after']:.2f}"
        print(
            f"{name:16s} acc {100 * row['accuracy']:6.2f}  many {100 * row['many_accuracy']:6.2f}  "
            f"medium {100 * row['medium_accuracy']:6.2f}  few {100 * row['few_accuracy']:6.2f}{extra}",
            flush=True,
        )

    add("fedavg_head", accuracy(z_te, y_te, hw, hb, groups))
    add("logit_adjusted", accuracy(z_te, y_te, hw, hb - torch.log(counts.float() / counts.sum()), groups))
    g = derived_generator(int(cfg.seed), 0xD1A6)
    m = int(mc.num_features)
    num_classes = len(counts)

    def retrain(feats: Tensor) -> tuple[Tensor, Tensor]:
        epochs, lr, batch = mc.retrain_epochs, mc.retrain_lr, mc.retrain_batch_size
        w_, b_, _ = retrain_classifier(feats, num_classes, epochs, lr, batch, g)
        return w_, b_

    draw = [torch.randint(int(counts[c]), (m,), generator=g) for c in range(num_classes)]
    real = torch.cat([z_tr[y_tr == c][d] for c, d in enumerate(draw)])
    rw, rb = retrain(real)
    add("real_balanced", accuracy(z_te, y_te, rw, rb, groups))
    if getattr(state, "features", None) is not None:  # a CReFF/CLIP2FL run: its V and φ̂
        w, b, v = state.classifier_weight, state.classifier_bias, state.features
        add("creff", accuracy(z_te, y_te, w, b, groups))
    else:  # a FedAvg run: V as CReFF starts it, matched at the real-feature classifier
        w, b = rw, rb
        v = torch.randn(len(counts) * m, z_tr.shape[1], generator=derived_generator(int(cfg.seed), 0xFEA7))
    # per-class gradients of the real features at φ̂, as the clients compute them (pooled)
    gws, gbs = [], []
    for c in range(len(counts)):
        xc = x_tr[y_tr == c]
        acc_w, acc_b = torch.zeros_like(w), torch.zeros_like(b)
        for _ in range(int(mc.grad_repeats)):
            xb = xc[torch.randperm(len(xc), generator=g)[: int(mc.grad_batch)]]
            xb = dsa(xb, g) if mc.grad_augment == "dsa" else xb
            gw, gb = class_gradient(w, b, features(model, xb), c)
            acc_w, acc_b = acc_w + gw, acc_b + gb
        gws.append(acc_w / mc.grad_repeats)
        gbs.append(acc_b / mc.grad_repeats)
    real_w, real_b = torch.stack(gws), torch.stack(gbs)
    present = torch.ones(len(counts), dtype=torch.bool)
    done = 0
    for k in sorted(int(s) for s in args.steps.split(",") if s):
        res = optimise_features(
            v, w, b, real_w, real_b, present, steps=k - done, lr=mc.feature_lr, with_bias=mc.match_bias
        )
        v, done = res.features, k
        kw_, kb_ = retrain(v)
        add(
            f"matched_{k}",
            accuracy(z_te, y_te, kw_, kb_, groups)
            | {
                "match_before": res.match_before,
                "match_after": res.match_after,
            },
        )
    vc = v.view(len(counts), m, -1)
    mean_real = torch.stack([z_tr[y_tr == c].mean(0) for c in range(len(counts))])
    stats = {
        "real_zero_share": float((z_tr == 0).float().mean()),
        "real_norm": float(z_tr.norm(dim=1).mean()),
        "real_min": float(z_tr.min()),
        "federated_norm": float(v.norm(dim=1).mean()),
        "federated_negative_share": float((v < 0).float().mean()),
        "class_mean_cosine": torch.nn.functional.cosine_similarity(vc.mean(1), mean_real).tolist(),
        "train_counts": counts.tolist(),
        "groups": groups,
    }
    out = {"run_dir": str(args.run_dir), "checkpoint": ck.name, "rows": rows, "features": stats}
    print(json.dumps(stats))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
