"""Batcher: one policy's finished trajectories -> training batches on the learner's device.

It takes full trajectory slots off the policy's learner queue (marked held by its learner: SlotLedger) until it has one
training batch (the batch schedule's number of trajectories, in the schedule's order: sf/learning/batch_schedule.py),
copies them out of shared memory onto the device and, in async mode, returns the slots to the free list at once
(hts/ppo: slots are fixed, the rollout workers wait for SharedState.sync_ready instead).

In process mode (async) it runs in a thread of its own (`start_thread`) and hands batches to the training loop through
a one-element queue (`next_batch`); it copies a batch out only while that queue is empty: while one batch trains and one
waits, it stops taking slots, the free list runs dry and rollout workers pause (backpressure) instead of memory growing.
Staleness is bounded earlier: each batch copied out is counted (SharedState.batches_out), and while
--num_batches_to_accumulate batches are out (default 2: one training, one waiting) the policy's workers serve no
request, so no experience is gathered with weights that several SGD steps will have replaced by the time it trains
(policy lag about one batch's SGD steps, as Sample Factory's; without the pause every spare slot filled ahead: about
three).
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable

import torch

from sf.learning.phase_timing import LAPS  # SF_PROFILE: phase times (benchmarks/profile_training.py)
from sf.processes.control import device_thread
from sf.processes.shared_state import SLOT_FREE, slot_held
from sf.processes.slot_ledger import CENSUS_PAUSE_SEC, SlotLedger


class Batcher:
    def __init__(self, buffers, queues, ledger: SlotLedger, device, policy_id: int, trajs_per_batch: int,
                 frames_per_traj: int, masks_steps: bool, schedule, frees_slots: bool,
                 recycled: Callable[[int], None] | None = None, copied: Callable[[], None] | None = None):
        """queues: .learner (this policy's queue of full slots), .free (the free list). schedule: the learner's batch
        schedule (order_batch). frees_slots: the run's mode returns a batch's slots to the free list once they are
        copied out (RunMode.frees_slots; hts/ppo: fixed slots, the rollout workers wait for sync_ready).
        masks_steps: mark the steps this policy acted (experience["own"]).
        recycled: --sampler_only (a benchmark): the slots go back to the free list as they come, untrained, and this is
        called with their env frames. copied: called in process mode for every batch copied out (SharedState's
        batches_out: the policy workers pause while --num_batches_to_accumulate are out)."""
        self.buffers, self.queues, self.ledger, self.device = buffers, queues, ledger, device
        self.policy_id, self.held = policy_id, slot_held(policy_id)
        self.trajs_per_batch, self.frames_per_traj = trajs_per_batch, frames_per_traj
        self.masks_steps, self.schedule, self.recycled, self.copied = masks_steps, schedule, recycled, copied
        self.frees_slots = frees_slots
        self.pending: list[int] = []  # slots taken, not yet copied out
        self.batches: queue.Queue | None = None  # process mode: the batch copied out and waiting (start_thread)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def collect(self, timeout: float):
        """Take finished slots; once a training batch is complete, copy it out and free its slots.
        Returns the experience dict (storage layout, on the device) or None."""
        taken = self._take(timeout)
        LAPS.lap("wait_trajectories")  # (batcher: also its waits for room in the batch queue)
        if not taken:
            return None
        self.pending.extend(int(s) for s in taken)
        if self.recycled is not None:  # benchmark: recycle the slots at once, count the frames, train nothing
            self._release(self.pending)
            self.recycled(len(self.pending) * self.frames_per_traj)
            self.pending = []
            return None
        if len(self.pending) < self.trajs_per_batch:
            return None
        self.schedule.order_batch(self.pending)
        slots = torch.tensor(self.pending[: self.trajs_per_batch], dtype=torch.int64)
        self.pending = self.pending[self.trajs_per_batch:]
        experience = self.buffers.gather(slots, self.device)
        if self.masks_steps:  # masked: steps another policy acted (it took over the agent at
            # an episode start), or none did (policy id -1: the env said the agent was inactive, info["is_active"])
            experience["own"] = experience["policy_ids"] == self.policy_id
        # no wait for the device: gather returns once the slots were read on the host (CUDA: into pinned staging, whose
        # asynchronous copy to the device the batch's consumers wait for on the device; see GatherStaging)
        if self.frees_slots:
            self._release(slots.tolist())
        LAPS.lap("copy")
        return experience

    def _take(self, timeout: float) -> list:
        """Finished trajectories off this policy's queue (up to what the batch lacks; waiting up to `timeout`), marked
        held by this learner in one move (SlotLedger): a replacement gets them again if this learner dies, and those it
        dies taking are found by the runner's census. None while the runner counts slots ([])."""
        with self.ledger.move(wait=min(timeout, CENSUS_PAUSE_SEC)) as ok:
            if ok:
                try:
                    taken = self.queues.learner.get_many(timeout=timeout,
                                                         max_messages_to_get=self.trajs_per_batch - len(self.pending))
                except queue.Empty:
                    return []
                self.ledger.owner[taken] = self.held
                return taken
        return []

    def _release(self, slots: list) -> None:
        """Return the slots of copied-out trajectories to the free list (marked FREE, then put), in one move opened by
        the store that counts their frames as copied out (SharedState.released): a learner killed at any point takes
        with it exactly the frames of the batches it copied out and did not train on."""
        with self.ledger.releasing(len(slots) * self.frames_per_traj):
            self.ledger.owner[slots] = SLOT_FREE
            self.queues.free.put_many(slots)

    # --- process mode: a thread of its own ---
    def start_thread(self) -> None:
        self.batches = queue.Queue(maxsize=1)
        self._thread = device_thread(self._fill, self.device, "batcher")  # (its gathers copy on a side stream)
        self._thread.start()

    def _fill(self) -> None:
        batches, stop = self.batches, self._stop
        while not stop.is_set():
            if batches.full():  # copy a batch out only when the trainer has room for it: fresher experience
                time.sleep(0.005)
                continue
            exp = self.collect(timeout=0.1)
            if exp is not None and self.copied is not None:
                self.copied()
            while exp is not None and not stop.is_set():
                try:
                    batches.put(exp, timeout=0.1)
                    break
                except queue.Full:
                    pass

    def next_batch(self, timeout: float):
        """The batch copied out and waiting (the thread's), waiting up to `timeout`; None if none came."""
        try:
            return self.batches.get(timeout=timeout)
        except queue.Empty:
            return None

    def batch_waiting(self) -> bool:
        """A batch waits for the trainer (process mode): with the one training, two are out of shared memory."""
        return self.batches is not None and self.batches.full()

    def stop_thread(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
