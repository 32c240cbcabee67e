"""The end-of-run console: what the rounds table alone would hide (issue 40 item 6)."""

from __future__ import annotations

from fl_lightning.tracking.console import format_table, notes


def test_clip2fl_shows_its_teacher_and_the_fedavg_head_beside_the_retrained_one():
    records = [
        {"round": 1, "accuracy": 0.21, "fedavg_head/accuracy": 0.40, "train_loss": 1.9},
        {"round": 2, "accuracy": 0.318, "fedavg_head/accuracy": 0.566, "train_loss": 1.5},
    ]
    table = format_table(records)
    assert "FedAvg head acc" in table.splitlines()[0] and "0.5660" in table.splitlines()[-1]
    said = notes(records, {"teacher_held_out_accuracy": 0.52})
    assert said[0].startswith("teacher: held-out accuracy 0.5200")
    assert said[1].startswith("re-trained head: final accuracy 0.3180, below the FedAvg head's 0.5660")
    assert notes([{"round": 1, "accuracy": 0.7}], {}) == []  # FedAvg: nothing to add


def test_a_multilabel_run_whose_f1_stayed_zero_is_flagged():
    zero = [{"round": r, "c_ap": 0.34, "c_f1": 0.0, "o_f1": 0.0} for r in (1, 2, 3)]
    (line,) = notes(zero, {})
    assert line.startswith("warning: C-F1 and O-F1 are 0 in every round") and "eval.threshold" in line
    assert notes([*zero[:2], {"round": 3, "c_ap": 0.4, "c_f1": 0.05, "o_f1": 0.0}], {}) == []
