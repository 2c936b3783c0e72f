"""`sf.ipc.Queue`: the C++ shared-memory queue behind a `multiprocessing.Queue`-compatible face.

The heavy lifting is in C++ (`cpp/ipc/`): `_cqueue.CQueue` implements put/get/put_many/get_many/qsize/
empty/full/close directly as C methods, so a call like `q.put((3, 17, 42))` never runs a Python frame.
This module adds what belongs to Python: pickling for spawned children (the memfd travels as a file
descriptor), the pickle used for messages without a fast path, and the few no-op methods that
`multiprocessing.Queue` has. See docs/ipc.md for the design.
"""
from __future__ import annotations

import queue as _queue
from multiprocessing import context as _mp_context
from multiprocessing import reduction as _reduction

from sf.ipc import _cqueue  # type: ignore[attr-defined]  # the compiled extension (no stub)

Full = _queue.Full
Empty = _queue.Empty
CorruptQueueError = _cqueue.CorruptQueueError
DEFAULT_MAX_SIZE_BYTES: int = _cqueue.DEFAULT_MAX_SIZE_BYTES

# Messages without a fast path are pickled like multiprocessing.Queue does it, with ForkingPickler, so
# objects with multiprocessing-aware reductions (e.g. torch tensors once torch.multiprocessing is
# imported) behave the same as with the standard queue.
_cqueue._set_serializers(_reduction.ForkingPickler.dumps, _reduction.ForkingPickler.loads)


def _rebuild_queue(cls: type, dupfd) -> "Queue":
    """Unpickle in the child: map the region behind the inherited memfd (no __init__, no new memory)."""
    q = cls.__new__(cls)
    q._attach_fd(dupfd.detach())
    return q


class Queue(_cqueue.CQueue):
    """Multi-producer, multi-consumer FIFO in shared memory; a drop-in for `multiprocessing.Queue`.

    Args:
        maxsize: limit on the number of queued messages; 0 (or negative) means no limit, as in
            `multiprocessing.Queue`.
        max_size_bytes: capacity of the circular buffer in bytes (default 1 MiB). Each message takes
            its encoded size + 4 bytes; one that can never fit raises ValueError naming the sizes.

    Methods (implemented in C): `put(obj, block=True, timeout=None)`, `put_nowait(obj)`,
    `put_many(objs, block=True, timeout=None)` (all or nothing), `get(block=True, timeout=None)`,
    `get_nowait()`, `get_many(block=True, timeout=None, max_messages_to_get=None)` -> list,
    `qsize()`, `empty()`, `full()`, `close()`, `stats()`. They raise `queue.Full` / `queue.Empty`.

    Ints, tuples of ints (up to 255 elements, each fitting int64) and `bytes` are encoded in C
    without pickle; any other picklable object is pickled. Hand the queue to child processes as a
    `Process` argument (fork or spawn) or by inheritance; it keeps working if any process using it
    is killed, even inside put/get. Nothing is created in /dev/shm: the memory is an anonymous memfd
    that disappears with the last process mapping it.
    """

    __slots__ = ()

    def __init__(self, maxsize: int = 0, max_size_bytes: int = DEFAULT_MAX_SIZE_BYTES) -> None:
        super().__init__(maxsize, max_size_bytes)

    def __reduce__(self):
        """Pickle for a child being spawned: the memfd is passed as a file descriptor.

        Like `multiprocessing.Queue`, only allowed while spawning a process (as an argument of
        `Process` or inherited by it); elsewhere a pickled fd would be meaningless.
        """
        _mp_context.assert_spawning(self)
        return _rebuild_queue, (type(self), _reduction.DupFd(self._fd))

    def put_many_nowait(self, objs) -> None:
        """Equivalent to `put_many(objs, block=False)` (faster-fifo compatible name)."""
        self.put_many(objs, False)

    def get_many_nowait(self, max_messages_to_get: int | None = None) -> list:
        """Equivalent to `get_many(block=False, ...)` (faster-fifo compatible name)."""
        return self.get_many(False, None, max_messages_to_get)

    def join_thread(self) -> None:
        """No-op: unlike `multiprocessing.Queue` there is no feeder thread to join."""

    def cancel_join_thread(self) -> None:
        """No-op: unlike `multiprocessing.Queue` there is no feeder thread."""

    def __repr__(self) -> str:
        if self.closed:
            return f"<{type(self).__name__} closed>"
        return f"<{type(self).__name__} maxsize={self.maxsize} max_size_bytes={self.max_size_bytes}>"
