"""`fl-lightning teacher build <run overrides>`: train (or load from the cache) the aligned
teacher a `method=clip2fl method.teacher=aligned` run with the same overrides would use, and
print where it is cached and its held-out accuracy.

    fl-lightning teacher build +experiment=clip2fl_fmnist_lt
    fl-lightning teacher build data=fmnist method.teacher_epochs=30 --rebuild

The cache (`$FL_LIGHTNING_TEACHER_CACHE`, else `~/.cache/fl_lightning/teachers`) is keyed by
everything that decides the teacher: dataset and its options, the held-out range, the tower,
its training, the text encoder and prompts. See docs/clip2fl.md for what it stands in for.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from ..core.errors import ConfigError


def teacher_command(action: str, overrides: list[str], rebuild: bool = False) -> int:
    from ..config import compose, validate_registered

    if action != "build":
        raise ConfigError(f"unknown teacher action {action!r}; valid: build")
    if not any(o.startswith(("method=", "+experiment=")) for o in overrides):
        overrides = ["method=clip2fl", *overrides]
    cfg = compose(overrides)
    if cfg.method.name != "clip2fl":
        raise ConfigError(f"the aligned teacher belongs to method=clip2fl (got method={cfg.method.name})")
    validate_registered(cfg)  # the tower and its arguments, the hold-out: one line before any training
    from ..methods.clip2fl import CLIP2FLConfig, aligned_config, text_config
    from ..methods.teacher import load_or_build_aligned
    from .text import dataset_class_names

    method = cfg.method
    assert isinstance(method, CLIP2FLConfig)
    if method.teacher != "aligned":
        raise ConfigError(f"method.teacher={method.teacher}: only the aligned teacher is built")
    data_cfg: dict[str, Any] = asdict(cfg.data)
    text_cfg = text_config("aligned", dict(cfg.text))
    _, _, info, path = load_or_build_aligned(
        data_cfg, text_cfg, dataset_class_names(cfg), aligned_config(method), rebuild=rebuild
    )
    lo, hi = info["train_range"]
    print(
        f"aligned teacher for {data_cfg['name']}: trained on training images [{lo}, {hi}) "
        f"({info['train_images']} images, held out from every client of a run with data.train_subset<={lo}); "
        f"held-out accuracy {info['held_out_accuracy']:.4f} on {info['test_images']} test images "
        f"(nearest class text, {text_cfg['name']})"
    )
    print(f"cached at {path}")
    zero_shot = {k: info[k] for k in ("unseen_accuracy", "unseen_within_accuracy") if k in info}
    print(json.dumps({"held_out_accuracy": info["held_out_accuracy"], **zero_shot, "path": str(path)}))
    return 0
