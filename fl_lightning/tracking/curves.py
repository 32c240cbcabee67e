"""`curves.png`, written into every run directory when the run ends: the primary metric and
the losses per round, read from the run's `metrics.jsonl` lines and `summary.json` numbers.

matplotlib is imported only here, when the picture is drawn (its Agg canvas directly: no
global backend switch, no display).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.files import save_figure

#: the losses a run's lines may hold, and how the plot names them
LOSSES = (
    ("train_loss", "train (clients' local training)", "C1"),
    ("loss", "test (global model)", "C2"),
    ("client_loss", "test (clients' own splits)", "C4"),
)


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pts = [
        (int(r["round"]), float(r[key]))
        for r in records
        if isinstance(r.get(key), (int, float)) and "round" in r and not r.get("diverged")
    ]
    return [p[0] for p in pts], [p[1] for p in pts]


def save_run_curves(records: Sequence[dict[str, Any]], summary: dict[str, Any], path: str | Path) -> Path:
    """Two panels over rounds: the primary metric (best round marked, and the worst 10% of
    clients when the run measured it) and the training and test losses."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    primary = str(summary.get("primary_metric") or "accuracy")
    fig = Figure(figsize=(11.0, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    ax_m, ax_l = fig.subplots(1, 2)
    n_rounds = max((int(r["round"]) for r in records if "round" in r), default=0)
    marker = "o" if n_rounds <= 30 else None  # markers only where they stay apart

    rounds, values = _series(records, primary)
    if rounds:
        ax_m.plot(rounds, values, marker=marker, markersize=3.5, color="C0", label=primary)
        best = max(range(len(values)), key=lambda i: values[i])
        ax_m.plot(rounds[best], values[best], marker="*", markersize=13, color="C3", linestyle="none",
                  label=f"best {values[best]:.4f} (round {rounds[best]})")  # fmt: skip
        if best != len(values) - 1:
            ax_m.annotate(f"final {values[-1]:.4f}", (rounds[-1], values[-1]), textcoords="offset points",
                          xytext=(-4, -14), ha="right", fontsize=8)  # fmt: skip
        w_rounds, worst = _series(records, f"{primary}_worst10")
        if w_rounds:
            ax_m.plot(w_rounds, worst, marker=marker, markersize=2.5, color="C0", linestyle="--",
                      alpha=0.6, label="worst 10% of clients")  # fmt: skip
        ax_m.legend(fontsize=8, loc="best")
    else:
        ax_m.text(0.5, 0.5, f"no evaluated round with {primary}", ha="center", va="center",
                  transform=ax_m.transAxes, color="0.4")  # fmt: skip
    ax_m.set_ylabel(f"{primary} (higher is better)")
    ax_m.set_title(primary, fontsize=10)

    drawn = 0
    for key, label, color in LOSSES:
        xs, ys = _series(records, key)
        if xs:
            ax_l.plot(xs, ys, marker=marker, markersize=3, color=color, label=label)
            drawn += 1
    if drawn:
        ax_l.legend(fontsize=8, loc="best")
    else:
        ax_l.text(0.5, 0.5, "no finite loss", ha="center", va="center", transform=ax_l.transAxes, color="0.4")
    ax_l.set_ylabel("loss (lower is better)")
    ax_l.set_title("loss", fontsize=10)

    # the planned rounds on the x-axis: a partial or diverged run shows where it stopped
    span = max(n_rounds, int(summary.get("rounds") or 0), 1)
    diverged = [int(r["round"]) for r in records if r.get("diverged") and "round" in r]
    for ax in (ax_m, ax_l):
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        ax.grid(True, alpha=0.3)
        ax.set_xlim(0.5, span + 0.5)
        for rnd in diverged:
            ax.axvline(rnd, color="C3", linestyle=":", linewidth=1.2)
            ax.text(rnd, 0.98, " diverged", color="C3", fontsize=8, va="top", ha="left",
                    transform=ax.get_xaxis_transform())  # fmt: skip
    status = summary.get("status", "")
    done, total = summary.get("rounds_completed"), summary.get("rounds")
    title = f"{summary.get('method', '?')} on {summary.get('dataset', '?')}, seed {summary.get('seed', '?')}"
    title += f"  ({summary.get('experiment', '')}/{summary.get('run_id', '')}: {status}"
    title += f", {done}/{total} rounds)" if done is not None and total is not None else ")"
    fig.suptitle(title, fontsize=10)
    # fixed margins for this fixed figure size: `tight_layout` drew the figure once more to
    # measure it, half of a picture's time, paid at the end of every run
    fig.subplots_adjust(left=0.065, right=0.985, bottom=0.12, top=0.87, wspace=0.2)

    return save_figure(fig, path)
