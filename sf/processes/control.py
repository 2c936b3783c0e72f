"""Process control for every process of a run: the parent-death signal and the parent check a worker's loops make,
thread counts and CPU affinity, and killing processes and their descendants together with the files they leave behind
(through hooks the envs register: a VizDoom engine's shared memory). Used by the runner
(sf/runner/startup/supervision.py starts and supervises the workers) and by the workers themselves.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NAME = 15
# this child's parent when it started (set by sf.runner.startup.supervision.child_main via set_parent)
_parent_pid = None
RUNNER_PID_VAR = "SF_FORK_SERVER_PARENT"  # the runner's pid, in the environment of the fork server it starts
_leftover_hooks: list = []


def set_parent(pid: int) -> None:
    """Remember the process runner_alive() watches (the child's parent at start-up)."""
    global _parent_pid
    _parent_pid = pid


class ParentDied(BaseException):
    """Raised in a worker's main thread when the runner died, to unwind through its `finally` blocks."""


def _prctl(option: int, arg: int) -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, arg)
    except OSError:  # not Linux: the parent-pid checks in the loops still apply
        pass


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies, so no orphan keeps shared memory."""
    _prctl(PR_SET_PDEATHSIG, int(sig))


def process_title(name: str) -> str:
    """The kernel's name for process `name` of a run (sf.processes.shared_state's names, less "_worker"): sf:learner,
    sf:policy_0, sf:rollout_3, sf:fork_server; at most 15 bytes (the kernel's limit)."""
    return ("sf:" + name.replace("_worker", ""))[:15]


def set_process_name(name: str) -> None:
    """Show this process as process_title(name) in top, ps and psutil's name() (/proc/<pid>/comm; its command line is
    unchanged). Called first thing in the main thread: the threads it starts later (torch's) inherit the name."""
    _prctl(PR_SET_NAME, process_title(name).encode())  # type: ignore[arg-type]  # prctl takes a char* here


def become_subreaper() -> None:
    """The runner adopts the orphans of its descendants (the engines of a worker that was SIGKILLed) instead of init,
    so that kill_adopted() can end them."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def add_leftover_hook(hook: Callable[[list[str]], list[Path]]) -> None:
    """Register `hook(cmdline) -> files` naming what a killed process of that command line leaves behind (an env
    engine's shared memory: sf_envs.registry.process_leftover_files). Each process registers the hooks of the envs it
    runs; this module knows no env."""
    if hook not in _leftover_hooks:
        _leftover_hooks.append(hook)


def kill_processes(processes: list) -> None:
    """SIGKILL psutil processes; for those a leftover hook recognizes (env engines), also remove the files they leave
    (their shared memory) once they are dead: the engine's host removes those when it closes the game, which a host
    that was (or is about to be) killed never does."""
    files = []
    for p in processes:
        try:
            cmdline = p.cmdline()
            files += [f for hook in _leftover_hooks for f in hook(cmdline)]
        except psutil.Error:  # gone already, or unreadable: it is still killed below if it can be
            pass
        try:
            p.kill()
        except psutil.Error:
            pass
    if files:
        _wait_dead(processes, timeout=5.0)
        for f in files:
            try:
                f.unlink(missing_ok=True)
            except OSError:
                pass


def _wait_dead(processes: list, timeout: float) -> None:
    """Wait until each process is gone or a zombie (dead, not yet reaped: its parent may be frozen, see kill_tree)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        alive = []
        for p in processes:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                pass
        if not alive:
            return
        processes = alive
        time.sleep(0.02)


REPEAT_GAP_SEC = 0.5  # a person's second Ctrl-C comes later than this after the first


class StopRequests:
    """How many times a process was asked to stop by SIGINT/SIGTERM, counted as a person means them: the first signal
    asks for an orderly stop, and only a later Ctrl-C (SIGINT at least REPEAT_GAP_SEC after the last one counted) asks
    again (stop at once). `timeout` and terminals deliver one request to a process and to its process group, so the
    same request can arrive twice within microseconds; and a repeated SIGTERM is not a second request: escalating is
    its sender's (SIGKILL after a grace period: `timeout -k`, Slurm's KillWait)."""

    def __init__(self):
        self.count, self._last = 0, float("-inf")

    def receive(self, signum: int, now: float | None = None) -> bool:
        """Count `signum` (at monotonic time `now`); True if it is a new request, False if it repeats the last."""
        now = time.monotonic() if now is None else now
        if self.count and (signum != signal.SIGINT or now - self._last < REPEAT_GAP_SEC):
            return False
        self.count, self._last = self.count + 1, now
        return True


def _raise_parent_died(signum, frame) -> None:
    # ignore any further SIGTERM: closing a VizDoom game delivers one to this process (seen with vizdoom 1.2),
    # which would otherwise kill the worker half-way through closing its envs
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise ParentDied("SIGTERM: the runner exited or asked this worker to die")


def runner_alive() -> bool:
    """False once the process that was this child's parent when it started is gone (checked in the workers' loops;
    the parent-death signal normally ends them first)."""
    return _parent_pid is not None and os.getppid() == _parent_pid


def kill_descendants(pid: int | None = None) -> None:
    """SIGKILL every process below `pid` (default: this process), e.g. the env engines of a worker about to die."""
    try:
        kill_processes(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        pass


def kill_tree(process) -> None:
    """SIGKILL a worker (multiprocessing.Process) and, first, everything it started. The worker is frozen (SIGSTOP)
    while its engines die: running, it would take a dead engine for a failed env and start a fresh one."""
    try:
        os.kill(process.pid, signal.SIGSTOP)
    except OSError:  # gone already
        pass
    kill_descendants(process.pid)
    process.kill()


def limit_threads(num_threads: int) -> None:
    """Pin the thread pools of torch, OpenMP/MKL and OpenCV to `num_threads` (envs run single-threaded)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(num_threads)
    import torch
    torch.set_num_threads(num_threads)
    try:
        import cv2
        cv2.setNumThreads(num_threads if num_threads > 1 else 0)
    except ImportError:
        pass


# The CUDA driver's own library: whatever initializes CUDA in a process (torch, jax, a GPU renderer) does it there.
CUDA_DRIVER = "libcuda.so.1"
CUDA_ERROR_NOT_INITIALIZED = 3  # (cuda.h) every driver call but cuInit answers it until cuInit has run in the process
_driver_checks: list[tuple[str, bool | None]] = []  # the fork server's (what it had imported, CUDA initialized?)


def cuda_driver_initialized() -> bool | None:
    """Whether this process initialized the CUDA driver (cuInit ran), asked of the driver without initializing it:
    cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED before cuInit, anything else (success, 0) after. torch's own
    flag (torch.cuda._is_in_bad_fork) sees only torch's initialization, and nothing done from C++ or by another library.
    None: no driver to ask (no libcuda: no NVIDIA driver, so nothing can have initialized CUDA here). Loading the
    library initializes nothing: a process forked after it can still initialize CUDA itself."""
    try:
        driver = ctypes.CDLL(CUDA_DRIVER)
    except OSError:
        return None
    count = ctypes.c_int()
    return driver.cuDeviceGetCount(ctypes.byref(count)) != CUDA_ERROR_NOT_INITIALIZED


def check_cuda_driver(imported: str) -> None:
    """In the fork server, once it imported `imported`: has anything initialized CUDA? Every worker is forked from it,
    and a child of a process that initialized CUDA cannot use CUDA ("initialization error"). The answer is kept in this
    process, so every worker forked from it inherits it: a CUDA process refuses to start in one line that names the
    culprit (forked_from_cuda), and a CPU run, which no initialized CUDA harms, runs. (Not a fall-back to spawn: spawned
    workers each import torch again, minutes and gigabytes for a large run, to hide a bug the user can fix.)"""
    initialized = cuda_driver_initialized()
    if initialized is None:  # (a debug line: the fork server configures no logging; seen where a test configures it)
        logging.getLogger("sf").debug("fork server: no CUDA driver here (%s cannot be loaded): nothing to check",
                                      CUDA_DRIVER)
    _driver_checks.append((imported, initialized))


def driver_checks() -> list[tuple[str, bool | None]]:
    """The fork server's driver checks, in order (inherited by the workers forked from it; [] elsewhere)."""
    return list(_driver_checks)


def forked_from_cuda() -> str | None:
    """Why this process cannot use CUDA because of the process it was forked from, or None."""
    culprit = next((imported for imported, initialized in _driver_checks if initialized), None)
    if culprit is not None:
        return (f"the fork server it was forked from had initialized CUDA once it imported {culprit}, and a child of "
                f"such a process cannot use CUDA: make that code initialize CUDA only when called (in the env's "
                f"factory, under `if __name__ == \"__main__\":`), or train with --device cpu")
    import torch
    if torch.cuda._is_in_bad_fork():  # (torch's own flag, set in a forked child whose parent initialized CUDA)
        return ("it was forked from a process that had initialized CUDA: CUDA processes must be started by the fork "
                "server or with spawn")
    return None


def bind_device(device) -> None:
    """Make `device` this thread's current CUDA device (nothing for the CPU). Every process and thread that does CUDA
    work calls it first: a new process or thread starts on GPU 0, and any CUDA call that names no device (a stream, an
    event, pinned host memory, a synchronisation) would create a context on GPU 0 and act there, while a rank >= 1 or
    `cuda:1` trains on another GPU.

    A process forked from one that had initialized CUDA cannot use CUDA at all: said here in one line, before the
    first CUDA call fails with "Cannot re-initialize CUDA in forked subprocess" (forked_from_cuda)."""
    import torch
    device = torch.device(device)
    if device.type != "cuda":
        return
    why = forked_from_cuda()
    if why is not None:
        raise RuntimeError(f"process {os.getpid()} cannot use {device}: {why}")
    torch.cuda.set_device(device.index or 0)  # ("cuda" names the current device: a new process's or thread's is 0)


def device_thread(target: Callable[[], None], device, name: str) -> threading.Thread:
    """A daemon thread running `target` with `device` bound first (bind_device: CUDA's current device is per thread)."""
    def run() -> None:
        bind_device(device)
        target()
    return threading.Thread(target=run, name=name, daemon=True)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: taskset, a Slurm allocation, a container's cpuset), which
    is what a run's workers share; os.cpu_count() where the platform has no affinity."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def set_affinity(core: int | None, nice: int = 0) -> None:
    if core is not None:
        try:
            cores = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cores[core % len(cores)]})
        except (AttributeError, OSError):
            pass
    if nice:
        try:
            os.nice(nice)
        except OSError:
            pass
