"""The run's queues, made once by the runner, and each process's view of them:

    rollout workers --(w, group)--> policy queue [p] --> policy workers of p --group--> worker queues [w]
    rollout workers --slot--> learner queue [p] --> learner p --slot--> free queue --> rollout workers
    everyone --(kind, ...)--> report queue --> runner (sf/runner/reports.py)

Messages are small int tuples (slot indices, request groups); every capacity holds all the messages that can be in
flight at once.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

from sf.ipc import Queue

if TYPE_CHECKING:
    from sf.cfg.config import Config
    from sf.cfg.shape import RunShape


def make_queues(cfg: Config, num_policies: int, shape: RunShape) -> SimpleNamespace:
    """policy [P], workers [W], learner [P], free, report; the free list filled (every slot free at start) where the
    mode frees slots."""
    P, num_slots = num_policies, shape.slots
    msg_bytes = 64  # a small int tuple; capacities hold every message in flight at once,
    requests = 2 * shape.groups  # twice over: voided ones beside those asked again
    queues = SimpleNamespace(
        policy=[Queue(maxsize=requests + 1, max_size_bytes=max(2**16, msg_bytes * requests * 2)) for _ in range(P)],
        workers=[Queue(maxsize=2 * cfg.worker_num_splits * P + 1, max_size_bytes=2**13 * P)
                 for _ in range(cfg.num_workers)],
        learner=[Queue(maxsize=num_slots + 1, max_size_bytes=max(2**16, msg_bytes * num_slots * 2)) for _ in range(P)],
        free=Queue(maxsize=num_slots + 1, max_size_bytes=max(2**16, msg_bytes * num_slots * 2)),
        report=Queue(max_size_bytes=2**25),
    )
    if cfg.mode.frees_slots:  # (HTS-RL's intervals: fixed slots, no free list)
        queues.free.put_many(list(range(num_slots)))
    return queues


def worker_queues(q, w: int) -> SimpleNamespace:
    """A rollout worker's: every policy's request and learner queue, its own reply queue."""
    return SimpleNamespace(policy=q.policy, worker=q.workers[w], learner=q.learner, free=q.free, report=q.report)


def policy_queues(q, p: int) -> SimpleNamespace:
    """A policy worker's: its policy's request queue, every rollout worker's reply queue."""
    return SimpleNamespace(policy=q.policy[p], workers=q.workers)


def learner_queues(q, p: int) -> SimpleNamespace:
    """A learner's: its policy's queue of full trajectories, the free list, the report queue."""
    return SimpleNamespace(learner=q.learner[p], free=q.free, report=q.report)


def close_queues(q) -> None:
    for queue in [*q.policy, *q.learner, q.free, q.report, *q.workers]:
        queue.close()
