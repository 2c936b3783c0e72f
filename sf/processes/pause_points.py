"""Pause points: a test stops a process at a named moment of the trajectory-slot protocol, to kill it exactly there.

    SF_TEST_PAUSE_AT=point[,point...]   SF_TEST_PAUSE_DIR=dir

The first process of the run that reaches a listed point creates dir/point, writes its pid into it and stops itself
(SIGSTOP); a process that reaches the point later (another one, or the replacement of a killed one) goes on. Both
variables are read once, at import: unset, a point costs one test of a global (`if PAUSE_AT: pause("...")`).

Points (where a kill is hardest on the bookkeeping, sf/runner/health/healing.py):
    rollout_worker_queued           a rollout worker marked finished trajectories queued for a learner (slot_owner) and
                                    has not put them on the learner's queue yet
    rollout_worker_trajectory_end   a rollout worker took a fresh slot for an agent whose trajectory just ended, before
                                    the full one is handed on (the group's other agents have not made this step yet)
    learner_two_batches_out         a learner finished an SGD step of a batch while the next batch waits for it: two
                                    batches copied out of shared memory (their slots freed), neither counted as trained
    learner_final_save              a learner asked to stop is about to write its final checkpoint (a learner that
                                    hangs there is killed after the stall bound: sf/runner/health/stopping.py)
"""
from __future__ import annotations

import os
import signal

_DIR = os.environ.get("SF_TEST_PAUSE_DIR", "")
PAUSE_AT = frozenset(p for p in os.environ.get("SF_TEST_PAUSE_AT", "").split(",") if p) if _DIR else frozenset()


def pause(point: str) -> None:
    """Stop this process here if `point` is listed and no process of the run stopped at it before."""
    if point not in PAUSE_AT:
        return
    try:
        fd = os.open(os.path.join(_DIR, point), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGSTOP)
