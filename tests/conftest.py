"""What every test gets: the repository root and tests/ on sys.path, a way to run the entry points for real (fixture
`entry`) and one torch thread.

tests/ mirrors sf/ (tests/sampling, tests/learning, tests/runner, ...). Helpers shared across its folders are modules
beside this file, imported by name: e2e_helpers (running train.py and torchrun, the repository root, free ports),
sampling_helpers (the sampling stage stepped in this process), model_test_helpers (small cfgs, spaces, batches).
Tests that start processes carry the marker e2e: `pytest -m "not e2e"` (make test-fast) is the fast loop.

`make test` runs the suite in parallel (pytest-xdist, `-n 4`: much of an e2e test's time is spent waiting on its
processes, so four at once on 2 cores take about half the time), then the tests marked serial alone (they check or
clean state of the whole machine, /dev/shm's VizDoom files, which tests running beside them would disturb, or hold
stages to a quiet machine's time limits). A test run beside others must only count what is its own (e2e_helpers'
shm_left_behind, engine_files: by instance id, tagged processes)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):  # the package, and the shared helper modules beside this file
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def run_entry(script: str, *args, timeout: float = 120, env=None, cwd=None) -> subprocess.CompletedProcess:
    """Run `python <script> args...` from the repository root; returns the completed process."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run([sys.executable, str(ROOT / script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd or ROOT)


@pytest.fixture(scope="session")
def entry():
    return run_entry


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """In-process tests use tiny models: one torch thread is faster and robust to a busy shared machine."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
