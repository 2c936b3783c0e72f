"""Self-healing (issue 18): a dead process is replaced in place and the run goes on.

In-process: voided requests are dropped unanswered and asked again; a dead worker's slots go back to the free list, a
dead learner's to its queue; the census puts slots left inside a move (each window of the slot protocol) where their
marks say, waits for live moves and stops new ones; lost frames are the steps in a dead worker's slots and a dead
learner's copied-out batches; the slot audit finds a lost and a duplicated slot; weights a learner died writing.
End-to-end (train.py in a subprocess): each process kind SIGKILLed once in one run, kills at pause points inside the
slot protocol (sf/processes/pause_points.py), a hung policy worker (SIGSTOP) replaced by the watchdog, a crash loop
stopping the run, a Doom worker killed with its engines.
"""
import os
import re
import signal
import threading
import time
from pathlib import Path
from queue import Empty

import numpy as np
import psutil
import pytest
import torch

from sf.buffers.shared_weights import SharedWeights
from sf.ipc import Queue
from sf.learning.checkpoint_store import CheckpointManager
from sf.processes.shared_state import SLOT_FREE, SharedState, slot_held, slot_queued
from sf.processes.slot_ledger import SlotLedger
from sf.runner.health.healing import Healer, audit_slots
from sf.runner.stats import read_event_scalars
from sf.sampling.rollout_worker import RolloutWorker
from types import SimpleNamespace

from e2e_helpers import child_pids, engine_files, shm_files, start_train, train_args, wait_for
from sampling_helpers import Run


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


def _on(queue) -> list:
    try:
        return sorted(int(s) for s in queue.get_many(timeout=0.1))
    except Empty:
        return []


NOBODY = set  # alive(): no other process is alive


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
    agent_slots = np.array([[3, 5], [4, 2]])
    out = healer.reclaim_worker_slots(1, agent_slots, rollout=8, alive=NOBODY)
    assert (out.freed, out.lost_frames, out.mid_move) == (3, (5 + 2 + 8) * 4, 0)
    assert agent_slots[:, 0].tolist() == [-1, -1]  # its entries no longer name slots it holds
    out = healer.reclaim_learner_slots(0, "learner", alive=NOBODY)
    assert (out.requeued, out.freed, out.lost_frames) == (2, 0, 0)
    assert _on(queues.free) == [0, 1, 2, 3, 4, 5]
    assert _on(queues.learner[0]) == [6, 7, 8, 9]
    assert owner[[3, 4, 5]].tolist() == [SLOT_FREE] * 3 and owner[[8, 9]].tolist() == [slot_queued(0)] * 2


def test_census_puts_slots_left_inside_a_move_where_their_marks_say():
    """Each window of the slot protocol where a mark and a place disagree, left by a kill: a rollout worker that took a
    slot off the free list and had not marked it (2), one that marked trajectories for the learner and had not put them
    on its queue (3, 4); a learner that took trajectories and had not marked them held (5), one that marked a batch
    FREE and had not put it back (6, 7). The census puts each where its mark says; the audit then finds all in place."""
    state, queues, healer = _slots_state(num_slots=10)
    owner = state.slot_owner_np
    owner[:] = [SLOT_FREE, SLOT_FREE, SLOT_FREE, slot_queued(0), slot_queued(0), slot_queued(0), SLOT_FREE, SLOT_FREE,
                0, slot_held(0)]
    queues.free.put_many([0, 1])
    state.moving_np[state.heartbeat_slot("rollout_worker_1")] = 7  # died inside a move
    assert healer.census(NOBODY) == 6
    assert _on(queues.free) == [0, 1, 2, 6, 7] and _on(queues.learner[0]) == [3, 4, 5]
    assert state.census_np[0] == 0
    queues.free.put_many([0, 1, 2, 6, 7])
    queues.learner[0].put_many([3, 4, 5])
    assert audit_slots(state, queues, 10).endswith("every slot accounted for exactly once")


def test_census_waits_for_live_moves_and_stops_new_ones():
    """A live process inside a move (here a thread standing for a rollout worker that marked a slot queued and puts it
    70 ms later) is waited for, not taken for a dead one: its slot ends up on the queue once. While the census runs,
    a rollout worker opens no move: it keeps its finished trajectories and takes no free slot."""
    state, queues, healer = _slots_state(num_slots=4)
    owner, row = state.slot_owner_np, state.heartbeat_slot("rollout_worker_0")
    owner[:] = [slot_queued(0), 0, SLOT_FREE, SLOT_FREE]
    queues.free.put_many([2, 3])
    state.moving_np[row] = 1

    def live_worker():
        time.sleep(0.07)
        queues.learner[0].put_many([0])
        state.moving_np[row] = 2

    thread = threading.Thread(target=live_worker)
    thread.start()
    assert healer.census(lambda: {"rollout_worker_0"}) == 0
    assert state.moving_np[row] == 2  # it returned only once the move had ended
    thread.join()
    assert _on(queues.learner[0]) == [0] and _on(queues.free) == [2, 3]
    queues.free.put_many([2, 3])
    worker = SimpleNamespace(ledger=SlotLedger(state, "rollout_worker_0"), worker_idx=0,
                             outbox=SimpleNamespace(finished=[[1]]), learner_queues=queues.learner, queues=queues,
                             agent_slots=np.zeros((1, 2), int))
    state.census_np[0] = 1  # a census runs
    RolloutWorker._send_finished(worker)
    assert RolloutWorker._move_free_slot(worker, 0, None) is None
    assert worker.outbox.finished == [[1]] and owner[1] == 0 and _on(queues.learner[0]) == []
    assert state.moving_np[row] % 2 == 0
    state.census_np[0] = 0
    RolloutWorker._send_finished(worker)
    assert RolloutWorker._move_free_slot(worker, 0, None) == 2 and owner[[1, 2]].tolist() == [slot_queued(0), 0]
    assert _on(queues.learner[0]) == [1] and worker.agent_slots[0].tolist() == [2, 0]


def test_census_gives_up_on_a_process_stuck_inside_a_move(monkeypatch):
    """A live process that never leaves its move (stopped there): after CENSUS_WAIT_SEC the census moves nothing and
    lets the others move slots again. Here a population's learner of policy 1, inside a take, then inside a return."""
    monkeypatch.setattr("sf.runner.health.healing.CENSUS_WAIT_SEC", 0.05)
    state = SharedState(2, num_policies=2, num_slots=2)
    queues = SimpleNamespace(free=Queue(), learner=[Queue(), Queue()])
    healer = Healer(SimpleNamespace(max_restarts_per_hour=2), state, queues, frames_per_step=1)
    state.slot_owner_np[:] = [slot_queued(1), SLOT_FREE]
    state.moving_np[state.heartbeat_slot("learner_p1")] = 1
    assert healer.census(lambda: {"learner_p1", "rollout_worker_0"}) is None
    state.moving_np[state.heartbeat_slot("learner_p1")] = 2
    state.released_np[1] = 2 * 640 + 1
    assert healer.census(lambda: {"learner_p1"}) is None
    assert healer.census(lambda: {"learner_p0", "rollout_worker_1"}) == 2  # (dead: its slots put where marked)
    assert state.census_np[0] == 0 and _on(queues.learner[1]) == [0] and _on(queues.free) == [1]


def test_dead_learner_loses_exactly_the_batches_it_copied_out_and_did_not_train():
    """Frames copied out (SharedState.released / 2) minus frames trained: two batches of 8 x 8 frames; killed while it
    returned the second batch's slots (released odd), the slots it still held are that batch's: freed, not queued
    again (their frames are counted lost already). Its replacement starts from frames trained."""
    state, queues, healer = _slots_state(num_slots=12)
    owner = state.slot_owner_np
    owner[:] = SLOT_FREE
    owner[[0, 1]] = slot_held(0)
    state.learner[0, 0] = 1000.0  # frames trained (ENV_STEPS)
    state.released_np[0] = 2 * (1000 + 2 * 64) + 1
    queues.free.put_many(list(range(2, 12)))
    out = healer.reclaim_learner_slots(0, "learner", alive=NOBODY)
    assert (out.lost_frames, out.freed, out.requeued, out.mid_move) == (128, 2, 0, 0)
    assert state.released_np[0] == 2000 and _on(queues.learner[0]) == [] and len(_on(queues.free)) == 12


def test_slot_audit_finds_lost_and_duplicated_slots():
    state, queues, _ = _slots_state(num_slots=6)
    owner = state.slot_owner_np
    owner[:] = [SLOT_FREE, SLOT_FREE, slot_queued(0), 0, slot_held(0), SLOT_FREE]
    queues.free.put_many([0, 1])
    queues.learner[0].put_many([2])
    assert audit_slots(state, queues, 6).endswith("1 lost (marked for a queue, on none: left inside a move)")
    queues.free.put_many([0, 1, 5, 5])
    queues.learner[0].put_many([2])
    assert audit_slots(state, queues, 6).endswith("1 duplicated")
    queues.free.put_many([0, 1, 5])
    queues.learner[0].put_many([2])
    assert audit_slots(state, queues, 6).endswith("every slot accounted for exactly once")


class _Killed(Exception):
    pass


def test_dead_worker_loses_exactly_the_steps_in_its_slots(tmp_path, monkeypatch):
    """A rollout worker dies inside a group step, at agent 0's trajectory end (it took agent 0's next slot; agent 1,
    same group, has not made this step; agents 2-3 are the other group's): the frames counted lost are the steps
    recorded in the slots it held, counted here from the buffers (dones rows written)."""
    def pause(point):
        if point == "rollout_worker_trajectory_end":
            raise _Killed
    monkeypatch.setattr("sf.sampling.rollout_worker.PAUSE_AT", {"rollout_worker_trajectory_end"})
    monkeypatch.setattr("sf.sampling.rollout_worker.pause", pause)
    run = Run(tmp_path, envs=4, rollout=8)
    try:
        run.buffers.dones.fill_(-1.0)  # (no slot is used twice before the first trajectory end)
        with pytest.raises(_Killed):
            for _ in range(200):
                run.step()
        owner = run.state.slot_owner_np
        slots = np.flatnonzero(owner == 0)
        recorded = int((run.buffers.dones[slots] != -1).sum())
        assert len(slots) == 5 and recorded >= 8 + 7  # agent 0's full slot and its new one, agent 1 at 7 steps, ...
        healer = Healer(SimpleNamespace(max_restarts_per_hour=2), run.state, SimpleNamespace(free=run.queues.free),
                        frames_per_step=1)
        out = healer.reclaim_worker_slots(0, run.env_slots[0].numpy(), 8, NOBODY)
        assert (out.freed, out.lost_frames) == (5, recorded)
    finally:
        run.close()


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


@pytest.mark.e2e
def test_each_process_kind_killed_once_the_run_goes_on(tmp_path):
    log = tmp_path / "log.txt"
    p = start_train(train_args(tmp_path, "test_corridor", "--num_workers", "2", "--train_for_seconds", "600",
                               "--save_every_sec", "2"), log)
    try:
        wait_for(lambda: _progress(log)[1] > 0 and "Saved checkpoint" in log.read_text(), 120, "training to start", log)
        first = child_pids(log)
        for name in ("rollout_worker_0", "policy_worker_0", "learner"):
            _kill_and_wait_for_progress(log, name)
        # a report written between the kill and the replacement's first step shows the dead learner's version, below
        # the replacement's: wait for one past it (seen on a loaded machine)
        started_at = int(re.search(r"Replacement learner: .*; policy version (\d+)", log.read_text()).group(1))
        wait_for(lambda: _progress(log)[1] > started_at, 90, "a version past the replacement learner's first", log)
        version_before_stop = _progress(log)[1]
        text = _stop(p, log)
    finally:
        p.kill()
    for name in ("rollout_worker_0", "policy_worker_0", "learner"):
        assert re.search(rf"Restarted {name} \(pid \d+\) after it was killed by SIGKILL: restart 1 of", text), name
    # the kill lands while the learner trains (its last SGD step's weights taken over) or, on a small model that
    # publishes after every short step, while it writes them (then they are torn: the latest checkpoint's instead)
    replacement = re.search(r"Replacement learner: weights of (?:the last SGD step \(version (\d+)\)|the latest "
                            r"checkpoint \(the learner died writing its weights\)), optimizer state of the latest "
                            r"checkpoint \(version (\d+)\); policy version (\d+)", text)
    assert replacement, text[-4000:]
    published, checkpoint, new_version = replacement.groups()
    if published is not None:
        assert int(new_version) == int(published) + 1  # versions go on
    else:
        assert int(new_version) > int(checkpoint)  # past every version the actors may have seen (_take_over)
    assert "Faults: 3 restarts (rollout workers 1, policy workers 1, learners 1)" in text
    assert re.search(r"Slot audit: \d+ slots, .*: every slot accounted for exactly once", text), text[-3000:]
    state = CheckpointManager(tmp_path / "e2e").load("latest")  # the final checkpoint loads, newer than the kills
    assert state["policy_version"] >= version_before_stop > int(new_version)
    scalars = read_event_scalars(tmp_path / "e2e")
    for kind in ("rollout_worker", "policy_worker", "learner"):
        assert scalars[f"faults/restarts_{kind}"][-1][1] == 1.0, kind
    for pid in [*first.values(), *child_pids(log).values()]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _start(tmp_path, log, *extra):
    """A long test_corridor run of 2 rollout workers, returned once it trained."""
    p = start_train(train_args(tmp_path, "test_corridor", "--num_workers", "2", "--train_for_seconds", "600",
                               *extra), log)
    try:
        wait_for(lambda: _progress(log)[1] > 0, 120, "training to start", log)
    except BaseException:
        p.kill()
        raise
    return p


@pytest.mark.e2e
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


@pytest.mark.e2e
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


def _paused(pause_dir, point: str):
    """The pid of the process stopped at pause point `point` (sf/processes/pause_points.py), once it is stopped."""
    marker = pause_dir / point
    if not marker.exists() or not marker.read_text().strip():
        return None
    pid = int(marker.read_text())
    stat = Path(f"/proc/{pid}/stat").read_text()
    return pid if stat.rsplit(")", 1)[1].split()[0] == "T" else None  # T: stopped


@pytest.mark.e2e
def test_kills_inside_slot_moves_reclaim_at_once_and_count_lost_frames_exactly(tmp_path, monkeypatch):
    """Three kills at the hardest moments of the slot protocol (pause points: the process stops itself there), in one
    run of 3 rollout workers x 4 envs in one group each (--worker_num_splits 1: a worker's agents step together),
    rollout 8, frameskip 1, batches of 8 trajectories:
    - a rollout worker that marked its first 4 full trajectories queued for the learner and had not put them on the
      queue: they reach the learner (nothing lost), its 4 fresh slots return to the free list;
    - a rollout worker at agent 0's first trajectory end (agent 0 took its next slot; agents 1-3 made 7 steps): 8 +
      3 x 7 = 29 frames lost, 5 slots freed;
    - the learner after an SGD step of a batch while the next batch waits: two batches copied out and untrained,
      2 x 8 x 8 = 128 frames lost.
    Each death's slots are back in circulation with its replacement (its Restarted line); the end-of-run audit finds
    every slot once; faults/lost_frames and the Faults: line say 157."""
    pause_dir = tmp_path / "pauses"
    pause_dir.mkdir()
    monkeypatch.setenv("SF_TEST_PAUSE_DIR", str(pause_dir))
    monkeypatch.setenv("SF_TEST_PAUSE_AT",
                       "rollout_worker_queued,rollout_worker_trajectory_end,learner_two_batches_out")
    log = tmp_path / "log.txt"
    p = start_train(train_args(tmp_path, "test_corridor", "--num_workers", "3", "--worker_num_splits", "1",
                               "--num_epochs", "8", "--train_for_seconds", "600"), log)
    reports = lambda: log.read_text().count("Total num frames:")  # noqa: E731
    try:
        wait_for(lambda: (_paused(pause_dir, "rollout_worker_queued")
                          and _paused(pause_dir, "rollout_worker_trajectory_end")),
                 120, "two rollout workers to stop at their pause points", log)
        seen = reports()
        wait_for(lambda: reports() > seen, 30, "a report line (the runner saw the first weights)", log)
        names = {pid: name for name, pid in child_pids(log).items()}
        queued = names[_paused(pause_dir, "rollout_worker_queued")]
        ended = names[_paused(pause_dir, "rollout_worker_trajectory_end")]
        # first the one stopped inside a move: the census after the other kill would wait for it (alive, inside one)
        for name in (queued, ended):
            os.kill(child_pids(log)[name], signal.SIGKILL)
            wait_for(lambda: f"Restarted {name} (pid " in log.read_text(), 60, f"{name} to be replaced", log)
        wait_for(lambda: _paused(pause_dir, "learner_two_batches_out"), 120, "the learner to stop with two batches out",
                 log)
        os.kill(child_pids(log)["learner"], signal.SIGKILL)
        wait_for(lambda: "Restarted learner (pid " in log.read_text(), 60, "the learner to be replaced", log)
        _, version = _progress(log)
        wait_for(lambda: _progress(log)[1] > version, 90, "training to go on", log)
        text = _stop(p, log)
    finally:
        p.kill()
    assert re.search(rf"Restarted {queued} \(pid \d+\) after it was killed by SIGKILL: .*; slots: 4 freed, 4 it was "
                     r"moving put where their marks say; 0 env frames lost", text), text[-5000:]
    assert re.search(rf"Restarted {ended} \(pid \d+\) after it was killed by SIGKILL: .*; slots: 5 freed; 29 env "
                     r"frames lost", text), text[-5000:]
    assert re.search(r"Restarted learner \(pid \d+\) after it was killed by SIGKILL: .*; 128 env frames lost", text)
    assert "Faults: 3 restarts (rollout workers 2, policy workers 0, learners 1), 157 env frames lost" in text
    assert re.search(r"Slot audit: \d+ slots, .*: every slot accounted for exactly once", text), text[-3000:]
    assert read_event_scalars(tmp_path / "e2e")["faults/lost_frames"][-1][1] == 157.0


@pytest.mark.e2e
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
