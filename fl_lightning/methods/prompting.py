"""What the federated prompt methods share (PromptFL, the zero-shot row, FedOTP): they train
`model=clip_prompt` (models/clip_prompt.py: CoOp's context on frozen open_clip towers) and
only it, give it the dataset's class names and normalisation, and, for the offline `mini`
scales, align the towers of a small random open_clip model first (`aligned_clip`).

The aligned stand-in: a random open_clip model's image tower trained on held-out training
images (indices `model.align_holdout_from` .. + `align_holdout_size`, kept from the clients by
`data.train_subset`) with cross-entropy on 100 · cos(image, text_c) against its own *frozen*
text tower's features of "a photo of a {class}.", as `fl-lightning teacher build` trains
CLIP2FL's aligned teacher (`methods/teacher.py`, whose data loading, training loop and cache
it reuses). The pair then behaves like CLIP on this dataset: the handwritten prompt classifies
zero-shot and prompts can be tuned. It knows nothing CLIP knows: its text tower is random.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.centralized import fit_centralized
from ..core.errors import ConfigError
from ..core.files import write_cache
from ..core.objective import BroadcastT, ClientObjective
from ..core.strategy import ConfigT, StateT, Strategy
from .teacher import _data_identity, _load_data, default_cache_dir

log = logging.getLogger(__name__)

ALIGN_TEMPLATE = "a photo of a {}."
ALIGN_SCALE = 100.0  # CLIP's logit scale, written into the aligned model
ALIGN_CACHE_VERSION = 1
ALIGN_LR = 0.001  # SGD, momentum 0.9, cosine: 0.05 (the teacher's) diverges at scale 100 (measured)


class PromptObjective(ClientObjective[BroadcastT]):
    """Cross-entropy on scale · cos(image, prompted class text); only the context trains (the
    model's only parameters). Not batched: the text tower runs inside the step. `own_classes`:
    a client scores only the classes it holds, its labels relabelled among them (FedTPG's
    clients, its FedCoOp's too: `available_classes`), not every class of the task.
    `trained_classes`: else those classes, sorted (`data.base_new`: the base half, as CoOp's
    `subsample_classes` leaves the training softmax, of each member of a composite; the new
    names stay unseen)."""

    batched_step = False

    def __init__(
        self,
        model: nn.Module,
        own_classes: bool = False,
        trained_classes: tuple[int, ...] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.own_classes = own_classes
        self.trained_classes = trained_classes

    def loss_terms(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        x, y = batch
        if self.own_classes and self.class_counts is not None:
            held = torch.nonzero(self.class_counts > 0).flatten().to(y.device)  # sorted
        elif self.trained_classes is not None:
            held = torch.tensor(self.trained_classes, dtype=torch.long, device=y.device)
        else:
            return super().loss_terms(batch)
        z = self.represent(x)
        self.batch_features = z
        m: Any = self.model
        logits = m.logit_scale * z @ m.text_features(held).T
        return {"ce": F.cross_entropy(logits, torch.searchsorted(held, y))}


class PromptStrategy(Strategy[ConfigT, StateT, BroadcastT]):
    """The shared driver side: `model=clip_prompt` required and given the task's class names
    and image normalisation (and its aligned weights, when `model.align_holdout_from` is set)."""

    prompt_learner: ClassVar[bool] = True  # models/clip_prompt.py accepts only such methods
    aligned_info: dict[str, Any] | None = None

    def trained_classes(self) -> tuple[int, ...] | None:
        """The classes the clients' softmax holds, sorted: under `data.base_new` the base half
        (each member's own, of a composite), else None (all)."""
        from ..core.metrics import base_class_ids

        if not self.task.data.get("base_new"):
            return None
        return base_class_ids(self.task.num_classes, self.task.class_sets)

    def model_kwargs(self, model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        out = dict(kwargs, class_names=list(self.task.class_names))
        if self.task.image_mean:
            out |= {"data_mean": list(self.task.image_mean), "data_std": list(self.task.image_std)}
        if out.get("align_holdout_from") is not None:
            path, info = aligned_clip(self.task.data, out)
            out["aligned"], self.aligned_info = str(path), info | {"path": str(path)}
        return out

    def run_summary(self) -> dict[str, Any]:
        return {"aligned_clip": self.aligned_info} if self.aligned_info else {}


# --- the mini scales' stand-in for CLIP: a random open_clip model, aligned ---------------------
def _align_key(data: Mapping[str, Any], kwargs: Mapping[str, Any]) -> str:
    from ..text.encoders import OpenCLIPTextEncoder

    clip = OpenCLIPTextEncoder.feature_identity(
        arch=kwargs.get("arch", "RN50"), pretrained=kwargs.get("pretrained"), seed=int(kwargs.get("seed", 0))
    )
    keys = (
        "class_names",
        "align_holdout_from",
        "align_holdout_size",
        "align_epochs",
        "data_mean",
        "data_std",
    )
    blob = json.dumps(
        {"v": ALIGN_CACHE_VERSION, "data": _data_identity(data), "clip": clip,
         "align": {k: kwargs.get(k) for k in keys}, "template": ALIGN_TEMPLATE},
        sort_keys=True, default=str,
    )  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def aligned_clip(data: Mapping[str, Any], kwargs: Mapping[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The aligned open_clip weights file for `model=clip_prompt` keys `kwargs` (from the cache,
    or trained and cached) and its info (zero-shot accuracy of the handwritten prompt on the
    test set, sizes)."""
    path = default_cache_dir() / f"clip_aligned_{data.get('name')}_{_align_key(data, kwargs)}.pt"
    if path.is_file():
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            return path, dict(blob["info"])
        except Exception as e:  # unreadable: rebuild and overwrite
            log.warning("ignoring unreadable aligned CLIP %s (%s)", path, e)
    state, info = _align(data, kwargs)
    write_cache(path, lambda f: torch.save({"state": state, "info": info}, f))
    log.info("aligned CLIP written to %s (zero-shot accuracy %.4f)", path, info["zero_shot_accuracy"])
    return path, info


def _align(data: Mapping[str, Any], kw: Mapping[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    from ..models.clip_prompt import _channels, clip_view, tower_size
    from ..text.encoders import OpenCLIPTextEncoder, load_open_clip
    from ..text.prompts import clean_class_name

    clip, name = load_open_clip(
        kw.get("arch", "RN50"), kw.get("pretrained"), int(kw.get("seed", 0)), "model.pretrained"
    )
    with torch.no_grad():
        text = OpenCLIPTextEncoder.of_model(clip, name).encode(
            [ALIGN_TEMPLATE.format(clean_class_name(c)) for c in kw["class_names"]]
        )
    # the held-out images are the training set's, before the few-shot protocols pick the clients'
    # (k shots, base classes only): the stand-in, like CLIP, has seen every class
    unpicked = {"shots": None, "personal_shots": None, "personal_from_test": False, "base_new": False}
    ds = _load_data({**data, **unpicked})
    lo = int(kw["align_holdout_from"])
    size = kw.get("align_holdout_size")
    hi = len(ds.train_y) if size is None else min(len(ds.train_y), lo + int(size))
    if hi <= lo:
        raise ConfigError(
            f"model.align_holdout_from={lo}: {data.get('name')} has {len(ds.train_y)} training images"
        )
    x, y = ds.tensors(ds.train_x[lo:hi], ds.train_y[lo:hi])
    mean, std, px = _channels(kw["data_mean"]), _channels(kw["data_std"]), tower_size(clip.visual)
    visual = clip.visual

    def cosine_ce(tower: nn.Module, xb: Tensor, yb: Tensor) -> Tensor:
        emb = F.normalize(tower(clip_view(xb, mean, std, px)).float(), dim=-1)
        return F.cross_entropy(ALIGN_SCALE * emb @ text.T, yb)

    def build() -> nn.Module:
        for p in visual.parameters():
            p.requires_grad_(True)
        return cast(nn.Module, visual)

    epochs = int(kw.get("align_epochs", 15))
    fit_centralized(build, cosine_ce, x, y, epochs=epochs, lr=ALIGN_LR, momentum=0.9, batch_size=64, seed=0,
                    what=f"CLIP alignment ({name}, {len(y)} images)")  # fmt: skip
    tx, ty = ds.tensors(ds.test_x, ds.test_y)
    correct = 0
    with torch.no_grad():
        clip.logit_scale.fill_(float(torch.log(torch.tensor(ALIGN_SCALE))))
        for i in range(0, len(ty), 500):
            emb = F.normalize(visual(clip_view(tx[i : i + 500], mean, std, px)).float(), dim=-1)
            correct += int(((emb @ text.T).argmax(1) == ty[i : i + 500]).sum())
    info = {"zero_shot_accuracy": correct / max(len(ty), 1), "train_range": [lo, hi], "test_images": len(ty),
            "epochs": epochs}  # fmt: skip
    return {k: v.detach().cpu() for k, v in clip.state_dict().items()}, info
