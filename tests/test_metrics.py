"""`fl_lightning.core.metrics` against scikit-learn (multi-label) and written-out numpy (single-label).

Data are fixed and seeded. Multi-label logits are rounded to one decimal so scores tie; one class has
no positive target and one is never predicted positive, so both zero-denominator paths run.
References are float64; torchmetrics computes AP and P/R in float32 (relative rounding 2**-24 per
operation, sums over at most 1,200 terms), which stays well inside the 1e-6 tolerance.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, f1_score, precision_score, recall_score

from fl_lightning.core.errors import ConfigError
from fl_lightning.core.metrics import EvalSpec, TaskMetrics, domain_accuracy, longtail_groups, primary_metric

N, C = 200, 6
TOL = 1e-6
ML_KEYS = {"c_ap", "o_ap", "c_p", "c_r", "c_f1", "o_p", "o_r", "o_f1"}


def _multilabel_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1234)
    logits = rng.normal(0.0, 2.0, size=(N, C))
    logits[:, 4] = -np.abs(logits[:, 4]) - 1.1  # class 4: never predicted positive (precision 0)
    # One decimal: many exact ties. Rounding last keeps every value the double nearest its decimal,
    # so no two scores differ by an ulp only (sigmoid would merge those, sklearn on logits would not).
    logits = np.round(logits, 1)
    target = (rng.random((N, C)) < np.array([0.5, 0.3, 0.2, 0.1, 0.4, 0.0])).astype(np.float32)
    return logits, target  # class 5: no positive target (excluded from C-AP, recall 0)


def _single_label_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(99)
    logits = rng.normal(0.0, 1.0, size=(N, C))  # continuous: no ties in the argmax
    target = rng.choice(5, size=N, p=[0.4, 0.25, 0.2, 0.1, 0.05])  # class 5 never occurs
    logits[np.arange(N), target] += 0.8  # better than chance, not perfect
    return logits, target


def _run(spec: EvalSpec, logits: np.ndarray, target: np.ndarray, batch: int) -> dict[str, float]:
    m = TaskMetrics(spec)
    scores = torch.from_numpy(logits)
    tgt = torch.from_numpy(target)
    for i in range(0, len(scores), batch):
        m.update(scores[i : i + batch], tgt[i : i + batch])
    return m.compute()


def _assert_valid(res: dict[str, float]) -> None:
    for k, v in res.items():
        assert type(v) is float, k
        assert math.isfinite(v) and 0.0 <= v <= 1.0, (k, v)


@pytest.mark.parametrize("threshold", [0.5, 0.3])
def test_multilabel_matches_sklearn(threshold: float) -> None:
    logits, target = _multilabel_data()
    res = _run(EvalSpec(num_classes=C, multilabel=True, threshold=threshold), logits, target, batch=N)
    assert set(res) == ML_KEYS
    _assert_valid(res)

    y = target.astype(int)
    pred = (1.0 / (1.0 + np.exp(-logits)) > threshold).astype(int)  # positive iff sigmoid > threshold
    assert pred[:, 4].sum() == 0 and y[:, 5].sum() == 0 and pred[:, 5].sum() > 0

    present = y.sum(axis=0) > 0
    # AP depends only on the order of the scores: sklearn on the logits is the reference.
    c_ap = np.mean([average_precision_score(y[:, c], logits[:, c]) for c in range(C) if present[c]])
    assert c_ap == pytest.approx(average_precision_score(y[:, present], logits[:, present], average="macro"))
    c_p = precision_score(y, pred, average="macro", zero_division=0)
    c_r = recall_score(y, pred, average="macro", zero_division=0)
    expected = {
        "c_ap": c_ap,
        "o_ap": average_precision_score(y, logits, average="micro"),
        "c_p": c_p,
        "c_r": c_r,
        "c_f1": 2 * c_p * c_r / (c_p + c_r),
        "o_p": precision_score(y, pred, average="micro", zero_division=0),
        "o_r": recall_score(y, pred, average="micro", zero_division=0),
        "o_f1": f1_score(y, pred, average="micro", zero_division=0),
    }
    for k, v in expected.items():
        assert res[k] == pytest.approx(v, abs=TOL, rel=0), k
    # C-F1 is not the mean of per-class F1 (that is what this data would give otherwise).
    assert abs(res["c_f1"] - f1_score(y, pred, average="macro", zero_division=0)) > 1e-3


def test_multilabel_long_tail_groups_average_the_ap_of_their_labels() -> None:
    """many_/medium_/few_c_ap: the mean AP (sklearn's) over each group's labels that have a
    positive target; a group without one has no value."""
    logits, target = _multilabel_data()
    y = target.astype(int)
    present = y.sum(axis=0) > 0
    groups = tuple(0 if c < 2 else 2 if c >= C - 2 else 1 for c in range(C))
    res = _run(EvalSpec(num_classes=C, multilabel=True, class_groups=groups), logits, target, batch=7)
    for g, name in enumerate(("many", "medium", "few")):
        members = [c for c in range(C) if groups[c] == g and present[c]]
        key = f"{name}_c_ap"
        if not members:
            assert key not in res
            continue
        expected = np.mean([average_precision_score(y[:, c], logits[:, c]) for c in members])
        assert res[key] == pytest.approx(expected, abs=TOL, rel=0), key
    assert set(res) - ML_KEYS <= {"many_c_ap", "medium_c_ap", "few_c_ap"} and "many_c_ap" in res


def test_multilabel_zero_denominators_are_zero() -> None:
    # No positive target and no positive prediction anywhere: every ratio is 0/0.
    logits = -np.abs(_multilabel_data()[0]) - 0.1
    target = np.zeros((N, C), dtype=np.float32)
    res = _run(EvalSpec(num_classes=C, multilabel=True), logits, target, batch=N)
    assert res == {k: 0.0 for k in ML_KEYS}


def test_single_label_matches_numpy() -> None:
    logits, target = _single_label_data()
    groups = (0, 0, 1, 1, 2, 2)
    res = _run(EvalSpec(num_classes=C, per_class=True, class_groups=groups), logits, target, batch=N)
    _assert_valid(res)

    correct = logits.argmax(axis=1) == target
    expected = {"accuracy": correct.mean()}
    for c in range(C):
        if (target == c).any():  # class 5 never occurs: no key
            expected[f"class_accuracy/{c}"] = correct[target == c].mean()
    for g, name in enumerate(("many", "medium", "few")):
        in_group = np.isin(target, [c for c in range(C) if groups[c] == g])
        expected[f"{name}_accuracy"] = correct[in_group].mean()
    assert set(res) == set(expected)
    assert "class_accuracy/5" not in res
    for k, v in expected.items():
        assert res[k] == pytest.approx(v, abs=1e-12, rel=0), k  # ratios of integer counts


def test_single_label_group_without_samples_is_left_out() -> None:
    logits, target = _single_label_data()
    res = _run(EvalSpec(num_classes=C, class_groups=(0, 0, 1, 1, 1, 2)), logits, target, batch=N)
    assert set(res) == {"accuracy", "many_accuracy", "medium_accuracy"}  # class 5 (few) has no sample


@pytest.mark.parametrize(
    "spec",
    [
        EvalSpec(num_classes=C, multilabel=True),
        EvalSpec(num_classes=C, per_class=True, class_groups=(0, 0, 1, 1, 2, 2)),
    ],
    ids=["multilabel", "single_label"],
)
def test_batch_split_invariance(spec: EvalSpec) -> None:
    logits, target = _multilabel_data() if spec.multilabel else _single_label_data()
    whole = _run(spec, logits, target, batch=N)
    for batch in (1, 7):
        assert _run(spec, logits, target, batch=batch) == whole


def test_float32_scores_and_float_targets_accepted() -> None:
    logits, target = _multilabel_data()
    spec = EvalSpec(num_classes=C, multilabel=True)
    res32 = _run(spec, logits.astype(np.float32), target, batch=7)
    res64 = _run(spec, logits, target.astype(np.float64), batch=7)
    assert res32 == res64  # float32 -> float64 is exact, so ranking and thresholding are unchanged


def test_non_finite_scores_give_finite_metrics() -> None:
    # NaN ranks lowest and +-inf like the extreme logits: same as replacing them by -1e9 / +-1e9.
    logits, target = _multilabel_data()
    odd, plain = logits.copy(), logits.copy()
    odd[::9, 0], plain[::9, 0] = np.nan, -1e9
    odd[1::9, 1], plain[1::9, 1] = np.inf, 1e9
    odd[2::9, 2], plain[2::9, 2] = -np.inf, -1e9
    spec = EvalSpec(num_classes=C, multilabel=True)
    res = _run(spec, odd, target, batch=7)
    _assert_valid(res)
    assert res == _run(spec, plain, target, batch=7)
    single = _run(EvalSpec(num_classes=C, per_class=True), odd, target.argmax(axis=1), batch=7)
    _assert_valid(single)


def test_soft_multilabel_target_is_rejected() -> None:
    m = TaskMetrics(EvalSpec(num_classes=C, multilabel=True))
    with pytest.raises(ValueError):
        m.update(torch.zeros(2, C), torch.full((2, C), 0.7))
    with pytest.raises(RuntimeError):  # torchmetrics' validate_args: only 0/1
        m.update(torch.zeros(2, C), torch.full((2, C), 2.0))


def test_compute_without_update_raises() -> None:
    with pytest.raises(ValueError):
        TaskMetrics(EvalSpec(num_classes=C)).compute()


def test_longtail_groups_boundaries() -> None:
    counts = [500, 101, 100, 50, 20, 19, 0]
    # 100 == many_above and 20 == few_below are both medium.
    assert longtail_groups(counts, many_above=100, few_below=20) == (0, 0, 1, 1, 1, 2, 2)
    assert longtail_groups([5, 6, 7], many_above=6, few_below=6) == (2, 1, 0)
    with pytest.raises(ConfigError):
        longtail_groups(counts, many_above=10, few_below=20)


def test_spec_primary_metric_and_pickle() -> None:
    ml = EvalSpec(num_classes=C, multilabel=True, threshold=0.3)
    sl = EvalSpec(num_classes=3, per_class=True, class_groups=(0, 1, 2))
    assert primary_metric(ml) == "c_ap"
    assert primary_metric(sl) == "accuracy"
    assert pickle.loads(pickle.dumps(ml)) == ml and pickle.loads(pickle.dumps(sl)) == sl
    with pytest.raises(ConfigError):
        EvalSpec(num_classes=3, class_groups=(0, 1))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("multilabel", [True, False], ids=["multilabel", "single_label"])
def test_cuda_matches_cpu(multilabel: bool) -> None:
    spec = EvalSpec(num_classes=C, multilabel=multilabel, per_class=not multilabel)
    logits, target = _multilabel_data() if multilabel else _single_label_data()
    results = []
    for device in ("cpu", "cuda"):
        m = TaskMetrics(spec, device=device)
        for i in range(0, N, 7):  # inputs on the CPU: update moves them to the metric's device
            m.update(torch.from_numpy(logits[i : i + 7]), torch.from_numpy(target[i : i + 7]))
        results.append(m.compute())
    cpu, cuda = results
    assert set(cpu) == set(cuda)
    for k in cpu:  # float32 sums may be ordered differently on the GPU
        assert cuda[k] == pytest.approx(cpu[k], abs=TOL, rel=0), k


def test_domain_accuracy_is_the_unweighted_mean_over_domains() -> None:
    """FedGLCL's Office/DomainNet statistic ("the test accuracy of each client and their
    average"): domain a 3 of 4 right, domain b 0 of 1, domain c absent: per domain 0.75 and 0.0,
    mean 0.375, where the pooled accuracy would be 3/5 = 0.6."""
    scores = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0], [1.0, 0.0], [0.0, 5.0]])
    target = torch.tensor([0, 1, 0, 1, 0])
    domains = torch.tensor([0, 0, 0, 0, 1])
    out = domain_accuracy(scores, target, domains, ["a", "b", "c"])
    assert out == {"accuracy_a": 0.75, "accuracy_b": 0.0, "domain_avg_accuracy": 0.375}
