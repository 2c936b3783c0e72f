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
shm_left_behind, engine_files: by instance id, tagged processes). Each of the four processes has module fixtures of its
own: one that trains an experiment is made once for the session and copied (e2e_helpers.made_once).

In the parallel pass the longest tests start first (their seconds in tests/durations.json), then the other tests that
start processes, then the rest, and `--maxschedchunk 2` hands them out two at a time: a long test started last would
otherwise end the pass alone while the other processes idle. `SF_TEST_DURATIONS=tests/durations.json make test`
rewrites the file (the tests of 5 s or more, as measured in that run); a test missing from it is only scheduled
later."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):  # the package, and the shared helper modules beside this file
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

DURATIONS = Path(__file__).with_name("durations.json")
LONG_TEST_SECONDS = 5.0


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (each worker collects, in the same order): the longest first, then the e2e tests, then the
    rest; otherwise pytest's own order (module fixtures set up once each)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    items.sort(key=lambda item: (-seconds.get(item.nodeid, 0.0), item.get_closest_marker("e2e") is None))


_durations: dict = {}


def pytest_runtest_logreport(report):
    """With SF_TEST_DURATIONS=PATH: each test's seconds, set-up and tear-down included (in the controller under
    pytest-xdist: the workers' reports reach it)."""
    if os.environ.get("SF_TEST_DURATIONS") and not os.environ.get("PYTEST_XDIST_WORKER"):
        _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    path = os.environ.get("SF_TEST_DURATIONS")
    if path and not os.environ.get("PYTEST_XDIST_WORKER") and _durations:
        old = json.loads(Path(path).read_text()) if Path(path).exists() else {}
        old.update({k: round(v, 1) for k, v in _durations.items()})  # the serial pass adds to the parallel one's
        long = {k: v for k, v in sorted(old.items(), key=lambda kv: -kv[1]) if v >= LONG_TEST_SECONDS}
        Path(path).write_text(json.dumps(long, indent=1) + "\n")


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
