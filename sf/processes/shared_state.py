"""Small shared-memory state every process of a run can read without messages.

    stop            [1]  int64   1 once the runner asked everyone to stop
    worker_frames   [W]  int64   env frames collected by each rollout worker (FPS is read off these)
    learner         [3]  float64 env frames trained on, policy version, 1.0 when the learner finished its final save
    sync_ready      [1]  int64   hts/ppo modes: training batches whose data the learner took (and, after it, published the
                                 weights the next rollout uses); rollout interval j starts once it is >= j
    best_metric     [2]  float64 running average of the best-checkpoint metric and its number of episodes
    heartbeats      [P]  float64 time.monotonic() of each process's last sign of life (learner, policy workers, rollout
                                 workers, in that order): the runner's watchdog for a process stuck in a call that
                                 never returns (an env engine that hangs), which no exception or exit code reveals
"""
from __future__ import annotations

import time

import torch

ENV_STEPS, VERSION, FINISHED = 0, 1, 2


class SharedState:
    def __init__(self, num_workers: int, num_policy_workers: int = 1):
        names = ["learner", *(f"policy_worker_{i}" for i in range(num_policy_workers)),
                 *(f"rollout_worker_{w}" for w in range(num_workers))]
        self._heartbeat_slots = {name: i for i, name in enumerate(names)}
        self.heartbeats = torch.full((len(names),), time.monotonic(), dtype=torch.float64).share_memory_()
        self.stop = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.worker_frames = torch.zeros(num_workers, dtype=torch.int64).share_memory_()
        self.learner = torch.zeros(3, dtype=torch.float64).share_memory_()
        self.best_metric = torch.zeros(2, dtype=torch.float64).share_memory_()
        self.sync_ready = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._views()

    def _views(self) -> None:
        # numpy views for the per-step reads and writes of workers: ~0.1 us instead of ~5-10 us of torch indexing
        self._stop_np, self._worker_frames_np = self.stop.numpy(), self.worker_frames.numpy()
        self._heartbeats_np, self._sync_ready_np = self.heartbeats.numpy(), self.sync_ready.numpy()

    def __getstate__(self) -> dict:  # views are rebuilt in the receiving process (pickled, they would be copies)
        return {k: v for k, v in self.__dict__.items() if not k.endswith("_np")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._views()

    def stopping(self) -> bool:
        return bool(self._stop_np[0])

    def sync_ready_batches(self) -> int:
        return int(self._sync_ready_np[0])

    def set_sync_ready(self, batches: int) -> None:
        self._sync_ready_np[0] = batches

    def set_worker_frames(self, worker: int, frames: int) -> None:
        self._worker_frames_np[worker] = frames

    def heartbeat_slot(self, name: str) -> int:
        return self._heartbeat_slots[name]

    def beat(self, slot: int) -> None:
        """A sign of life of the process owning `slot` (heartbeat_slot(its name)); ~0.2 us, fine in a step loop."""
        self._heartbeats_np[slot] = time.monotonic()

    def beat_all(self) -> None:
        self._heartbeats_np[:] = time.monotonic()

    def seconds_since_beat(self, name: str) -> float:
        return time.monotonic() - float(self._heartbeats_np[self._heartbeat_slots[name]])

    def request_stop(self) -> None:
        self.stop[0] = 1
