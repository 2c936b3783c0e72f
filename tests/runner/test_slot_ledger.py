"""The slot hand-over protocol's process side (sf/processes/slot_ledger.py): a move's counter is odd exactly inside the
move and even after it, however the body ends; a census keeps moves from moving slots, and a move it kept waits its
`wait` once closed; a learner's release move is opened by the store of its frames, retried while a census runs, and
left open by a body that raises. Then the learner's batcher, which takes and returns slots through it. (The rollout
worker's moves, and the census itself: test_self_healing.py.)"""
from queue import Empty
from types import SimpleNamespace

import pytest

from sf.ipc import Queue
from sf.learning.batcher import Batcher
from sf.processes import slot_ledger
from sf.processes.shared_state import SLOT_FREE, SharedState, slot_held
from sf.processes.slot_ledger import CENSUS_PAUSE_SEC, SlotLedger


def _ledger(name="rollout_worker_1", policy=None):
    state = SharedState(2, num_policies=2, num_slots=6)
    return state, SlotLedger(state, name, policy)


@pytest.fixture
def sleeps(monkeypatch):
    """time.sleep in the ledger, recorded (seconds) instead of slept."""
    calls = []
    monkeypatch.setattr(slot_ledger.time, "sleep", calls.append)
    return calls


def test_a_move_is_odd_exactly_inside_it_on_its_own_row(sleeps):
    state, ledger = _ledger()
    row = state.heartbeat_slot("rollout_worker_1")
    assert ledger.row == row and state.moving_np.tolist() == [0] * len(state.moving_np)
    for _ in range(2):
        with ledger.move(wait=0.5) as ok:
            assert ok and state.moving_np[row] % 2 == 1
            others = [m for r, m in enumerate(state.moving_np.tolist()) if r != row]
            assert others == [0] * len(others)  # (other processes' rows untouched)
        assert state.moving_np[row] % 2 == 0
    assert state.moving_np[row] == 4 and sleeps == []  # a move that moved does not wait


@pytest.mark.parametrize("error", [Empty, ValueError])
def test_a_move_whose_body_raises_is_closed_and_the_error_goes_on(sleeps, error):
    state, ledger = _ledger()
    with pytest.raises(error):
        with ledger.move(wait=0.5):
            raise error()
    assert state.moving_np[ledger.row] == 2 and sleeps == []


def test_a_move_returning_from_its_body_is_closed():
    state, ledger = _ledger()

    def take():
        with ledger.move() as ok:
            if ok:
                return state.moving_np[ledger.row] % 2
        return None
    assert take() == 1 and state.moving_np[ledger.row] == 2


def test_a_census_blocks_moves_and_a_blocked_move_waits_once_closed(monkeypatch):
    """While the census flag is up a move opens and closes (the runner sees it was not inside one) without moving
    anything; with `wait` it then sleeps (after closing: the census is not kept waiting), without it returns at once."""
    state, ledger = _ledger()
    state.census_np[0] = 1
    seen = []
    monkeypatch.setattr(slot_ledger.time, "sleep", lambda s: seen.append((s, int(state.moving_np[ledger.row]))))
    with ledger.move(wait=CENSUS_PAUSE_SEC) as ok:
        assert not ok and state.moving_np[ledger.row] == 1
    with ledger.move() as ok:
        assert not ok
    assert seen == [(CENSUS_PAUSE_SEC, 2)] and state.moving_np[ledger.row] == 4
    state.census_np[0] = 0
    with ledger.move(wait=CENSUS_PAUSE_SEC) as ok:
        assert ok
    assert len(seen) == 1


def test_release_move_is_opened_by_the_frames_store_and_waits_for_a_census(monkeypatch):
    """released = 2 x frames copied out: odd (2 x the new total + 1) inside the move; while a census runs the store is
    taken back (2 x the old total) and tried again after CENSUS_PAUSE_SEC."""
    state, ledger = _ledger("learner_p1", policy=1)
    ledger.start_released(100)
    assert state.released_np.tolist() == [0, 200] and ledger.released_frames == 100
    state.census_np[0] = 1
    seen = []

    def sleep(seconds):
        seen.append((seconds, int(state.released_np[1])))
        if len(seen) == 2:
            state.census_np[0] = 0  # the census ended
    monkeypatch.setattr(slot_ledger.time, "sleep", sleep)
    with ledger.releasing(64):
        assert state.released_np[1] == 2 * 164 + 1 and ledger.released_frames == 164
    assert seen == [(CENSUS_PAUSE_SEC, 200)] * 2 and state.released_np.tolist() == [0, 328]
    assert state.moving_np.tolist() == [0] * len(state.moving_np)  # (its own counter: released)


def test_a_release_whose_body_raises_stays_open():
    """The learner dies with the error: the runner finds released odd and frees the slots it still held."""
    state, ledger = _ledger("learner_p1", policy=1)
    ledger.start_released(10)
    with pytest.raises(RuntimeError):
        with ledger.releasing(5):
            raise RuntimeError("put failed")
    assert state.released_np[1] == 2 * 15 + 1


# --- the learner's batcher, through the ledger ---
def _batcher(state, trajs_per_batch=2):
    queues = SimpleNamespace(learner=Queue(), free=Queue())
    ledger = SlotLedger(state, "learner_p1", policy=1)
    schedule = SimpleNamespace(order_batch=lambda pending: None)
    return queues, Batcher(None, queues, ledger, "cpu", 1, trajs_per_batch, frames_per_traj=8, masks_steps=False,
                           schedule=schedule, frees_slots=True)


def test_batcher_takes_slots_marked_held_in_one_move_and_none_while_a_census_runs(sleeps):
    state = SharedState(2, num_policies=2, num_slots=6)
    queues, batcher = _batcher(state)
    row = batcher.ledger.row
    try:
        assert batcher._take(timeout=0.0) == [] and state.moving_np[row] == 2 and sleeps == []  # (queue.Empty)
        queues.learner.put_many([4, 2, 5])
        state.census_np[0] = 1
        assert batcher._take(timeout=1.0) == [] and state.moving_np[row] == 4
        assert sleeps == [CENSUS_PAUSE_SEC]  # min(timeout, the pause)
        assert batcher._take(timeout=0.0) == [] and sleeps == [CENSUS_PAUSE_SEC, 0.0]
        state.census_np[0] = 0
        assert batcher._take(timeout=1.0) == [4, 2]  # (what the batch lacks)
        assert state.slot_owner_np[[4, 2, 5]].tolist() == [slot_held(1), slot_held(1), SLOT_FREE]
        assert state.moving_np[row] == 8
        batcher._release([4, 2])
        assert state.slot_owner_np[[4, 2]].tolist() == [SLOT_FREE] * 2 and queues.free.get_many(timeout=1.0) == [4, 2]
        assert state.released_np[1] == 2 * 16 and batcher.ledger.released_frames == 16
    finally:
        queues.learner.close()
        queues.free.close()
