"""CLIP2FL's frozen teacher: an image tower whose L2-normalised embeddings, against the
L2-normalised class-text features, give the teacher logits scale · cos(image, text_c).

* `clip`: the image tower of an open_clip model loaded from a local weights file
  (`text=clip text.pretrained=/path/to/weights.pt`), with its own text tower for the class
  features. No CLIP weights exist on our machines.
* `aligned`: a stand-in for CLIP. A small image tower (ResNet-8 by default) trained once, on
  training images that no client holds (indices `teacher_holdout_from` .. + size of the full
  training set; the run keeps clients off them with `data.train_subset`), with cross-entropy
  on scale · cos(image, text_c) against the *frozen* MiniLM class-text features: an image
  encoder aligned to a text space, as CLIP's is, but trained on a few thousand labelled images
  of this dataset instead of 400M web image-text pairs. `fl-lightning teacher build` trains
  it; it is cached on disk, keyed by everything that decides it, with its held-out accuracy
  (nearest class text on the test set).

`TeacherSpec` is what travels to the hosts (picklable); `FrozenTeacher` is the module built
from it there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.centralized import fit_centralized
from ..core.errors import ConfigError
from ..core.files import cache_dir, write_cache
from ..core.objective import Backbone
from ..core.types import StateDict
from .configs.clip2fl import TEACHERS

log = logging.getLogger(__name__)

TEACHER_CACHE_VERSION = 1
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # open_clip's OPENAI_DATASET_MEAN / STD
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def default_cache_dir() -> Path:
    """`$FL_LIGHTNING_TEACHER_CACHE`, else `$FL_LIGHTNING_DATA/.cache/teachers`, else
    `~/.cache/fl_lightning/teachers` (`core.files.cache_dir`)."""
    return cache_dir("teachers", "FL_LIGHTNING_TEACHER_CACHE")


@dataclass(frozen=True)
class AlignedTeacherConfig:
    """Everything that decides an aligned teacher (its cache key, with the data and text)."""

    holdout_from: int = 55000  # first training index it learns from; clients get none from here on
    holdout_size: int | None = None  # how many from there (None: to the end)
    arch: str = "resnet8"  # a registered model whose feature dimension can be set
    model_kwargs: dict[str, Any] = field(default_factory=lambda: {"scaling": 2})
    epochs: int = 15
    lr: float = 0.05
    momentum: float = 0.9
    batch_size: int = 64
    logit_scale: float = 100.0  # scale · cos(image, text): CLIP's zero-shot scale
    templates: tuple[str, ...] = ("a photo of a {}.",)
    seed: int = 0
    targets: str = "text"  # the control of the text it aligns to (text/targets.py), drawn with `seed`
    #: learn only from held-out images of these classes (None: all): the others it knows only
    #: through their class vector, zero-shot (issue 37's E2: a teacher unseen on the tail)
    classes: tuple[int, ...] | None = None


@dataclass
class TeacherSpec:
    """A teacher as the hosts build it (picklable)."""

    kind: str  # aligned | clip
    arch: str  # aligned: a registered model; clip: an open_clip architecture
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    state: StateDict | None = None  # aligned: the trained image tower
    pretrained: str | None = None  # clip: the weights file
    num_classes: int = 0
    in_channels: int = 3
    image_size: int = 32
    data_mean: tuple[float, ...] = (0.5,)  # the dataset's normalisation (clip re-normalises)
    data_std: tuple[float, ...] = (0.5,)


class FrozenTeacher(nn.Module):
    """L2-normalised image embeddings of a frozen tower; stays in eval mode."""

    data_mean: Tensor  # clip only: non-persistent buffers
    data_std: Tensor
    clip_mean: Tensor
    clip_std: Tensor

    def __init__(self, spec: TeacherSpec) -> None:
        super().__init__()
        self.kind = spec.kind
        if spec.kind == "aligned":
            from ..models import build_model

            self.tower: nn.Module = build_model(
                spec.arch, spec.num_classes, spec.in_channels, spec.image_size, **spec.model_kwargs
            )
            assert spec.state is not None
            self.tower.load_state_dict(spec.state)
        elif spec.kind == "clip":
            import open_clip

            from ..text.encoders import _register_open_clip_configs

            name = _register_open_clip_configs(spec.arch)
            model = open_clip.create_model(name, pretrained=spec.pretrained, device="cpu")
            self.tower = model.visual
            size = getattr(model.visual, "image_size", 224)
            self.clip_size = int(size[0] if isinstance(size, (tuple, list)) else size)
            self.register_buffer(
                "data_mean", torch.tensor(spec.data_mean).view(1, -1, 1, 1), persistent=False
            )
            self.register_buffer("data_std", torch.tensor(spec.data_std).view(1, -1, 1, 1), persistent=False)
            self.register_buffer("clip_mean", torch.tensor(CLIP_MEAN).view(1, 3, 1, 1), persistent=False)
            self.register_buffer("clip_std", torch.tensor(CLIP_STD).view(1, 3, 1, 1), persistent=False)
        else:
            raise ConfigError(f"method.teacher={spec.kind!r}: expected one of {', '.join(TEACHERS)}")
        for p in self.parameters():
            p.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True) -> FrozenTeacher:
        return self  # frozen: eval mode whatever a parent asks

    def _clip_view(self, x: Tensor) -> Tensor:
        """The un-augmented image as CLIP's `preprocess` gives it: [0, 1], 3 channels, resized
        (bicubic) to the tower's size, CLIP-normalised."""
        img = (x * self.data_std + self.data_mean).clamp(0, 1)
        if img.shape[1] == 1:
            img = img.expand(-1, 3, -1, -1)
        img = F.interpolate(img, size=(self.clip_size, self.clip_size), mode="bicubic", align_corners=False)
        return (img - self.clip_mean) / self.clip_std

    @torch.no_grad()
    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "clip":
            emb = self.tower(self._clip_view(x))
        else:
            emb = self.tower.forward_features(x)  # type: ignore[operator]
        return F.normalize(emb.float(), dim=-1)


# --- the aligned teacher: build once, cache ------------------------------------------------
def _data_identity(data: Mapping[str, Any]) -> dict[str, Any]:
    skip = {"root", "download", "train_subset", "partition", "alpha", "min_size",
            "classes_per_client", "client_test_fraction", "cache_partitions"}  # fmt: skip
    # keys added after teachers were first cached count only when set, so those caches still hit
    later = {"shots": None, "shots_seed": 1, "personal_shots": None, "personal_from_test": False,
             "base_new": False}  # fmt: skip
    return {k: v for k, v in sorted(data.items()) if k not in skip and (k not in later or v != later[k])}


def teacher_key(
    data: Mapping[str, Any], text_identity: str, class_names: Sequence[str], cfg: AlignedTeacherConfig
) -> str:
    teacher = asdict(cfg)
    if teacher["targets"] == "text":  # the key every teacher cached before the switch has
        del teacher["targets"]
    if teacher["classes"] is None:  # likewise
        del teacher["classes"]
    blob = json.dumps(
        {"v": TEACHER_CACHE_VERSION, "data": _data_identity(data), "text": text_identity,
         "classes": list(class_names), "teacher": teacher},
        sort_keys=True, default=str,
    )  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def teacher_path(data: Mapping[str, Any], text_cfg: Mapping[str, Any], class_names: Sequence[str],
                 cfg: AlignedTeacherConfig, cache_dir: str | Path | None = None) -> Path:  # fmt: skip
    from ..text import text_feature_identity

    key = teacher_key(data, text_feature_identity(text_cfg), class_names, cfg)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / f"{data['name']}_{cfg.arch}_{key}.pt"


def _load_data(data: Mapping[str, Any]) -> Any:
    from ..data.registry import load_from_config

    # every training image (the hold-out's); test_subset: the held-out accuracy's test images
    return load_from_config({**data, "train_subset": None})


#: how a long teacher build is made shorter (said when one starts); it is cached once built
TEACHER_SHORTER = (
    "shorter: method.teacher_epochs=3 or method.teacher_holdout_size=1000 (a weaker teacher); "
    "built once, then read from its cache (`fl-lightning teacher build` ahead of the runs)"
)


def train_aligned_teacher(
    data: Mapping[str, Any], text: Tensor, cfg: AlignedTeacherConfig
) -> tuple[StateDict, dict[str, Any]]:
    """Train the image tower on the held-out training images against the frozen class-text
    features `text` [C, d]; returns its weights and info (held-out accuracy: nearest class
    text on the test set, the first `data.test_subset` images if set; sizes). Shows its
    progress (`core.progress`): minutes to hours on a CPU at the default size."""
    from ..models import build_model, feature_dim_key

    ds = _load_data(data)
    n = len(ds.train_y)
    stop = n if cfg.holdout_size is None else min(n, cfg.holdout_from + cfg.holdout_size)
    if cfg.holdout_from >= n or stop <= cfg.holdout_from:
        raise ConfigError(
            f"teacher hold-out [{cfg.holdout_from}, {stop}) is empty: {data['name']} has {n} training images "
            "(method.teacher_holdout_from)"
        )
    keep = np.arange(cfg.holdout_from, stop)
    if cfg.classes is not None:
        keep = keep[np.isin(ds.train_y[keep], list(cfg.classes))]
        if len(keep) == 0:
            raise ConfigError(f"the teacher hold-out has no image of classes {list(cfg.classes)}")
    x, y = ds.tensors(ds.train_x[keep], ds.train_y[keep])
    key = feature_dim_key(cfg.arch)
    if key is None:
        raise ConfigError(f"teacher arch {cfg.arch!r} has no settable feature dimension")
    kwargs = {**cfg.model_kwargs, key: int(text.shape[1])}
    t = F.normalize(text.float(), dim=-1)

    def cosine_ce(tower: nn.Module, xb: Tensor, yb: Tensor) -> Tensor:
        emb = F.normalize(cast(Backbone, tower).forward_features(xb), dim=-1)
        return F.cross_entropy(cfg.logit_scale * emb @ t.T, yb)

    tower = fit_centralized(
        lambda: build_model(cfg.arch, ds.num_classes, ds.in_channels, ds.image_size, **kwargs),
        cosine_ce, x, y, epochs=cfg.epochs, lr=cfg.lr, momentum=cfg.momentum, batch_size=cfg.batch_size,
        seed=cfg.seed, what=f"teacher build ({cfg.arch}, {len(y)} images)", shorten=TEACHER_SHORTER,
    )  # fmt: skip
    tx, ty = ds.stored(ds.test_x, ds.test_y)  # normalised 1,000 at a time: no float copy of the set
    with torch.no_grad():
        sims = torch.cat(
            [F.normalize(cast(Backbone, tower).forward_features(tx[i : i + 1000]), dim=-1) @ t.T
             for i in range(0, len(ty), 1000)]
        )  # fmt: skip
    info = {
        "held_out_accuracy": float((sims.argmax(1) == ty).float().mean()) if len(ty) else 0.0,
        "train_images": int(len(y)),
        "train_range": [cfg.holdout_from, stop],
        "test_images": int(len(ty)),
        "model_kwargs": kwargs,
        "num_classes": ds.num_classes,
        "in_channels": ds.in_channels,
        "image_size": ds.image_size,
    }
    if cfg.classes is not None:  # zero-shot on the unseen classes: among all, and among the unseen
        unseen = [c for c in range(ds.num_classes) if c not in cfg.classes]
        sel = torch.isin(ty, torch.tensor(unseen))
        if unseen and sel.any():
            among = torch.tensor(unseen)[sims[sel][:, unseen].argmax(1)]
            info["unseen_accuracy"] = float((sims[sel].argmax(1) == ty[sel]).float().mean())
            info["unseen_within_accuracy"] = float((among == ty[sel]).float().mean())
    return {k: v.detach().cpu() for k, v in tower.state_dict().items()}, info


def load_or_build_aligned(
    data: Mapping[str, Any], text_cfg: Mapping[str, Any], class_names: Sequence[str],
    cfg: AlignedTeacherConfig, cache_dir: str | Path | None = None, rebuild: bool = False,
) -> tuple[TeacherSpec, Tensor, dict[str, Any], Path]:  # fmt: skip
    """The aligned teacher (from the cache, or trained and cached) with its class-text
    features: (spec, text [C, d], info, path)."""
    from ..text import class_text_features
    from ..text.targets import class_targets

    text = class_text_features(text_cfg, list(class_names), templates=list(cfg.templates))
    assert isinstance(text, Tensor)
    text = class_targets(cfg.targets, text, cfg.seed)
    path = teacher_path(data, text_cfg, class_names, cfg, cache_dir)
    blob = None
    if path.is_file() and not rebuild:
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # unreadable: rebuild and overwrite
            log.warning("ignoring unreadable teacher cache %s (%s)", path, e)
    if blob is None:
        start = time.perf_counter()
        state, info = train_aligned_teacher(data, text, cfg)
        info["build_time_s"] = time.perf_counter() - start
        blob = {"state": state, "info": info}
        write_cache(path, lambda f: torch.save(blob, f))  # a folder we may not write: trained next time too
        log.info("aligned teacher written to %s (held-out accuracy %.4f)", path, info["held_out_accuracy"])
    info = dict(blob["info"])
    spec = TeacherSpec(
        kind="aligned", arch=cfg.arch, model_kwargs=dict(info["model_kwargs"]), state=blob["state"],
        num_classes=int(info["num_classes"]), in_channels=int(info["in_channels"]),
        image_size=int(info["image_size"]),
    )  # fmt: skip
    return spec, text, info, path
