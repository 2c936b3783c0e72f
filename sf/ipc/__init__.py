"""Inter-process communication: the crash-safe shared-memory queue (`Queue`) and its exceptions.

`from sf.ipc import Queue, Full, Empty` -- `Full` and `Empty` are the `queue` module's exceptions, so
code written for `multiprocessing.Queue` catches them unchanged. The C++ core lives in `cpp/ipc/`;
build it with `python setup.py build_ext --inplace`.
"""
from sf.ipc.queue import DEFAULT_MAX_SIZE_BYTES, CorruptQueueError, Empty, Full, Queue

__all__ = ["Queue", "Full", "Empty", "CorruptQueueError", "DEFAULT_MAX_SIZE_BYTES"]
