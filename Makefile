# Thin wrappers around `resfl <command>`; all logic lives in the package. Variables: DATASET, ALGO, DEVICES, ARGS.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
RESFL := $(VENV)/bin/resfl
DATASET ?= synthetic
ALGO ?= resfl
DEVICES ?= cores
ARGS ?=
SEEDS ?= 3
SCENARIO ?= iid
JOBS ?=
METHODS ?=
SWEEP ?= conf/sweeps/resfl_lambda_beta.yaml
LOCK := requirements.lock
LOCK_VENV ?= .cache/lock-venv

.PHONY: install lock train test test-slow test-all lint bench checksums sweep sweep-local privacy report table clean

install: $(VENV)/.installed

# Exactly the committed lock (every package, transitive included), then the project itself without resolving again
$(VENV)/.installed: $(LOCK) pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

# Re-resolves pyproject.toml's ranges (torch and .[dev] included) into the lock; pins that still fit are kept, so
# `rm requirements.lock && make lock` takes the newest releases
lock:
	test -x $(LOCK_VENV)/bin/pip-compile || { $(PYTHON) -m venv $(LOCK_VENV) && \
	  $(LOCK_VENV)/bin/pip install --quiet "pip-tools==7.6.2"; }
	CUSTOM_COMPILE_COMMAND="make lock" $(LOCK_VENV)/bin/pip-compile --quiet --extra dev --strip-extras \
	  --allow-unsafe --no-emit-index-url --no-emit-find-links --output-file $(LOCK) pyproject.toml

train: install
	$(RESFL) train dataset=$(DATASET) algorithm=$(ALGO) fabric.devices=$(DEVICES) $(ARGS)

test: install
	$(PY) -m pytest -q

test-slow: install
	$(PY) -m pytest -q -m slow

test-all: install
	$(PY) -m pytest -q -m "slow or not slow"

lint: install
	$(PY) -m ruff check .

bench: install
	$(RESFL) bench $(ARGS)

# sha256 of three small pinned runs' final models (tiny RESFL, tiny FedAvg, Adult FedAvg): equal on two fresh installs
checksums: install
	$(PY) -m resfl_lightning.benchmarks.checksums $(ARGS)

privacy: install
	$(RESFL) privacy $(ARGS)

report: install
	$(RESFL) report $(ARGS)

table: install
	$(RESFL) table --dataset $(DATASET) --scenario $(SCENARIO) --seeds $(SEEDS) \
	  $(if $(METHODS),--methods $(METHODS)) $(if $(JOBS),--jobs $(JOBS)) $(ARGS)

sweep: install
	$(VENV)/bin/wandb sweep $(SWEEP)

sweep-local: install
	$(RESFL) train -m dataset=$(DATASET) algorithm=$(ALGO) \
	  algorithm.lambda_priv=0.0,0.1 algorithm.lambda_fair=0.0,0.01 algorithm.beta=0.0,2.0 $(ARGS)

clean:
	rm -rf runs outputs multirun wandb .cache
