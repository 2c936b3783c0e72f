"""Build cpp/ipc/test_cqueue.cpp (the C core's own unit tests, no Python) with -Werror and run it."""
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CPP = ROOT / "cpp" / "ipc"


@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cpp_core_unit_tests(tmp_path):
    exe = tmp_path / "test_cqueue"
    build = subprocess.run(
        ["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{CPP}",
         str(CPP / "test_cqueue.cpp"), str(CPP / "cqueue.cpp"), "-lpthread", "-o", str(exe)],
        capture_output=True, text=True, timeout=150)
    assert build.returncode == 0, f"compile failed:\n{build.stderr}"
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    print(run.stdout)
    assert run.returncode == 0 and "ALL PASSED" in run.stdout, run.stdout + run.stderr
