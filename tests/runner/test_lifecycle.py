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

from e2e_helpers import ROOT, log_time, shm_files, shm_left_behind, tagged

pytestmark = pytest.mark.e2e

SMALL = ["--rollout", "8", "--recurrence", "8", "--batch_size", "64", "--rnn_size", "32", "--hidden_size", "32",
         "--encoder_mlp_layers", "32", "--report_interval_sec", "1", "--device", "cpu"]


def start(args, log_path: Path, tag: str, new_session: bool = False) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", SF_TEST_RUN_TAG=tag)
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], stdout=open(log_path, "w"),
                            stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=new_session)


def wait_until(pred, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


@pytest.mark.doom
def test_runner_killed_at_random_moments_of_start_up_leaves_nothing(tmp_path):
    """SIGKILL of train.py at 10 random moments of its first seconds, one in each 0.7-s stretch of them (env probe,
    fork server, learner, policy worker, rollout workers making their VizDoom engines, first frames): within seconds
    no process of the run is alive and no engine shared memory is left (no VizDoom file appeared that no live process
    holds: those of Doom tests running beside this one are held by their engines). On a loaded machine start-up is
    slower, so the same 7 s cover fewer of its stages."""
    pytest.importorskip("vizdoom")
    rng = random.Random(1234)
    shm_before = shm_files(vizdoom=True)
    args = ["--env", "doom_basic", "--train_dir", str(tmp_path), "--num_workers", "2", "--num_envs_per_worker", "2",
            "--hidden_size", "32", "--device", "cpu", "--train_for_seconds", "300"]
    survivors = []
    for trial in range(10):
        tag = uuid.uuid4().hex
        p = start(args + ["--experiment", f"k{trial}"], tmp_path / f"log{trial}.txt", tag)
        delay = rng.uniform(0.7 * trial, 0.7 * (trial + 1))  # the first 7 s, stratified
        time.sleep(delay)
        p.kill()
        p.wait()
        if not wait_until(lambda: not tagged(tag), 10.0):
            survivors.append((trial, round(delay, 2), [psutil.Process(x).name() for x in tagged(tag)]))
            for pid in tagged(tag):
                os.kill(pid, signal.SIGKILL)
    assert not survivors, f"processes outlived the runner by 10 s: {survivors}"
    left = {n for n in shm_left_behind(shm_before, vizdoom=True) if n.startswith("ViZDoom")}
    assert not left, sorted(left)


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
    p = start([*args, "--train_for_env_steps", "100000", "--serial_mode", str(serial)], log, tag)
    try:
        rc = p.wait(timeout=180)
    finally:
        p.kill()
    console = log.read_text()
    assert rc == 1, console[-3000:]
    crash = [line for line in console.splitlines() if "crashed:" in line]
    assert len(crash) == 1 and "optimizer state that does not fit" in crash[0], console[-3000:]
    # the run ends at once after the crash, whatever the machine's load made of its start-up (beside a CPU-bound
    # process the fork server's imports alone took 16 s): its Done line within the others' stop budget (8 s) of it
    done = next(line for line in console.splitlines() if "Done: " in line)
    assert log_time(done) - log_time(crash[0]) <= 10, console[-3000:]
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


@pytest.mark.parametrize("sig,serial,every_process", [(signal.SIGINT, False, False), (signal.SIGINT, True, False),
                                                       (signal.SIGTERM, False, False), (signal.SIGTERM, False, True)],
                         ids=["ctrl_c", "ctrl_c_serial", "sigterm", "sigterm_every_process"])
def test_signal_to_the_process_group(tmp_path, sig, serial, every_process):
    """Ctrl-C in a terminal signals the whole foreground process group, and so do `timeout` and batch systems with
    SIGTERM, not only train.py: the run still stops in order (SIGTERM: within its grace period), exit 0, with the
    learner's final checkpoint,
    no traceback, nothing left. Slurm's scancel and requeue signal every process of the job, each one, whatever its
    group (every_process): the workers and the fork server leave the stop to the runner (the learner was killed before
    it saved, with the fork server)."""
    tag = uuid.uuid4().hex
    log = tmp_path / "console.txt"
    p = start(["--env", "test_corridor", "--experiment", "e", "--train_dir", str(tmp_path), "--num_workers", "2",
               "--num_envs_per_worker", "4", "--serial_mode", str(serial), "--train_for_seconds", "300", *SMALL],
              log, tag, new_session=True)
    try:
        assert wait_until(lambda: re.search(r"Policy version: [1-9]", log.read_text()), 90), log.read_text()[-2000:]
        t0 = time.time()
        if every_process:
            for pid in tagged(tag):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        else:
            os.killpg(p.pid, sig)
        rc = p.wait(timeout=120)
        took = time.time() - t0
    finally:
        p.kill()
    console = log.read_text()
    assert rc == 0, console[-3000:]
    if sig == signal.SIGTERM:  # a deadline, not a speed: a scheduler's SIGKILL follows (--sigterm_grace_sec 30)
        assert took < 30, took
    assert "Traceback" not in console and "KeyboardInterrupt" not in console, console[-3000:]
    assert "Saved final checkpoint" in console
    assert wait_until(lambda: not tagged(tag), 10.0)


@pytest.mark.parametrize("sig,gap", [(signal.SIGTERM, 0.005), (signal.SIGINT, 0.005), (signal.SIGTERM, 0.6)],
                         ids=["sigterm_twice_at_once", "ctrl_c_twice_at_once", "sigterm_again_later"])
def test_a_signal_repeated_is_one_request(tmp_path, sig, gap):
    """`timeout` sends its SIGTERM to the run and to the run's process group: the runner gets it twice within
    microseconds, which once counted as a second Ctrl-C (exit at once: no final checkpoint, engines' shared memory
    left). The same signal twice in a row is one request, and a repeated SIGTERM never escalates (the sender's SIGKILL
    does): the run stops in order. (A later second Ctrl-C still stops at once: tests/test_stop_requests.py; this
    small run's stop is over before a person's second press could come.)"""
    tag = uuid.uuid4().hex
    log = tmp_path / "console.txt"
    p = start(["--env", "test_corridor", "--experiment", "e", "--train_dir", str(tmp_path), "--num_workers", "2",
               "--num_envs_per_worker", "4", "--train_for_seconds", "300", *SMALL], log, tag, new_session=True)
    try:
        assert wait_until(lambda: re.search(r"Policy version: [1-9]", log.read_text()), 90), log.read_text()[-2000:]
        os.kill(p.pid, sig)
        time.sleep(gap)
        os.kill(p.pid, sig)  # (a zombie until waited for: never another process)
        rc = p.wait(timeout=30)
    finally:
        p.kill()
    console = log.read_text()
    assert console.count("received: stopping") == 1, console[-3000:]
    assert rc == 0 and "Saved final checkpoint" in console, console[-3000:]
    assert wait_until(lambda: not tagged(tag), 10.0)


# --- one run per experiment; a finished experiment resumed ---

def _base(tmp_path) -> list:
    return ["--env", "test_corridor", "--experiment", "e", "--train_dir", str(tmp_path), "--num_workers", "1",
            "--num_envs_per_worker", "2", *SMALL]


def _train(args, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _start_live(tmp_path, tag: str) -> tuple[subprocess.Popen, Path]:
    """A run that trains (for minutes), returned once it has trained and saved a checkpoint."""
    log = tmp_path / "live.txt"
    p = start([*_base(tmp_path), "--train_for_seconds", "300", "--save_every_sec", "1",
               "--experiment_summaries_interval", "1"], log, tag)
    ckpt_dir = tmp_path / "e" / "checkpoint_p0"
    # "*.pth": a save in progress is a checkpoint_*.pth.tmp, and a kill then leaves nothing to resume from
    ok = wait_until(lambda: re.search(r"Policy version: [1-9]", log.read_text())
                    and any(ckpt_dir.glob("checkpoint_*.pth")), 120)
    assert ok, log.read_text()[-3000:]
    return p, log


def _refused(res: subprocess.CompletedProcess, pid: int, exp: Path) -> str:
    """The one line of a second runner refused: exit code 2, naming the holder's pid and the experiment."""
    lines = res.stderr.splitlines()
    assert res.returncode == 2 and len(lines) == 1 and res.stdout == "", res.stdout[-2000:] + res.stderr[-2000:]
    assert f"experiment {exp} is in use by another run (pid {pid}, since " in lines[0], lines[0]
    return lines[0]


def test_one_run_per_experiment(tmp_path):
    """While a run trains, a second train.py on its experiment is refused in one line naming the first's pid (exit
    code 2), whatever its --restart_behavior, and changes nothing (no directory moved aside or deleted, config.json and
    the event files as they were); sf.plot and enjoy.py read the live experiment (exit code 0); the run then stops as
    usual and leaves no lock file."""
    tag = uuid.uuid4().hex
    p, log = _start_live(tmp_path, tag)
    exp, lock = tmp_path / "e", tmp_path / ".e.lock"
    try:
        config, events = (exp / "config.json").read_bytes(), sorted(exp.glob("events.out.tfevents.*"))
        assert lock.read_text().split()[0] == str(p.pid)
        for behavior in ("resume", "restart", "overwrite"):
            _refused(_train([*_base(tmp_path), "--restart_behavior", behavior, "--train_for_seconds", "5"]), p.pid, exp)
            assert sorted(q.name for q in tmp_path.iterdir()) == [".e.lock", "e", "live.txt"]
            assert (exp / "config.json").read_bytes() == config and sorted(exp.glob("events.out.tfevents.*")) == events
        res = subprocess.run([sys.executable, "-m", "sf.plot", str(exp), "--out", str(tmp_path / "curves.png")],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert res.returncode == 0 and (tmp_path / "curves.png").is_file(), res.stderr[-2000:]
        res = subprocess.run([sys.executable, str(ROOT / "enjoy.py"), "--env", "test_corridor", "--experiment", "e",
                              "--train_dir", str(tmp_path), "--no_render", "--max_num_frames", "50", "--device", "cpu"],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert res.returncode == 0 and "Loaded latest checkpoint" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
        assert p.poll() is None, log.read_text()[-3000:]  # undisturbed
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        p.kill()
    assert "Traceback" not in log.read_text() and "Saved final checkpoint" in log.read_text()
    assert not lock.exists()
    assert wait_until(lambda: not tagged(tag), 10.0)


def test_runner_killed_then_started_again_at_once(tmp_path):
    """SIGKILL of a training runner leaves no stale lock: the same train.py started at once (while the dead runner's
    learner, which holds the lock too, may still be dying) trains on from its checkpoint, exit code 0. (That a learner
    holds the lock after its runner died: tests/runner/test_experiment_dir.py, through the same fork server.)"""
    tag = uuid.uuid4().hex
    p, log = _start_live(tmp_path, tag)
    try:
        p.kill()
        p.wait()
        res = _train([*_base(tmp_path), "--train_for_seconds", "5"])
        assert res.returncode == 0 and "Resumed from checkpoint" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]
        assert "Traceback" not in res.stdout + res.stderr
    finally:
        for pid in tagged(tag):
            os.kill(pid, signal.SIGKILL)
    assert not (tmp_path / ".e.lock").exists()


def test_resuming_a_finished_run_trains_and_writes_nothing(tmp_path):
    """A finished experiment resumed with the same budget (the saved configuration): nothing starts, nothing is
    written (every file of the experiment byte-identical, mtimes included: no final checkpoint re-saved, no best
    relabelled, no config.json, log or event file); the console gives the experiment's version and frames."""
    first = _train([*_base(tmp_path), "--train_for_env_steps", "500"])
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    exp = tmp_path / "e"
    files = lambda: {str(f.relative_to(tmp_path)): (f.stat().st_mtime_ns, f.read_bytes())  # noqa: E731
                     for f in tmp_path.rglob("*") if f.is_file()}
    before = files()
    _, version, frames = max(exp.glob("checkpoint_p0/checkpoint_*.pth")).stem.split("_")
    res = _train(["--env", "test_corridor", "--experiment", "e", "--train_dir", str(tmp_path)])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert files() == before
    assert (f"Done: nothing to train: the experiment reached --train_for_env_steps 500 already (policy version "
            f"{int(version)}, {frames} env frames)") in res.stdout, res.stdout
    assert "Policy version: 0" not in res.stdout and "Started" not in res.stdout


def test_console_counters_of_a_resumed_run_start_from_its_checkpoint(tmp_path):
    """Until the learner reports a batch, a resumed run's report line and totals are the experiment's (its checkpoint's
    policy version and env frames), not zeros."""
    from sf.runner.stats import RunStats
    stats = RunStats(tmp_path, 10, 1, resumed=[(36, 1152)])
    assert "Total num frames: 1152. Policy version: 36." in stats.report_line()
    stats.add_frames(30)
    assert "Total num frames: 1182. Policy version: 36." in stats.report_line()
    stats.add_train([], 37, 1184)
    assert "Policy version: 37." in stats.report_line()
    pop = RunStats(tmp_path, 10, 1, num_policies=2, resumed=[(5, 100), (7, 140)])
    assert pop.total_frames == 240 and "policy 1: version 7, 140 frames trained" in pop.report_line()
