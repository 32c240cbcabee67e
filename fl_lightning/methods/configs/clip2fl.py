"""CLIP2FL's config: CReFF's keys, the teacher's and the distillation's."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...core.checks import check_targets, positive
from ...core.errors import ConfigError
from ...core.method import METHODS
from .creff import CReFFConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


#: the teachers: `aligned` (a stand-in trained here, MiniLM text) or `clip` (CLIP weights)
TEACHERS = ("aligned", "clip")
TEACHER_ARCH_DEFAULTS: dict[str, dict[str, Any]] = {"resnet8": {"scaling": 2}}


@METHODS.register("clip2fl")
@dataclass
class CLIP2FLConfig(CReFFConfig):
    #: KD weight β: the code's default (the paper's best, 3, diverged in round 1 at lr 0.1 and
    #: on the BN-free `cnn` at the default lr; the paper's value is pinned in its presets)
    beta: float = 1.0
    kd_temperature: float = 3.0  # T [code], the KL is multiplied by T²
    teacher_scale: float = 100.0  # q = scale · cos(image, text) [code]
    pcl_weight: float = 0.001  # η [code: contrast_alpha]
    pcl_temperature: float = 0.1  # τ [code: ins_temp]
    teacher: str = "aligned"  # aligned (stand-in, MiniLM text) | clip (text=clip text.pretrained=...)
    templates: list[str] = field(default_factory=lambda: ["a photo of a {}."])  # [code] prompt
    # the aligned teacher (`fl-lightning teacher build` with the same overrides builds it)
    teacher_holdout_from: int = 55000  # it trains on training images from this index on
    teacher_holdout_size: int | None = None  # how many (None: to the end)
    teacher_arch: str = "resnet8"
    #: the tower's model arguments; null: its defaults here (resnet8: width 2, {scaling: 2})
    teacher_model_kwargs: dict[str, Any] | None = None
    teacher_epochs: int = 15
    teacher_lr: float = 0.05
    teacher_seed: int = 0
    #: the class text's control (text/targets.py): text | permuted | orthogonal | uniform |
    #: centred, for the prototypes of L_pcl and the text the teacher's logits (and the aligned
    #: teacher's training) use. Drawn with teacher_seed, so the cached teacher and the
    #: prototypes agree.
    targets: str = "text"
    #: the aligned teacher learns only from held-out images of these classes (null: all); the
    #: rest it knows only through their class text, zero-shot (issue 37's E2)
    teacher_classes: list[int] | None = None

    def check(self, run: RootConfig) -> None:
        """CReFF's, and the teacher must be buildable: `clip` needs CLIP weights, `aligned` its
        held-out images kept from the clients."""
        super().check(run)
        positive(self, "kd_temperature", "pcl_temperature")  # they divide the logits
        check_targets(self.targets)
        if self.teacher_classes is not None and (not self.teacher_classes or min(self.teacher_classes) < 0):
            raise ConfigError(
                f"method.teacher_classes={self.teacher_classes}: expected class ids >= 0 (null: every class)"
            )
        if self.teacher not in TEACHERS:
            raise ConfigError(f"method.teacher={self.teacher!r}: expected one of {', '.join(TEACHERS)}")
        if self.beta <= 0 and self.pcl_weight <= 0:
            return  # CReFF: no teacher used
        if self.teacher == "aligned" and self.beta > 0:  # the tower and its arguments, before any data
            from ...models import MODELS  # (torch: only for this teacher)

            params = inspect.signature(MODELS.get(self.teacher_arch)).parameters
            bad = sorted(set(teacher_model_kwargs(self)) - set(params))
            if bad:
                raise ConfigError(
                    f"method.teacher_model_kwargs has {bad[0]!r}, which model {self.teacher_arch} "
                    "does not take "
                    "(null gives the tower's defaults)"
                )
        text, sub = run.text or {}, run.data.train_subset
        if self.teacher == "clip":
            pre = text.get("pretrained") if text.get("name") == "clip" else None
            if not pre:
                raise ConfigError(
                    "method.teacher=clip needs CLIP weights: add text=clip text.pretrained=/path/to/"
                    "open_clip_ViT-B-32.pt (none ship with fl_lightning; method.teacher=aligned needs none)"
                )
            suffixes = (".pt", ".bin", ".safetensors", ".pth")
            looks_like_path = "/" in str(pre) or "\\" in str(pre) or str(pre).endswith(suffixes)
            if looks_like_path and not Path(str(pre)).expanduser().is_file():
                raise ConfigError(f"method.teacher=clip: text.pretrained={pre} is not a file")
        elif self.beta > 0 and (sub is None or int(sub) > self.teacher_holdout_from):
            raise ConfigError(
                f"method.teacher=aligned learns from training images {self.teacher_holdout_from} on "
                f"(method.teacher_holdout_from); keep every client off them: data.train_subset="
                f"{self.teacher_holdout_from} or less (got {sub})",
                needs=(f"data.train_subset={self.teacher_holdout_from} or less",),
            )


def teacher_model_kwargs(c: CLIP2FLConfig) -> dict[str, Any]:
    """`method.teacher_model_kwargs`, or the tower's defaults here when null (so another
    `teacher_arch` needs no kwargs of resnet8's removed)."""
    if c.teacher_model_kwargs is not None:
        return dict(c.teacher_model_kwargs)
    return dict(TEACHER_ARCH_DEFAULTS.get(c.teacher_arch, {}))
