"""Evaluation metrics on torchmetrics: accuracy (single-label, optionally per class and per
long-tail group) and the multi-label set of ML-GCN / C-Tran / FedLGT (C-AP, O-AP, C-P/R/F1, O-P/R/F1).

All values are plain floats in [0, 1]. A zero denominator gives 0.0 (sklearn's zero_division=0):
a class never predicted positive has precision 0, a class with no positive target has recall 0,
and F1 is 0 when precision + recall is 0. C-AP averages only over classes with a positive target
(AP is undefined without one); with no positive target at all, C-AP and O-AP are 0.0.
A multi-label score counts as a positive prediction when sigmoid(score) > threshold (strictly).
All values are independent of how a pass is split into batches.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import (
    MulticlassConfusionMatrix,
    MulticlassStatScores,
    MultilabelAveragePrecision,
    MultilabelF1Score,
    MultilabelPrecision,
    MultilabelRecall,
    MultilabelStatScores,
)
from torchmetrics.functional.classification import binary_average_precision

from .errors import ConfigError

GROUP_NAMES = ("many", "medium", "few")  # index = value in EvalSpec.class_groups


@dataclass(frozen=True)
class EvalSpec:
    """What an evaluation measures (picklable; built on the driver, shipped to hosts)."""

    num_classes: int
    multilabel: bool = False  # targets are float multi-hot [N, C]; scores are logits
    threshold: float = 0.5  # multi-label decision threshold on sigmoid(scores)
    per_class: bool = False  # single-label: also class_accuracy/<c> for every class c
    #: long tail, per class 0=many, 1=medium, 2=few: many_/medium_/few_accuracy (single-label)
    #: or many_/medium_/few_c_ap (multi-label: the mean AP of the group's labels)
    class_groups: tuple[int, ...] | None = None
    #: a coarse semantic group per class (fmnist_digits20: clothing, digit), single-label:
    #: `within_group_errors`, the share of wrong predictions that stay in the true class's
    #: group (the signature of semantic targets when top-1 does not move)
    coarse_groups: tuple[int, ...] | None = None
    #: base-to-new (`data.base_new`), single-label: classes [0, m) are base, [m, C) new. Adds
    #: base_accuracy (base-class images, argmax over the base classes' scores), new_accuracy
    #: (new-class images, argmax over the new classes') and base_new_hm, their harmonic mean:
    #: CoOp's separate base and new evaluations, for a model whose score of a class does not
    #: depend on which other classes are scored (CoOp's); one whose does (FedTPG's generator)
    #: scores the base columns with the base names only and the new ones with the new names
    base_classes: int | None = None
    #: base-to-new over a composite of datasets (`data=coop_multi`, FedTPG's cross-class
    #: protocol): each member's (name, first class, first new class, end), in label order
    #: (`base_new_sets`); instead of `base_classes`. Each dataset is scored on its own:
    #: `base_accuracy_<name>` over its base classes' scores only, `new_accuracy_<name>` over its
    #: new ones', `base_new_hm_<name>`; and the averages over the datasets, unweighted (each
    #: dataset counts once, whatever its test-set size: the authors' `Server.test`,
    #: `np.mean(acc_list)`): `base_accuracy`, `new_accuracy`, and `base_new_hm` the harmonic
    #: mean of those two (the tables' "Average" column, as CoCoOp's: not the mean of the
    #: datasets' own harmonic means)
    base_new_sets: tuple[tuple[str, int, int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.num_classes < 1:
            raise ConfigError(f"num_classes must be >= 1, got {self.num_classes}")
        if not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"threshold must lie in (0, 1), got {self.threshold}")
        if self.class_groups is not None:
            if len(self.class_groups) != self.num_classes or not set(self.class_groups) <= {0, 1, 2}:
                raise ConfigError(f"class_groups needs one of 0/1/2 per class ({self.num_classes} classes)")
        if self.coarse_groups is not None and (
            len(self.coarse_groups) != self.num_classes or self.multilabel
        ):
            raise ConfigError(f"coarse_groups needs one group per class ({self.num_classes}), single-label")
        if self.per_class and self.multilabel:
            raise ConfigError("per_class applies to single-label evaluation only")
        if self.base_classes is not None and (
            self.multilabel or not 0 < self.base_classes < self.num_classes
        ):
            raise ConfigError(
                f"base_classes needs single-label data and 0 < base_classes < {self.num_classes} classes"
            )
        if self.base_new_sets:
            ends = [0] + [hi for _, _, _, hi in self.base_new_sets]
            sets = zip(self.base_new_sets, ends[:-1], strict=True)  # each set starts where one ends
            if (
                self.multilabel
                or self.base_classes is not None
                or any(lo != end or not lo < mid < hi for (_, lo, mid, hi), end in sets)
                or ends[-1] != self.num_classes
            ):
                raise ConfigError(
                    "base_new_sets needs single-label data, no base_classes, and consecutive sets "
                    f"(start < first new < end) covering the {self.num_classes} classes"
                )


def harmonic_mean(a: float, b: float) -> float:
    """2ab / (a + b); 0 when either is 0 (Python's statistics.harmonic_mean, which FLiP uses)."""
    return 2 * a * b / (a + b) if a > 0 and b > 0 else 0.0


def base_class_count(num_classes: int) -> int:
    """How many classes are base: ceil(C/2) (CoOp's `subsample_classes`, FedTPG's
    `TestDataManager`); labels [0, m) are base, [m, C) new."""
    return (int(num_classes) + 1) // 2


def base_new_sets(
    num_classes: int, class_sets: Sequence[tuple[str, int]]
) -> tuple[tuple[str, int, int, int], ...]:
    """A composite's member datasets (name, class count; labels consecutive in this order) as
    (name, first class, first new class, end): each member's own base half, ceil(C_i/2)."""
    out, lo = [], 0
    for name, n in class_sets:
        out.append((str(name), lo, lo + base_class_count(n), lo + int(n)))
        lo += int(n)
    if lo != num_classes:
        raise ConfigError(f"the class sets hold {lo} classes, the dataset {num_classes}")
    return tuple(out)


def base_class_ids(num_classes: int, class_sets: Sequence[tuple[str, int]] = ()) -> tuple[int, ...]:
    """The base classes' labels: the first ceil(C/2), or each member's own first half for a
    composite (`class_sets`)."""
    if not class_sets:
        return tuple(range(base_class_count(num_classes)))
    return tuple(c for _, lo, mid, _ in base_new_sets(num_classes, class_sets) for c in range(lo, mid))


def dual_metrics(line: dict[str, float]) -> dict[str, float]:
    """FLiP's `dual` protocol from one round's metrics: `dual_hm`, the harmonic mean of the
    global model's accuracy on the whole test set (`accuracy`, FLiP's global) and the clients'
    accuracy on their own test splits (`client_accuracy`, sample-weighted: FLiP's personal);
    empty unless both are there."""
    if "accuracy" not in line or "client_accuracy" not in line:
        return {}
    return {"dual_hm": harmonic_mean(float(line["accuracy"]), float(line["client_accuracy"]))}


def longtail_groups(train_counts: Sequence[int], many_above: int, few_below: int) -> tuple[int, ...]:
    """Per class: 0 (many-shot, count > many_above), 2 (few-shot, count < few_below), else 1 (medium).

    The ImageNet-LT convention (many > 100, few < 20), thresholds from the config so they scale
    to a dataset."""
    if few_below > many_above:  # otherwise a count could be both many- and few-shot
        raise ConfigError(f"few_below ({few_below}) must not exceed many_above ({many_above})")
    return tuple(0 if n > many_above else 2 if n < few_below else 1 for n in train_counts)


def within_group_errors(confusion: torch.Tensor, groups: Sequence[int]) -> dict[str, float]:
    """From a confusion matrix [true, predicted]: the share of errors predicted in the true
    class's coarse group (absent without errors), and that share were errors spread evenly over
    the other classes (`_chance`: 9/19 for two groups of 10)."""
    g = torch.tensor(list(groups), device=confusion.device)
    same = (g[:, None] == g[None, :]) & ~torch.eye(len(g), dtype=torch.bool, device=confusion.device)
    errors = confusion.double().fill_diagonal_(0)
    total = float(errors.sum())
    chance = float(same.double().sum(1).mean()) / (len(g) - 1) if len(g) > 1 else 0.0
    if total == 0:
        return {"within_group_errors_chance": chance}
    return {"within_group_errors": float(errors[same].sum()) / total, "within_group_errors_chance": chance}


def domain_accuracy(
    scores: torch.Tensor, target: torch.Tensor, domains: torch.Tensor, names: Sequence[str]
) -> dict[str, float]:
    """Accuracy on each domain's test images (`accuracy_<domain>`) and their unweighted mean over
    the domains with test images (`domain_avg_accuracy`): the feature-skew protocol of FedBN and
    FedGLCL (one client a domain; "the test accuracy of each client and their average"), where
    the pooled `accuracy` weights each domain by its test-set size."""
    correct = scores.detach().argmax(-1).cpu() == target.cpu()
    domains = domains.cpu()
    out: dict[str, float] = {}
    for d, name in enumerate(names):
        mine = domains == d
        if bool(mine.any()):
            out[f"accuracy_{name}"] = float(correct[mine].double().mean())
    if out:
        out["domain_avg_accuracy"] = sum(out.values()) / len(out)
    return out


def blanked_ap(
    scores: torch.Tensor,
    target: torch.Tensor,
    blank: torch.Tensor,
    groups: Sequence[int] | None = None,
    group_names: Sequence[str] = (),
) -> dict[str, float]:
    """The AP on blanked labels (multi-label): for each label c, the AP of its scores over the
    images where c is absent or blanked (its object cut out of the image, the label kept), the
    blanked ones the positives; images where c is visible are left out. `blank_c_ap` is the
    mean over the labels with a blanked positive, `blank_<group>_ap` the same within each
    coarse group (`groups[c]` indexes `group_names`). A label is found there only from what
    co-occurs with it in the image."""
    scores = scores.detach().double().cpu()
    squashed = 0.5 + 0.5 * (scores / (1.0 + scores.abs()))  # AP wants [0, 1]; order kept (TaskMetrics)
    present, gone = target.cpu() > 0.5, blank.cpu().bool()
    ap: dict[int, float] = {}
    for c in torch.nonzero(gone.any(0)).flatten().tolist():
        rows = ~present[:, c] | gone[:, c]
        ap[c] = float(binary_average_precision(squashed[rows, c], gone[rows, c].long(), thresholds=None))
    out = {"blank_c_ap": sum(ap.values()) / len(ap)} if ap else {}
    for g, name in enumerate(group_names):
        mine = [v for c, v in ap.items() if groups is not None and groups[c] == g]
        if mine:
            out[f"blank_{name}_ap"] = sum(mine) / len(mine)
    return out


def primary_metric(spec: EvalSpec) -> str:
    """The metric that model selection and summaries use."""
    return "c_ap" if spec.multilabel else "accuracy"


class TaskMetrics:
    """One evaluation pass: `update(scores, target)` per batch, `compute()` once."""

    def __init__(self, spec: EvalSpec, device: torch.device | str = "cpu") -> None:
        self.spec = spec
        self.device = torch.device(device)
        c = spec.num_classes
        # Defaults kept on purpose: ignore_index=None (no label is skipped) and validate_args=True
        # (labels out of range and targets other than 0/1 raise instead of being miscounted).
        counts: dict[str, Metric | MetricCollection]
        ranking: dict[str, Metric | MetricCollection] = {}
        if spec.multilabel:
            # Thresholded predictions arrive as 0/1 ints (see update), so no threshold is passed.
            counts = {
                # Per-class P/R averaged by hand so every class counts, whatever the torchmetrics
                # version does with classes lacking support in its own macro average.
                "p": MultilabelPrecision(c, average="none", zero_division=0),
                "r": MultilabelRecall(c, average="none", zero_division=0),
                "o_p": MultilabelPrecision(c, average="micro", zero_division=0),
                "o_r": MultilabelRecall(c, average="micro", zero_division=0),
                "o_f1": MultilabelF1Score(c, average="micro", zero_division=0),
                "stats": MultilabelStatScores(c, average="none"),  # per-class support for C-AP
            }
            ranking = {
                # Exact AP (thresholds=None keeps every score), like sklearn. Macro is taken by hand
                # from per-class values: torchmetrics' macro counts a class without positives as AP 0.
                "ap": MultilabelAveragePrecision(c, average="none", thresholds=None),
                "o_ap": MultilabelAveragePrecision(c, average="micro", thresholds=None),  # flattens
            }
        else:
            # Per-class correct (tp) and total (support) counts give every single-label metric exactly.
            counts = {"stats": MulticlassStatScores(c, top_k=1, average="none")}
            if spec.coarse_groups is not None:  # which class the errors go to
                counts["confusion"] = MulticlassConfusionMatrix(c)
        # compute_groups: metrics with identical state (the threshold counts; the two APs) share one copy.
        self._counts = MetricCollection(counts, compute_groups=True).to(self.device)
        self._ranking = MetricCollection(ranking, compute_groups=True).to(self.device) if ranking else None
        # Positive iff score > logit(threshold), i.e. sigmoid(score) > threshold, decided on the logit.
        self._logit_threshold = math.log(spec.threshold / (1.0 - spec.threshold))
        self._samples = 0
        m = spec.base_classes
        #: base-to-new, per class set (one for a plain dataset, unnamed): (name, first class,
        #: first new class, end)
        self._sets = spec.base_new_sets or ((("", 0, m, c),) if m is not None else ())
        #: [set, half, (correct, total)]: base-class images among their set's base scores, new
        #: ones among its new scores (integer counts: independent of batching)
        self._halves = torch.zeros(len(self._sets), 2, 2, dtype=torch.int64) if self._sets else None

    def update(self, scores: torch.Tensor, target: torch.Tensor) -> None:
        """scores: logits [B, C]; target: class indices long [B], or float multi-hot [B, C]."""
        scores = scores.detach().to(self.device, torch.float64)  # exact for float32/16 logits
        # Finite values keep every metric finite: NaN ranks lowest (a diverged model scores like a
        # constant one), +-inf become the extreme finite logits.
        scores = torch.nan_to_num(scores, nan=torch.finfo(torch.float64).min)
        target = target.detach().to(self.device)
        self._samples += int(scores.shape[0])
        if not self.spec.multilabel:
            self._counts.update(scores, target)
            if self._halves is not None:
                self._update_halves(scores, target)
            return
        # torchmetrics' AP wants integer targets; refuse soft labels rather than truncate them.
        hard = target.long()
        if target.is_floating_point() and not torch.equal(hard.to(target.dtype), target):
            raise ValueError("multi-label targets must be multi-hot 0/1, got fractional values")
        self._counts.update((scores > self._logit_threshold).long(), hard)
        assert self._ranking is not None
        # AP needs scores in [0, 1] (torchmetrics sigmoids a batch only if some score lies outside,
        # so small logits would be read as probabilities) and depends only on their order. Not
        # torch.sigmoid: its vectorised and scalar CPU paths round differently, which splits tied
        # scores depending on batch layout. This monotone squash uses only exactly rounded
        # operations, so equal logits stay equal, and it keeps logits apart far beyond the point
        # (|logit| > 37) where a float64 sigmoid rounds them all to 1.
        squashed = 0.5 + 0.5 * (scores / (1.0 + scores.abs()))
        self._ranking.update(squashed, hard)

    def _update_halves(self, scores: torch.Tensor, target: torch.Tensor) -> None:
        assert self._halves is not None
        for s, (_, lo, mid, hi) in enumerate(self._sets):
            for half, a, b in ((0, lo, mid), (1, mid, hi)):
                rows = (target >= a) & (target < b)
                pred = scores[rows][:, a:b].argmax(dim=1) + a  # argmax over the half's own classes
                self._halves[s, half, 0] += int((pred == target[rows]).sum())
                self._halves[s, half, 1] += int(rows.sum())

    def compute(self) -> dict[str, float]:
        if self._samples == 0:
            raise ValueError("TaskMetrics.compute() before any update: nothing was evaluated")
        res = dict(self._counts.compute())
        if self._ranking is not None:
            with warnings.catch_warnings():
                # Expected for classes without positives; they are excluded from C-AP below.
                warnings.filterwarnings("ignore", message="No positive samples found in target")
                res.update(self._ranking.compute())
        if self.spec.multilabel:
            return self._multilabel(res)
        out = self._single_label(res["stats"])
        if self._halves is not None:
            out.update(self._base_new())
        if "confusion" in res:
            out.update(within_group_errors(res["confusion"], self.spec.coarse_groups or ()))
        return out

    def _base_new(self) -> dict[str, float]:
        """base_accuracy, new_accuracy, base_new_hm: of the one dataset, or per member of a
        composite (suffixed `_<name>`) and, unsuffixed, their unweighted averages (EvalSpec)."""
        assert self._halves is not None
        each: list[dict[str, float]] = []
        for (name, *_), ((bc, bn), (nc, nn)) in zip(self._sets, self._halves.tolist(), strict=True):
            one = {"base_accuracy": bc / bn} if bn else {}
            one |= {"new_accuracy": nc / nn} if nn else {}
            if bn and nn:
                one["base_new_hm"] = harmonic_mean(bc / bn, nc / nn)
            each.append({f"{k}_{name}": v for k, v in one.items()} if name else one)
        if not self.spec.base_new_sets:
            return each[0]
        out = {k: v for one in each for k, v in one.items()}
        names = [name for name, *_ in self._sets]
        for key in ("base_accuracy", "new_accuracy"):  # over the datasets with such test images
            vals = [one[f"{key}_{n}"] for n, one in zip(names, each, strict=True) if f"{key}_{n}" in one]
            if vals:
                out[key] = sum(vals) / len(vals)
        if "base_accuracy" in out and "new_accuracy" in out:
            out["base_new_hm"] = harmonic_mean(out["base_accuracy"], out["new_accuracy"])
        return out

    def _single_label(self, stats: torch.Tensor) -> dict[str, float]:
        # stats[c] = (tp, fp, tn, fn, support); integer counts, divided in float64 on the host.
        correct = [int(v) for v in stats[:, 0].tolist()]
        total = [int(v) for v in stats[:, 4].tolist()]
        out = {"accuracy": sum(correct) / sum(total)}
        if self.spec.per_class:
            out.update({f"class_accuracy/{c}": correct[c] / n for c, n in enumerate(total) if n > 0})
        if self.spec.class_groups is not None:
            for g, name in enumerate(GROUP_NAMES):
                members = [c for c, cg in enumerate(self.spec.class_groups) if cg == g]
                n = sum(total[c] for c in members)
                if n > 0:  # a group without test samples has no accuracy
                    out[f"{name}_accuracy"] = sum(correct[c] for c in members) / n
        return out

    def _multilabel(self, res: dict[str, torch.Tensor]) -> dict[str, float]:
        present = res["stats"][:, 4] > 0  # classes with at least one positive target
        ap = res["ap"].double()
        c_ap = float(ap[present].mean()) if bool(present.any()) else 0.0
        c_p = float(res["p"].double().mean())
        c_r = float(res["r"].double().mean())
        # C-F1 from macro P and R (ML-GCN's definition), not the mean of per-class F1.
        c_f1 = 2 * c_p * c_r / (c_p + c_r) if c_p + c_r > 0 else 0.0
        out = {
            "c_ap": c_ap,
            "o_ap": float(res["o_ap"]),
            "c_p": c_p,
            "c_r": c_r,
            "c_f1": c_f1,
            "o_p": float(res["o_p"]),
            "o_r": float(res["o_r"]),
            "o_f1": float(res["o_f1"]),
        }
        if self.spec.class_groups is not None:
            for g, name in enumerate(GROUP_NAMES):
                members = torch.tensor([cg == g for cg in self.spec.class_groups]) & present.cpu()
                if bool(members.any()):  # a group with no positive test target has no AP
                    out[f"{name}_c_ap"] = float(ap.cpu()[members].mean())
        return out
