"""Self-healing (issue 18): a dead process is replaced in place and the run goes on.

In-process: voided requests are dropped unanswered and asked again; a dead worker's slots go back to the free list, a
dead learner's to its queue; the slot audit finds a lost and a duplicated slot; weights a learner died writing.
End-to-end (train.py in a subprocess): each process kind SIGKILLed once in one run, a hung policy worker (SIGSTOP)
replaced by the watchdog, a crash loop stopping the run, a Doom worker killed with its engines.
"""
import re
import signal
import time
import os

import numpy as np
import psutil
import pytest
import torch

from sf.buffers.shared_weights import SharedWeights
from sf.ipc import Queue
from sf.learning.checkpoint import CheckpointManager
from sf.processes.shared_state import SLOT_FREE, SharedState, slot_held, slot_queued
from sf.runner.healing import Healer, audit_slots
from sf.runner.stats import read_event_scalars
from types import SimpleNamespace

from test_rollout_inprocess import Run
from test_train_e2e import child_pids, engine_files, shm_files, start_train, train_args, wait_for


# --- in-process ---

def test_voided_requests_are_dropped_and_asked_again(tmp_path):
    """A request of a voided epoch gets no actions and no reply; once released, the worker asks again in the new epoch
    and steps on its replies only."""
    run = Run(tmp_path, envs=4)
    try:
        run.step(3)
        run.worker.run_once(timeout=0.0)  # nothing pending: both groups await actions now
        assert run.worker.awaiting.tolist() == [1, 1]
        frames = run.worker.frames
        run.state.epoch_np[0] += 1  # the runner voids worker 0's requests (a policy worker died, say)
        actions_before = run.buffers.actions.clone()
        served = run.policy.run_once(timeout=0.2)
        assert served == 0 and torch.equal(run.buffers.actions, actions_before)  # dropped: nothing written
        with pytest.raises(Exception):
            run.queues.workers[0].get_many(timeout=0.2)  # and no reply
        run.state.epoch_go_np[0] = run.state.epoch_np[0]  # released: the worker asks again
        run.step(4)
        assert run.worker.epoch == 1 and run.worker.frames > frames
        assert run.state.serving_np[0] % 2 == 0  # not serving between batches
    finally:
        run.close()


def _slots_state(num_slots=12, workers=2):
    state = SharedState(workers, num_slots=num_slots)
    queues = SimpleNamespace(free=Queue(), learner=[Queue()], workers=[Queue() for _ in range(workers)])
    return state, queues, Healer(SimpleNamespace(max_restarts_per_hour=2), state, queues, frames_per_step=4)


def test_dead_worker_slots_go_to_the_free_list_and_a_dead_learners_back_to_its_queue():
    state, queues, healer = _slots_state()
    owner = state.slot_owner_np
    owner[:] = SLOT_FREE
    queues.free.put_many([0, 1, 2])
    owner[[3, 4, 5]] = 1                 # worker 1: 3 and 4 its agents' current slots at steps 5 and 2, 5 full unsent
    owner[[6, 7]] = slot_queued(0)       # on the learner's queue
    queues.learner[0].put_many([6, 7])
    owner[[8, 9]] = slot_held(0)         # taken by the learner
    owner[[10, 11]] = 0                  # worker 0's
    env_slots = np.array([[3, 5], [4, 2]])
    assert healer.reclaim_worker_slots(1, env_slots, rollout=8) == (5 + 2 + 8) * 4
    assert healer.requeue_learner_slots(0) == 2
    assert sorted(queues.free.get_many(timeout=0.1)) == [0, 1, 2, 3, 4, 5]
    assert sorted(queues.learner[0].get_many(timeout=0.1)) == [6, 7, 8, 9]
    assert owner[[3, 4, 5]].tolist() == [SLOT_FREE] * 3 and owner[[8, 9]].tolist() == [slot_queued(0)] * 2


def test_slot_audit_finds_lost_and_duplicated_slots():
    state, queues, _ = _slots_state(num_slots=6)
    owner = state.slot_owner_np
    owner[:] = [SLOT_FREE, SLOT_FREE, slot_queued(0), 0, slot_held(0), SLOT_FREE]
    queues.free.put_many([0, 1])
    queues.learner[0].put_many([2])
    assert audit_slots(state, queues, 6).endswith("1 lost (marked queued, on no queue: killed between the two)")
    queues.free.put_many([0, 1, 5, 5])
    queues.learner[0].put_many([2])
    assert audit_slots(state, queues, 6).endswith("1 duplicated")
    queues.free.put_many([0, 1, 5])
    queues.learner[0].put_many([2])
    assert audit_slots(state, queues, 6).endswith("every slot accounted for exactly once")


def test_crash_loop_limit_counts_per_kind():
    _, _, healer = _slots_state()
    assert healer.allowed("learner")
    healer.record("learner")
    healer.record("learner")
    assert not healer.allowed("learner") and healer.allowed("rollout_worker")
    healer.recent["learner"][0] -= 3601  # an hour ago: no longer counts
    assert healer.allowed("learner")


def test_weights_a_learner_died_writing():
    """A learner killed half-way through a publish leaves seq odd: readers keep their weights (no spinning), and its
    replacement's publish makes the weights readable again."""
    model = torch.nn.Linear(3, 2)
    shared = SharedWeights(model)
    shared.publish(model, 5)
    reader = torch.nn.Linear(3, 2)
    assert shared.load_into(reader, -1) == 5
    shared.counters[0] += 1  # the writer died after "odd: writing"
    shared.counters[1] = 6   # (a version it never finished)
    t0 = time.monotonic()
    assert shared.load_into(reader, 5) == 5 and shared.load_into(torch.nn.Linear(3, 2), -1) == -1
    assert time.monotonic() - t0 < 1.0
    with torch.no_grad():
        model.weight.fill_(0.5)
    shared.publish(model, 7)  # the replacement
    assert int(shared.counters[0]) % 2 == 0 and shared.load_into(reader, 5) == 7
    assert torch.equal(reader.weight, model.weight)


# --- end-to-end ---

def _last(pattern: str, text: str, default=0) -> int:
    found = re.findall(pattern, text)
    return int(found[-1]) if found else default


def _progress(log) -> tuple[int, int]:
    text = log.read_text()
    return _last(r"Total num frames: (\d+)", text), _last(r"Policy version: (\d+)", text)


def _kill_and_wait_for_progress(log, name: str, sig=signal.SIGKILL, restarts_before: int = 0) -> None:
    """Kill `name`, wait for its replacement, then for frames and policy versions to move past where they were."""
    frames, version = _progress(log)
    pid = child_pids(log)[name]
    os.kill(pid, sig)
    wait_for(lambda: log.read_text().count(f"Restarted {name} (pid ") > restarts_before, 60, f"{name} to be replaced")
    new_pid = child_pids(log)[name]
    assert new_pid != pid and psutil.pid_exists(new_pid)
    if sig == signal.SIGSTOP:
        wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 10,
                 "the stopped process to be killed")
    wait_for(lambda: all(a > b for a, b in zip(_progress(log), (frames, version))), 90,
             f"frames and versions to increase after {name} was replaced", log)


def _stop(p, log) -> str:
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=30)
    text = log.read_text()
    assert rc == 0, text[-4000:]
    return text


def test_each_process_kind_killed_once_the_run_goes_on(tmp_path):
    log = tmp_path / "log.txt"
    p = start_train(train_args(tmp_path, "test_corridor", "--num_workers", "2", "--train_for_seconds", "600",
                               "--save_every_sec", "2"), log)
    try:
        wait_for(lambda: _progress(log)[1] > 0 and "Saved checkpoint" in log.read_text(), 120, "training to start", log)
        first = child_pids(log)
        for name in ("rollout_worker_0", "policy_worker_0", "learner"):
            _kill_and_wait_for_progress(log, name)
        version_before_stop = _progress(log)[1]
        text = _stop(p, log)
    finally:
        p.kill()
    for name in ("rollout_worker_0", "policy_worker_0", "learner"):
        assert re.search(rf"Restarted {name} \(pid \d+\) after it was killed by SIGKILL: restart 1 of", text), name
    replacement = re.search(r"Replacement learner: weights of the last SGD step \(version (\d+)\), optimizer state of "
                            r"the latest checkpoint \(version \d+\); policy version (\d+)", text)
    assert replacement and int(replacement.group(2)) == int(replacement.group(1)) + 1  # versions go on
    assert "Faults: 3 restarts (rollout workers 1, policy workers 1, learners 1)" in text
    assert re.search(r"Slot audit: \d+ slots, .*: every slot accounted for exactly once", text), text[-3000:]
    state = CheckpointManager(tmp_path / "e2e").load("latest")  # the final checkpoint loads, newer than the kills
    assert state["policy_version"] >= version_before_stop > int(replacement.group(2))
    scalars = read_event_scalars(tmp_path / "e2e")
    for kind in ("rollout_worker", "policy_worker", "learner"):
        assert scalars[f"faults/restarts_{kind}"][-1][1] == 1.0, kind
    for pid in [*first.values(), *child_pids(log).values()]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _start(tmp_path, log, *extra):
    """A long test_corridor run of 2 rollout workers, returned once it trained."""
    p = start_train(train_args(tmp_path, "test_corridor", "--num_workers", "2", "--train_for_seconds", "600", *extra), log)
    try:
        wait_for(lambda: _progress(log)[1] > 0, 120, "training to start", log)
    except BaseException:
        p.kill()
        raise
    return p


def test_hung_policy_worker_is_killed_and_replaced(tmp_path):
    log = tmp_path / "log.txt"
    p = _start(tmp_path, log, "--stall_timeout_sec", "4")
    try:
        _kill_and_wait_for_progress(log, "policy_worker_0", signal.SIGSTOP)
        text = _stop(p, log)
    finally:
        p.kill()
    assert "policy_worker_0 gave no sign of life for " in text and "it is stuck; killing and replacing it" in text
    assert re.search(r"Restarted policy_worker_0 \(pid \d+\) after it gave no sign of life for \d+ s "
                     r"\(--stall_timeout_sec 4\)", text)


def test_crash_loop_stops_the_run(tmp_path):
    log = tmp_path / "log.txt"
    p = _start(tmp_path, log, "--max_restarts_per_hour", "2")
    try:
        for k in range(2):
            _kill_and_wait_for_progress(log, "rollout_worker_1", restarts_before=k)
        os.kill(child_pids(log)["rollout_worker_1"], signal.SIGKILL)
        rc = p.wait(timeout=30)
    finally:
        p.kill()
    text = log.read_text()
    assert rc == 1, text[-3000:]
    assert re.search(r"rollout_worker_1 was killed by SIGKILL: 2 rollout workers died within the last hour "
                     r"\(--max_restarts_per_hour 2\), a crash loop; stopping the run", text)
    assert "Saved final checkpoint" in text


@pytest.mark.doom
def test_doom_run_survives_a_kill_of_each_process_kind(tmp_path):
    """doom_basic: a rollout worker SIGKILLed: its VizDoom engines (adopted by the runner) die with their shared memory,
    and its replacement's engines play on; then the policy worker and the learner: the run goes on each time."""
    pytest.importorskip("vizdoom")
    shm_before = shm_files()
    log = tmp_path / "log.txt"
    p = start_train(["--env", "doom_basic", "--experiment", "e2e", "--train_dir", str(tmp_path), "--num_workers", "2",
                     "--num_envs_per_worker", "2", "--hidden_size", "32", "--report_interval_sec", "1",
                     "--train_for_seconds", "600", "--device", "cpu"], log)
    try:
        wait_for(lambda: _progress(log)[1] > 0, 150, "training to start", log)
        worker = psutil.Process(child_pids(log)["rollout_worker_1"])
        engines = [c for c in worker.children() if c.name() == "vizdoom"]
        assert len(engines) == 2, engines
        files = engine_files(engines)
        _kill_and_wait_for_progress(log, "rollout_worker_1")
        wait_for(lambda: not any(e.is_running() and e.status() != psutil.STATUS_ZOMBIE for e in engines), 15,
                 "the dead worker's engines to exit")
        wait_for(lambda: not files & shm_files(vizdoom=True), 10, "their shared memory to be removed")
        replacement = psutil.Process(child_pids(log)["rollout_worker_1"])
        wait_for(lambda: len([c for c in replacement.children() if c.name() == "vizdoom"]) == 2, 30,
                 "the replacement's engines")
        for name in ("policy_worker_0", "learner"):
            _kill_and_wait_for_progress(log, name)
        text = _stop(p, log)
    finally:
        p.kill()
    assert "every slot accounted for exactly once" in text
    assert "Faults: 3 restarts (rollout workers 1, policy workers 1, learners 1)" in text
    wait_for(lambda: shm_files() <= shm_before, 10, "no shared memory left")
