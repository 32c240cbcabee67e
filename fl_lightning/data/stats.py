"""Partition statistics as a picture and a table.

Both read the dict `FederatedSplit.stats(dataset)` returns (the run's `partition.json`),
so they also work on a finished run's file.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..core.files import copy_atomic, save_figure, write_cache

log = logging.getLogger("fl_lightning")

#: part of a cached plot's key: bump it when the picture changes, so an old look is redrawn
PLOT_VERSION = 1


def save_partition_plot(stats: dict[str, Any], path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """A heatmap of samples per (client, class), with client sizes beside it, as a PNG.
    With `cache_dir` (the partition cache's folder), a plot drawn before for the same
    statistics is copied, not drawn again: drawing costs a run ~0.2 s plus matplotlib's
    import, and a sweep over methods or seeds of one split draws it once."""
    if cache_dir is None:
        return draw_partition_plot(stats, path)
    text = json.dumps(stats, sort_keys=True)
    key = hashlib.sha1(f"{PLOT_VERSION}|{text}".encode()).hexdigest()[:16]
    cached = Path(cache_dir).expanduser() / f"plot-{key}.png"
    try:
        return copy_atomic(cached, path)
    except FileNotFoundError:
        pass
    except OSError as e:  # another user's, unreadable to us (a shared data root): drawn for this run
        log.warning("cannot read the cached partition plot %s (%s): drawn again", cached, e.strerror or e)
    draw_partition_plot(stats, path)
    # the run's own picture is written; a cache we cannot write only makes the next run draw again
    write_cache(cached, lambda out: out.write(Path(path).read_bytes()))
    return Path(path)


def draw_partition_plot(stats: dict[str, Any], path: str | Path) -> Path:
    """`save_partition_plot` without a cache: matplotlib's Agg canvas directly (no global
    backend switch, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.figure import Figure

    hist = np.asarray(stats["train_class_histogram"], dtype=float)
    n_clients, n_classes = hist.shape
    sizes = np.asarray(stats["train_sizes"], dtype=float)
    names = list(stats.get("class_names", [str(i) for i in range(n_classes)]))
    width = min(4.0 + 0.35 * n_classes, 24.0)
    height = min(3.5 + 0.3 * n_clients, 24.0)
    # heatmap | client sizes | colour bar: the colour bar's ticks and label need the figure's
    # right margin (between the heatmap and the sizes they covered the bars)
    fig_width = width + 2.5 + 0.2 + 1.2
    fig = Figure(figsize=(fig_width, height), dpi=100)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(1, 3, width_ratios=[width, 2.5, 0.2], wspace=0.08)
    ax = fig.add_subplot(grid[0, 0])
    bar = fig.add_subplot(grid[0, 1], sharey=ax)
    cax = fig.add_subplot(grid[0, 2])
    positive = hist[hist > 0]
    lo, hi = (float(positive.min()), float(positive.max())) if positive.size else (1.0, 1.0)
    norm: Normalize
    if hi / lo >= 50:  # long tails and Dirichlet skew: log colours
        norm = LogNorm(vmin=lo, vmax=hi)
    else:
        norm = Normalize(vmin=0.0, vmax=max(hi, 1.0))
    shown = np.ma.masked_where(hist <= 0, hist)
    im = ax.imshow(shown, aspect="auto", cmap="viridis", norm=norm, interpolation="nearest")
    ax.set_facecolor("white")
    if n_clients * n_classes <= 400:
        for (i, j), v in np.ndenumerate(hist):
            if v > 0:
                ax.text(j, i, f"{int(v)}", ha="center", va="center", fontsize=7,
                        color="white" if norm(v) < 0.6 else "black")  # fmt: skip
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if n_classes <= 40:
        ax.set_xticks(range(n_classes), names, rotation=60, ha="right", fontsize=8)
    if n_clients <= 50:
        doms, dom_names = stats.get("client_domains"), stats.get("domain_names", [])
        ticks = [str(i) for i in range(n_clients)]
        if doms:
            ticks = [f"{i} {dom_names[d] if 0 <= d < len(dom_names) else d}" for i, d in enumerate(doms)]
        ax.set_yticks(range(n_clients), ticks, fontsize=8)
    title = f"{stats.get('dataset', '')} | {stats.get('partition', '')}"
    opts = stats.get("options") or {}
    if opts:
        title += " | " + ", ".join(f"{k}={v}" for k, v in opts.items())
    if stats.get("standin"):
        title += "\n(offline stand-in, not the real dataset)"
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, cax=cax, label="samples" + (" per label" if stats.get("multilabel") else ""))
    if n_clients <= 200:
        bar.barh(range(n_clients), sizes, color="#4c72b0")
    else:  # one artist, not one bar per client: 10,000 bars cost ~5 s and ~100 MB
        bar.fill_betweenx(np.arange(n_clients), 0, sizes, step="mid", color="#4c72b0", linewidth=0)
    bar.set_xlabel("client size")
    bar.tick_params(axis="y", labelleft=False)
    bottom = (1.2 if n_classes <= 40 else 0.6) / height  # inches for rotated class names
    bar.grid(True, axis="x", alpha=0.3)
    top = 1.0 - 0.6 / height
    fig.subplots_adjust(left=0.8 / fig_width, right=1.0 - 1.0 / fig_width, bottom=bottom, top=top)
    return save_figure(fig, path)


def label_entropy(hist: np.ndarray) -> np.ndarray:
    """Per-client entropy (nats) of the class distribution."""
    hist = np.asarray(hist, dtype=float)
    p = hist / np.maximum(hist.sum(axis=1, keepdims=True), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=1)


def format_table(stats: dict[str, Any], max_columns: int = 12) -> str:
    """A per-client table: size, number of classes present, label entropy, and either the
    full class counts (few classes) or the three largest classes."""
    hist = np.asarray(stats["train_class_histogram"])
    names = stats.get("class_names", [])
    n_classes = hist.shape[1]
    full = n_classes <= max_columns
    doms = stats.get("client_domains")
    dom_names = stats.get("domain_names", [])
    head = ["client", "size"] + (["test"] if "test_sizes" in stats else []) + (["domain"] if doms else [])
    head += ["classes", "entropy"]
    head += [str(i) for i in range(n_classes)] if full else ["top classes"]
    ent = label_entropy(hist)
    rows = []
    for k, row in enumerate(hist):
        r = [str(k), str(stats["train_sizes"][k])]
        if "test_sizes" in stats:
            r.append(str(stats["test_sizes"][k]))
        if doms:
            d = doms[k]
            r.append(dom_names[d] if 0 <= d < len(dom_names) else str(d))
        r += [str(int((row > 0).sum())), f"{ent[k]:.2f}"]
        if full:
            r += [str(int(v)) for v in row]
        else:
            top = np.argsort(-row, kind="stable")[:3]
            r.append(
                ", ".join(f"{names[j] if j < len(names) else j}:{int(row[j])}" for j in top if row[j] > 0)
            )
        rows.append(r)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.rjust(w) if i < len(cells) - (0 if full else 1) else c  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths, strict=True)))  # fmt: skip
    out = [line(head)]
    out += [line(r) for r in rows]
    if full and names:
        out.append("classes: " + ", ".join(f"{i}={n}" for i, n in enumerate(names)))
    sizes = np.asarray(stats["train_sizes"])
    out.append(
        f"{stats['num_clients']} clients, {int(sizes.sum())} training samples "
        f"(min {int(sizes.min())}, max {int(sizes.max())}); mean label entropy {ent.mean():.3f} nats"
        + (
            f"; {stats['unassigned']} samples dropped by the long-tail subsampling"
            if stats.get("unassigned")
            else ""
        )
    )
    if stats.get("standin"):
        out.append(
            f"note: {stats['dataset']} is an offline stand-in for {stats['standin']}, not the real data"
        )
    return "\n".join(out)
