"""The configs of FedLGT and FedC-Tran (C-Tran on multi-label data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...core.checks import GROUP_TARGETS, check_targets, one_of, within
from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig
from . import multilabel, require_coarse_groups

if TYPE_CHECKING:
    from torch import nn

    from ...core.run_config import RootConfig
    from ...core.strategy import TaskInfo


LABEL_EMBEDDINGS = ("text", "learned", "frozen_random")
STATE_EMBEDDINGS = ("text", "learned")


@METHODS.register("fedlgt")
@dataclass
class FedLGTConfig(MethodConfig):
    label_embedding: str = "text"  # text (ULE) | learned (FedC-Tran) | frozen_random
    #: text: frozen features of state_words (random ones with label_embedding=frozen_random) |
    #: learned (the paper's FedC-Tran; the authors' code freezes them for FedC-Tran too)
    state_embedding: str = "text"
    #: controls of the frozen text tables (text/targets.py: text | permuted | orthogonal |
    #: uniform | centred), one switch per table so label meaning and state-token geometry are
    #: told apart (MiniLM's "positive"/"negative" have cosine 0.71); `frozen_random` above
    #: replaces both tables at once (kept for the committed reports)
    targets: str = "text"  # the label table (with label_embedding=text); + permuted_within, group_only
    state_targets: str = "text"  # the state table (with state_embedding=text)
    prompt: str = "The photo contains {}."  # [paper] "The photo contains [CLASS]"; [code] adds the "."
    #: [paper] the state embeddings' words; unknown is the zero vector
    state_words: list[str] = field(default_factory=lambda: ["positive", "negative"])
    lmt: bool = True  # [code] --use_lmt: C-Tran's random label mask
    known_fraction: float = 0.75  # [code] known labels per sample ~ U{0..floor(0.75 C)}
    ca_mle: bool = True  # [paper] client-aware masked label embedding (--use_global_guide)
    epsilon: float = 0.02  # [paper] uncertainty margin around the threshold
    threshold: float = 0.5  # [paper] τ
    reduction: str = "sum"  # sum (authors' code) | mean over the unknown positions

    def check_model(self, model: nn.Module, task: TaskInfo) -> None:
        from ...models.ctran import CTran

        if not isinstance(model, CTran):  # label and state embeddings are C-Tran's
            raise ConfigError("fedlgt / fedctran need a C-Tran model: model=ctran", needs=("model=ctran",))

    def check(self, run: RootConfig) -> None:
        within(self, "threshold", 0, 1, open_lo=True, open_hi=True)  # on sigmoid scores
        within(self, "epsilon", 0, 0.5, open_hi=True)  # |p - threshold| <= epsilon: 0.5 makes all unknown
        one_of(self, "label_embedding", LABEL_EMBEDDINGS)
        one_of(self, "state_embedding", STATE_EMBEDDINGS)
        check_targets(self.targets, extra=GROUP_TARGETS)
        check_targets(self.state_targets, "method.state_targets")
        if self.targets in GROUP_TARGETS:
            require_coarse_groups(run, f"method.targets={self.targets}")
        for table, targets, embedding in (("", self.targets, self.label_embedding),
                                          ("state_", self.state_targets, self.state_embedding)):  # fmt: skip
            if targets != "text" and embedding != "text":
                raise ConfigError(
                    f"method.{table}targets={targets} needs method.{table or 'label_'}embedding=text "
                    "(a frozen text table)"
                )
        one_of(self, "reduction", ("sum", "mean"))
        if not 0.0 <= self.known_fraction <= 1.0 or self.epsilon < 0:
            raise ConfigError("method.known_fraction must lie in [0, 1] and method.epsilon be >= 0")
        if "{}" not in self.prompt:
            raise ConfigError(f"method.prompt={self.prompt!r} needs a {{}} where the class name goes")
        if len(self.state_words) != 2:
            raise ConfigError("method.state_words needs two words: the positive and the negative state")
        if not multilabel(run):
            raise ConfigError(
                f"{self.name} is multi-label classification; data={run.data.name} is single-label "
                "(use data=fmnist_multilabel, voc2007, coco or flair)"
            )
        model = (run.model or {}).get("name")
        if model != "ctran":
            raise ConfigError(f"{self.name} trains a C-Tran: model=ctran (got model={model})")


@METHODS.register("fedctran")
@dataclass
class FedCTranConfig(FedLGTConfig):
    """C-Tran with learned label embeddings, FedAvg (the paper's FedC-Tran baseline)."""

    label_embedding: str = "learned"
    ca_mle: bool = False
