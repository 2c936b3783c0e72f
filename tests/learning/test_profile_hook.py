"""The learner's opt-in phase timing (SF_PROFILE, sf/learning/phase_timing.py) and the process names of a run
(sf.processes.control.set_process_name): what benchmarks/profile_training.py reads."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from e2e_helpers import ROOT, child_pids, start_train, train_args, wait_for

from sf.learning.phase_timing import PhaseTimer
from sf.processes.control import process_title

MAIN_PHASES = {"wait_batch", "prepare", "forward", "targets", "backward", "optimizer", "stats", "publish", "report"}
BATCHER_PHASES = {"wait_trajectories", "copy"}


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_laps_tile_each_thread_and_split_the_process_cpu_between_threads(tmp_path):
    """A side thread's CPU goes to its own phases, not to the main thread's laps it ran beside."""
    laps = PhaseTimer(str(tmp_path / "p.json"))
    laps.lap("start")  # sets the main thread's mark
    ready, done = threading.Event(), threading.Event()

    def side():
        laps.lap("side_start")
        ready.set()
        _spin(0.2)
        laps.lap("side_busy")
        done.set()

    t = threading.Thread(target=side)
    t.start()
    ready.wait(10)
    done.wait(10)  # the main thread sleeps while the side thread spins
    laps.lap("main_idle")
    _spin(0.1)
    laps.lap("main_busy")
    t.join()
    laps.write()
    data = json.loads((tmp_path / "p.json").read_text())
    ph = data["phases"]
    assert set(ph) == {"main_idle", "main_busy", "side_busy"}  # a thread's first lap only sets its mark
    assert ph["side_busy"]["thread"] == "side" and ph["main_busy"]["thread"] == "main"
    assert ph["side_busy"]["cpu"] >= 0.19
    assert ph["main_idle"]["cpu"] < 0.1  # the side thread's 0.2 s are not in it
    assert 0.09 <= ph["main_busy"]["cpu"] < 0.2
    assert ph["main_idle"]["wall"] + ph["main_busy"]["wall"] <= data["wall"]
    assert data["pid"] == os.getpid()


def test_each_rank_and_policy_writes_its_own_file(tmp_path, monkeypatch):
    """torchrun's ranks on one machine share SF_PROFILE: rank r > 0 writes path.rank<r> (policy p > 0: path.p<p>)."""
    laps = PhaseTimer(str(tmp_path / "p.json"))
    for rank, policy in (("", 0), ("0", 1), ("2", 0), ("3", 1)):
        monkeypatch.setenv("RANK", rank)
        laps.write(policy)
    assert sorted(os.listdir(tmp_path)) == ["p.json", "p.json.p1", "p.json.p1.rank3", "p.json.rank2"]


@pytest.mark.e2e  # (a fresh Python process: the variable is read at import)
def test_without_the_variable_nothing_is_timed_or_written(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SF_PROFILE"}
    code = ("import os, sf.learning.learner as l, sf.learning.appo as a\n"
            "from sf.learning import phase_timing as t\n"
            "assert l.LAPS is t.LAPS is a.LAPS and not isinstance(t.LAPS, t.PhaseTimer)\n"
            "t.LAPS.lap('x'); t.LAPS.lap('x'); t.LAPS.batch_done(10); t.LAPS.write()\n"
            "print(sorted(os.listdir('.')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=dict(env, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


def test_process_titles_fit_the_kernels_name():
    assert process_title("rollout_worker_3") == "sf:rollout_3"
    assert process_title("policy_worker_p1_0") == "sf:policy_p1_0"
    assert process_title("learner") == "sf:learner"
    assert len(process_title("rollout_worker_123456")) == 15


@pytest.mark.e2e
def test_a_run_names_its_processes_and_its_learner_writes_sane_phases(tmp_path, monkeypatch):
    profile = tmp_path / "profile.json"
    log = tmp_path / "log.txt"
    monkeypatch.setenv("SF_PROFILE", str(profile))  # inherited by train.py (start_train copies os.environ)
    p = start_train(train_args(tmp_path, "test_corridor", "--num_workers", "1", "--train_for_seconds", "300",
                               "--learner_torch_threads", "1"), log)
    try:
        wait_for(lambda: profile.exists() and json.loads(profile.read_text())["batches"] >= 2, 90,
                 "two training batches", log)
        pids = child_pids(log)
        names = {name: psutil.Process(pid).name() for name, pid in pids.items()}
        assert names == {"learner": "sf:learner", "policy_worker_0": "sf:policy_0", "rollout_worker_0": "sf:rollout_0"}
        server = psutil.Process(pids["learner"]).parent()
        assert server.name() == "sf:fork_server" and server.ppid() == p.pid
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=60)
    finally:
        p.kill()
    assert rc == 0, log.read_text()[-3000:]
    data = json.loads(profile.read_text())  # the learner's last write, at its exit
    assert data["pid"] == pids["learner"]
    assert data["samples"] == 64 * data["batches"] and data["batches"] >= 2
    ph = data["phases"]
    assert set(ph) == MAIN_PHASES | BATCHER_PHASES
    for name, v in ph.items():
        assert v["wall"] > 0 and v["count"] > 0 and v["cpu"] >= 0, (name, v)
        assert v["thread"] == ("side" if name in BATCHER_PHASES else "main"), (name, v)
    for names in (MAIN_PHASES, BATCHER_PHASES):  # each thread's laps tile its time
        assert sum(ph[k]["wall"] for k in names) <= data["wall"] + 1e-6
    assert sum(v["cpu"] for v in ph.values()) <= data["cpu"] + 0.02  # (rounding of the clocks)
    assert ph["forward"]["count"] == ph["backward"]["count"] == ph["optimizer"]["count"] >= data["batches"]
