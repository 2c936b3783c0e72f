"""End-to-end: the real multi-process system (train.py in a subprocess) with tiny budgets."""
import os
import re
import signal
import time

import psutil
import pytest

from e2e_helpers import (ROOT, child_pids, engine_files, shm_files, shm_left_behind, start_train, train_args,
                         wait_for)
from sf.runner.stats import read_event_scalars

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("serial", [False, True])
def test_trains_test_env_and_reports(tmp_path, entry, serial):
    shm_before = shm_files()
    res = entry("train.py", *train_args(tmp_path, "test_corridor", "--num_workers", "2", "--serial_mode", str(serial),
                                        "--train_for_env_steps", "6000"), timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    exp = tmp_path / "e2e"
    assert (exp / "config.json").exists()
    ckpts = list((exp / "checkpoint_p0").glob("checkpoint_*.pth"))
    assert ckpts, "final checkpoint missing"
    scalars = read_event_scalars(exp)
    for tag in ("perf/_fps", "train/policy_lag_avg", "train/policy_lag_max", "reward/reward", "train/policy_version"):
        assert tag in scalars, (tag, sorted(scalars))
    versions = [v for _, v in scalars["train/policy_version"]]
    assert max(versions) >= 5  # policy versions advance: 6000 frames / 64-sample minibatches
    lag = [v for _, v in scalars["train/policy_lag_avg"]]
    assert all(0 <= x <= 100 for x in lag)
    assert max(v for _, v in scalars["perf/_fps"]) > 0
    assert "Policy lag (min:" in res.stdout
    # no step skipped: counted in TensorBoard and on the last lines (a run whose every step was skipped trained nothing)
    assert [v for _, v in scalars["train/skipped_steps"]][-1] == 0
    steps = int(re.search(r"Done: .*policy version \d+ \(0 of (\d+) optimizer steps skipped\)", res.stdout).group(1))
    assert steps >= max(versions) and re.search(r"Final weights sha256: .*; changed from this process's start, 0 of "
                                                rf"{steps} optimizer steps skipped", res.stdout), res.stdout[-2000:]
    assert not shm_left_behind(shm_before)  # no shared memory left behind


@pytest.mark.doom
def test_trains_doom_basic(tmp_path, entry):
    pytest.importorskip("vizdoom")
    res = entry("train.py", "--env", "doom_basic", "--experiment", "e2e", "--train_dir", str(tmp_path),
                "--num_workers", "2", "--num_envs_per_worker", "4",
                "--batch_size", "64", "--hidden_size", "64",  # preset: 4 epochs x 4 minibatches
                "--train_for_env_steps", "4000", "--device", "cpu", "--experiment_summaries_interval", "1", timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    scalars = read_event_scalars(tmp_path / "e2e")
    assert max(v for _, v in scalars["train/policy_version"]) >= 16  # 16 SGD steps per training batch
    assert "train/policy_lag_avg" in scalars


@pytest.mark.parametrize("random_policy", [False, True])
def test_sampler_only_collects_without_training(tmp_path, entry, random_policy):
    """The benchmark mode of benchmarks/system_throughput.py: frames are collected and counted, no SGD step."""
    res = entry("train.py", *train_args(tmp_path, "test_corridor", "--num_workers", "2", "--sampler_only", "True",
                                        "--random_policy", str(random_policy), "--train_for_env_steps", "4000"),
                timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    frames = [int(n) for n in re.findall(r"Total num frames: (\d+)", res.stdout)]
    assert frames and max(frames) >= 4000
    assert set(re.findall(r"Policy version: (\d+)", res.stdout)) == {"0"}  # nothing trained


def test_killed_rollout_worker_is_detected(tmp_path):
    """Without self-healing (--max_restarts_per_hour 0) a dead worker stops the run (tests/runner/test_self_healing.py:
    with it, the worker is replaced)."""
    log = tmp_path / "log.txt"
    p = start_train(train_args(tmp_path, "test_corridor", "--num_workers", "2", "--train_for_seconds", "300",
                               "--max_restarts_per_hour", "0"), log)
    try:
        wait_for(lambda: "rollout_worker_1" in child_pids(log), 90, "workers to start", log)
        time.sleep(2)
        os.kill(child_pids(log)["rollout_worker_0"], signal.SIGKILL)
        rc = p.wait(timeout=30)
    finally:
        p.kill()
    text = log.read_text()
    assert rc != 0
    assert "rollout_worker_0 exited unexpectedly" in text
    for name, pid in child_pids(log).items():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, name


def test_env_exception_reported_with_traceback(tmp_path):
    """Each env raises after 300 steps: replaced twice with its traceback in the log, then the run stops."""
    log = tmp_path / "log.txt"
    p = start_train(train_args(tmp_path, "gym:faulty_env:Faulty-v0", "--num_workers", "1", "--use_rnn", "False",
                               "--max_env_restarts", "2", "--train_for_seconds", "300"), log)
    try:
        rc = p.wait(timeout=60)
    finally:
        p.kill()
    text = log.read_text()
    assert rc != 0
    warnings = text.split("replacing it with a fresh env (")[1:]  # each replacement logged with the env's traceback
    assert len(warnings) == 2, text[-4000:]
    for k, w in enumerate(warnings, 1):
        assert w.startswith(f"{k} of --max_env_restarts 2):\nTraceback") and "FaultyEnv exploded on purpose" in w
    crash = [line for line in text.splitlines() if "rollout_worker_0 crashed" in line]
    assert len(crash) == 1 and "after 2 replacements" in crash[0]  # one console line; the traceback in the log file
    log_file = (tmp_path / "e2e" / "sf_log.txt").read_text()
    assert "rollout_worker_0 crashed:\nTraceback" in log_file and "FaultyEnv exploded on purpose" in log_file
    assert list((tmp_path / "e2e" / "checkpoint_p0").glob("checkpoint_*.pth")), "no checkpoint at the stop"


def test_failed_envs_are_replaced_and_training_continues(tmp_path, entry):
    res = entry("train.py", *train_args(tmp_path, "gym:faulty_env:Faulty-v0", "--num_workers", "1",
                                        "--use_rnn", "False", "--max_env_restarts", "1000",
                                        "--train_for_env_steps", "4000"),
                env={"PYTHONPATH": f"{ROOT / 'tests' / 'runner'}:{ROOT}"}, timeout=180)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert out.count("replacing it with a fresh env") >= 4 and "crashed" not in out
    assert "Saved final checkpoint" in out


def test_sigint_stops_everything_and_cleans_up(tmp_path):
    shm_before = shm_files()
    log = tmp_path / "log.txt"
    p = start_train(train_args(tmp_path, "test_corridor", "--num_workers", "2", "--train_for_seconds", "300"), log)
    try:
        wait_for(lambda: re.search(r"Policy version: [1-9]", log.read_text()), 90, "training to report", log)
        pids = child_pids(log)
        assert len(pids) == 4
        t0 = time.time()
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=20)
        assert time.time() - t0 < 10
    finally:
        p.kill()
    assert rc == 0, log.read_text()[-3000:]
    assert "Saved final checkpoint" in log.read_text()
    for pid in pids.values():
        assert not psutil.pid_exists(pid)
    assert not shm_left_behind(shm_before)


def test_stopped_and_continued_run_is_not_a_stall(tmp_path):
    """Ctrl-Z then fg stops and continues every process at once, in no order: the watchdog must not take the pause
    for a stall (a worker continued after the runner has a stale heartbeat), and the run goes on."""
    log = tmp_path / "log.txt"
    p = start_train(train_args(tmp_path, "test_corridor", "--num_workers", "2", "--stall_timeout_sec", "10",
                               "--train_for_seconds", "300"), log)  # 10 s: more than a worker's start-up here
    try:
        wait_for(lambda: re.search(r"Policy version: [1-9]", log.read_text()), 90, "training to report", log)
        runner = psutil.Process(p.pid)
        tree = [runner, *runner.children(recursive=True)]
        for proc in tree:
            proc.suspend()
        time.sleep(14)
        for proc in tree:  # the runner first, the workers a second later: their heartbeats are the stalest possible
            proc.resume()
            time.sleep(1.0 if proc is runner else 0.0)

        def frames() -> list[int]:
            return [int(x) for x in re.findall(r"Total num frames: (\d+)", log.read_text())]
        resumed_at = frames()[-1]
        wait_for(lambda: frames()[-1] > resumed_at, 30, "frames to be collected again after the pause", log)
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=20)
    finally:
        p.kill()
    text = log.read_text()
    assert "gave no sign of life" not in text, text[-3000:]
    assert rc == 0, text[-3000:]


def test_sigkill_then_resume_continues_counters(tmp_path):
    log = tmp_path / "log.txt"
    args = train_args(tmp_path, "test_corridor", "--num_workers", "2", "--save_every_sec", "1",
                      "--train_for_seconds", "300")
    p = start_train(args, log)
    ckpt_dir = tmp_path / "e2e" / "checkpoint_p0"
    try:
        wait_for(lambda: len(list(ckpt_dir.glob("checkpoint_*.pth"))) >= 1 and "Policy lag" in log.read_text(),
                 120, "a checkpoint", log)
        time.sleep(1.5)
        pids = child_pids(log)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
    finally:
        p.kill()
    wait_for(lambda: not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                             for pid in pids.values()), 10, "children to exit after the parent's SIGKILL")
    from sf.learning.checkpoint_store import CheckpointManager
    before = CheckpointManager(tmp_path / "e2e").load("latest")
    assert before is not None
    # the same command, with a budget just above where it stopped, continues from the checkpoint
    target = int(before["env_steps"]) + 2000
    log2 = tmp_path / "log2.txt"
    p2 = start_train(args[:-2] + ["--train_for_env_steps", str(target)], log2)
    rc = p2.wait(timeout=180)
    assert rc == 0, log2.read_text()[-3000:]
    assert "Resumed from checkpoint" in log2.read_text()
    after = CheckpointManager(tmp_path / "e2e").load("latest")
    assert int(after["env_steps"]) >= target
    assert int(after["policy_version"]) > int(before["policy_version"])


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.doom
@pytest.mark.parametrize("victim", ["runner", "rollout_worker_0"])
def test_sigkill_leaves_no_doom_engine(tmp_path, victim):
    """VizDoom engines are processes of the rollout workers, with shared-memory segments of their own. The runner
    SIGKILLed: the workers close their games instead of dying at once. A worker SIGKILLed: the runner, their
    subreaper, adopts its engines and ends them when the run stops, removing their shared memory (here without
    self-healing, which would replace the worker: tests/runner/test_self_healing.py). Either way no engine and no
    segment outlives the run."""
    pytest.importorskip("vizdoom")
    shm_before = shm_files()
    log = tmp_path / "log.txt"
    p = start_train(["--env", "doom_basic", "--experiment", "e2e", "--train_dir", str(tmp_path), "--num_workers", "2",
                     "--num_envs_per_worker", "2", "--hidden_size", "32", "--report_interval_sec", "1",
                     "--train_for_seconds", "300", "--device", "cpu", "--max_restarts_per_hour", "0"], log)
    try:
        wait_for(lambda: re.search(r"Total num frames: [1-9]", log.read_text()), 120, "frames to be collected", log)

        def vizdoom_engines():
            return [c for c in psutil.Process(p.pid).children(recursive=True) if c.name() == "vizdoom"]
        # one worker reports frames while the other's engines may still be starting: wait for all 4
        wait_for(lambda: len(vizdoom_engines()) == 4, 120, "the 4 engines to run", log)
        procs = vizdoom_engines()
        engines, files = [c.pid for c in procs], engine_files(procs)
        assert len(engines) == 4, engines
        assert files
        # the engines' segments exist (under load an engine still starting may not have made its screen buffer yet)
        wait_for(lambda: files <= shm_files(vizdoom=True), 30, "the engines' shared memory segments")
        os.kill(p.pid if victim == "runner" else child_pids(log)[victim], signal.SIGKILL)
        rc = p.wait(timeout=60)
    finally:
        p.kill()
    assert rc != 0
    wait_for(lambda: not any(_alive(pid) for pid in engines), 15,
             f"VizDoom engines to exit after SIGKILL of the {victim}")
    wait_for(lambda: not files & shm_files(vizdoom=True), 5, "engine shared memory removed")
    assert not shm_left_behind(shm_before)


@pytest.mark.doom
def test_hung_engine_is_reported_with_stack_and_the_worker_replaced(tmp_path):
    """A VizDoom engine that stops answering (SIGSTOP: what a hung engine looks like to its host) leaves its rollout
    worker blocked in make_action (or new_episode): no exception, no exit code. The heartbeat watchdog names the worker
    with its Python stack within --stall_timeout_sec, kills it with its engines (their shared memory goes with them)
    and starts a replacement; the run goes on and stops cleanly at Ctrl-C."""
    pytest.importorskip("vizdoom")
    shm_before = shm_files()
    log = tmp_path / "log.txt"
    p = start_train(["--env", "doom_basic", "--experiment", "e2e", "--train_dir", str(tmp_path), "--num_workers", "2",
                     "--num_envs_per_worker", "2", "--hidden_size", "32", "--report_interval_sec", "1",
                     "--stall_timeout_sec", "4", "--train_for_seconds", "300", "--device", "cpu"], log)
    try:
        wait_for(lambda: re.search(r"Total num frames: [1-9]", log.read_text()), 120, "frames to be collected", log)
        worker = psutil.Process(child_pids(log)["rollout_worker_1"])

        def engines_of_worker():
            return [c for c in worker.children() if c.name() == "vizdoom"]
        # (the frames may all be worker 0's: on a loaded machine worker 1 may still be starting its second engine)
        wait_for(lambda: len(engines_of_worker()) == 2, 60, "rollout_worker_1's two engines", log)
        engines = engines_of_worker()
        files = engine_files(engines)
        engines[0].suspend()
        t0 = time.time()
        wait_for(lambda: "Restarted rollout_worker_1" in log.read_text(), 60, "the stuck worker to be replaced", log)
        assert time.time() - t0 < 4 + 10, "detection (4 s) and the replacement took too long"
        frames = int(re.findall(r"Total num frames: (\d+)", log.read_text())[-1])
        wait_for(lambda: int(re.findall(r"Total num frames: (\d+)", log.read_text())[-1]) > frames,
                 60, "frames to go on", log)
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=30)
    finally:
        p.kill()
    text = log.read_text()
    assert rc == 0, text[-3000:]
    report = text.split("rollout_worker_1 gave no sign of life for ")[1]
    assert ("(--stall_timeout_sec 4): it is stuck; killing and replacing it" in report
            and "most recent call first" in report)
    # (blocked in the env's step, or in the reset that follows an episode's end: doom_basic's episodes are short)
    assert re.search(r"doom_env\.py\", line \d+ in (step|reset)\n(.*\n)*?"
                     r".*rollout_worker\.py\", line \d+ in _step_group", report), report[:2000]
    assert "Saved final checkpoint" in text
    assert not any(_alive(pid) for pid in [worker.pid, *(e.pid for e in engines)])
    wait_for(lambda: not files & shm_files(vizdoom=True), 5, "engine shared memory removed")
    assert not shm_left_behind(shm_before)


def test_corrupted_latest_falls_back_and_incompatible_is_one_line(tmp_path, entry):
    args = train_args(tmp_path, "test_corridor", "--num_workers", "1", "--train_for_env_steps", "1500")
    assert entry("train.py", *args, timeout=180).returncode == 0
    args2 = args[:-1] + ["3000"]
    assert entry("train.py", *args2, timeout=180).returncode == 0
    ckpts = sorted((tmp_path / "e2e" / "checkpoint_p0").glob("checkpoint_*.pth"))
    assert len(ckpts) == 2
    ckpts[-1].write_bytes(b"garbage" * 10)
    res = entry("train.py", *(args[:-1] + ["4500"]), timeout=180)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "WARNING" in res.stdout + res.stderr and ckpts[-1].name in res.stdout + res.stderr
    # a different model: one line, exit 2, no traceback
    res = entry("train.py", *(args[:-1] + ["9000"]), "--rnn_size", "16", timeout=180)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_user_registered_env_trains(tmp_path, entry):
    res = entry("tests/runner/custom_train.py", *train_args(tmp_path, "my_cartpole", "--num_workers", "1",
                                                            "--train_for_env_steps", "2000"), timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "Saved final checkpoint" in res.stdout
