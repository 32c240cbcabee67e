"""A run that learned nothing: its global metric no better than chance for its last evaluated
rounds while its loss stayed finite. Such a run completes (nothing diverged), so without a
flag it would look like a success; `summary.json` gets `warning: "no better than chance"` and
`chance: {...}` (the level, the margin, the rounds), and the console, `sweep`, `compare` and
`reproduce` say so.

Chance, measured on the run's own test targets:

- single-label `accuracy`: the best a model that ignores its input can score, i.e. always
  predicting the most frequent test class (1/K on a balanced test set), plus a margin of three
  binomial standard errors of an accuracy measured on n test images at that level,
  3 * sqrt(p (1 - p) / n): a model whose true accuracy is at the level lands above it with
  probability ~0.1%, so a run that does is not flagged. (Fashion-MNIST's 10,000 test images:
  0.100 + 0.009.)
- multi-label `c_ap` (per-class average precision, averaged over classes with a positive):
  scores that ignore the input. A constant score gets each class's prevalence as its AP;
  random scores get a little more on a finite test set (AP rewards the positives that happen
  to rank first), so the level is random scores' mean C-AP on these targets and the margin
  three standard deviations of it, both from 32 seeded draws (AP has no simple closed form).

Only the global model's metric is checked (`accuracy` or `c_ap` in the round records): runs
that evaluate only personal models (`client_accuracy`) are not flagged, since a client's
majority class makes chance a per-client number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: the evaluated rounds (the last ones) that must all be at chance; a run with fewer
#: evaluated rounds is judged on all it has
CHANCE_ROUNDS = 3
WARNING = "no better than chance"


def chance_level(targets: Any, multilabel: bool) -> tuple[str, float, float] | None:
    """(metric, level, margin) of a model that knows nothing, on these test targets
    (single-label: class ids [N]; multi-label: multi-hot [N, C]); None if there are none."""
    y = np.asarray(targets)
    n = len(y)
    if n == 0:
        return None
    if not multilabel:
        p = float(np.bincount(y.astype(np.int64)).max() / n)
        return "accuracy", p, 3.0 * math.sqrt(p * (1.0 - p) / n)
    y = (y > 0.5).astype(np.int64)
    present = y.sum(0) > 0
    if not present.any():
        return None
    import torch
    from torchmetrics.functional.classification import multilabel_average_precision

    gen = torch.Generator().manual_seed(0)
    target = torch.from_numpy(y)
    draws = []
    for _ in range(32):
        ap = multilabel_average_precision(
            torch.rand(y.shape, generator=gen), target, num_labels=y.shape[1], average="none"
        )
        draws.append(float(ap[torch.from_numpy(present)].mean()))
    return "c_ap", float(np.mean(draws)), 3.0 * float(np.std(draws, ddof=1))


def chance_note(records: Sequence[dict[str, Any]], level: tuple[str, float, float] | None) -> dict[str, Any]:
    """`{"warning": ..., "chance": {...}}` when the last `CHANCE_ROUNDS` evaluated rounds'
    global metric all lie at or below level + margin with a finite training loss; else {}."""
    if level is None:
        return {}
    metric, p, margin = level
    evald = [r for r in records if isinstance(r.get(metric), (int, float)) and not r.get("diverged")]
    last = evald[-CHANCE_ROUNDS:]
    if not last:
        return {}
    finite = all(math.isfinite(float(r.get("train_loss", 0.0) or 0.0)) for r in last)
    if not finite or any(float(r[metric]) > p + margin for r in last):
        return {}
    return {
        "warning": WARNING,
        "chance": {
            "metric": metric, "level": round(p, 6), "margin": round(margin, 6),
            "rounds": [int(r["round"]) for r in last], "values": [float(r[metric]) for r in last],
        },
    }  # fmt: skip


def chance_line(summary: dict[str, Any]) -> str | None:
    """The console's line for a summary with the chance warning, else None."""
    if summary.get("warning") != WARNING:
        return None
    c = summary.get("chance")
    if not isinstance(c, dict):
        return WARNING
    try:
        rounds = list(c["rounds"])
        return (
            f"{WARNING}: {c['metric']} {float(c['values'][-1]):.4f} <= {float(c['level']):.4f} + "
            f"{float(c['margin']):.4f} (chance level + margin) in the last {len(rounds)} evaluated rounds"
        )
    except (KeyError, TypeError, ValueError, IndexError):
        return WARNING
