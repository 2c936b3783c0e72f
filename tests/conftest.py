"""Shared test helpers: the repository root on sys.path and a way to run the entry points for real."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):  # the package, and shared helpers such as tests/model_test_helpers.py
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
