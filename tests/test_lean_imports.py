"""Start-up (issue 18): the lean torchmetrics import and the CLI's quick exit, each in a fresh
interpreter (this test process has imported torchmetrics long ago)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fl_lightning import lean_imports

HEAVY = ("transformers", "scipy.signal", "matplotlib", "torchvision", "rich", "dp_accounting")

PROBE = f"""
import json, sys
from fl_lightning.lean_imports import install
install()
import lightning.pytorch  # imports torchmetrics, as every worker and driver does
import fl_lightning.runtime.host  # what a client worker imports (actor.py): no accountant, no scipy
import torch
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.utilities.imports import _TRANSFORMERS_GREATER_EQUAL_4_4
acc = MulticlassAccuracy(num_classes=3, average="micro")(torch.tensor([0, 2, 1, 1]),
                                                        torch.tensor([0, 1, 1, 1]))
loaded = {{m: m in sys.modules for m in {HEAVY!r}}}
import importlib.util
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE
import transformers, torchvision.models  # still importable for our own code
print(json.dumps({{"loaded": loaded, "acc": float(acc), "resnet": torchvision.models.resnet18 is not None,
                  "tm_sees_transformers": bool(_TRANSFORMERS_GREATER_EQUAL_4_4),
                  "rich_installed": importlib.util.find_spec("rich") is not None,
                  "lightning_sees_rich": bool(_RICH_AVAILABLE)}}))
"""


#: One fresh interpreter for both probes: it imports torch (neither Lightning nor torchmetrics,
#: nor any of HEAVY) once, then forks a child per probe, each with the switch set before it
#: imports Lightning, as a fresh interpreter would; each child's result is one line on stdout.
FORKS = f"""
import os, sys, traceback
import torch  # the start-up both probes share
for lean in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        os.environ["FL_LIGHTNING_LEAN_IMPORTS"] = lean
        try:
            exec(compile({PROBE!r}, "probe", "exec"), {{"__name__": "__main__"}})
            code = 0
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"probe {{lean}} failed"
"""


def _probes(*lean: str) -> list[dict[str, object]]:
    out = subprocess.run(
        [sys.executable, "-c", FORKS, *lean], capture_output=True, text=True, timeout=300
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith('{"loaded"')]
    assert len(lines) == len(lean), out.stdout[-3000:]  # one result a probe, in their order
    return [json.loads(line) for line in lines]


def test_lightning_imports_torchmetrics_without_its_optional_backends() -> None:
    lean, full = _probes("1", "0")  # "0", the switch: torchmetrics as it comes
    assert lean["loaded"] == dict.fromkeys(HEAVY, False)
    assert lean["acc"] == 0.75 and lean["resnet"] is True
    assert lean["tm_sees_transformers"] is False  # what torchmetrics was told: its BERTScore skipped it
    assert full["loaded"]["transformers"] and full["loaded"]["scipy.signal"]
    assert full["tm_sees_transformers"] is True
    assert full["acc"] == 0.75
    # rich (Flower's, the bench extra): Lightning's progress bar does not import it, and says so
    assert lean["lightning_sees_rich"] is False
    if full["rich_installed"]:
        assert full["loaded"]["rich"] and full["lightning_sees_rich"]


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


def test_cli_exit_does_not_wait_for_an_idle_evaluation_thread() -> None:
    """A run stopped by a signal on its way out left its evaluation pool's thread waiting for
    work; the exit joined it and the process hung for good after `terminated (SIGTERM)` (seen
    in the killed-sweep test: summary.json written, the process in a futex wait 8 min later)."""
    code = """
from concurrent.futures import ThreadPoolExecutor
from fl_lightning.cli.main import exit_now
pool = ThreadPoolExecutor(1, thread_name_prefix="fl-eval")
pool.submit(print, "evaluated", flush=True).result()
exit_now(143)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 143 and out.stdout.split() == ["evaluated"], out.stderr


# --- contained: only the tested versions, and it steps aside on any exception ----------------
def _fake(tmp_path: Path, name: str, body: str) -> None:
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "sub.py").write_text("")
    head = "import lightning_utilities.core.imports as lui\nfrom . import sub\n"
    (pkg / "__init__.py").write_text(head + body + "\n")


@pytest.fixture
def fresh_imports(tmp_path, monkeypatch):
    """A path for fake packages, `sys.meta_path` and `sys.modules` restored afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_a_package_imported_lean_sees_the_backends_hidden(fresh_imports) -> None:
    import lightning_utilities.core.imports as lui

    available = lui.package_available
    assert available("matplotlib")  # installed: what the fake must not see
    _fake(fresh_imports, "fakemetrics_seen", "SEES = lui.package_available('matplotlib')")
    lean_imports.install(target="fakemetrics_seen")
    assert importlib.import_module("fakemetrics_seen").SEES is False
    assert lui.package_available is available  # swapped back


def test_a_package_that_fails_with_the_backends_hidden_is_imported_as_it_comes(fresh_imports) -> None:
    """As a torchmetrics would whose use of the swapped names changed upstream."""
    import lightning_utilities.core.imports as lui

    available = lui.package_available
    _fake(fresh_imports, "fakemetrics_fails",
          "if not lui.package_available('matplotlib'):\n    raise AttributeError('renamed upstream')\n"
          "SEES = lui.package_available('matplotlib')")  # fmt: skip
    lean_imports.install(target="fakemetrics_fails")
    module = importlib.import_module("fakemetrics_fails")
    assert module.SEES is True and "fakemetrics_fails.sub" in sys.modules
    assert lui.package_available is available
    _fake(fresh_imports, "fakemetrics_own_error", "raise ValueError('its own bug')")
    lean_imports.install(target="fakemetrics_own_error")
    with pytest.raises(ValueError, match="its own bug"):  # not hidden behind ours
        importlib.import_module("fakemetrics_own_error")


def test_nothing_is_swapped_where_the_private_names_are_gone(monkeypatch) -> None:
    import lightning_utilities.core.imports as lui

    available = lui.package_available
    monkeypatch.delattr(lui, "_version")
    with lean_imports._hidden():
        assert lui.package_available is available


def test_only_the_tested_versions_are_changed(fresh_imports, monkeypatch) -> None:
    assert lean_imports.tested()  # this environment is the tested one (pyproject pins Lightning)
    monkeypatch.setitem(lean_imports.TESTED, "torchmetrics", "0.0.1")
    assert not lean_imports.tested()
    _fake(fresh_imports, "fakemetrics_untested", "SEES = lui.package_available('matplotlib')")
    lean_imports.install(target="fakemetrics_untested")
    assert not any(getattr(f, "target", "") == "fakemetrics_untested" for f in sys.meta_path)
    assert importlib.import_module("fakemetrics_untested").SEES is True
