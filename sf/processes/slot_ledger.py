"""The slot hand-over protocol, one process's side: where each trajectory slot is (SharedState.slot_owner), the moves
that change it (SharedState.moving, a learner's SharedState.released) and the runner's census (SharedState.census).

A move is the moment a slot's mark and its place may disagree: between taking slots off a queue and marking them its
own, or between marking them for a queue and putting them there. A process opens a move (its counter odd), checks the
census flag, moves slots only if no census runs, and closes the move (even) whatever happens inside it. A process
SIGKILLed inside a move leaves its counter odd: the runner then counts the slots (sf/runner/health/healing.py), which
it may do only once no live process is inside a move (it raises the flag and waits for every odd counter of the living
to turn even), and puts every slot found off the queue its mark names on that queue.

    with ledger.move(wait=CENSUS_PAUSE_SEC) as ok:     # moving[row] odd inside, even after (the body may raise)
        if ok:                                         # False while the runner counts slots: move nothing
            slot = free.get_nowait()                   # queue op, then mark (a take) ...
            ledger.owner[slot] = me                    # ... or mark, then queue op (a hand-over)
    # left without moving (a census ran): slept `wait` seconds, so that a caller's retry loop lets the census finish

A learner returning a copied-out batch's slots to the free list opens its move with the store that counts their frames
as copied out (`releasing`, SharedState.released = 2 x frames + 1): a learner killed at any point of it takes with it
exactly the frames of the batches it copied out and did not train on.
"""
from __future__ import annotations

import contextlib
import time

CENSUS_PAUSE_SEC = 0.002  # a move the census kept from opening waits this long: the census takes milliseconds


class SlotLedger:
    """One process's view of the slot protocol: its row of SharedState.moving (the row of its heartbeat) and, for the
    learner of `policy`, that policy's SharedState.released."""

    def __init__(self, shared_state, name: str, policy: int | None = None):
        """name: the process's name (SharedState.heartbeat_names()); policy: set for a learner (release moves)."""
        self.owner = shared_state.slot_owner_np  # [N] int32: each slot's mark (shared_state.py: the codes)
        self._moving, self._census = shared_state.moving_np, shared_state.census_np
        self._released = shared_state.released_np
        self.row, self.policy = shared_state.heartbeat_slot(name), policy
        self.released_frames = 0  # (a learner) frames copied out of slots and returned: SharedState.released / 2

    def move(self, wait: float | None = None) -> "Move":
        """A move of slots: `with ledger.move(wait) as ok:` (see Move)."""
        return Move(self._moving, self.row, self._census, wait)

    def start_released(self, frames: int) -> None:
        """A learner's start: `frames` trained, none copied out and untrained (SharedState.released = 2 x frames)."""
        self.released_frames = frames
        self._released[self.policy] = 2 * frames

    @contextlib.contextmanager
    def releasing(self, frames: int):
        """A learner's move returning the slots of copied-out trajectories of `frames` env frames: opened by the store
        that counts them as copied out (SharedState.released odd), once no census runs (it waits CENSUS_PAUSE_SEC
        between tries); closed (even) after the body. A body that raises leaves it open: the learner dies with it, and
        the runner's reclaim frees the slots it still held (sf/runner/health/healing.py)."""
        released, p = self._released, self.policy
        before, after = self.released_frames, self.released_frames + frames
        while True:
            released[p] = 2 * after + 1
            if not self._census[0]:
                break
            released[p] = 2 * before  # the runner counts slots: not yet
            time.sleep(CENSUS_PAUSE_SEC)
        self.released_frames = after
        yield
        released[p] = 2 * after


class Move:
    """One move of slots (a class, not a generator: rollout workers open one for every trajectory, and this costs a
    third). `with` gives whether slots may move (False while the runner counts them). The counter is odd from before
    the census flag is read until the body ends, however it ends (an exception propagates after the move is closed).
    A move the census kept from moving sleeps `wait` seconds once closed (None: it returns at once)."""
    __slots__ = ("moving", "row", "census", "wait", "ok")

    def __init__(self, moving, row: int, census, wait: float | None):
        self.moving, self.row, self.census, self.wait = moving, row, census, wait

    def __enter__(self) -> bool:
        self.moving[self.row] += 1
        self.ok = not self.census[0]
        return self.ok

    def __exit__(self, exc_type, exc, tb) -> None:
        self.moving[self.row] += 1
        if exc_type is None and not self.ok and self.wait is not None:
            time.sleep(self.wait)
