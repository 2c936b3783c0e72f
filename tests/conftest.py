"""Shared test helpers: the repository root on sys.path and a way to run the entry points for real."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def run_entry(script: str, *args, timeout: float = 120, env=None, cwd=None) -> subprocess.CompletedProcess:
    """Run `python <script> args...` from the repository root; returns the completed process."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run([sys.executable, str(ROOT / script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd or ROOT)


@pytest.fixture(scope="session")
def entry():
    return run_entry
