"""CLIP2FL: Shi et al., "CLIP-guided Federated Learning on Heterogeneous and Long-Tailed
Data", AAAI 2024, https://arxiv.org/abs/2312.08648.

CReFF (`creff.py`) plus a frozen vision-language teacher (`teacher.py`), used twice:

* client loss: CE + β·T²·KL(softmax(q/T) ‖ softmax(p/T)) (batch mean), p the student's
  logits, q = s·cos(teacher image embedding, class text) the teacher's zero-shot logits
  (s = `teacher_scale`, 100 in the code; T = `kd_temperature`, 3);
* server: the federated-feature objective adds η·L_pcl, the prototype contrastive loss of the
  code (`prototype_contrastive`: each feature against the class-text prototypes, τ =
  `pcl_temperature`), so the student's feature space must have the text dimension: the
  model's `feature_dim` is set to it (ResNet-8's neck).

β = 0 and η = 0 is CReFF exactly (neither term is computed). `teacher=clip`: open_clip
towers from `text=clip text.pretrained=<weights file>`; `teacher=aligned`: the stand-in
trained on held-out images against MiniLM text (see `teacher.py`, docs/clip2fl.md).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import ConfigError
from ..text.targets import class_targets
from .configs.clip2fl import CLIP2FLConfig, teacher_model_kwargs
from .creff import CReFF, CReFFObjective
from .teacher import AlignedTeacherConfig, FrozenTeacher, TeacherSpec

log = logging.getLogger(__name__)


def aligned_config(c: CLIP2FLConfig) -> AlignedTeacherConfig:
    return AlignedTeacherConfig(
        holdout_from=c.teacher_holdout_from, holdout_size=c.teacher_holdout_size, arch=c.teacher_arch,
        model_kwargs=teacher_model_kwargs(c), epochs=c.teacher_epochs, lr=c.teacher_lr,
        logit_scale=c.teacher_scale, templates=tuple(c.templates), seed=c.teacher_seed,
        targets=c.targets,
        classes=tuple(int(k) for k in c.teacher_classes) if c.teacher_classes is not None else None,
    )  # fmt: skip


def text_config(teacher: str, text: dict[str, Any]) -> dict[str, Any]:
    """The text encoder of the class prototypes: the run's `text` (MiniLM when none is set)."""
    if text.get("name", "none") == "none":
        return {"name": "minilm"}
    return dict(text)


class CLIP2FLObjective(CReFFObjective):
    teacher_text: Tensor  # [C, d] L2-normalised class text (non-persistent buffer)

    def __init__(
        self,
        model: nn.Module,
        num_classes: int,
        beta: float = 0.0,
        kd_temperature: float = 3.0,
        teacher_scale: float = 100.0,
        teacher: TeacherSpec | None = None,
        teacher_text: Tensor | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, num_classes, **kwargs)
        self.beta, self.kd_temperature, self.teacher_scale = beta, kd_temperature, teacher_scale
        self.teacher = FrozenTeacher(teacher) if beta > 0 and teacher is not None else None
        text = F.normalize(teacher_text.float(), dim=-1) if teacher_text is not None else torch.zeros(0, 0)
        self.register_buffer("teacher_text", text, persistent=False)
        self._logits: Tensor | None = None
        self.clean_view = self.teacher is not None  # the teacher sees the un-augmented image

    def teacher_logits(self, x: Tensor) -> Tensor:
        """q = scale · cos(teacher image embedding, class text)."""
        assert self.teacher is not None
        return self.teacher_scale * self.teacher(x) @ self.teacher_text.T

    def task_loss(self, logits: Tensor, y: Tensor) -> Tensor:
        self._logits = logits
        return super().task_loss(logits, y)

    def loss_terms(self, batch: tuple[Tensor, ...]) -> dict[str, Tensor]:
        """With `data.augment` the batch is (augmented x, y, clean x): the student learns from the
        augmented image, the teacher sees the clean one (the authors' code)."""
        terms = super().loss_terms((batch[0], batch[1]))
        if self.beta > 0 and self.teacher is not None and self._logits is not None:
            t, clean = self.kd_temperature, batch[2] if len(batch) > 2 else batch[0]
            p, q = self._logits, self.teacher_logits(clean).to(self._logits)
            kl = F.kl_div(F.log_softmax(p / t, dim=-1), F.softmax(q / t, dim=-1), reduction="batchmean")
            terms["kd"] = self.beta * t * t * kl
        return terms


class CLIP2FL(CReFF):
    config_cls = CLIP2FLConfig
    objective_cls = CLIP2FLObjective
    config: CLIP2FLConfig

    def __init__(self, config: CLIP2FLConfig, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.text: Tensor | None = None
        self.teacher_spec: TeacherSpec | None = None
        self.teacher_info: dict[str, Any] = {}
        self.text_encoder = str(self.task.text.get("name", "none"))
        if config.beta <= 0 and config.pcl_weight <= 0:
            return
        names = list(self.task.class_names)
        if config.teacher == "clip":
            from ..text import class_text_features

            text = class_text_features(dict(self.task.text), names, templates=list(config.templates))
            assert isinstance(text, Tensor)
            self.text = class_targets(config.targets, text, config.teacher_seed)
            if config.beta > 0:
                self.teacher_spec = self._clip_spec()
        else:
            text_cfg = text_config(config.teacher, dict(self.task.text))
            self.text_encoder = str(text_cfg["name"])
            if config.beta > 0:
                if not self.task.data:
                    raise ConfigError("method.teacher=aligned needs the run's data config to find its images")
                spec, text, info, path = _aligned(self.task.data, text_cfg, names, aligned_config(config))
                self.teacher_spec, self.teacher_info = spec, info | {"path": str(path)}
                log.info("aligned teacher %s: held-out accuracy %.4f", path, info["held_out_accuracy"])
            else:
                from ..text import class_text_features

                text = class_text_features(text_cfg, names, templates=list(config.templates))
                assert isinstance(text, Tensor)
                text = class_targets(config.targets, text, config.teacher_seed)
            self.text = text  # the aligned teacher's: its targets applied

    def _clip_spec(self) -> TeacherSpec:
        from .teacher import _load_data

        ds = _load_data(self.task.data)
        mean = ds.mean if isinstance(ds.mean, tuple) else (float(ds.mean),)
        std = ds.std if isinstance(ds.std, tuple) else (float(ds.std),)
        return TeacherSpec(
            kind="clip", arch=str(self.task.text.get("arch", "ViT-B-32")),
            pretrained=self.task.text.get("pretrained"), num_classes=self.task.num_classes,
            data_mean=tuple(mean), data_std=tuple(std),
        )  # fmt: skip

    def model_kwargs(self, model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The student's feature dimension = the class-text (teacher) dimension."""
        from ..models import feature_dim_key

        key = feature_dim_key(model)
        if self.text is None or key is None:
            return kwargs
        d = int(self.text.shape[1])
        if kwargs.get(key) not in (None, d):
            log.info("clip2fl: model.%s=%s set to the teacher's dimension %d", key, kwargs[key], d)
        return {**kwargs, key: d}

    def objective_kwargs(self) -> dict[str, Any]:
        c = self.config
        return super().objective_kwargs() | {
            "beta": c.beta,
            "kd_temperature": c.kd_temperature,
            "teacher_scale": c.teacher_scale,
            "teacher": self.teacher_spec,
            "teacher_text": self.text if c.beta > 0 else None,
        }

    def check_model(self, model: nn.Module) -> None:
        super().check_model(model)
        if self.config.pcl_weight > 0 and self.text is not None:
            d = int(model.state_dict()["head.weight"].shape[1])  # the federated features' (CReFF's φ̂)
            if d != self.text.shape[1]:
                raise ConfigError(
                    f"clip2fl's contrastive term needs features of the text dimension {self.text.shape[1]}; "
                    f"the model's are {d} (use a model with feature_dim, e.g. resnet8)"
                )

    def run_summary(self) -> dict[str, Any]:
        if not self.teacher_info:
            return {}
        info = self.teacher_info
        return {
            "teacher_held_out_accuracy": info["held_out_accuracy"],
            "teacher_train_images": info["train_images"],
        } | {f"teacher_{k}": info[k] for k in ("unseen_accuracy", "unseen_within_accuracy") if k in info}

    def contrastive(self) -> tuple[Tensor | None, float, float]:
        if self.config.pcl_weight <= 0:
            return None, 0.0, self.config.pcl_temperature
        return self.text, self.config.pcl_weight, self.config.pcl_temperature

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.pop("teacher_model_kwargs", None)
        out["text_encoder"] = self.text_encoder
        if self.teacher_info:
            out["teacher_held_out_accuracy"] = self.teacher_info["held_out_accuracy"]
        return out

    def warnings(self) -> list[str]:
        c = self.config
        return (
            ["clip2fl with method.beta=0 and method.pcl_weight=0 is CReFF"]
            if c.beta <= 0 and c.pcl_weight <= 0
            else []
        )


def _aligned(
    data: dict[str, Any], text_cfg: dict[str, Any], names: list[str], cfg: AlignedTeacherConfig
) -> Any:
    from .teacher import load_or_build_aligned

    return load_or_build_aligned(data, text_cfg, names, cfg)
