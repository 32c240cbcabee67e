# Two commands do everything (see README): `make demo` and `make test`. Each creates or
# refreshes the virtual environment and fetches the embedded data, idempotently.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
FLL    := $(VENV)/bin/fl-lightning
# Where datasets live (Fashion-MNIST lands in $(FL_LIGHTNING_DATA)/fashion-mnist).
export FL_LIGHTNING_DATA ?= $(HOME)/.cache/fl_lightning/data

.PHONY: venv data demo test bench clean

# Reinstalled whenever pyproject.toml changes. torch/torchvision come from local disk here.
$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

venv: $(VENV)/.installed

data: venv
	@$(FLL) fetch fmnist >/dev/null

demo: data
	$(FLL) sweep +experiment=demo method=fedavg,fedglcl

test: data
	$(PY) -m pytest -q --durations=15

bench: data
	$(PY) benchmarks/engine_overhead.py --out benchmarks/results/engine_overhead.json

clean:
	rm -rf $(VENV) runs .pytest_cache
