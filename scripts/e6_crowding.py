"""E6 follow-up, exploratory (written after E6's result, not pre-registered): does a class lose
accuracy when its FedGLCL target sits close to another class's target? Per-class final accuracy
of the oracle and oracle_permuted rows (eval.per_class=true, `scripts/e6_crowding.sh`) against
each class's largest cosine to another class's target ("crowding"). JSON on stdout.

    python scripts/e6_crowding.py <runs folder> [seeds ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

from fl_lightning.config import compose
from fl_lightning.data.fmnist_digits20 import COARSE_GROUPS
from fl_lightning.data.registry import load_from_config
from fl_lightning.text.oracle import held_out_class_means, oracle_targets, pca_keep_gram

KINDS = ("oracle", "oracle_permuted")


def crowding(targets: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Each class's largest cosine to another class's target, and which class that is."""
    t = F.normalize(targets.double(), dim=-1)
    cos = (t @ t.T).numpy()
    np.fill_diagonal(cos, -1.0)
    return cos.max(axis=1), cos.argmax(axis=1)


def main(runs: Path, seeds: list[int]) -> dict[str, object]:
    cfg = compose(["data=fmnist_digits20_eff"])
    data = {k: getattr(cfg.data, k) for k in cfg.data.__dataclass_fields__}
    # the oracle as FedGLCL builds it (methods/fedglcl.py: the held-out means, 384 dimensions)
    ds = load_from_config({**data, "train_subset": None})
    means, _ = held_out_class_means(ds, int(data["train_subset"]))
    vectors = pca_keep_gram(means, 384)
    groups = COARSE_GROUPS["fmnist_digits20_eff"]
    n = len(groups)
    out: dict[str, object] = {"runs": str(runs), "seeds": seeds}
    acc: dict[tuple[str, int], np.ndarray] = {}
    pooled_crowd, pooled_acc = [], []
    for kind in KINDS:
        for s in seeds:
            last = [
                json.loads(line)
                for line in (runs / f"{kind}_s{s}" / "metrics.jsonl").read_text().splitlines()
            ][-1]
            acc[kind, s] = np.array([last[f"class_accuracy/{c}"] for c in range(n)])
            crowd, nearest = crowding(oracle_targets(kind, vectors, s, groups))
            out[f"{kind}_s{s}"] = {
                "accuracy": float(last["accuracy"]),
                "spearman_crowding_vs_class_accuracy": float(spearmanr(crowd, acc[kind, s]).statistic),
                "classes_whose_nearest_target_is_in_their_group": int(
                    sum(groups[c] == groups[int(nearest[c])] for c in range(n))
                ),
            }
            pooled_crowd += list(crowd)
            pooled_acc += list(acc[kind, s])
    out["pooled_spearman"] = float(spearmanr(pooled_crowd, pooled_acc).statistic)
    loss = np.mean([acc["oracle", s] - acc["oracle_permuted", s] for s in seeds], axis=0)
    oracle_crowd, _ = crowding(oracle_targets("oracle", vectors, seeds[0], groups))
    out["per_class_oracle_minus_permuted"] = [round(float(x), 4) for x in loss]
    out["per_class_oracle_crowding"] = [round(float(x), 4) for x in oracle_crowd]
    out["spearman_oracle_crowding_vs_loss"] = float(spearmanr(oracle_crowd, loss).statistic)
    return out


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/e6x/e6x")
    print(json.dumps(main(folder, [int(x) for x in sys.argv[2:]] or [0, 1, 2]), indent=1))
