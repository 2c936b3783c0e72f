# Quick start: `make train` (set up + short training run) and `make test` (set up + test suite).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SF_VENV  := .venv-sf
SF_PY    := $(SF_VENV)/bin/python
SF_STAMP := $(SF_VENV)/.installed
# A budget in env frames: the same amount of experience on any machine (the final log line says how long it took);
# override it: make train TRAIN_ARGS="--env doom_basic --experiment quickstart --train_for_seconds 300"
TRAIN_ARGS ?= --env doom_basic --experiment quickstart --train_for_env_steps 400000

.PHONY: setup setup-sf setup-slurm train test test-fast test-slow test-gpu lint gpu-bundle gpu-rehearsal bench clean

# what training needs: the venv, the package with its envs, the C++ queue, Doom's scenario data (no Slurm, no
# Sample Factory: those are the tests' and the sweeps' set-up, `make setup-slurm` / `make setup-sf`)
setup: $(STAMP)

# Slurm and munge (Debian's slurm-wlm, munge): the sweep launcher's Slurm backend, and the single-node cluster that
# tests/launch/test_slurm.py starts for itself. Installed as root with apt-get; elsewhere, or if that fails, a warning
# (those tests skip, saying why) and the rest of the set-up stands.
setup-slurm:
	@PATH="$$PATH:/usr/sbin:/sbin"; command -v sbatch >/dev/null && command -v slurmctld >/dev/null && \
	  command -v slurmd >/dev/null && command -v munged >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null; } || \
	  echo "warning: Slurm not installed (as root: apt-get install slurm-wlm munge); tests/launch/test_slurm.py skips"

# Sample Factory 2.1.1 in a venv of its own: the reference that tests/test_import_sf.py checks imported experiments
# against (not a dependency of the package; those tests skip, saying why, without it). A failure (offline, say) is a
# warning and leaves no half-made venv; the rest of the set-up stands. MuJoCo 2: gymnasium 0.29's v4 models (Swimmer's
# `collision` attribute) do not load in MuJoCo 3, so its trainer could not run mujoco_swimmer for the learning suite.
setup-sf: $(SF_STAMP)

$(SF_STAMP):
	@new=; test -x $(SF_PY) || { $(PYTHON) -m venv $(SF_VENV) && new=1; }; \
	if { $(SF_PY) -c "import torch" 2>/dev/null || $(SF_PY) -m pip install -q torch==2.13.0; } && \
	   $(SF_PY) -m pip install -q sample-factory==2.1.1 "numpy<2" "gymnasium<1.0" vizdoom ale-py "mujoco<3" imageio; then touch $@; \
	else [ -z "$$new" ] || rm -rf $(SF_VENV); \
	  echo "warning: $(SF_VENV) (Sample Factory 2.1.1, tests/test_import_sf.py's reference) not set up; they skip"; fi

# torch is pinned first when absent: an unpinned torch would pull a multi-GB CUDA build on CPU machines.
$(STAMP): setup.py pyproject.toml $(wildcard cpp/ipc/*.cpp cpp/ipc/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[doom,atari,dev,envpool,export,mujoco,pettingzoo]"
	@# MuJoCo videos (enjoy.py --save_video) render headless through EGL: Mesa's software renderer needs no GPU
	@{ ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -qE 'libEGL_(mesa|nvidia)|libOSMesa' || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libegl1 libegl-mesa0 \
	    libgl1-mesa-dri >/dev/null; } || \
	  echo "warning: no EGL or OSMesa library and none installed (as root: apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri); MuJoCo videos (enjoy.py --save_video) need one"
	$(PY) setup.py -q build_ext --inplace
	$(PY) -m sf_envs.doom.fetch_scenarios || echo "warning: Doom scenario data (battle, duel, deathmatch) not fetched; see README"
	touch $(STAMP)

train: setup
	$(PY) train.py $(TRAIN_ARGS)

# 4 tests at once, the longest first (pytest-xdist; tests/conftest.py says why), then those that must run alone;
# TEST_JOBS=0: one at a time
TEST_JOBS ?= 4
# the files with tests marked serial, so that the second pass collects only them (tests/test_package.py checks the list)
SERIAL_TESTS = tests/envs/test_env_doom.py tests/test_gpu_check_script.py
test: setup setup-sf setup-slurm
	$(PY) -m pytest -q -n $(TEST_JOBS) --maxschedchunk 2 -m "not slow and not serial"
	$(PY) -m pytest -q -m "serial and not slow" $(SERIAL_TESTS)

# the fast loop: no test that starts processes (marker e2e)
test-fast: setup
	$(PY) -m pytest -q -m "not e2e and not slow"

# the linter and the type checker alone (make test runs them too: tests/test_lint.py; settings in pyproject.toml)
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test-slow: setup
	$(PY) -m pytest -q -m slow

# the CUDA paths (data-parallel NCCL learners, hts bit-identity, shared weights, a short training run): skipped, with
# the reason, where torch sees no GPU
test-gpu: setup
	$(PY) -m pytest -q -m gpu tests/gpu

# what a bare GPU machine lacks, for benchmarks/gpu_check.sh there (docs/benchmarks.md, "On a GPU"): .gpu_bundle/
gpu-bundle:  # no set-up first: the script says what it lacks (make setup), in one line
	bash benchmarks/gpu_bundle.sh

# The GPU check rehearsed here with the GPU machine's versions (docs/benchmarks.md, "On a GPU": Python 3.12, torch
# 2.11.0; PyPI's build of it, the device's own CUDA 13 build, which runs on the CPU too: download.pytorch.org's CPU
# builds are not reachable from here), installed as the device call installs: the "image" (torch, numpy 2.3, pytest,
# tensorboard, opencv, onnx, onnxruntime) from wheels downloaded once into $(REHEARSAL)/image, then with
# --no-index; the bundle made by gpu_bundle.sh for that Python; a bare copy of the tree (no data/, no built queue)
# where gpu_check.sh --device cpu installs the bundle and runs every stage, the any-device tests of tests/gpu included.
REHEARSAL        ?= .gpu-rehearsal
REHEARSAL_PYTHON ?= $(firstword $(wildcard /root/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12) python3.12)
REHEARSAL_VENV   := .venv-gpu-rehearsal
REHEARSAL_IMAGE  := "torch==2.11.0" "numpy>=2.3,<2.4" pytest tensorboard opencv-python-headless onnx onnxruntime
gpu-rehearsal: setup
	@$(REHEARSAL_PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null || \
	  { echo "gpu-rehearsal: error: no CPython 3.12 ($(REHEARSAL_PYTHON)); set REHEARSAL_PYTHON"; exit 2; }
	test -f $(REHEARSAL)/image/.complete || { $(REHEARSAL_PYTHON) -m pip download -q --only-binary=:all: \
	  -d $(REHEARSAL)/image $(REHEARSAL_IMAGE) && touch $(REHEARSAL)/image/.complete; }
	test -x $(REHEARSAL_VENV)/bin/python || { $(REHEARSAL_PYTHON) -m venv $(REHEARSAL_VENV) && \
	  $(REHEARSAL_VENV)/bin/python -m pip install -q --no-index --find-links $(REHEARSAL)/image $(REHEARSAL_IMAGE) \
	  || { rm -rf $(REHEARSAL_VENV); exit 1; }; }
	SF_BUNDLE_BUILD_PYTHON=$(REHEARSAL_PYTHON) bash benchmarks/gpu_bundle.sh $(REHEARSAL)/bundle
	rm -rf $(REHEARSAL)/tree && mkdir -p $(REHEARSAL)/tree && git ls-files -co --exclude-standard -z | \
	  grep -zv '^$(REHEARSAL)/' | xargs -0 cp --parents -t $(REHEARSAL)/tree
	cd $(REHEARSAL)/tree && SF_CHECK_PYTHON=$(CURDIR)/$(REHEARSAL_VENV)/bin/python SF_GPU_BUNDLE=$(CURDIR)/$(REHEARSAL)/bundle \
	  bash benchmarks/gpu_check.sh $(CURDIR)/$(REHEARSAL)/check --device cpu $(REHEARSAL_ARGS)

clean:
	rm -rf build *.egg-info sf/ipc/_cqueue*.so
