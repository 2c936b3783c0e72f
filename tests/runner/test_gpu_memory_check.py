"""Pre-flight's memory check on a GPU (issue 39): each learner and policy worker costs the host a CUDA context, and the
device must hold at least their contexts, models and batches; a layout that cannot fit is refused in one line before
anything starts. No GPU here: the device's memory is faked (device_memory; torch.cuda for train.py)."""
import os
import subprocess
import sys

import psutil
import pytest

import sf.runner.startup.preflight as preflight
import sf.runner.runner as runner_module
from e2e_helpers import ROOT
from sf.cfg import ConfigError, parse_cfg

GiB = 2**30
H100 = (79 * GiB, 80 * GiB)  # what an 80 GB H100 reports free and in all (MiB, not MB), before any process of the run
TINY = ["--rollout", "8", "--recurrence", "8", "--batch_size", "64", "--rnn_size", "16", "--hidden_size", "16",
        "--encoder_mlp_layers", "16", "--use_rnn", "False", "--num_workers", "2", "--num_envs_per_worker", "2"]
POPULATION = ["--num_policies", "64", "--policy_workers_per_policy", "4"]  # 64 learners + 256 policy workers on CUDA


def _cfg(tmp_path, *args, device="cuda"):
    cfg = parse_cfg(["--env", "test_race", "--experiment", "gpu_memory", "--train_dir", str(tmp_path), *TINY,
                     "--device", "cpu", *args])
    return cfg.replace(device=device)  # (parsing refuses --device cuda where no GPU is: the check below is tested)


@pytest.fixture
def gpu(monkeypatch):
    """The device's (free, total) bytes as the runner reads them; records the devices asked about."""
    asked = []

    def device_memory(device):
        asked.append(str(device))
        return H100
    monkeypatch.setattr(preflight, "device_memory", device_memory, raising=False)  # (before issue 39: none)
    monkeypatch.setattr(runner_module, "bind_device", lambda device: None, raising=False)  # (the runner binds its GPU)
    return asked


def _host(monkeypatch, available: int) -> None:
    real = psutil.virtual_memory()
    monkeypatch.setattr(preflight.psutil, "virtual_memory", lambda: real._replace(available=available))


def test_a_layout_that_fits_the_gpu_passes(tmp_path, monkeypatch, gpu):
    _host(monkeypatch, 64 * GiB)
    runner_module.Runner(_cfg(tmp_path, "--num_policies", "2", "--policy_workers_per_policy", "2"))
    assert gpu == ["cuda"]


def test_a_population_beyond_the_gpu_is_refused_in_one_line(tmp_path, monkeypatch, gpu):
    """64 policies x 4 policy workers: 320 CUDA contexts alone exceed an 80 GB GPU."""
    _host(monkeypatch, 2**40)  # (the host fits: the GPU's line is asked for)
    with pytest.raises(ConfigError) as refused:
        runner_module.Runner(_cfg(tmp_path, *POPULATION))
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith("--device cuda: this layout needs at least 8"), line  # 80 GiB of contexts, and more
    assert "(320 CUDA processes x context 80.0 GiB, 64 learners " in line, line
    assert "but GPU 0 has 79.0 GiB free (of 80.0 GiB); lower --num_policies, --policy_workers_per_policy or " \
           "--batch_size" in line, line


def test_serial_mode_creates_one_context_only(tmp_path, monkeypatch, gpu):
    """--serial_mode runs every learner and policy worker in the runner, whose context the free memory excludes."""
    _host(monkeypatch, 2**40)
    runner_module.Runner(_cfg(tmp_path, *POPULATION, "--serial_mode", "True"))
    assert gpu == ["cuda"]


def test_host_memory_counts_each_cuda_process_context(tmp_path, monkeypatch, gpu):
    """2 rollout workers, 2 learners and 4 policy workers fit 1.5 GiB on the CPU (80 MiB each); with CUDA the learners
    and policy workers take 256 MiB of host memory each, more than the host has."""
    _host(monkeypatch, 3 * GiB // 2)
    layout = ["--num_policies", "2", "--policy_workers_per_policy", "2"]
    runner_module.Runner(_cfg(tmp_path, *layout, device="cpu"))
    with pytest.raises(ConfigError, match=r"^this configuration needs about 1\.\d GiB of memory \(.*8 processes \(6 "
                                          r"with CUDA\) 1\.7 GiB\) but 1\.5 GiB is available; lower "):
        runner_module.Runner(_cfg(tmp_path, *layout))


def test_cpu_runs_are_checked_as_before(tmp_path, monkeypatch, gpu):
    """No GPU is asked about; the layout refused on a GPU runs on the CPU; the host's estimate is the CPU one."""
    _host(monkeypatch, 2**40)
    runner_module.Runner(_cfg(tmp_path, *POPULATION, device="cpu"))
    _host(monkeypatch, GiB // 2)
    with pytest.raises(ConfigError, match=r"8 processes 0\.7 GiB, model copies 0\.0 GiB\) but 0\.5 GiB is available"):
        runner_module.Runner(_cfg(tmp_path, "--num_policies", "2", "--policy_workers_per_policy", "2", device="cpu"))
    assert gpu == []


# train.py with torch's CUDA faked: a GPU is available, it has 79 of 80 GiB free; the host has 1 TiB available
FAKE_GPU = """
import runpy, sys
import psutil, torch
host = psutil.virtual_memory()
psutil.virtual_memory = lambda: host._replace(available=2**40)
torch.cuda.is_available = lambda: True
torch.cuda.mem_get_info = lambda device=None: (79 * 2**30, 80 * 2**30)
torch.cuda.set_device = lambda device: None
sys.argv[0] = "train.py"
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.e2e
def test_train_py_refuses_the_population_in_one_line_before_anything_starts(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "LOCAL_RANK")}
    args = ["--env", "test_race", "--experiment", "gpu_memory", "--train_dir", str(tmp_path), *TINY, *POPULATION,
            "--device", "cuda"]
    done = subprocess.run([sys.executable, "-c", FAKE_GPU, *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=dict(env, PYTHONUNBUFFERED="1"))
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda: this layout needs at least" in lines[0], output
    assert "320 CUDA processes x context" in lines[0] and "but GPU 0 has 79.0 GiB free" in lines[0], output
    assert not (tmp_path / "gpu_memory").exists()  # nothing was written
