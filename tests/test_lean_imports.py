"""Start-up (issue 18): the lean torchmetrics import and the CLI's quick exit, each in a fresh
interpreter (this test process has imported torchmetrics long ago)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HEAVY = ("transformers", "scipy.signal", "matplotlib", "torchvision")

PROBE = f"""
import json, sys
from fl_lightning.lean_imports import install
install()
import lightning.pytorch  # imports torchmetrics, as every worker and driver does
import torch
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.utilities.imports import _TRANSFORMERS_GREATER_EQUAL_4_4
acc = MulticlassAccuracy(num_classes=3, average="micro")(torch.tensor([0, 2, 1, 1]),
                                                        torch.tensor([0, 1, 1, 1]))
loaded = {{m: m in sys.modules for m in {HEAVY!r}}}
import transformers, torchvision.models  # still importable for our own code
print(json.dumps({{"loaded": loaded, "acc": float(acc), "resnet": torchvision.models.resnet18 is not None,
                  "tm_sees_transformers": bool(_TRANSFORMERS_GREATER_EQUAL_4_4)}}))
"""


def _probe(lean: str) -> dict[str, object]:
    env = {**os.environ, "FL_LIGHTNING_LEAN_IMPORTS": lean}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_lightning_imports_torchmetrics_without_its_optional_backends() -> None:
    lean = _probe("1")
    assert lean["loaded"] == dict.fromkeys(HEAVY, False)
    assert lean["acc"] == 0.75 and lean["resnet"] is True
    assert lean["tm_sees_transformers"] is False  # what torchmetrics was told: its BERTScore skipped it
    full = _probe("0")  # the switch: torchmetrics as it comes
    assert full["loaded"]["transformers"] and full["loaded"]["scipy.signal"]
    assert full["tm_sees_transformers"] is True
    assert full["acc"] == 0.75


def test_cli_exit_runs_threads_and_atexit_then_keeps_the_code() -> None:
    code = """
import atexit, threading, time
from fl_lightning.cli.main import exit_now
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread ran", flush=True))).start()
exit_now(3)
print("never")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stderr
    assert out.stdout.split() == ["thread", "ran", "atexit", "ran"]
