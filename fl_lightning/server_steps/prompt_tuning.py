"""FedTSP's server step: tune class-specific soft prompts through a FROZEN text encoder so
that the text prototypes line up with the clients' aggregated image prototypes.

    tuner = PromptTuner(text_cfg, class_names, descriptions=descs)       # driver only
    ctx = tuner.initial_ctx()                                            # [C, m, h], CPU
    out = tuner.tune(ctx, logit_scale, image_protos, present, steps=1, lr=0.01)
    out.text                                                             # [C, d], to broadcast

Prompt c, j is "<ctx_c> {class}: {description_j}." with the m vectors ctx_c shared by the
k descriptions of class c (`text.soft_prompt.ClassSoftPrompts`); the text prototype of
class c is the normalised mean of its k features. The loss is InfoNCE between text and
image prototypes with cosine similarity times exp(logit_scale) (a learnable temperature,
initialised at ln 100 as in the authors' code, which does not clamp it; `tune` clamps it
at `max_logit_scale`, a guard that must lie above the start so that the scale can move
both ways). Only `ctx` and `logit_scale` change; the
encoder and its embeddings never receive a gradient. Everything that survives a round
(`ctx`, `logit_scale`, the optimiser state) goes in and comes out as CPU tensors, so the
caller keeps it in its `ServerState`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.progress import progress

LN_100 = math.log(100.0)
LN_1000 = math.log(1000.0)


def prototype_infonce(
    text: Tensor,
    image: Tensor,
    logit_scale: Tensor,
    present: Tensor | None = None,
    direction: str = "image_to_text",
) -> Tensor:
    """InfoNCE between text prototypes [C, d] and image prototypes [C, d], positives on the
    diagonal, logits = exp(logit_scale) · cosine, over the classes `present` (bool [C];
    default all). `image_to_text` (the authors' code): each present image prototype against
    every text prototype. `text_to_image` (Eq. 7 of the paper): each present class's text
    prototype against the present image prototypes. `symmetric`: their mean."""
    C = text.shape[0]
    idx = (
        torch.arange(C, device=text.device)
        if present is None
        else present.to(text.device).nonzero().squeeze(1)
    )
    t, i = F.normalize(text.float(), dim=-1), F.normalize(image.float(), dim=-1)
    scale = logit_scale.exp()
    i2t = F.cross_entropy(scale * i[idx] @ t.T, idx)
    if direction == "image_to_text":
        return i2t
    t2i = F.cross_entropy(scale * t[idx] @ i[idx].T, torch.arange(len(idx), device=text.device))
    if direction == "text_to_image":
        return t2i
    if direction == "symmetric":
        return 0.5 * (i2t + t2i)
    raise ValueError(f"direction={direction!r}: expected image_to_text, text_to_image or symmetric")


@dataclass
class TuneResult:
    ctx: Tensor  # [C, m, h] (or [m, h] when shared across classes), CPU
    logit_scale: Tensor  # scalar, CPU
    text: Tensor  # [C, d] the text prototypes with the tuned ctx (normalised), CPU
    opt_state: dict[int, dict[str, Any]] = field(default_factory=dict)  # per-parameter optimiser state, CPU
    losses: list[float] = field(default_factory=list)  # the loss before each step, then after the last


class PromptTuner:
    """The frozen text encoder plus the prompts' token embeddings (derived from the config:
    rebuilt identically on resume); the trainable values are passed in and returned."""

    def __init__(
        self,
        text_cfg: Mapping[str, Any],
        class_names: Sequence[str],
        descriptions: Sequence[Sequence[str]] | None = None,
        ctx_init: str | None = "a photo of a",
        n_ctx: int | None = None,
        seed: int = 0,
        targets: str = "text",
    ) -> None:
        from ..text import build_text_encoder
        from ..text.soft_prompt import ClassSoftPrompts

        self.encoder = build_text_encoder(text_cfg)
        with torch.random.fork_rng(devices=[]):  # random init of the context (ctx_init=None)
            torch.manual_seed(seed)
            self.prompts = ClassSoftPrompts(
                self.encoder, class_names, descriptions, ctx_init=ctx_init, n_ctx=n_ctx
            )
        self.prompts.to(self.encoder.device)
        self.prompts.requires_grad_(False)
        self.text_dim = int(self.encoder.embed_dim)
        self._initial_ctx = self.prompts.ctx.detach().cpu().clone()
        self._controls(targets, seed)

    def _controls(self, targets: str, seed: int) -> None:
        """The `targets` control (text/targets.py) as a fixed map on the prompts' output, so
        tuning still works through it: permuted = a fixed row shuffle, centred = minus the
        initial prototypes' mean; orthogonal and uniform are fixed vectors (no tuning)."""
        from ..text.targets import class_targets, derangement

        self.targets = targets
        self._perm: Tensor | None = None
        self._offset: Tensor | None = None
        self._fixed: Tensor | None = None
        if targets == "text":
            return
        with torch.no_grad():
            raw = self.prompts(reduce="mean").float()
        if targets == "permuted":
            self._perm = derangement(raw.shape[0], seed).to(raw.device)
        elif targets == "centred":
            self._offset = raw.mean(0, keepdim=True)
        else:
            self._fixed = class_targets(targets, raw.cpu(), seed).to(raw.device)

    @property
    def device(self) -> torch.device:
        return self.encoder.device

    def initial_ctx(self) -> Tensor:
        """The prompt vectors before any tuning (from `ctx_init`, or the seeded random init)."""
        return self._initial_ctx.clone()

    def _features(self, ctx: Tensor) -> Tensor:
        """Text prototypes [C, d] with `ctx` spliced in (differentiable w.r.t. ctx)."""
        self.prompts.ctx = (
            torch.nn.Parameter(ctx, requires_grad=ctx.requires_grad)
            if not isinstance(ctx, torch.nn.Parameter)
            else ctx
        )
        out: Tensor = self.prompts(reduce="mean")
        if self._fixed is not None:
            return self._fixed
        if self._perm is not None:
            out = out[self._perm]
        if self._offset is not None:
            out = F.normalize(out - self._offset.to(out), dim=-1)
        return out

    @torch.no_grad()
    def text_prototypes(self, ctx: Tensor) -> Tensor:
        """The text prototypes [C, d] (L2-normalised, CPU float32) for the prompt vectors `ctx`."""
        return self._features(ctx.to(self.device)).float().cpu()

    def loss(
        self,
        ctx: Tensor,
        logit_scale: Tensor,
        image: Tensor,
        present: Tensor | None = None,
        direction: str = "image_to_text",
    ) -> float:
        with torch.no_grad():
            text = self._features(ctx.to(self.device))
            return float(
                prototype_infonce(
                    text, image.to(self.device), logit_scale.to(self.device), present, direction
                )
            )

    def tune(
        self,
        ctx: Tensor,
        logit_scale: Tensor,
        image: Tensor,
        present: Tensor | None = None,
        steps: int = 1,
        lr: float = 0.01,
        momentum: float = 0.0,
        scale_lr: float | None = None,
        learn_scale: bool = True,
        max_logit_scale: float | None = LN_1000,
        direction: str = "image_to_text",
        opt_state: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> TuneResult:
        """`steps` full-batch SGD steps (one "server epoch" each) on the prompt vectors and,
        with `learn_scale`, the logit scale (clamped to `max_logit_scale` as CLIP clamps at
        ln 100; None: no clamp, as in the authors' code). `opt_state` carries momentum
        buffers across rounds (empty without momentum)."""
        dev = self.device
        v = torch.nn.Parameter(ctx.detach().to(dev).clone())
        s = torch.nn.Parameter(logit_scale.detach().to(dev).float().clone(), requires_grad=learn_scale)
        groups: list[dict[str, Any]] = [{"params": [v], "lr": lr}]
        if learn_scale:
            groups.append({"params": [s], "lr": scale_lr if scale_lr is not None else lr})
        opt = torch.optim.SGD(groups, lr=lr, momentum=momentum)
        if opt_state:
            state = {
                int(k): {n: (t.to(dev) if isinstance(t, Tensor) else t) for n, t in st.items()}
                for k, st in opt_state.items()
            }
            opt.load_state_dict({"state": state, "param_groups": opt.state_dict()["param_groups"]})
        image, losses = image.to(dev), []
        with progress("server prompt tuning", steps, "step") as bar:
            for _ in range(steps):
                loss = prototype_infonce(self._features(v), image, s, present, direction)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if max_logit_scale is not None:
                    with torch.no_grad():
                        s.clamp_(max=max_logit_scale)
                losses.append(float(loss.detach()))
                bar.update(loss=losses[-1])
        with torch.no_grad():  # one forward gives the new prototypes and the loss after tuning
            text = self._features(v).float()
            losses.append(float(prototype_infonce(text, image, s, present, direction)))
        self.prompts.ctx = torch.nn.Parameter(v.detach(), requires_grad=False)
        state = {
            int(k): {n: (t.detach().cpu().clone() if isinstance(t, Tensor) else t) for n, t in st.items()}
            for k, st in opt.state_dict()["state"].items()
        }
        return TuneResult(v.detach().cpu().clone(), s.detach().cpu().clone(), text.cpu(), state, losses)
