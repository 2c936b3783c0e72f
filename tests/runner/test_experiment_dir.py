"""--restart_behavior: resume keeps the experiment directory, restart moves it aside, overwrite deletes it; restart and
overwrite act only on an experiment of ours (a real directory inside the train dir with its config.json). One run at a
time per experiment: its lock (the end-to-end cases, with real runs, are in test_lifecycle.py)."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from e2e_helpers import ROOT
from sf.cfg import ConfigError, RunError, default_cfg, save_cfg
from sf.runner.startup.experiment_lock import ExperimentLock, lock_path
from sf.runner.startup.preflight import prepare_experiment_dir


def _cfg(tmp_path, behavior, experiment="exp"):
    return default_cfg(env="test_corridor", experiment=experiment, train_dir=str(tmp_path), restart_behavior=behavior)


def _experiment(tmp_path, marker: str):
    cfg = _cfg(tmp_path, "resume")
    exp = prepare_experiment_dir(cfg)
    save_cfg(cfg, exp)
    (exp / "marker").write_text(marker)
    return exp


def test_restart_behaviors(tmp_path):
    exp = _experiment(tmp_path, "old run")
    assert (prepare_experiment_dir(_cfg(tmp_path, "resume")) / "marker").exists()

    exp = prepare_experiment_dir(_cfg(tmp_path, "restart"))
    assert exp.exists() and not (exp / "marker").exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("exp_old_")]
    assert len(aside) == 1 and (aside[0] / "marker").read_text() == "old run"

    exp = _experiment(tmp_path, "second run")
    exp = prepare_experiment_dir(_cfg(tmp_path, "overwrite"))
    assert exp.exists() and not (exp / "marker").exists()
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("exp_old_")]) == 1
    for _ in range(2):  # within the same second: a distinct name, nothing lost
        _experiment(tmp_path, "again")
        prepare_experiment_dir(_cfg(tmp_path, "restart"))
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("exp_old_")]) == 3


@pytest.mark.parametrize("behavior", ["restart", "overwrite"])
def test_only_an_experiment_of_ours_is_moved_or_deleted(tmp_path, behavior):
    train_dir = tmp_path / "train"
    train_dir.mkdir()
    plain = train_dir / "plain"  # a directory that holds no experiment
    plain.mkdir()
    (plain / "precious").write_text("data")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    (train_dir / "link").symlink_to(outside, target_is_directory=True)  # an experiment name that leads elsewhere
    (train_dir / "file").write_text("not a directory")
    for name in ("plain", "link", "file"):
        with pytest.raises(ConfigError, match="not an experiment directory"):
            prepare_experiment_dir(_cfg(train_dir, behavior, name))
    assert (plain / "precious").read_text() == "data"
    assert (outside / "config.json").read_text() == "{}" and (train_dir / "link").is_symlink()
    assert (train_dir / "file").read_text() == "not a directory"
    assert sorted(p.name for p in train_dir.iterdir()) == ["file", "link", "plain"]


# --- one run per experiment (sf/runner/startup/experiment_lock.py) ---

HOLD = """
import sys, time
from sf.runner.startup.experiment_lock import ExperimentLock
lock = ExperimentLock.acquire(sys.argv[1], sys.argv[2])
print("locked", flush=True)
time.sleep(600)
"""


def _holder(train_dir, name="exp") -> subprocess.Popen:
    """Another process that takes the experiment's lock and keeps it (until killed)."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(train_dir), name], stdout=subprocess.PIPE, text=True,
                         cwd=ROOT)
    assert p.stdout.readline().strip() == "locked"
    return p


@pytest.mark.e2e
def test_lock_refuses_a_second_holder_naming_the_first_and_dies_with_it(tmp_path):
    """Another process holds the lock: acquire() is one line naming its pid and the experiment (ConfigError: exit code
    2). Its SIGKILL releases the lock (the kernel's doing): no stale lock; the file it leaves is taken over."""
    exp = _experiment(tmp_path, "old run")
    holder = _holder(tmp_path)
    try:
        with pytest.raises(ConfigError) as refused:
            ExperimentLock.acquire(tmp_path, "exp")
        line = str(refused.value)
        assert f"experiment {exp} is in use by another run (pid {holder.pid}, since " in line and "\n" not in line
        assert "whatever --restart_behavior" in line
    finally:
        holder.kill()
        holder.wait()
    assert lock_path(tmp_path, "exp").exists()  # left by the killed holder, unlocked
    lock = ExperimentLock.acquire(tmp_path, "exp", wait_for_dead=0)
    assert lock_path(tmp_path, "exp").read_text().split()[0] == str(os.getpid())
    lock.release()
    assert not lock_path(tmp_path, "exp").exists()  # a run that ends leaves nothing beside its experiment
    assert (exp / "marker").read_text() == "old run"


@pytest.mark.e2e
@pytest.mark.parametrize("behavior", ["restart", "overwrite"])
def test_lock_lasts_across_restart_and_overwrite(tmp_path, behavior):
    """The lock file is beside the experiment directory: moving it aside or deleting it does not free the name."""
    _experiment(tmp_path, "old run")
    lock = ExperimentLock.acquire(tmp_path, "exp")
    try:
        prepare_experiment_dir(_cfg(tmp_path, behavior))
        holder = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path), "exp"], capture_output=True, text=True,
                                cwd=ROOT, timeout=60)
        assert holder.returncode != 0 and f"pid {os.getpid()}" in holder.stderr, holder.stderr[-2000:]
    finally:
        lock.release()


def test_a_planted_link_is_not_followed(tmp_path):
    """A symbolic link under the lock's name (to a file elsewhere) is refused in one line; its target is untouched."""
    target = tmp_path / "precious.txt"
    target.write_text("data")
    train_dir = tmp_path / "train"
    train_dir.mkdir()
    lock_path(train_dir, "exp").symlink_to(target)
    with pytest.raises(RunError, match=r"cannot open its lock file .*\.exp\.lock: Too many levels of symbolic links"):
        ExperimentLock.acquire(train_dir, "exp")
    assert target.read_text() == "data" and lock_path(train_dir, "exp").is_symlink()


ORPHAN = """
import os, sys, time
from sf.runner.startup.experiment_lock import ExperimentLock, run_holding
from sf.runner.startup.supervision import worker_context

if __name__ == "__main__":
    lock = ExperimentLock.acquire(sys.argv[1], "exp")
    # as the runner starts a learner
    child = worker_context([]).Process(target=run_holding, args=(lock, time.sleep, 600))
    child.start()
    print(child.pid, flush=True)
    os.kill(os.getpid(), 9)  # the runner dies; its child (no parent-death signal here) lives on, holding the lock
"""


@pytest.mark.e2e
def test_a_learner_holds_the_lock_after_its_runner_died(tmp_path):
    """The runner passes its lock to the processes it starts through the fork server (as it does to its learners): a
    runner SIGKILLed leaves the lock held for as long as such a process lives. A new acquire() waits `wait_for_dead`
    for it, then is refused in one line naming the dead runner; once that process is gone, the lock is free."""
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN)
    runner = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    child = int(runner.stdout.readline())
    runner.wait(timeout=60)
    try:
        assert runner.returncode == -9 and psutil.pid_exists(child)
        with pytest.raises(ConfigError) as refused:
            ExperimentLock.acquire(tmp_path, "exp", wait_for_dead=0.5)
        assert f"(pid {runner.pid}, since " in str(refused.value)
        assert "that process has died but processes it started still hold the lock" in str(refused.value)
    finally:
        os.kill(child, signal.SIGKILL)
    deadline = time.time() + 10
    while (psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE
           and time.time() < deadline):
        time.sleep(0.05)
    ExperimentLock.acquire(tmp_path, "exp", wait_for_dead=0).release()
