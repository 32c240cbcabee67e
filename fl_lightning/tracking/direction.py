"""Which way a metric is better, from its name (compare and reproduce both judge by it)."""

from __future__ import annotations


def lower_is_better(metric: str) -> bool:
    """Losses, errors, perplexities, timings (`*_s`) and byte counts are better low; the rest
    (accuracies, C-AP, F1, ...) high."""
    m = metric.lower()
    return any(w in m for w in ("loss", "error", "perplexity")) or m.endswith("_s") or m.startswith("bytes")
