"""Start-up and stop of the real multi-process system: whatever dies when, nothing hangs and nothing is left behind.

Processes of a run are found by a tag in their environment (every descendant inherits it: workers, the fork server,
VizDoom engines), not by parent links, which a death rewires."""
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--rollout", "8", "--recurrence", "8", "--batch_size", "64", "--rnn_size", "32", "--hidden_size", "32",
         "--encoder_mlp_layers", "32", "--report_interval_sec", "1", "--device", "cpu"]


def start(args, log_path: Path, tag: str, new_session: bool = False) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", SF_TEST_RUN_TAG=tag)
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], stdout=open(log_path, "w"),
                            stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=new_session)


def tagged(tag: str) -> list[int]:
    """Live processes (zombies excluded) whose environment carries the tag."""
    needle = f"SF_TEST_RUN_TAG={tag}".encode()
    found = []
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read() and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    found.append(pid)
        except (OSError, psutil.Error):
            pass
    return found


def wait_until(pred, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def doom_shm() -> set:
    return {n for n in os.listdir("/dev/shm") if n.startswith("ViZDoom")}


@pytest.mark.doom
def test_runner_killed_at_random_moments_of_start_up_leaves_nothing(tmp_path):
    """SIGKILL of train.py at 20 random moments of its first seconds (env probe, fork server, learner, policy worker,
    rollout workers making their VizDoom engines, first frames): within seconds no process of the run is alive and no
    engine shared memory is left."""
    pytest.importorskip("vizdoom")
    rng = random.Random(1234)
    shm_before = doom_shm()
    args = ["--env", "doom_basic", "--train_dir", str(tmp_path), "--num_workers", "2", "--num_envs_per_worker", "2",
            "--hidden_size", "32", "--device", "cpu", "--train_for_seconds", "300"]
    survivors = []
    for trial in range(20):
        tag = uuid.uuid4().hex
        p = start(args + ["--experiment", f"k{trial}"], tmp_path / f"log{trial}.txt", tag)
        delay = rng.uniform(0.0, 7.0)
        time.sleep(delay)
        p.kill()
        p.wait()
        if not wait_until(lambda: not tagged(tag), 10.0):
            survivors.append((trial, round(delay, 2), [psutil.Process(x).name() for x in tagged(tag)]))
            for pid in tagged(tag):
                os.kill(pid, signal.SIGKILL)
    assert not survivors, f"processes outlived the runner by 10 s: {survivors}"
    assert wait_until(lambda: doom_shm() <= shm_before, 5.0), sorted(doom_shm() - shm_before)


def _break_optimizer_state(ckpt: Path) -> None:
    state = torch.load(ckpt, weights_only=True)
    group = state["optimizer"]["param_groups"][0]
    group["params"] = group["params"][:-1]  # the optimizer of this model has one more parameter tensor
    torch.save(state, ckpt)


@pytest.mark.parametrize("serial", [False, True])
def test_learner_failing_at_start_up_ends_the_run_in_one_line(tmp_path, serial):
    """The learner raises before it publishes its first weights (here: a checkpoint whose optimizer state does not fit;
    a bad hyperparameter or out-of-memory would do the same): exit 1 within seconds, the error in one console line,
    its traceback in the log file, no process left."""
    args = ["--env", "test_corridor", "--experiment", "e", "--train_dir", str(tmp_path), "--num_workers", "2",
            "--num_envs_per_worker", "4", *SMALL]
    first = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "--train_for_env_steps", "2000"],
                           capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert first.returncode == 0, first.stdout[-2000:]
    _break_optimizer_state(max((tmp_path / "e" / "checkpoint_p0").glob("checkpoint_*.pth")))
    tag = uuid.uuid4().hex
    log = tmp_path / "console.txt"
    t0 = time.time()
    p = start([*args, "--train_for_env_steps", "100000", "--serial_mode", str(serial)], log, tag)
    try:
        rc = p.wait(timeout=60)
    finally:
        p.kill()
    console = log.read_text()
    assert rc == 1, console[-3000:]
    assert time.time() - t0 < 30
    crash = [line for line in console.splitlines() if "crashed:" in line]
    assert len(crash) == 1 and "optimizer state that does not fit" in crash[0], console[-3000:]
    assert "Traceback" not in console
    assert "Traceback" in (tmp_path / "e" / "sf_log.txt").read_text()
    assert wait_until(lambda: not tagged(tag), 10.0)


def test_serial_mode_runs_layouts_with_more_envs_than_two_batches(tmp_path):
    """8 workers x 8 envs: every env finishes its trajectory in the same pass, more slots than the free list holds; the
    rollout workers waiting for a slot run the learner, which frees them (this hung before)."""
    res = subprocess.run([sys.executable, str(ROOT / "train.py"), "--env", "test_corridor", "--serial_mode", "True",
                          "--num_workers", "8", "--num_envs_per_worker", "8", "--train_for_env_steps", "30000",
                          "--experiment", "s", "--train_dir", str(tmp_path), "--device", "cpu"],
                         capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    frames = [int(n) for n in re.findall(r"Total num frames: (\d+)", res.stdout)]
    assert max(frames) >= 30000


@pytest.mark.parametrize("sig,serial", [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["ctrl_c", "ctrl_c_serial", "sigterm"])
def test_signal_to_the_process_group(tmp_path, sig, serial):
    """Ctrl-C in a terminal signals the whole foreground process group, and so do `timeout` and batch systems with
    SIGTERM, not only train.py: the run still stops in order within 10 s, exit 0, with the learner's final checkpoint,
    no traceback, nothing left."""
    tag = uuid.uuid4().hex
    log = tmp_path / "console.txt"
    p = start(["--env", "test_corridor", "--experiment", "e", "--train_dir", str(tmp_path), "--num_workers", "2",
               "--num_envs_per_worker", "4", "--serial_mode", str(serial), "--train_for_seconds", "300", *SMALL],
              log, tag, new_session=True)
    try:
        assert wait_until(lambda: re.search(r"Policy version: [1-9]", log.read_text()), 90), log.read_text()[-2000:]
        t0 = time.time()
        os.killpg(p.pid, sig)
        rc = p.wait(timeout=30)
        took = time.time() - t0
    finally:
        p.kill()
    console = log.read_text()
    assert rc == 0, console[-3000:]
    assert took < 10, took
    assert "Traceback" not in console and "KeyboardInterrupt" not in console, console[-3000:]
    assert "Saved final checkpoint" in console
    assert wait_until(lambda: not tagged(tag), 10.0)
