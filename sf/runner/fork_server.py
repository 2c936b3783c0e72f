"""Imported by the fork server every worker process is forked from (supervision.worker_context), never by the runner.

Whatever is imported here is imported once, and its memory pages are shared by every worker (copy-on-write).
"""
import gc
import os
import signal

# The workers live in a process group of their own: what a terminal's Ctrl-C or `timeout`/a batch system's SIGTERM
# sends to the foreground group reaches the runner alone, which stops its workers in order (final checkpoint first).
# Signalled directly, the learner would die without its final checkpoint and the fork server with all its children.
os.setpgid(0, 0)
signal.signal(signal.SIGINT, signal.SIG_IGN)  # before the line above took effect; kept by the forked workers

import torch  # noqa: E402,F401

import sf.learning.learner  # noqa: E402,F401
import sf.runner.supervision  # noqa: E402,F401
import sf.sampling.policy_worker  # noqa: E402,F401
import sf.sampling.rollout_worker  # noqa: E402,F401



def _warm_up() -> None:
    """One Adam step on a tiny model: torch imports much on first use (torch._dynamo, sympy: seconds of CPU), which
    the learner would otherwise do at each start, silent for the stall watchdog. One thread: no thread pool exists in
    this process when it forks."""
    torch.set_num_threads(1)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.zeros(1, 2)).sum().backward()
    optimizer.step()


_warm_up()

# Objects that exist now live for the process's lifetime: keep the cyclic GC from touching (and so copying) their pages
# in every worker.
gc.freeze()
