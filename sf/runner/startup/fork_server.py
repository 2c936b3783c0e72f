"""Imported by the fork server every worker process is forked from (supervision.worker_context), never by the runner.

Whatever is imported here is imported once, and its memory pages are shared by every worker (copy-on-write).
"""
import os
import signal
import sys

# The workers live in a process group of their own: what a terminal's Ctrl-C or `timeout`/a batch system's SIGTERM
# sends to the foreground group reaches the runner alone, which stops its workers in order (final checkpoint first).
# Signalled directly, the learner would die without its final checkpoint and the fork server with all its children.
os.setpgid(0, 0)
signal.signal(signal.SIGINT, signal.SIG_IGN)  # before the line above took effect; kept by the forked workers
# A batch system may signal every process of a job (Slurm's scancel and requeue: SIGTERM to each one): the runner gets
# it too and stops the run in order; this process ends when the runner closes its end (multiprocessing's forkserver
# exits on EOF). Each worker installs its own SIGTERM handler at start (supervision.child_main).
signal.signal(signal.SIGTERM, signal.SIG_IGN)

from sf.processes.control import RUNNER_PID_VAR, die_with_parent, runner_alive, set_parent, set_process_name  # noqa: E402

set_process_name("fork_server")  # top, ps: sf:fork_server (each worker renames itself at start)
# It exits when the runner's end of its pipe closes, but reads that pipe only once its preloading (torch, the warm-up
# below: seconds, more on a loaded machine) is over: a runner SIGKILLed during start-up would leave it running that
# long. The kernel ends it with the runner instead (a worker it forked asks the same for itself). A runner that died
# before this line (Python's start-up and train.py's imports come first: seconds beside a CPU-bound process) sends no
# signal any more: its orphan, adopted by another process, exits here.
die_with_parent()
set_parent(int(os.environ.get(RUNNER_PID_VAR, os.getppid())))
if not runner_alive():
    os._exit(0)

# Every worker is forked from this process, so it must never initialize CUDA: a child of a process that did cannot
# use CUDA ("initialization error"). torch.cuda.is_available() calls cudaGetDeviceCount, which initializes the driver,
# unless this variable makes it ask NVML (torch's documented fork-safe check); the workers inherit it, harmlessly.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import torch  # noqa: E402,F401

import sf.learning.learner  # noqa: E402,F401
from sf.processes.control import check_cuda_driver  # noqa: E402
import sf.runner.startup.supervision  # noqa: E402,F401
import sf.sampling.policy_worker  # noqa: E402,F401
import sf.sampling.rollout_worker  # noqa: E402,F401


def _warm_up() -> None:
    """One Adam step on a tiny model: torch imports much on first use (torch._dynamo, sympy: seconds of CPU), which
    the learner would otherwise do at each start, silent for the stall watchdog. One thread: no thread pool exists in
    this process when it forks.

    Nothing here may initialize CUDA, or no worker forked from this process can use it (seen on an H100: "Cannot
    re-initialize CUDA in forked subprocess", then "CUDA error: initialization error"). So no backward(): the autograd
    engine's first backward starts a thread per device and asks CUDA for its device count, which initializes the
    driver; the gradients are set by hand (the step imports the same modules). And Adam's step asks whether the current
    CUDA stream is capturing a graph, which creates a CUDA context: that check is skipped for this optimizer alone
    (under both of its names: torch renamed it)."""
    torch.set_num_threads(1)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    for check in ("_accelerator_graph_capture_health_check", "_cuda_graph_capture_health_check"):
        setattr(optimizer, check, lambda: None)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()


_warm_up()

# The Python-level care above (tests/runner/test_fork_server.py) asked of the driver itself; the env modules, preloaded
# after this module, are asked about by sf/runner/startup/fork_server_ready.py, the last module preloaded.
check_cuda_driver("train.py's imports (__main__), torch, sf's worker modules and the warm-up")
PRELOADED = frozenset(sys.modules)  # (what the env modules add: named by fork_server_ready's check)
