"""Console output: a round progress bar, and a short table at the end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


class Progress:
    def __init__(self, total: int, initial: int = 0, enabled: bool = True, metric: str = "accuracy") -> None:
        self.bar = None
        self.metric = metric
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total, initial=initial, desc="rounds", unit="round", file=sys.stderr, dynamic_ncols=True
            )

    def update(self, rnd: int, record: dict[str, Any]) -> None:
        if self.bar is None:
            return
        post = {}
        for k in dict.fromkeys((self.metric, "accuracy", "client_accuracy", "train_loss")):
            if isinstance(record.get(k), float):
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
        ("round", "round", "d"), ("accuracy", "acc", ".4f"),
        ("fedavg_head/accuracy", "FedAvg head acc", ".4f"),  # CReFF / CLIP2FL: beside the re-trained head
        ("client_accuracy", "client acc", ".4f"),
        ("client_majority_accuracy", "majority ref", ".4f"),
        ("c_ap", "C-AP", ".4f"), ("o_ap", "O-AP", ".4f"), ("c_f1", "C-F1", ".4f"), ("o_f1", "O-F1", ".4f"),
        ("client_c_ap", "client C-AP", ".4f"),
        ("train_loss", "train loss", ".4f"), ("bytes_up", "up MB", ".2f"), ("round_time_s", "time s", ".1f"),
    ]  # fmt: skip
    cols = [c for c in cols if any(r.get(c[0]) is not None for r in rows)]
    cells = [[h for _, h, _ in cols]]
    for r in rows:
        mb = None if r.get("bytes_up") is None else r["bytes_up"] / 1e6  # a round may lack it (resume)
        cells.append([_fmt(mb if k == "bytes_up" else r.get(k), f) for k, _, f in cols])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_table(records: list[dict[str, Any]], summary: dict[str, Any], run_dir: Path) -> None:
    print(format_table(records))
    metric = summary.get("primary_metric") or summary.get("accuracy_metric", "accuracy")
    status = summary.get("status", "completed")
    print(
        f"{summary['method']} on {summary['dataset']} (seed {summary['seed']}): "
        f"final {metric} {_fmt(summary.get(f'final_{metric}'), '.4f')}, "
        f"best {_fmt(summary.get(f'best_{metric}'), '.4f')} (round {summary['best_round']}), "
        f"{summary['rounds_completed']}/{summary['rounds']} rounds in {summary['wall_time_s']:.1f}s"
        + ("" if status == "completed" else f" [{status.upper()}]")
    )
    for line in notes(records, summary):
        print(line)
    print(f"run dir: {run_dir}")


def notes(records: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    """What the table alone would hide: the teacher a run distilled from and the FedAvg head
    beside the re-trained one (CLIP2FL, CReFF), client accuracy's majority-class reference,
    and F1 that stayed 0 (multi-label: no score
    ever passed the decision threshold)."""
    out = []
    last = records[-1] if records else {}
    if summary.get("teacher_held_out_accuracy") is not None:
        out.append(
            f"teacher: held-out accuracy {summary['teacher_held_out_accuracy']:.4f} (test set, "
            "nearest class text): what the clients were distilled towards"
        )
    head, retrained = last.get("fedavg_head/accuracy"), last.get("accuracy")
    if isinstance(head, float) and isinstance(retrained, float):
        better = "below" if retrained < head else "at or above"
        out.append(
            f"re-trained head: final accuracy {retrained:.4f}, {better} the FedAvg head's {head:.4f} "
            "(the clients' own classifier, same features)"
        )
    ref = summary.get("final_client_majority_accuracy")
    if ref is not None:  # what a personalised accuracy is to be read against
        out.append(
            f"client accuracy {_fmt(summary.get('final_client_accuracy'), '.4f')} against "
            f"{ref:.4f} for each client always predicting its majority training class"
        )
    f1 = [(r.get("c_f1"), r.get("o_f1")) for r in records if r.get("c_f1") is not None]
    if f1 and all(c == 0 and o == 0 for c, o in f1):
        out.append(
            "warning: C-F1 and O-F1 are 0 in every round: no label's score passed eval.threshold, so "
            "nothing was predicted positive; read C-AP (threshold-free), or lower eval.threshold"
        )
    return out
