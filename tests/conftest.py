"""Shared fixtures: the real Fashion-MNIST files, one local Ray for the session, quiet W&B.

Nothing here fakes a part: runs use the real Lightning Trainer, a real local Ray on
loopback, real W&B offline files and the real dataset (small subsets for speed).
"""

from __future__ import annotations

import gc
import os
import re
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The collection's imports (torch, Lightning, every test module: ~12 CPU-s a worker) with the
# cyclic collector paused, their objects frozen once they are done (`pytest_collection_finish`),
# as a client worker's (`fl_lightning/heavy_imports.py`): a quarter of the imports' CPU, and the
# suite's full collections no longer scan them.
gc.disable()

from fl_lightning.lean_imports import install  # noqa: E402  (as the CLI and the workers do)

install()
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    import torch

    torch.set_num_threads(1)  # one thread per pytest worker: two workers on 2 cores, not 4 threads
    # and one per client of every run the tests start (CLI children, Ray workers): a client's
    # default is its CPU share, two threads that spin against the other workers' (a Ray test's
    # CPU measured 83 -> 56 s with one); a test of the default sets it or unsets this
    os.environ.setdefault("FL_LIGHTNING_THREADS_PER_CLIENT", "1")
os.environ.setdefault("WANDB_MODE", "offline")  # tests never reach W&B's servers
os.environ.setdefault("WANDB_SILENT", "true")

from fl_lightning.config import compose  # noqa: E402
from fl_lightning.data.fetch import fetch_fmnist, fmnist_present  # noqa: E402

# Small but real: the first 2,000 training and 500 test images of Fashion-MNIST.
SMALL = [
    "data=fmnist",
    "data.train_subset=2000",
    "data.test_subset=500",
    "fl.num_clients=4",
    "fl.rounds=2",
    "fl.batch_size=32",
    "logger=none",
]


@pytest.fixture(scope="session")
def data_root() -> str:
    root = str(Path(compose([]).data.root).expanduser())  # `~/...` without FL_LIGHTNING_DATA (make sets it)
    if not fmnist_present(root):
        fetch_fmnist(root)  # idempotent: the README commands normally did this already
    return root


@pytest.fixture(autouse=True)
def no_shared_wandb_service():
    """A subprocess a test starts is a user's other shell: W&B puts `$WANDB_SERVICE` in this
    process's environment once a test logs in-process, and a child would join that service
    (a killed child's run then stays open in it, and its resume is refused)."""
    os.environ.pop("WANDB_SERVICE", None)
    yield
    os.environ.pop("WANDB_SERVICE", None)


#: the connection of the Ray `ray_session` started (absent: none, or one that was up already)
_SHARED_RAY: dict[str, Any] = {}


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """One private local Ray (2 CPUs, loopback) shared by a pytest worker's tests that need
    it; runs started inside reuse it instead of paying ~3 s for their own."""
    import ray

    _start_shared_ray()
    yield ray
    _drop_ray_workers()
    if "conn" in _SHARED_RAY:
        _SHARED_RAY.pop("conn").shutdown()


def _start_shared_ray() -> None:
    """Start the shared Ray, unless one was up already (then left as it is). Its workers'
    output stays in Ray's session logs: forwarded to this process, a line of a worker that an
    earlier test left (a `setup` worker aborting at exit with "Mutex corrupt", in CI under
    load) came whenever it came, into the captured stderr of whichever test ran then (a
    one-line check of a command that starts no Ray failed on it). What a test checks of a
    run's workers comes back through results, metrics and files, never their stderr. It waits
    through most of the suite: no idle workers kept ready (`idle_workers=False`)."""
    from fl_lightning.runtime.local_ray import init_ray

    conn = init_ray(None, num_cpus=2, log_to_driver=False, idle_workers=False)
    if conn is not None:
        _SHARED_RAY["conn"] = conn


def _replace_shared_ray() -> None:
    _drop_ray_workers()
    _SHARED_RAY.pop("conn").shutdown()
    _start_shared_ray()


#: `ray_workers`' session: the warm client workers one test's Ray runs leave for the next's
_RAY_WORKERS: dict[str, Any] = {}


def _drop_ray_workers() -> None:
    """End the warm workers `ray_workers` kept (the shared Ray stays up)."""
    session = _RAY_WORKERS.pop("session", None)
    if session is not None:
        session.close()


@pytest.fixture
def ray_workers(ray_session: Any) -> Any:
    """A session for a test's Ray runs on the shared Ray whose client workers stay warm for the
    next test's (`Session(reuse_actors=True)`, as a sequential sweep's runs: each run sets its
    workers up anew, and the golden, serial == Ray and resume tests that run on them pass
    unchanged). A client worker imports torch and Lightning, ~3.3 CPU-s each: tests that share
    them run one after another (`pytest_collection_modifyitems`), and any other test finds them
    ended (`pytest_runtest_setup`), so that the Ray's CPUs they hold are free. Every Ray run of a
    test that asks for it passes `session=` this (a run in a `Session` of its own would wait for
    the CPUs these hold)."""
    from fl_lightning.runtime.session import Session

    if "session" not in _RAY_WORKERS:
        _RAY_WORKERS["session"] = Session(keep_ray=True, reuse_actors=True)
    return _RAY_WORKERS["session"]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Warm workers held between tests hold CPUs of the shared Ray: a test that does not ask for
    them (one that starts its own workers, counts free CPUs, or kills a worker) finds them
    ended, before any of its fixtures (a module's, too) is set up."""
    if "ray_workers" not in getattr(item, "fixturenames", ()):
        _drop_ray_workers()


def cpus_free(wait_s: float) -> bool:
    """Whether every CPU of the connected Ray is free within `wait_s` seconds."""
    import ray

    deadline = time.monotonic() + wait_s
    while ray.available_resources().get("CPU") != ray.cluster_resources().get("CPU"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture(autouse=True)
def _fresh_ray_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked `fresh_ray` needs every CPU of the shared Ray free and may disturb it:
    a shared Ray with a CPU held at its start is replaced first (with a warning naming the
    test), and it is replaced after it. Under load (9-11 on 2 cores) a per-client run waited
    10 min for a second worker with Ray's 2 CPUs taken (its first worker and one held by
    something an earlier test on that Ray left, not found yet), failing tests that had
    nothing to do with it; each such test checks its own clean-up."""
    marked = request.node.get_closest_marker("fresh_ray") is not None
    if marked and "conn" in _SHARED_RAY and not cpus_free(wait_s=20):
        warnings.warn(f"{request.node.nodeid}: a CPU of the shared Ray was held at its start; Ray replaced",
                      stacklevel=1)  # fmt: skip
        _replace_shared_ray()
    yield
    if marked and "conn" in _SHARED_RAY:
        _replace_shared_ray()


#: a line of Ray's own processes (GCS, raylet, ...), which Ray forwards to its driver whenever it
#: comes: an in-process test's captured stderr caught one that an earlier test caused
#: ("(pid=gcs_server) ... Failed to kill actor": a worker that test killed). The shared Ray
#: forwards nothing now (`_start_shared_ray`); kept for a Ray that was up before the suite.
#: Never a line of the command under test; a worker's own lines (`(pid=1234)`) are kept.
_RAY_SYSTEM_LINE = re.compile(
    r"^(\x1b\[\d+m)?\((pid=)?(gcs_server|raylet|autoscaler|monitor|log_monitor|dashboard\w*)\)"
)


def stderr_lines(err: str) -> list[str]:
    """The non-blank lines of a captured stderr, without Ray's own processes' lines."""
    return [ln for ln in err.splitlines() if ln.strip() and not _RAY_SYSTEM_LINE.match(ln)]


def once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `name`, filled by `build` once for the whole suite: `make test`'s workers
    share one (the first builds it under a file lock, the others wait for it), where a
    module-scoped fixture would be built again by every worker that runs one of its tests
    (the 200-client runs: ~75 s each time). For what its tests only read."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the workers' common folder
    folder, done = base / name, base / f"{name}.done"
    with FileLock(str(base / f"{name}.lock")):
        if not done.exists():
            folder.mkdir(exist_ok=True)
            build(folder)
            done.touch()
    return folder


#: fixtures that make a test more than a unit test: the data set, a Ray, files on disk
_NOT_UNIT = {"data_root", "ray_session", "tmp_path", "tmp_path_factory"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order tests run in (every one still runs): first the unit lane (no data set, no
    Ray, no files: a broken function shows in the first minute), then the long tests marked
    `slow`, then the tests that share warm Ray workers (`ray_workers`), then the rest. `make
    test`'s workers (`--dist worksteal`) start on contiguous thirds of this order (most long
    tests fall in the first worker's, after its unit tests) and an idle one takes half of
    another's queue from its end, long tests included. Dealing the long tests over the workers
    (`--dist load`, or thirds each starting on its share) measured slower in fresh clones
    (Makefile)."""

    def lane(item: pytest.Item) -> int:
        names = set(getattr(item, "fixturenames", ()))
        if "ray_workers" in names:
            return 2  # one after another: each takes the warm workers the one before left
        if item.get_closest_marker("slow") is not None:
            return 1
        return 3 if _NOT_UNIT & names else 0

    items.sort(key=lane)  # stable: the collection order within each lane


#: FedAvg's CNN at a quarter of its width where a test runs it (`small`): ~13x fewer
#: multiply-adds a step (conv 8/16, hidden 64 instead of 32/64, 512), the same layers and code.
#: What the tests here check is the engine's, not the default model's capacity; the defaults
#: grid (test_defaults_grid.py) and the README example train the default width.
NARROW = ["model.channels=[8,16]", "model.hidden=64"]
#: its default width, for a test that needs a checkpoint of its size or a run that learns fast
WIDE = ["model.channels=[32,64]", "model.hidden=512"]


def small(tmp_path: Path, *extra: str) -> list[str]:
    """`SMALL` in `tmp_path`, then `extra`; on FedAvg's CNN (the default model) at `NARROW`
    width unless `extra` sets it or names a weights file (of the default width)."""
    base = [*SMALL, f"output_dir={tmp_path}"]
    try:
        cnn = compose([*base, *extra]).model["name"] == "cnn"
        cnn = cnn and not any(a.startswith("model.weights=") for a in extra)  # a trunk file's width
    except Exception:  # noqa: BLE001  (a test's deliberately bad arguments: as given)
        cnn = False
    return [*base, *(NARROW if cnn else []), *extra]


def pytest_collection_finish(session: pytest.Session) -> None:
    """The collection's imports done: frozen, and the collector back on (see the top)."""
    gc.freeze()
    gc.enable()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs: list[Any]) -> None:
    """xdist's controller collects nothing: its collector back on before its workers start."""
    gc.enable()
