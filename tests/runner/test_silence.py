"""The stall watchdog's view of a silent process (sf/runner/supervision.Silence): stuck (stopped or asleep), busy
(runnable and running) or starved (runnable, not given a CPU), told from the kernel's state of its main thread."""
import os
import signal
import subprocess
import sys
import time

import pytest

from sf.runner.startup.supervision import Silence, kernel_state, thread_state

pytestmark = pytest.mark.e2e

SPIN = [sys.executable, "-c", "while True: pass"]


def watch(pid: int, seconds: float = 1.0) -> tuple[Silence, float]:
    """Looks at `pid` every 0.05 s for `seconds`, as the runner does every loop once a process is half-way silent;
    returns the Silence and the seconds watched."""
    silence = Silence(pid, idle=0.0)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(0.05)
        silence.sample()
    return silence, time.monotonic() - t0


def start(cmd, core: int | None = None, nice: int = 0) -> subprocess.Popen:
    def pre():
        if core is not None:
            os.sched_setaffinity(0, {core})
        if nice:
            os.nice(nice)
    return subprocess.Popen(cmd, preexec_fn=pre)


@pytest.fixture
def procs():
    started = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def test_a_stopped_process_is_stuck(procs):
    p = start(["sleep", "60"])
    procs.append(p)
    time.sleep(0.2)
    p.send_signal(signal.SIGSTOP)
    s, elapsed = watch(p.pid)
    runnable, ran = s.shares(elapsed)
    assert runnable == 0.0 and ran < 0.01
    assert thread_state(p.pid) == "T"
    assert "is stopped (T)" in s.describe(elapsed) and "runnable in 0% of the looks" in s.describe(elapsed)


def test_a_sleeping_process_is_stuck(procs):
    p = start(["sleep", "60"])
    procs.append(p)
    time.sleep(0.2)
    s, elapsed = watch(p.pid)
    assert s.shares(elapsed)[0] == 0.0
    assert kernel_state(p.pid).startswith("is sleeping (S)")


def test_a_spinning_process_is_busy(procs):
    p = start(SPIN)
    procs.append(p)
    time.sleep(0.3)
    s, elapsed = watch(p.pid)
    runnable, ran = s.shares(elapsed)
    assert runnable > 0.9, runnable
    assert ran > 0.0


def test_a_process_without_cpu_is_starved_not_busy(procs):
    """A nice-19 spinner pinned to one core beside two nice-0 spinners: runnable nearly always, running ~1% of the
    time (CFS weights 15 against 2 x 1024): what a rollout worker looks like when other runs hold the CPUs."""
    core = sorted(os.sched_getaffinity(0))[0]
    hogs = [start(SPIN, core) for _ in range(2)]
    procs.extend(hogs)
    starved = start(SPIN, core, nice=19)
    procs.append(starved)
    time.sleep(0.5)
    s, elapsed = watch(starved.pid, 2.0)
    runnable, ran = s.shares(elapsed)
    assert runnable > 0.9 and ran < 0.25, (runnable, ran)
    assert thread_state(starved.pid) == "R"
    assert thread_state(-1) == "" and kernel_state(-1) == "is gone"


def test_a_process_waiting_on_a_starved_child_is_starved_and_on_a_stopped_one_stuck(procs):
    """A rollout worker blocked in env.step waits (asleep) for its engine: the engine's state decides. Starved engine
    (runnable, ~no CPU): starved. Stopped engine (a hang): stuck."""
    core = sorted(os.sched_getaffinity(0))[0]
    procs.extend(start(SPIN, core) for _ in range(2))
    parent = start(["sh", "-c", f"taskset -c {core} nice -n 19 {sys.executable} -c 'while True: pass' & wait"])
    procs.append(parent)
    time.sleep(0.5)
    s, elapsed = watch(parent.pid, 2.0)
    runnable, ran = s.shares(elapsed)
    assert thread_state(parent.pid) == "S" and len(s.tree) == 2
    assert runnable > 0.9 and ran < 0.25, (runnable, ran)
    assert "or one of its 1 children was runnable" in s.describe(elapsed)
    os.kill(s.tree[1], signal.SIGSTOP)
    deadline = time.monotonic() + 30
    while thread_state(s.tree[1]) != "T" and time.monotonic() < deadline:  # a starved process stops once it runs
        time.sleep(0.05)
    s, elapsed = watch(parent.pid)
    assert s.shares(elapsed)[0] == 0.0
    os.kill(s.tree[1], signal.SIGKILL)
