"""Per-process set-up and crash reporting for the workers the runner starts (process control itself, shared with the
workers, is sf/processes/control.py).

Every child: ignores SIGINT (the runner owns Ctrl-C and stops children in order), dies with its parent
(PR_SET_PDEATHSIG, plus a parent-pid check in the loops), sets its own thread counts and CPU affinity,
and reports any exception with its traceback to the runner before exiting non-zero. Rollout workers own
processes of their own (a VizDoom env is an engine process with shared-memory segments): on the runner's
death they unwind and close their envs instead of being SIGKILLed, and whoever kills a worker kills its
descendants first, so that no engine outlives the run; a killed engine's shared-memory files go with it.
A child that is stuck (alive, but in a call that never returns) is found by the runner through its heartbeat
(SharedState) and its Python stack read with read_stack().
"""
from __future__ import annotations

import faulthandler
import functools
import io
import logging
import os
import pickle
import sys
import signal
import tempfile
import time
import traceback

import psutil
from multiprocessing.reduction import ForkingPickler

from sf.processes.control import (RUNNER_PID_VAR, ParentDied, _raise_parent_died, die_with_parent, forked_from_cuda,
                                 kill_processes, runner_alive, set_parent, set_process_name)

# torchrun (data-parallel ranks, sf/processes/ranks.py): every line names its rank
_RANK = f"[rank {os.environ.get('RANK', '0')}]" if os.environ.get("WORLD_SIZE", "1") != "1" else ""
LOG_FORMAT = f"[%(asctime)s][%(process)d]{_RANK}[%(levelname)s] %(message)s"
LOG_DATEFMT = "%Y-%m-%d %H:%M:%S"
STACK_SIGNAL = signal.SIGUSR1
TRACE_LOG = "sf.trace"  # logger of crash tracebacks: the log file only (the console gets one line per crash)
_stack_file = None  # this process's stack-dump file (kept open: faulthandler writes to its descriptor)


def kill_adopted(own_children: set) -> None:
    """SIGKILL the children of this process that it did not start itself: orphans adopted as a subreaper."""
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    kill_processes([child for child in children if child.pid not in own_children])


def worker_context(env_modules: list[str]):
    """The multiprocessing context every worker starts from: a fork server, started once, that has imported torch, our
    worker modules and `env_modules` (what making one env imported, e.g. vizdoom). A worker forked from it starts in
    milliseconds and shares those pages with its siblings; spawned, each would import torch again (a CPU second and tens
    of MiB of private memory apiece, minutes and gigabytes for 72 workers on 2 cores). The fork server dies with the
    runner (it exits when its pipe from the runner closes), and its children with it (parent-death signal)."""
    import multiprocessing.forkserver

    import torch.multiprocessing
    ctx = torch.multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", "sf.runner.startup.fork_server", *env_modules,
                                "sf.runner.startup.fork_server_ready"])
    os.environ[RUNNER_PID_VAR] = str(os.getpid())  # (sf/runner/startup/fork_server.py: is its parent still alive?)
    multiprocessing.forkserver.ensure_running()  # now: it is one of the runner's own children, not an adopted orphan
    return ctx


def enable_stack_dumps(name: str, report_queue) -> None:
    """On STACK_SIGNAL, write every thread's Python stack to an anonymous file whose descriptor the runner learns
    through the report queue and reads as /proc/<pid>/fd/<fd> (read_stack). faulthandler writes from a C signal
    handler, so this works while the main thread is stuck in C code (a game engine that never answers)."""
    global _stack_file
    _stack_file = tempfile.TemporaryFile("w+")
    faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True)
    report_queue.put(("stack_file", name, _stack_file.fileno()))


def read_stack(pid: int, fd: int | None, wait: float = 2.0) -> str:
    """The Python stack of a child that called enable_stack_dumps (fd: the descriptor it reported), or why not."""
    if fd is None:
        return "(no stack: the process had not set up its stack dumps yet)"
    try:
        if psutil.Process(pid).status() == psutil.STATUS_STOPPED:  # its signal handler cannot run: do not wait for it
            return "(no stack: the process is stopped, by SIGSTOP or a debugger)"
    except psutil.Error:
        pass
    try:
        os.kill(pid, STACK_SIGNAL)
        text, deadline = "", time.time() + wait
        while time.time() < deadline:  # written by the child's signal handler as soon as it is scheduled
            time.sleep(0.1)
            with open(f"/proc/{pid}/fd/{fd}") as f:
                latest = f.read()
            if latest and latest == text:
                break
            text = latest
        return text.rstrip() or "(the process wrote no stack)"
    except OSError as e:
        return f"(no stack: {e})"


def cpu_seconds(pid: int) -> float:
    """Seconds the main thread of `pid` has run on a CPU so far (/proc/<pid>/schedstat; 0.0 where unknown)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def thread_state(pid: int) -> str:
    """The scheduler state letter of the main thread of `pid` (R runnable, S sleeping, D disk, T stopped, ...); "" if
    it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


_STATES = {"R": "runnable", "S": "sleeping", "D": "in uninterruptible sleep (disk or kernel wait)", "T": "stopped",
           "t": "stopped by a debugger", "Z": "a zombie"}


def kernel_state(pid: int) -> str:
    """What the kernel says of the main thread of `pid`: its state and the kernel function it waits in, e.g.
    "is sleeping (S) in futex_do_wait" (the top of its kernel stack too where readable, as root): why a silent
    process is silent when its Python stack cannot be had."""
    state = thread_state(pid)
    if not state:
        return "is gone"
    text = f"is {_STATES.get(state, 'in state')} ({state})"
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
        if wchan and wchan != "0":
            text += f" in {wchan}"
        with open(f"/proc/{pid}/stack") as f:
            frames = [line.split()[-1].split("+")[0] for line in f.read().splitlines()[:4]]
        if frames:
            text += f" (kernel stack {' < '.join(frames)})"
    except OSError:  # not root, or gone meanwhile
        pass
    return text


class Silence:
    """A silent process watched from half its stall limit on: stuck, busy, or starved?

    The process is looked at with its children (a rollout worker waits for its env engines): stuck (stopped, deadlocked,
    waiting on an engine that hangs) = its main thread is stopped, or it and its children sleep; busy (a long
    computation between two beats, or a loop that never ends) = runnable and running; starved = runnable but not run,
    because other work holds the CPUs: seen for 3-17 s with pinned, niced rollout workers and their engines of a run in
    its own session beside another run on 2 cores (the kernel shares CPUs between sessions first). A thread still
    waiting for a CPU shows none of that wait in its run-queue time (/proc/<pid>/schedstat) yet: the kernel adds a wait
    when it ends. Hence the samples of the states."""

    def __init__(self, pid: int, idle: float):
        self.pid, self.since = pid, idle
        try:
            self.tree = [pid, *(c.pid for c in psutil.Process(pid).children())]
        except psutil.Error:
            self.tree = [pid]
        self.ran = self._ran()
        self.samples = self.runnable = 0
        self.stopped = False  # its main thread at the last look

    def _ran(self) -> float:
        return sum(cpu_seconds(p) for p in self.tree)

    def sample(self) -> None:
        self.samples += 1
        self.stopped = thread_state(self.pid) in ("T", "t")
        self.runnable += any(thread_state(p) == "R" for p in self.tree)

    def shares(self, idle: float) -> tuple[float, float]:
        """(share of the looks that found it or a child runnable, CPU seconds it and its children ran per second of
        the silence so far)."""
        return self.runnable / max(self.samples, 1), (self._ran() - self.ran) / max(idle - self.since, 1e-6)

    def describe(self, idle: float) -> str:
        runnable, ran = self.shares(idle)
        children = f" or one of its {len(self.tree) - 1} children" if len(self.tree) > 1 else ""
        return (f"Its main thread {kernel_state(self.pid)}; over the last {idle - self.since:.0f} s it{children} was "
                f"runnable in {runnable:.0%} of the looks, and they ran {ran:.0%} of a CPU")


def _release_fork_server() -> None:
    """Close this child's copy of the fork server's liveness pipe. multiprocessing hands every child it forks the pipe's
    write end (so that the child could start processes through the same server); the fork server exits only when every
    write end is closed, and its children die only when it exits (parent-death signal): with the copies open, the
    runner's death would leave the fork server, its workers and their engines running for good."""
    import multiprocessing.forkserver as forkserver
    server = forkserver._forkserver  # private, stable since Python 3.4: the module-level ForkServer
    fd = getattr(server, "_forkserver_alive_fd", None)
    # a forked child (the runner knows the server's pid)
    if fd is not None and getattr(server, "_forkserver_pid", None) is None:
        try:
            os.close(fd)
        except OSError:
            pass
        setattr(server, "_forkserver_alive_fd", None)


def _on_sigterm(unwind: bool, signum, frame) -> None:
    """SIGTERM while the runner lives came from outside to every process of the run (Slurm's scancel and requeue signal
    each process of a job, not only the runner): the runner got it too and stops the run in order, the learner writing
    its final checkpoint, so it is ignored here. Without a runner it is the parent-death signal (`unwind`) or a stop:
    unwind (ParentDied) or exit."""
    if runner_alive():
        return
    if unwind:
        _raise_parent_died(signum, frame)
    os._exit(128 + signum)


class ArgumentsError(RuntimeError):
    """A child could not unpickle its arguments in its own process: a replacement would fail the same way."""
    stops_the_run = True


class _Pickler(ForkingPickler):
    """multiprocessing's pickler (descriptors and shared tensors are passed as for any argument), which refers to the
    report queue instead of pickling it again: child_main receives it among its own arguments, and each copy's
    descriptors would count toward what the fork server may send a process (sf.processes.fds.MAX_FDS_SENT)."""

    def __init__(self, file, report_queue):
        super().__init__(file)
        self.report_queue = report_queue

    def persistent_id(self, obj):
        return "report_queue" if obj is self.report_queue else None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, report_queue):
        super().__init__(file)
        self.report_queue = report_queue

    def persistent_load(self, pid):
        if pid != "report_queue":
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self.report_queue


class _Arguments:
    """A child's target and arguments, pickled apart from child_main's own arguments when the process is started, so
    that child_main unpickles them inside its guard. multiprocessing unpickles a process's arguments before its target
    runs: an argument that cannot be unpickled in the new process (a CUDA tensor where the process cannot use CUDA)
    ended it with torch's traceback on the fork server's stderr, and nothing in the run's log."""

    def __init__(self, report_queue, target, args):
        self.report_queue, self.target, self.args = report_queue, target, args

    def __reduce__(self):  # called while multiprocessing pickles the process: the descriptors go with it
        buf = io.BytesIO()
        _Pickler(buf, self.report_queue).dump((self.target, self.args))
        return _PickledArguments, (buf.getvalue(),)


class _PickledArguments:
    def __init__(self, data: bytes):
        self.data = data

    def load(self, name: str, report_queue):
        try:
            return _Unpickler(io.BytesIO(self.data), report_queue).load()
        except Exception as e:  # noqa: B902 — whatever fails here is reported in one line, not as a torch traceback
            first = str(e).strip().splitlines()[0] if str(e).strip() else "(no message)"
            why = forked_from_cuda()
            raise ArgumentsError(f"{name} cannot unpickle its arguments in its own process: {type(e).__name__}: "
                                 f"{first}{f'; {why}' if why else ''}") from e


def child_args(name: str, report_queue, runner_pid: int, unwind: bool, target, *args) -> tuple:
    """child_main's arguments for a child that runs `target(*args)`: those unpickled inside its guard (_Arguments)."""
    return name, report_queue, runner_pid, unwind, _Arguments(report_queue, target, args)


def child_main(name: str, report_queue, runner_pid: int, unwind: bool, target, *args) -> None:
    """Entry point of every child process: set-up, run `target(*args)`, report a crash with its traceback.

    The parent-death signal is armed first, then the runner is checked to be alive: a runner that died before the
    signal was armed (it can die at any moment of our start-up) would otherwise leave this child running for good.
    `unwind`: for a worker that owns processes (env engines), the runner's death raises ParentDied in its main thread
    (SIGTERM) instead of killing it (SIGKILL), so that its `finally` blocks close the envs and their engines.
    `target` and `args` come from child_args (unpickled here, a failure reported like a crash) or as they are.
    """
    set_process_name(name)  # top, ps: which worker this is (sf:rollout_3)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner owns Ctrl-C and stops its children in order
    _release_fork_server()
    signal.signal(signal.SIGTERM, functools.partial(_on_sigterm, unwind))
    die_with_parent(signal.SIGTERM if unwind else signal.SIGKILL)
    parent = os.getppid()  # the runner, or the fork server that started us on its behalf (it dies with it)
    set_parent(parent)
    if parent == 1 or not psutil.pid_exists(runner_pid):
        os._exit(1)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, datefmt=LOG_DATEFMT, stream=sys.stdout)
    enable_stack_dumps(name, report_queue)
    try:
        if isinstance(target, _PickledArguments):
            target, args = target.load(name, report_queue)
        target(*args)
    except ParentDied:  # nobody left to report to; `finally` blocks have closed what this worker owned
        os._exit(1)
    except BaseException as e:  # noqa: B902 — anything that kills a worker must reach the runner's log
        tb = traceback.format_exc()
        fatal = bool(getattr(e, "stops_the_run", False))  # an error a replacement process would meet again
        try:
            report_queue.put(("error", name, tb, fatal), timeout=5)
        except Exception:  # no runner to read it: the console is the only place left
            print(f"[{name}] crashed:\n{tb}", flush=True)
        os._exit(1)
