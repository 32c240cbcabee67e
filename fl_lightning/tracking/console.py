"""Console output: a round progress bar, and a short table at the end."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


class Progress:
    def __init__(self, total: int, initial: int = 0, enabled: bool = True) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="rounds", unit="round", file=sys.stderr, dynamic_ncols=True)

    def update(self, rnd: int, record: dict[str, Any]) -> None:
        if self.bar is None:
            return
        post = {}
        for k in ("accuracy", "client_accuracy", "train_loss"):
            if k in record:
                post[k.replace("accuracy", "acc")] = f"{record[k]:.4f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(records: list[dict[str, Any]], max_rows: int = 12) -> str:
    """Rounds table; long runs show evenly spaced rounds and always the last one."""
    if not records:
        return "(no rounds completed)"
    step = max(1, -(-len(records) // max_rows))
    rows = records[::step]
    if rows[-1] is not records[-1]:
        rows.append(records[-1])
    cols = [
        ("round", "round", "d"), ("accuracy", "acc", ".4f"), ("client_accuracy", "client acc", ".4f"),
        ("train_loss", "train loss", ".4f"), ("bytes_up", "up MB", ".2f"), ("round_time_s", "time s", ".1f"),
    ]  # fmt: skip
    cols = [c for c in cols if any(c[0] in r for r in rows)]
    cells = [[h for _, h, _ in cols]]
    for r in rows:
        cells.append([_fmt(r.get(k) / 1e6 if k == "bytes_up" else r.get(k), f) for k, _, f in cols])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_table(records: list[dict[str, Any]], summary: dict[str, Any], run_dir: Path) -> None:
    print(format_table(records))
    print(
        f"{summary['method']} on {summary['dataset']} (seed {summary['seed']}): "
        f"final {summary['accuracy_metric']} {_fmt(summary['final_accuracy'], '.4f')}, "
        f"best {_fmt(summary['best_accuracy'], '.4f')} (round {summary['best_round']}), "
        f"{summary['rounds_completed']}/{summary['rounds']} rounds in {summary['wall_time_s']:.1f}s"
    )
    print(f"run dir: {run_dir}")
