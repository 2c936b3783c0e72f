"""Self-healing: what the runner does when a process of the run dies, so that a replacement can take its place while
every other process goes on.

What a dead process leaves behind, and how it is made whole (SharedState holds the shared parts):
- requests for actions in flight: a dead rollout worker's would make policy workers write into slots it no longer
  owns; those a dead policy worker had taken would never be answered. `void_requests` bumps the epoch of the rollout
  workers concerned (policy workers drop requests of a voided epoch), `wait_for_policy_workers` waits until no policy
  worker still serves a batch begun before, `release` lets the workers ask again in the new epoch;
- trajectory slots (SharedState.slot_owner): a dead rollout worker's, full or partly filled, go back to the free list
  unread (its frames are lost and counted); the slots a dead learner had taken from its queue go back to that queue for
  its replacement (nothing lost);
- its env engines (adopted by the runner as a subreaper): killed by the runner, their shared memory removed.

Crash loops: more than --max_restarts_per_hour deaths of one process kind within the last hour end the run.
"""
from __future__ import annotations

import collections
import re
import signal
import time
from queue import Empty

import numpy as np

from sf.processes.shared_state import SLOT_FREE, slot_held, slot_queued

KINDS = ("rollout_worker", "policy_worker", "learner")
SERVING_WAIT_SEC = 10.0  # a policy worker's batch takes milliseconds; one stuck longer is the stall watchdog's business


def process_kind(name: str) -> str:
    """rollout_worker_3 -> rollout_worker, policy_worker_p1_0 -> policy_worker, learner_p2 / learner -> learner."""
    return re.sub(r"(_p\d+)?(_\d+)?$", "", name)


def exit_cause(exitcode: int | None) -> str:
    """How a process ended, for a log line: 'was killed by SIGKILL', 'exited with code 1'."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class Healer:
    def __init__(self, cfg, state, queues, frames_per_step: int):
        """frames_per_step: env frames of one agent step (frameskip)."""
        self.cfg, self.state, self.queues = cfg, state, queues
        self.frames_per_step = frames_per_step
        self.max_per_hour = cfg.max_restarts_per_hour
        self.recent: dict[str, collections.deque] = {kind: collections.deque() for kind in KINDS}
        self.totals: collections.Counter = collections.Counter()
        self.lost_frames = 0

    # --- crash loops ---
    def allowed(self, kind: str) -> bool:
        """True if one more restart of `kind` stays within --max_restarts_per_hour."""
        recent, now = self.recent[kind], time.monotonic()
        while recent and now - recent[0] > 3600.0:
            recent.popleft()
        return len(recent) < self.max_per_hour

    def record(self, kind: str, lost_frames: int = 0) -> int:
        """Count a restart of `kind`; returns the restarts of that kind within the hour."""
        self.recent[kind].append(time.monotonic())
        self.totals[kind] += 1
        self.lost_frames += lost_frames
        return len(self.recent[kind])

    def scalars(self) -> dict[str, float]:
        """TensorBoard's faults/ series: restarts per process kind, env frames lost."""
        return {**{f"restarts_{kind}": float(self.totals[kind]) for kind in KINDS}, "lost_frames": float(self.lost_frames)}

    def summary(self) -> str:
        return (f"{sum(self.totals.values())} restarts (rollout workers {self.totals['rollout_worker']}, policy workers "
                f"{self.totals['policy_worker']}, learners {self.totals['learner']}), {self.lost_frames} env frames lost")

    # --- requests in flight ---
    def void_requests(self, workers: list[int]) -> None:
        """Policy workers drop the requests these rollout workers sent so far."""
        self.state.epoch_np[workers] += 1

    def wait_for_policy_workers(self, rows: list[int]) -> bool:
        """Wait until none of the policy workers in `rows` (SharedState.serving rows of live ones) still serves a batch
        it began before the requests were voided; False if one is still at it after SERVING_WAIT_SEC."""
        time.sleep(0.002)  # a batch that began as the epoch changed has made its `serving` count visible by now
        before = self.state.serving_np[rows].copy()
        busy = [r for r, n in zip(rows, before) if n % 2]
        deadline = time.monotonic() + SERVING_WAIT_SEC
        while busy and time.monotonic() < deadline:
            time.sleep(0.001)
            busy = [r for r in busy if self.state.serving_np[r] == before[rows.index(r)]]
        return not busy

    def release(self, workers: list[int]) -> None:
        """These rollout workers may ask again, in their new epoch."""
        self.state.epoch_go_np[workers] = self.state.epoch_np[workers]

    def drop_replies(self, worker: int) -> None:
        """Empty a dead rollout worker's reply queue (replies to voided requests): its replacement's replies need room."""
        drain(self.queues.workers[worker])

    # --- trajectory slots ---
    def reclaim_worker_slots(self, worker: int, env_slots: np.ndarray, rollout: int) -> int:
        """Return every slot a dead rollout worker held to the free list (partly filled or full but not handed to a
        learner: never read); returns the env frames lost with them. env_slots: [E * A, C] its agents' (slot, t, ...)."""
        owner = self.state.slot_owner_np
        slots = np.flatnonzero(owner == worker)
        if len(slots) == 0:
            return 0
        steps = dict(zip(env_slots[:, 0].tolist(), env_slots[:, 1].tolist()))  # the agents' current slots and steps
        lost = sum(steps.get(s, rollout) for s in slots.tolist()) * self.frames_per_step
        owner[slots] = SLOT_FREE
        self.queues.free.put_many(slots.tolist())
        return lost

    def requeue_learner_slots(self, policy: int) -> int:
        """Give the trajectories a dead learner had taken from its queue back to that queue (for its replacement);
        returns how many."""
        owner = self.state.slot_owner_np
        slots = np.flatnonzero(owner == slot_held(policy))
        if len(slots):
            owner[slots] = slot_queued(policy)
            self.queues.learner[policy].put_many(slots.tolist())
        return len(slots)


def drain(queue) -> list[int]:
    """Every message on `queue` now (slot indices), taken off it."""
    out = []
    while True:
        try:
            out += [int(s) for s in queue.get_many_nowait()]
        except Empty:
            return out


def audit_slots(state, queues, num_slots: int) -> str:
    """After every process stopped: every slot is exactly once on the free list, on its learner's queue, or held by
    a rollout worker or learner (SharedState.slot_owner). Empties the queues it reads. Returns a one-line verdict."""
    owner = state.slot_owner_np
    seen = collections.Counter()
    problems = []
    for where, expected, slots in [("free list", SLOT_FREE, drain(queues.free)),
                                   *[(f"learner {p}'s queue", slot_queued(p), drain(q))
                                     for p, q in enumerate(queues.learner)]]:
        seen.update(slots)
        wrong = [s for s in slots if owner[s] != expected]
        if wrong:
            problems.append(f"{len(wrong)} on the {where} marked elsewhere")
    queued = {SLOT_FREE, *(slot_queued(p) for p in range(len(queues.learner)))}
    missing = [s for s in range(num_slots) if owner[s] in queued and s not in seen]
    duplicated = [s for s, n in seen.items() if n > 1]
    held = num_slots - sum(seen.values())
    if missing:
        problems.append(f"{len(missing)} lost (marked queued, on no queue: killed between the two)")
    if duplicated:
        problems.append(f"{len(duplicated)} duplicated")
    verdict = "; ".join(problems) if problems else "every slot accounted for exactly once"
    return (f"Slot audit: {num_slots} slots, {len(seen)} on the free list and learner queues, {held - len(missing)} "
            f"held by workers and learners: {verdict}")
