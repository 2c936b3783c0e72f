"""SIGKILL stress of sf.ipc.Queue (issue 15): processes killed at random moments of put, put_many, get and
get_many must never wedge the queue, stretch a call past its timeout, or leave false waiter counts.

Each trial:
  1. starts 1-3 *victims*, each in a tight loop of one of put / put_many / get / get_many with
     timeout=0.1 s (a small maxsize makes producers sleep on a full queue, an empty queue makes consumers
     sleep), and SIGKILLs them at random moments;
  2. checks `stats()`: once nobody is inside a call, `consumers_waiting` and `producers_waiting` must be 0
     (with the separate consumer running, at most that one consumer may be waiting);
  3. starts a fresh *probe* producer (put(timeout=0.1) in a loop) and requires one of its messages to
     reach the consumer within 5 s, then SIGKILLs the probe too at a random moment and checks again.
Every timed call made by a survivor (probe, consumer) must return within its timeout + GRACE_S (the
lock-acquisition grace, CQ_LOCK_GRACE_NS in cpp/ipc/cqueue.h), not counting the time the caller spent
runnable but not scheduled (schedstat's run_delay: on 2 shared cores under load that alone can reach
a second; the raw durations are reported too). The consumer is either the process that
forks everybody ("main") or a separate process ("separate"); trials alternate between the two set-ups.

The victims and the probe look at no multiprocessing lock: a process SIGKILLed while holding one (say
inside `Event.is_set()`) would leave it locked for good, which is a hang of the test harness, not of
the queue. (That is what made issue 15's reproducer fail.)

    python tests/ipc/kill_stress.py --trials 1000      # the long run (a few minutes on 2 cores)
tests/ipc/test_ipc_queue_kill_stress.py runs a few dozen trials of each set-up.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

if __name__ == "__main__":  # run as a script: make `sf` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sf.ipc import Empty, Full, Queue  # noqa: E402

CALL_TIMEOUT_S = 0.1   # timeout of every call made by victims, probes and consumers
GRACE_S = 1.0          # documented lock-acquisition grace (kLockGraceNs): no call may exceed timeout + this
ARRIVAL_LIMIT_S = 5.0  # a fresh producer's message must reach the consumer within this long
KINDS = ("put", "put_many", "get", "get_many")
MAXSIZE = 400          # small enough that put victims fill the queue and sleep in put

# Messages are (tag, trial, seq) tuples: tag 0 victim data, 1 probe data, 2 prefill.
VICTIM, PROBE, FILL = 0, 1, 2

# Control words of the separate consumer (a RawArray: no lock anywhere).
STOP, PAUSE, PAUSED = 0, 1, 2


def _run_queue_clock():
    """Seconds this thread has spent runnable but not running (/proc schedstat's run_delay), as a function.

    A call's duration minus what this grew by during the call is the time the call really *waited*; on a
    loaded machine (2 shared cores here) a process can sit in the run queue for hundreds of ms, which no
    queue implementation can prevent. Opened per process (after fork). Returns 0 where unavailable.
    """
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:
        return lambda: 0.0
    return lambda: int(os.pread(fd, 128, 0).split()[1]) / 1e9


def _victim(q: Queue, kind: str, trial: int, started) -> None:
    rng = random.Random(os.getpid() ^ trial)
    started.value = 1
    seq = 0
    while True:
        try:
            if kind == "put":
                q.put((VICTIM, trial, seq), timeout=CALL_TIMEOUT_S)
                seq += 1
            elif kind == "put_many":
                k = rng.randint(1, 64)
                q.put_many([(VICTIM, trial, seq + i) for i in range(k)], timeout=CALL_TIMEOUT_S)
                seq += k
            elif kind == "get":
                q.get(timeout=CALL_TIMEOUT_S)
            else:
                q.get_many(timeout=CALL_TIMEOUT_S, max_messages_to_get=rng.choice((None, 1, 7, 100)))
        except (Full, Empty):
            pass


def _probe(q: Queue, trial: int, started, report) -> None:
    """A fresh producer: put(timeout) in a loop; report = [puts done, longest call, longest wait] (s)."""
    run_queue = _run_queue_clock()
    started.value = 1
    seq = 0
    while True:
        d0 = run_queue()
        t0 = time.monotonic()
        try:
            q.put((PROBE, trial, seq), timeout=CALL_TIMEOUT_S)
            seq += 1
            report[0] = seq
        except Full:
            pass
        dt = time.monotonic() - t0
        if dt > report[1]:
            report[1] = dt
        wait = dt - (run_queue() - d0)
        if wait > report[2]:
            report[2] = wait


def _note(msgs, arrivals, bad) -> None:
    now = time.monotonic()
    for m in msgs:
        if not (isinstance(m, tuple) and len(m) == 3 and all(type(x) is int for x in m)):
            bad.value += 1
        elif m[0] == PROBE and 0 <= m[1] < len(arrivals) and arrivals[m[1]] == 0.0:
            arrivals[m[1]] = now


def _consumer(q: Queue, arrivals, ctl, longest, bad) -> None:
    """The separate consumer: get_many(timeout) until told to stop; can be paused (outside any call).
    longest = [longest call, longest wait] (s)."""
    run_queue = _run_queue_clock()
    while not ctl[STOP]:
        req = ctl[PAUSE]
        if req:
            ctl[PAUSED] = req
            time.sleep(0.0005)
            continue
        d0 = run_queue()
        t0 = time.monotonic()
        try:
            msgs = q.get_many(timeout=CALL_TIMEOUT_S)
        except Empty:
            msgs = []
        dt = time.monotonic() - t0
        longest[0] = max(longest[0], dt)
        longest[1] = max(longest[1], dt - (run_queue() - d0))
        _note(msgs, arrivals, bad)


def _wait_flag(flag, proc, limit: float = 10.0) -> None:
    t_end = time.monotonic() + limit
    while not flag.value and proc.is_alive() and time.monotonic() < t_end:
        time.sleep(0.0005)


def _kill(proc) -> None:
    try:
        os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.join(10)


@dataclass
class Trial:
    index: int
    mode: str
    kinds: list
    arrival_s: float | None = None      # probe start -> first probe message consumed
    longest_call_s: float = 0.0         # longest timed call of the survivors (probe, consumer)
    longest_by: str = ""                # which of them made it
    longest_wait_s: float = 0.0         # the same, less the time spent runnable but not scheduled
    waiter_errors: list = field(default_factory=list)  # stats() snapshots with false waiter counts

    @property
    def ok(self) -> bool:
        return (self.arrival_s is not None and self.arrival_s <= ARRIVAL_LIMIT_S
                and self.longest_wait_s <= CALL_TIMEOUT_S + GRACE_S and not self.waiter_errors)


class Harness:
    """One queue and (mode "separate") one consumer process, kept across trials like the reproducer."""

    def __init__(self, mode: str, n_trials: int, seed: int) -> None:
        assert mode in ("main", "separate")
        self.mode = mode
        self.ctx = mp.get_context("fork")
        self.rng = random.Random(seed)
        self.q = Queue(maxsize=MAXSIZE, max_size_bytes=1 << 16)
        self.arrivals = self.ctx.RawArray("d", n_trials)
        self.bad = self.ctx.RawValue("q", 0)
        self.longest = self.ctx.RawArray("d", 2)  # consumer's (either mode) longest call, longest wait
        self.run_queue = _run_queue_clock()
        self.ctl = self.ctx.RawArray("q", 3)
        self.consumer = None
        if mode == "separate":
            self.consumer = self.ctx.Process(target=_consumer,
                                             args=(self.q, self.arrivals, self.ctl, self.longest, self.bad))
            self.consumer.start()

    # -- the consumer's side ------------------------------------------------------------------------
    def _main_get(self, block: bool = True) -> list:
        d0 = self.run_queue()
        t0 = time.monotonic()
        try:
            msgs = self.q.get_many(block, CALL_TIMEOUT_S)
        except Empty:
            msgs = []
        dt = time.monotonic() - t0
        self.longest[0] = max(self.longest[0], dt)
        self.longest[1] = max(self.longest[1], dt - (self.run_queue() - d0))
        _note(msgs, self.arrivals, self.bad)
        return msgs

    def _pause(self, token: int) -> None:
        self.ctl[PAUSE] = token
        t_end = time.monotonic() + 10
        while self.ctl[PAUSED] != token and time.monotonic() < t_end:
            time.sleep(0.0005)
        assert self.ctl[PAUSED] == token, "separate consumer did not pause"

    def _check_waiters(self, trial: Trial, where: str, consumer_may_wait: bool) -> None:
        s = self.q.stats()
        if s["producers_waiting"] != 0 or s["consumers_waiting"] > (1 if consumer_may_wait else 0):
            trial.waiter_errors.append((where, s))

    # -- one trial ----------------------------------------------------------------------------------
    def run_trial(self, i: int) -> Trial:
        rng, q, ctx = self.rng, self.q, self.ctx
        kinds = [rng.choice(KINDS) for _ in range(rng.randint(1, 3))]
        trial = Trial(i, self.mode, kinds)
        paused = False
        if self.mode == "main":
            while self._main_get(block=False):  # start from an empty queue
                pass
        elif rng.random() < 0.5:  # let producers fill the queue and consumers find it empty
            self._pause(i + 1)
            paused = True
        n_fill = rng.choice((0, 0, rng.randint(1, 50), rng.randint(50, 300)))
        if n_fill:
            try:
                q.put_many([(FILL, i, s) for s in range(n_fill)], timeout=CALL_TIMEOUT_S)
            except Full:
                pass

        # 1. victims, killed at random moments of their loops
        victims = []
        for kind in kinds:
            started = ctx.RawValue("b", 0)
            p = ctx.Process(target=_victim, args=(q, kind, i, started))
            p.start()
            victims.append((p, started))
        for p, started in victims:
            _wait_flag(started, p)
        time.sleep(rng.uniform(0.0, 0.02))
        for p, _ in victims:
            _kill(p)
            time.sleep(rng.uniform(0.0, 0.003))
        self._check_waiters(trial, "after victims", consumer_may_wait=self.mode == "separate" and not paused)
        if paused:
            self.ctl[PAUSE] = 0

        # 2. a fresh producer must get through
        started, report = ctx.RawValue("b", 0), ctx.RawArray("d", 3)
        t0 = time.monotonic()
        probe = ctx.Process(target=_probe, args=(q, i, started, report))
        probe.start()
        while time.monotonic() - t0 < ARRIVAL_LIMIT_S + 1 and self.arrivals[i] == 0.0:
            if self.mode == "main":
                self._main_get()
            else:
                time.sleep(0.001)
        if self.arrivals[i]:
            trial.arrival_s = self.arrivals[i] - t0
        # ... and is killed at a random moment of its own loop
        time.sleep(rng.uniform(0.0, 0.01))
        _kill(probe)
        trial.longest_call_s = max(report[1], self.longest[0])
        trial.longest_by = "probe" if report[1] >= self.longest[0] else "consumer"
        trial.longest_wait_s = max(report[2], self.longest[1])
        self.longest[0] = self.longest[1] = 0.0
        self._check_waiters(trial, "after probe", consumer_may_wait=self.mode == "separate")
        return trial

    def close(self) -> dict:
        """Stop the consumer; return the final stats (nobody is inside a call any more)."""
        if self.consumer is not None:
            self.ctl[STOP] = 1
            self.consumer.join(10)
            if self.consumer.is_alive():
                _kill(self.consumer)
        return self.q.stats()


def run(n_trials: int, seed: int = 0, modes=("main", "separate"), log=None) -> dict:
    """Run n_trials trials, alternating the consumer set-ups; return a summary dict."""
    per_mode = {m: (n_trials + len(modes) - 1 - k) // len(modes) for k, m in enumerate(modes)}
    trials, finals, bad = [], {}, 0
    t_start = time.monotonic()
    for k, mode in enumerate(modes):
        h = Harness(mode, per_mode[mode], seed + k)
        for i in range(per_mode[mode]):
            t = h.run_trial(i)
            trials.append(t)
            if log and not t.ok:
                log(f"FAIL {mode} trial {i} kinds={t.kinds} arrival={t.arrival_s} "
                    f"longest_call={t.longest_call_s:.3f} ({t.longest_by}) wait={t.longest_wait_s:.3f} "
                    f"waiters={t.waiter_errors}")
            elif log and t.longest_call_s > CALL_TIMEOUT_S + 0.2:
                log(f"note: {mode} trial {i} kinds={t.kinds}: a {t.longest_by} call took {t.longest_call_s:.3f} s, "
                    f"{t.longest_call_s - t.longest_wait_s:.3f} s of it runnable but not scheduled")
        finals[mode] = h.close()
        bad += h.bad.value
    ok = [t for t in trials if t.ok]
    final_waiters = sum(f["consumers_waiting"] + f["producers_waiting"] for f in finals.values())
    arrivals = sorted(t.arrival_s for t in trials if t.arrival_s is not None)
    return {
        "trials": len(trials),
        "passed": len(ok),
        "no_arrival": sum(t.arrival_s is None or t.arrival_s > ARRIVAL_LIMIT_S for t in trials),
        "call_overruns": sum(t.longest_wait_s > CALL_TIMEOUT_S + GRACE_S for t in trials),
        "raw_call_overruns": sum(t.longest_call_s > CALL_TIMEOUT_S + GRACE_S for t in trials),
        "longest_wait_s": max((t.longest_wait_s for t in trials), default=0.0),
        "false_waiter_counts": sum(bool(t.waiter_errors) for t in trials),
        "longest_call_s": max((t.longest_call_s for t in trials), default=0.0),
        "calls_over_timeout_plus_0.2s": sum(t.longest_call_s > CALL_TIMEOUT_S + 0.2 for t in trials),
        "arrival_median_s": arrivals[len(arrivals) // 2] if arrivals else None,
        "arrival_max_s": arrivals[-1] if arrivals else None,
        "malformed_messages": bad,
        "final_stats": finals,
        "final_waiters": final_waiters,  # waiter counts once nobody waits: must be 0
        "recoveries": sum(f["recoveries"] for f in finals.values()),
        "wall_s": time.monotonic() - t_start,
        "failures": [t for t in trials if not t.ok],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=1000, help="trials in all, split between the two set-ups")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", default="main,separate", help="consumer set-ups: main, separate or both")
    args = ap.parse_args()
    s = run(args.trials, args.seed, tuple(args.modes.split(",")), log=lambda m: print(m, flush=True))
    for key in ("trials", "passed", "no_arrival", "call_overruns", "raw_call_overruns", "calls_over_timeout_plus_0.2s",
                "false_waiter_counts", "malformed_messages", "final_waiters", "recoveries"):
        print(f"{key:28s} {s[key]}")
    print(f"{'longest call / wait':28s} {s['longest_call_s']:.3f} / {s['longest_wait_s']:.3f} s "
          f"(limit {CALL_TIMEOUT_S + GRACE_S:.1f} s)")
    print(f"{'arrival median/max':28s} {s['arrival_median_s']:.3f} / {s['arrival_max_s']:.3f} s")
    print(f"{'final stats':28s} {s['final_stats']}")
    print(f"{'wall':28s} {s['wall_s']:.1f} s")
    sys.exit(0 if s["passed"] == s["trials"] and not s["final_waiters"] and not s["malformed_messages"] else 1)


if __name__ == "__main__":
    main()
