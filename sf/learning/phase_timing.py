"""Opt-in timing of the learner's phases: with the environment variable SF_PROFILE=path (read once, at import), each
learner process writes to `path` (a population's policy p > 0: `path.p<p>`; under torchrun rank r > 0 adds `.rank<r>`:
the ranks of one machine share its environment), as JSON, the wall and CPU seconds it spent
in each phase of its work, after a training batch (at most every WRITE_EVERY_SEC) and at its exit.
benchmarks/profile_training.py reads it. Without the variable every hook is a method that does nothing.

Phases are laps: lap(name) charges the time since the same thread's previous lap (its first lap only sets the mark) to
`name`, so one thread's phases tile its time and sum to at most the wall time since the first lap. CPU: a side thread's
(the batcher's) is its own thread time; the main thread's is the process's CPU (the torch threads that compute its
forward and backward included) less the side threads' over the same lap, so that the phases of all threads add up to
the process's CPU. On a GPU the phases are the host's times: kernels run asynchronously, and the phase that
synchronizes (the step statistics' copy to the host) takes their wait.

The file: {"pid", "time" (time.time() of the write), "wall" (s since the first lap), "cpu" (the process's CPU seconds,
all threads, since it started), "batches", "samples" (trained, since the first lap), "phases": {name: {"wall", "cpu",
"count", "thread": "main" or "side"}}}.
"""
from __future__ import annotations

import json
import os
import threading
import time

WRITE_EVERY_SEC = 0.5


class PhaseTimer:
    def __init__(self, path: str):
        self.path = path
        self.t0: float | None = None  # perf_counter of the first lap (this module is imported before the fork)
        self.phases: dict[str, list] = {}  # name -> [wall, cpu, count, thread]
        self.marks: dict[int, tuple[float, float]] = {}  # thread ident -> (perf_counter, CPU clock) of its last lap
        self.side_clocks: dict[int, tuple[int, float]] = {}  # side thread -> (CPU clock id, its CPU at 1st lap)
        self.side_last: dict[int, float] = {}  # side thread ident -> its CPU seconds since its first lap, last seen
        self.batches = self.samples = 0
        self.last_write = 0.0

    def _side_cpu(self) -> float:
        for ident, (clock, base) in list(self.side_clocks.items()):
            try:
                self.side_last[ident] = time.clock_gettime(clock) - base
            except OSError:  # the thread is gone: its CPU stays where its laps charged it
                pass
        return sum(self.side_last.values())

    def lap(self, name: str) -> None:
        ident = threading.get_ident()
        main = ident == threading.main_thread().ident
        if not main and ident not in self.side_clocks:
            self.side_clocks[ident] = (time.pthread_getcpuclockid(ident), time.thread_time())
        now = time.perf_counter()
        if main:
            cpu = time.process_time() - self._side_cpu()
        else:
            cpu = time.thread_time()
            self.side_last[ident] = cpu - self.side_clocks[ident][1]  # (kept once the thread is gone)
        if self.t0 is None:
            self.t0 = now
        mark = self.marks.get(ident)
        self.marks[ident] = (now, cpu)
        if mark is not None:
            phase = self.phases.setdefault(name, [0.0, 0.0, 0, "main" if main else "side"])
            phase[0] += now - mark[0]
            phase[1] += cpu - mark[1]
            phase[2] += 1

    def batch_done(self, samples: int, policy_id: int = 0) -> None:
        """A training batch of `samples` samples was trained; writes the file at most every WRITE_EVERY_SEC."""
        self.batches += 1
        self.samples += samples
        if time.perf_counter() - self.last_write >= WRITE_EVERY_SEC:
            self.write(policy_id)

    def write(self, policy_id: int = 0) -> None:
        self.last_write = time.perf_counter()
        data = {"pid": os.getpid(), "time": time.time(),
                "wall": self.last_write - self.t0 if self.t0 is not None else 0.0, "cpu": time.process_time(),
                "batches": self.batches, "samples": self.samples,
                "phases": {k: {"wall": w, "cpu": c, "count": n, "thread": t}
                           for k, (w, c, n, t) in list(self.phases.items())}}
        path = self.path if policy_id == 0 else f"{self.path}.p{policy_id}"
        rank = int(os.environ.get("RANK") or 0)  # (validated at the run's start: sf.processes.ranks.world_from_env)
        path = path if rank == 0 else f"{path}.rank{rank}"
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:  # replaced whole: a reader never sees half a file
            json.dump(data, f, indent=1)
        os.replace(tmp, path)


class _Off:
    """SF_PROFILE unset: nothing is timed or written."""

    def lap(self, name: str) -> None:
        pass

    def batch_done(self, samples: int, policy_id: int = 0) -> None:
        pass

    def write(self, policy_id: int = 0) -> None:
        pass


LAPS = PhaseTimer(os.environ["SF_PROFILE"]) if os.environ.get("SF_PROFILE") else _Off()
