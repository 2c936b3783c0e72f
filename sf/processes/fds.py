"""File descriptors a process started from the fork server receives with its arguments.

multiprocessing's fork server gets every descriptor of a new process's pickled arguments (a shared CPU tensor's
storage, an sf.ipc.Queue's memfd) in one message beside 4 of its own, and refuses more than MAXFDS_TO_SEND in all:
a process whose arguments carry more than MAX_FDS_SENT cannot be started. sf.utils.packed keeps many tensors in one
descriptor; fds_sent() counts what an argument tuple carries, the way the fork server's Popen collects them.
"""
from __future__ import annotations

import io
from multiprocessing import context, forkserver, reduction
from multiprocessing.popen_forkserver import _DupFd

import torch.multiprocessing  # noqa: F401 — registers the reductions that share tensors by descriptor

MAX_FDS_SENT = forkserver.MAXFDS_TO_SEND - 5  # connect_to_new_process refuses len(fds) + 4 >= MAXFDS_TO_SEND


class _Collector:
    """Stands in for popen_forkserver.Popen while pickling: collects the descriptors instead of sending them."""
    DupFd = _DupFd

    def __init__(self):
        self.fds: list[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(fd)
        return len(self.fds) - 1


def fds_sent(obj) -> int:
    """The number of file descriptors the fork server would send a process whose arguments are `obj` (pickled as
    multiprocessing pickles them for a new process)."""
    collector = _Collector()
    context.set_spawning_popen(collector)
    try:
        reduction.ForkingPickler(io.BytesIO()).dump(obj)
    finally:
        context.set_spawning_popen(None)
    return len(collector.fds)
