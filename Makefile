# Quick start: `make train` (set up + short training run) and `make test` (set up + test suite).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# A budget in env frames: the same amount of experience on any machine (the final log line says how long it took);
# override it: make train TRAIN_ARGS="--env doom_basic --experiment quickstart --train_for_seconds 300"
TRAIN_ARGS ?= --env doom_basic --experiment quickstart --train_for_env_steps 400000

.PHONY: setup train test test-fast test-slow test-gpu bench clean

setup: $(STAMP)

# torch is pinned first when absent: an unpinned torch would pull a multi-GB CUDA build on CPU machines.
$(STAMP): setup.py pyproject.toml $(wildcard cpp/ipc/*.cpp cpp/ipc/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[doom,atari,dev]"
	$(PY) setup.py -q build_ext --inplace
	$(PY) -m sf_envs.doom.fetch_scenarios || echo "warning: Doom scenario data (battle, duel, deathmatch) not fetched; see README"
	touch $(STAMP)

train: setup
	$(PY) train.py $(TRAIN_ARGS)

test: setup
	$(PY) -m pytest -q

# the fast loop: no test that starts processes (marker e2e)
test-fast: setup
	$(PY) -m pytest -q -m "not e2e and not slow"

test-slow: setup
	$(PY) -m pytest -q -m slow

# the CUDA paths (data-parallel NCCL learners, hts bit-identity, shared weights, a short training run): skipped, with
# the reason, where torch sees no GPU
test-gpu: setup
	$(PY) -m pytest -q -m gpu tests/gpu

clean:
	rm -rf build *.egg-info sf/ipc/_cqueue*.so
