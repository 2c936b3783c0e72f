"""benchmarks/env_throughput.py runs and prints its table (a short smoke run on a built-in env)."""
import pytest

pytestmark = pytest.mark.e2e


def test_env_throughput_smoke(entry):
    res = entry("benchmarks/env_throughput.py", "--env", "test_corridor", "--num_workers", "2", "--duration", "0.5",
                "--warmup", "0.2", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "machine:" in out and "command:" in out and "env frames/s" in out
    rows = [line for line in out.splitlines() if line.startswith("test_corridor")]
    assert len(rows) == 2  # 1 process, then 2
    assert all(float(r.split("|")[4].replace(",", "")) > 100 for r in rows)


def test_env_throughput_unknown_env(entry):
    res = entry("benchmarks/env_throughput.py", "--env", "doom_basc", "--duration", "0.1", timeout=60)
    assert res.returncode == 2 and "doom_basic" in res.stderr and len(res.stderr.strip().splitlines()) == 1
