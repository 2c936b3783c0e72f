"""Per-process set-up and crash reporting for the workers the runner starts.

Every child: ignores SIGINT (the runner owns Ctrl-C and stops children in order), dies with its parent
(PR_SET_PDEATHSIG, plus a parent-pid check in the loops), sets its own thread counts and CPU affinity,
and reports any exception with its traceback to the runner before exiting non-zero.
"""
from __future__ import annotations

import ctypes
import logging
import os
import sys
import signal
import traceback

PR_SET_PDEATHSIG = 1
LOG_FORMAT = "[%(asctime)s][%(process)d][%(levelname)s] %(message)s"
LOG_DATEFMT = "%Y-%m-%d %H:%M:%S"


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies, so no orphan keeps shared memory."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the parent-pid checks in the loops still apply
        pass


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


def child_main(name: str, report_queue, target, *args) -> None:
    """Entry point of every child process: set-up, run `target(*args)`, report a crash with its traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, datefmt=LOG_DATEFMT, stream=sys.stdout)
    try:
        target(*args)
    except BaseException:  # noqa: B902 — anything that kills a worker must reach the runner's log
        tb = traceback.format_exc()
        try:
            report_queue.put(("error", name, tb), timeout=5)
        except Exception:
            pass
        print(f"[{name}] crashed:\n{tb}", flush=True)
        os._exit(1)
