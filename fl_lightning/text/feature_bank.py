"""Class-text features, computed once on the driver and cached on disk.

    feats = class_text_features(cfg.text, class_names, templates="imagenet80", cache_dir=d)  # [C, d]
    feats, info = class_text_features(..., return_info=True)    # info["cache_hit"], info["path"]

Each class gets one prompt per template (or per description: "a photo of a {class}: {desc}."),
the prompts are encoded, averaged and re-normalised. The cache key is a hash of the encoder's
feature identity (name, weights file path + size + mtime or tag, options), the class names and
the exact prompt texts, so changing any of them recomputes. Files are written atomically
(temp file + rename) and read with `torch.load(weights_only=True)`. Features are CPU float32.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.files import cache_dir, write_cache
from . import build_text_encoder, text_feature_identity
from .prompts import DESCRIPTION_TEMPLATE, class_prompts, description_prompts
from .prompts import templates as resolve_templates

log = logging.getLogger(__name__)

CACHE_VERSION = 1


def default_cache_dir() -> Path:
    """`$FL_LIGHTNING_TEXT_CACHE`, else `$FL_LIGHTNING_DATA/.cache/text`, else
    `~/.cache/fl_lightning/text` (`core.files.cache_dir`)."""
    return cache_dir("text", "FL_LIGHTNING_TEXT_CACHE")


def prompts_for(
    class_names: Sequence[str],
    templates: str | Sequence[str] | None = None,
    descriptions: Sequence[Sequence[str]] | None = None,
    description_template: str = DESCRIPTION_TEMPLATE,
) -> list[list[str]]:
    """Per class, the prompts to encode: from descriptions if given, else from templates."""
    if descriptions is not None:
        if templates is not None:
            raise ValueError("give templates or descriptions, not both")
        return description_prompts(class_names, descriptions, description_template)
    return class_prompts(class_names, resolve_templates(templates if templates is not None else "simple"))


def cache_key(encoder_identity: str, class_names: Sequence[str], prompts: Sequence[Sequence[str]]) -> str:
    blob = json.dumps(
        {"v": CACHE_VERSION, "encoder": encoder_identity, "classes": list(class_names), "prompts": prompts},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


@torch.no_grad()
def encode_class_prompts(encoder: Any, prompts: Sequence[Sequence[str]]) -> Tensor:
    """[C, d]: each class's prompts encoded, averaged, re-normalised (CPU float32)."""
    flat = [p for ps in prompts for p in ps]
    feats = encoder.encode(flat).float().cpu()
    out, i = [], 0
    for ps in prompts:
        out.append(feats[i : i + len(ps)].mean(0))
        i += len(ps)
    return F.normalize(torch.stack(out), dim=-1)


def class_text_features(
    encoder_cfg: Mapping,
    class_names: Sequence[str],
    templates: str | Sequence[str] | None = None,
    descriptions: Sequence[Sequence[str]] | None = None,
    cache_dir: str | Path | None = None,
    *,
    description_template: str = DESCRIPTION_TEMPLATE,
    encoder: Any = None,
    return_info: bool = False,
) -> Tensor | tuple[Tensor, dict]:
    """Class-text features [C, d] (CPU float32, rows L2-normalised), from the disk cache when
    possible. `encoder_cfg` is `cfg.text` (name + builder arguments); `encoder` reuses an
    already built encoder for a miss (otherwise one is built and dropped). `cache_dir=None`
    uses `default_cache_dir()`. With `return_info`, also returns
    {"cache_hit": bool, "path": Path, "key": str, "prompts": [[str]]}."""
    prompts = prompts_for(class_names, templates, descriptions, description_template)
    key = cache_key(text_feature_identity(encoder_cfg), class_names, prompts)
    name = str(encoder_cfg["name"]).replace("/", "_")
    path = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = path / f"{name}_{key}.pt"
    feats, hit = None, False
    if path.is_file():
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            if blob.get("key") == key and blob["features"].shape[0] == len(class_names):
                feats, hit = blob["features"].float(), True
        except Exception as e:  # corrupt or foreign file: recompute and overwrite
            log.warning("ignoring unreadable text-feature cache %s (%s)", path, e)
    if feats is None:
        enc = encoder if encoder is not None else build_text_encoder(encoder_cfg)
        feats = encode_class_prompts(enc, prompts)
        blob = {"key": key, "features": feats, "class_names": list(class_names)}
        write_cache(path, lambda f: torch.save(blob, f))  # a folder we may not write: computed next time too
        log.info("text features for %d classes (%s) written to %s", len(class_names), name, path)
    if return_info:
        return feats, {"cache_hit": hit, "path": path, "key": key, "prompts": prompts}
    return feats
