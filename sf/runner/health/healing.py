"""Self-healing: what the runner does when a process of the run dies, so that a replacement can take its place while
every other process goes on.

What a dead process leaves behind, and how it is made whole (SharedState holds the shared parts):
- requests for actions in flight: a dead rollout worker's would make policy workers write into slots it no longer
  owns; those a dead policy worker had taken would never be answered. `void_requests` bumps the epoch of the rollout
  workers concerned (policy workers drop requests of a voided epoch), `wait_for_policy_workers` waits until no policy
  worker still serves a batch begun before, `release` lets the workers ask again in the new epoch;
- trajectory slots (SharedState.slot_owner), at once, before the replacement starts: a dead rollout worker's own slots
  (its agents' partly filled ones, full ones not yet marked for a learner) go back to the free list unread; the slots a
  dead learner had taken and not copied out go back to its queue for its replacement. A process killed inside a move
  (SharedState.moving: between a queue operation and the marks that go with it) leaves slots off the queue their mark
  names. Then the census (`census`) stops every process from opening a move, waits until no live one is inside one,
  and puts every slot marked FREE or queued(p) that is on no queue on the queue its mark names: trajectories a worker
  had marked for a learner reach that learner, a slot taken off the free list and not yet marked returns to it, a
  batch's slots a learner had marked FREE return to the free list;
- its env engines (adopted by the runner as a subreaper): killed by the runner, their shared memory removed.

Lost frames (faults/lost_frames, the `Faults:` line, each `Restarted` line): env frames (agent steps x frameskip) that
rollout workers recorded in trajectory slots and that no learner will train on, because the process holding them died.
Exactly:
- a rollout worker: the steps in the slots it held: for each agent's current slot, the steps the worker published in
  env_slots (it publishes each step as it records it); for each of its other slots (a full trajectory not yet marked
  for a learner), `rollout` steps. (Its frame counter, the FPS, may not have counted the last of them yet.)
- a learner: the trajectories it copied out of shared memory (their slots returned to the free list) and did not
  finish training on: SharedState.released / 2 - learner[p, ENV_STEPS], i.e. the batch in training (a batch counts as
  trained once all its SGD steps are done) and the batch waiting for it;
- a policy worker: nothing (it holds no slot; the requests it took are asked again and their actions rewritten).
Not lost: trajectories a worker marked for a learner (on the queue or still inside the move), and those a learner took
and had not copied out: they are trained on.

What a kill can lose (--rollout T, a worker of A agents, batches of B = batch_size * num_batches_per_epoch samples):

    killed          its slots                                                 env frames lost (x frameskip)
    rollout worker  own slots to the free list; slots it was moving where     its agents' partial trajectories, and full
                    their marks say (trajectories marked for a learner        ones not yet marked for a learner: one of
                    reach it)                                                 each per agent at most, < 2 A T
    learner         taken, not copied out: back on its queue; slots it was    batches copied out and not trained: 0, B
                    moving where their marks say                              or 2 B (one training, one waiting)
    policy worker   none                                                      0

Crash loops: more than --max_restarts_per_hour deaths of one process kind within the last hour end the run.

The runner finds the death (and decides whether it may be healed at all); Healer.replace makes whole what the dead
process left, in the order above, and starts its replacement through the runner.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import re
import signal
import time
from queue import Empty
from typing import TYPE_CHECKING, Callable

import numpy as np
import psutil

from sf.processes.shared_state import ENV_STEPS, SLOT_FREE, learner_name, slot_held, slot_queued
from sf.runner.startup.supervision import kill_adopted

if TYPE_CHECKING:
    from sf.cfg.config import Config

log = logging.getLogger("sf")
KINDS = ("rollout_worker", "policy_worker", "learner")
SERVING_WAIT_SEC = 10.0  # a policy worker's batch takes milliseconds; one stuck longer is the stall watchdog's business
# a move takes microseconds, or up to a queue wait's timeout (0.1 s); a process still inside one after this is stopped
# or starved of CPU, and the census leaves its slots to the end-of-run audit rather than hold every other process longer
CENSUS_WAIT_SEC = 5.0


def process_kind(name: str) -> str:
    """rollout_worker_3 -> rollout_worker, policy_worker_p1_0 -> policy_worker, learner_p2 / learner -> learner."""
    return re.sub(r"(_p\d+)?(_\d+)?$", "", name)


def memory_mib(procs: dict) -> dict[str, float]:
    """Resident memory in MiB of this process ("runner") and of `procs` (name -> process) summed by kind:
    rollout_workers, policy_workers, learners (a single learner, named "learner": learner)."""
    groups: dict[str, float] = {"runner": psutil.Process().memory_info().rss}
    for name, p in procs.items():
        try:
            rss = psutil.Process(p.pid).memory_info().rss
        except (psutil.Error, TypeError):
            continue
        kind = process_kind(name)  # rollout_worker_3, policy_worker_p1_0, learner_p2
        key = kind + "s" if kind != name else name
        groups[key] = groups.get(key, 0) + rss
    return {k: v / 2**20 for k, v in groups.items()}


def policy_worker_of(name: str) -> tuple[int, int]:
    """policy_worker_3 -> (0, 3); policy_worker_p1_0 -> (1, 0)."""
    parts = name[len("policy_worker_"):].split("_")
    return (int(parts[0][1:]), int(parts[1])) if len(parts) == 2 else (0, int(parts[0]))


def exit_cause(exitcode: int | None) -> str:
    """How a process ended, for a log line: 'was killed by SIGKILL', 'exited with code 1'."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class Healer:
    def __init__(self, cfg: Config, state, queues, frames_per_step: int):
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
        return {**{f"restarts_{kind}": float(self.totals[kind]) for kind in KINDS},
                "lost_frames": float(self.lost_frames)}

    def summary(self) -> str:
        return (f"{sum(self.totals.values())} restarts (rollout workers {self.totals['rollout_worker']}, "
                f"policy workers {self.totals['policy_worker']}, learners {self.totals['learner']}), "
                f"{self.lost_frames} env frames lost")

    # --- replacement ---
    def replace(self, name: str, proc, cause: str, procs: dict, env_slots, own_children: set[int],
                starters: dict[str, Callable[..., str]]) -> bool:
        """Start a process in place of `name`, which died (`proc`, of `cause`), once what it left is made whole; False
        (logged, nothing done) if that would be one restart too many (a crash loop: the run is to stop).
        procs: the run's processes by name (the replacement joins it); env_slots: [W, agents per worker, (slot, t,
        policy)]; own_children: pids of the runner's own children (the others are adopted orphans: a dead worker's env
        engines); starters: per process kind, the runner's start of one (rollout_worker(w), policy_worker(p, i),
        learner(p) as a replacement), returning its name."""
        kind = process_kind(name)
        if not self.allowed(kind):
            log.error("%s %s: %d %ss died within the last hour (--max_restarts_per_hour %d), a crash loop; stopping "
                      "the run", name, cause, self.max_per_hour, kind.replace("_", " "), self.max_per_hour)
            return False
        proc.join(timeout=1.0)
        slots, W = Reclaimed(), self.cfg.num_workers
        alive = lambda: {n for n, q in procs.items() if q.is_alive()}  # noqa: E731
        serving = lambda: [self.state.serving_index(*policy_worker_of(n))  # noqa: E731
                           for n, q in procs.items() if process_kind(n) == "policy_worker" and q.is_alive()]
        if kind == "rollout_worker":
            w = int(name.rsplit("_", 1)[1])
            kill_adopted(own_children)  # its env engines (adopted by the runner) and their shared memory
            self.void_requests([w])
            if not self.wait_for_policy_workers(serving()):
                log.warning("a policy worker is still serving requests of %s; reusing its slots anyway", name)
            self.drop_replies(w)
            slots = self.reclaim_worker_slots(w, env_slots[w].numpy(), self.cfg.rollout, alive)
            self.release([w])
            new = starters[kind](w)
        elif kind == "policy_worker":
            p, i = policy_worker_of(name)
            workers = list(range(W))
            self.void_requests(workers)  # it may have taken requests it never answered: every worker asks again
            if not self.wait_for_policy_workers(serving()):
                log.warning("a policy worker is still serving requests voided at the death of %s", name)
            self.release(workers)
            new = starters[kind](p, i)
        else:
            p = int(name[len("learner_p"):]) if name.startswith("learner_p") else 0
            slots = self.reclaim_learner_slots(p, name, alive)
            new = starters[kind](p)
        count = self.record(kind, slots.lost_frames)
        log.warning("Restarted %s (pid %d) after it %s: restart %d of %ss this hour (--max_restarts_per_hour %d); %s%d "
                    "env frames lost", new, procs[new].pid, cause, count, kind.replace("_", " "), self.max_per_hour,
                    slots.describe(), slots.lost_frames)
        return True

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
        """Empty a dead rollout worker's reply queue (replies to voided requests): its replacement's replies need
        room."""
        drain(self.queues.workers[worker])

    # --- trajectory slots ---
    def reclaim_worker_slots(self, worker: int, agent_slots: np.ndarray, rollout: int,
                             alive: Callable[[], set]) -> Reclaimed:
        """A dead rollout worker's slots to the free list, unread, their steps counted as lost (module docstring); then
        the census if it died inside a move. agent_slots: [E * A, C] its row of env_slots, (slot, t, ...) per agent
        (cleared here: it names slots the worker no longer holds). alive: names of the processes alive now."""
        owner = self.state.slot_owner_np
        slots = np.flatnonzero(owner == worker).tolist()
        steps = dict(zip(agent_slots[:, 0].tolist(), agent_slots[:, 1].tolist()))  # each agent's current slot and step
        lost = sum(steps.get(s, rollout) for s in slots) * self.frames_per_step  # any other slot of its is full
        agent_slots[:, 0] = -1
        if slots:
            owner[slots] = SLOT_FREE
            self.queues.free.put_many(slots)
        out = Reclaimed(freed=len(slots), lost_frames=lost)
        self._census_after(f"rollout_worker_{worker}", None, alive, out)
        return out

    def reclaim_learner_slots(self, policy: int, name: str, alive: Callable[[], set]) -> Reclaimed:
        """A dead learner's slots: those it took and had not copied out back to its queue, for its replacement; those of
        a batch it died returning (copied out) to the free list; then the census if it died inside a move. Its lost
        frames: copied out (SharedState.released) minus trained (learner[p, ENV_STEPS])."""
        state, owner = self.state, self.state.slot_owner_np
        trained = int(state.learner[policy, ENV_STEPS])
        released = int(state.released_np[policy])
        out = Reclaimed(lost_frames=max(0, released // 2 - trained))
        held = np.flatnonzero(owner == slot_held(policy)).tolist()
        if held and released % 2:  # it died returning a copied-out batch: the slots it still held are that batch's
            owner[held] = SLOT_FREE
            self.queues.free.put_many(held)
            out.freed = len(held)
        elif held:
            owner[held] = slot_queued(policy)
            self.queues.learner[policy].put_many(held)
            out.requeued = len(held)
        self._census_after(name, policy, alive, out)
        state.released_np[policy] = 2 * trained  # what it lost is counted; its replacement starts from here
        return out

    def _census_after(self, name: str, policy: int | None, alive: Callable[[], set], out: Reclaimed) -> None:
        """The census, if the dead process `name` (the learner of `policy`, if one) died inside a move:
        SharedState.moving odd, or a learner's `released`. Its moving count is made even again for its replacement."""
        row = self.state.heartbeat_slot(name)
        if self.state.moving_np[row] % 2 or (policy is not None and self.state.released_np[policy] % 2):
            out.mid_move = self.census(alive)
        self.state.moving_np[row] = 0

    def census(self, alive: Callable[[], set]) -> int | None:
        """Put every slot that dead processes left inside a move where its mark says: each slot marked FREE or queued(p)
        and found on no queue goes on the free list or learner p's queue. Stops every process from opening a move
        (SharedState.census) and waits until none of those alive (names, `alive()`, asked again as it waits) is inside
        one: then every slot is where its mark says, or with a dead process. Returns how many slots it moved; None if a
        live process stayed inside a move for CENSUS_WAIT_SEC (nothing moved: the end-of-run audit reports them)."""
        state = self.state
        state.census_np[0] = 1
        try:
            time.sleep(0.001)  # a move opened before the flag was visible to its process is visible as open by now
            deadline = time.monotonic() + CENSUS_WAIT_SEC
            while True:
                names = alive()
                rows = [state.heartbeat_slot(n) for n in names]
                policies = [p for p in range(state.num_policies) if learner_name(p, state.num_policies) in names]
                if not (state.moving_np[rows] % 2).any() and not (state.released_np[policies] % 2).any():
                    break
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.001)
            places = drain_places(self.queues)
            moved = 0
            for code, slots in places.items():  # marked for a place, on no queue: put there
                missing = np.setdiff1d(np.flatnonzero(state.slot_owner_np == code), slots).tolist()
                slots += missing
                moved += len(missing)
            put_places(self.queues, places)
            return moved
        finally:
            state.census_np[0] = 0


@dataclasses.dataclass
class Reclaimed:
    """What became of a dead process's trajectory slots."""
    freed: int = 0  # its own slots (or a copied-out batch's), back on the free list unread
    requeued: int = 0  # trajectories a dead learner took and had not copied out, back on its queue
    mid_move: int | None = 0  # slots found off the queue their mark names, put there; None: census gave up
    lost_frames: int = 0  # env frames lost with it (module docstring)

    def describe(self) -> str:
        """'slots: 4 freed, 4 it was moving put where their marks say; ' (empty when there were none)."""
        parts = [f"{self.freed} freed"] if self.freed else []
        if self.requeued:
            parts.append(f"{self.requeued} queued again for the replacement")
        if self.mid_move:
            parts.append(f"{self.mid_move} it was moving put where their marks say")
        if self.mid_move is None:
            parts.append(f"those it was moving not counted (a live process stayed inside a move for "
                         f"{CENSUS_WAIT_SEC:g} s: the end-of-run audit reports them)")
        return f"slots: {', '.join(parts)}; " if parts else ""


def drain(queue) -> list[int]:
    """Every message on `queue` now (slot indices), taken off it."""
    out = []
    while True:
        try:
            out += [int(s) for s in queue.get_many_nowait()]
        except Empty:
            return out


def drain_places(queues) -> dict[int, list[int]]:
    """Every slot on the free list and the learner queues now, taken off them: {slot_owner code of the place: slots}."""
    return {SLOT_FREE: drain(queues.free), **{slot_queued(p): drain(q) for p, q in enumerate(queues.learner)}}


def put_places(queues, places: dict[int, list[int]]) -> None:
    """Put slots back (drain_places' form), each list on its queue in its order."""
    for code, slots in places.items():
        if slots:
            (queues.free if code == SLOT_FREE else queues.learner[slot_queued(0) - code]).put_many(slots)


def audit_slots(state, queues, num_slots: int) -> str:
    """After every process stopped: every slot is exactly once on the free list, on its learner's queue, or held by
    a rollout worker or learner (SharedState.slot_owner). Empties the queues it reads. Returns a one-line verdict."""
    owner = state.slot_owner_np
    seen = collections.Counter()
    problems = []
    for code, slots in drain_places(queues).items():
        seen.update(slots)
        wrong = [s for s in slots if owner[s] != code]
        if wrong:
            where = "free list" if code == SLOT_FREE else f"learner {slot_queued(0) - code}'s queue"
            problems.append(f"{len(wrong)} on the {where} marked elsewhere")
    queued = {SLOT_FREE, *(slot_queued(p) for p in range(len(queues.learner)))}
    missing = [s for s in range(num_slots) if owner[s] in queued and s not in seen]
    duplicated = [s for s, n in seen.items() if n > 1]
    held = num_slots - sum(seen.values())
    if missing:
        problems.append(f"{len(missing)} lost (marked for a queue, on none: left inside a move)")
    if duplicated:
        problems.append(f"{len(duplicated)} duplicated")
    verdict = "; ".join(problems) if problems else "every slot accounted for exactly once"
    return (f"Slot audit: {num_slots} slots, {len(seen)} on the free list and learner queues, {held - len(missing)} "
            f"held by workers and learners: {verdict}")
