"""sf.ipc.Queue in one process: message types, Full/Empty/timeouts, size errors, close, threads."""
import pickle
import queue
import threading
import time

import numpy as np
import pytest

from sf.ipc import DEFAULT_MAX_SIZE_BYTES, Empty, Full, Queue

pytestmark = pytest.mark.timeout(60)


def test_exceptions_are_the_queue_modules():
    assert Full is queue.Full and Empty is queue.Empty


@pytest.mark.parametrize("msg", [
    0, 1, -1, 255, 2**31, -2**31 - 1, 2**63 - 1, -2**63, 2**64, -2**100,  # ints, incl. beyond int64
    (3, 17, 42), (), (7,), (1, 2**40, -5), tuple(range(255)), tuple(range(256)),  # int tuples
    (True, 1), (1, 2.0), (1, (2, 3)), (2**63, 1),  # tuples that are not plain int64 tuples: pickled
    True, False, None, 3.5, "text", b"", b"bytes\x00\xff", bytearray(b"ba"),
    {"a": [1, 2, (3, 4)]}, [1, 2, 3], {1, 2},
])
def test_roundtrip_keeps_value_and_type(msg):
    q = Queue()
    q.put(msg)
    out = q.get(timeout=1)
    assert out == msg and type(out) is type(msg)
    if isinstance(msg, tuple):
        assert all(type(a) is type(b) for a, b in zip(out, msg))


def test_numpy_and_large_pickled_objects():
    q = Queue(max_size_bytes=4 << 20)
    arr = np.random.default_rng(0).standard_normal((300, 700))  # 1.6 MB pickled
    q.put({"obs": arr, "id": 3})
    out = q.get(timeout=1)
    assert out["id"] == 3 and np.array_equal(out["obs"], arr)


def test_fifo_order_and_get_many():
    q = Queue()
    msgs = [i if i % 3 else (i, i + 1) for i in range(1000)] + [b"x" * 100, "s"]
    q.put_many(msgs)
    assert q.qsize() == len(msgs) and not q.empty()
    assert q.get() == msgs[0]
    assert q.get_many(max_messages_to_get=5) == msgs[1:6]
    rest = []
    while len(rest) < len(msgs) - 6:
        rest += q.get_many(timeout=1)
    assert rest == msgs[6:]
    assert q.empty() and q.qsize() == 0
    q.put_many([])  # no-op
    q.put_many(iter([1, 2]))  # any iterable
    assert q.get_many() == [1, 2]


def test_get_many_reads_messages_bigger_than_its_buffer():
    q = Queue(max_size_bytes=8 << 20)
    big = [bytes([i]) * (1 << 20) for i in range(5)]  # each bigger than the initial read buffer
    q.put_many(big)
    got = []
    while len(got) < 5:
        got += q.get_many(timeout=1)
    assert got == big


def test_nonblocking_full_and_empty():
    q = Queue(maxsize=3)
    with pytest.raises(Empty):
        q.get_nowait()
    with pytest.raises(Empty):
        q.get(block=False)
    with pytest.raises(Empty):
        q.get_many(block=False)
    with pytest.raises(Empty):
        q.get(timeout=0)
    for i in range(3):
        q.put_nowait(i)
    assert q.full() and q.qsize() == 3
    with pytest.raises(Full):
        q.put_nowait(3)
    with pytest.raises(Full):
        q.put(3, block=False)
    with pytest.raises(Full):
        q.put(3, timeout=0)
    with pytest.raises(Full):  # all or nothing: 2 do not fit, none goes in
        q.put_many([1, 2], block=False)
    assert q.get_nowait() == 0
    assert not q.full()
    q.put_many_nowait([9])
    assert q.get_many_nowait() == [1, 2, 9]


def test_byte_capacity_full():
    q = Queue(max_size_bytes=1000)
    payload = b"z" * 195  # 195 + 1 tag + 4 framing = 200 bytes per record
    for _ in range(5):
        q.put_nowait(payload)
    assert q.full()
    with pytest.raises(Full):
        q.put_nowait(b"")
    q.get()
    q.put_nowait(payload)


@pytest.mark.parametrize("timeout", [0.05, 0.3])
def test_timeouts_are_honoured(timeout):
    q = Queue(maxsize=1)
    t0 = time.monotonic()
    with pytest.raises(Empty):
        q.get(timeout=timeout)
    assert timeout <= time.monotonic() - t0 < timeout + 0.25
    t0 = time.monotonic()
    with pytest.raises(Empty):
        q.get_many(timeout=timeout)
    assert timeout <= time.monotonic() - t0 < timeout + 0.25
    q.put(1)
    t0 = time.monotonic()
    with pytest.raises(Full):
        q.put(2, timeout=timeout)
    assert timeout <= time.monotonic() - t0 < timeout + 0.25


def test_bad_arguments_raise_clear_errors():
    q = Queue()
    with pytest.raises(ValueError, match="non-negative"):
        q.get(timeout=-1)
    with pytest.raises(TypeError, match="timeout"):
        q.put(1, timeout="soon")
    with pytest.raises(TypeError, match="unexpected keyword"):
        q.get(blocking=True)
    with pytest.raises(TypeError):
        q.put()
    with pytest.raises(ValueError, match="max_messages_to_get"):
        q.get_many(max_messages_to_get=0)
    with pytest.raises(ValueError, match="max_size_bytes"):
        Queue(max_size_bytes=10)
    with pytest.raises(TypeError):
        q.put_many(5)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        q.put(lambda: 0)  # not picklable: the error surfaces, the queue is untouched
    assert q.empty()


def test_message_larger_than_capacity_is_a_value_error_not_a_hang():
    q = Queue(max_size_bytes=1000)
    with pytest.raises(ValueError, match=r"1005 bytes.*max_size_bytes=1000"):
        q.put(b"x" * 1000, timeout=None)  # would block forever if it were treated as "full"
    with pytest.raises(ValueError, match="max_size_bytes=1000"):
        q.put(list(range(1000)))  # pickled fallback too
    q.put(b"x" * (1000 - 5))  # exactly the capacity fits
    assert len(q.get()) == 995
    with pytest.raises(ValueError, match="smaller batches"):
        q.put_many([b"x" * 300] * 4)
    with pytest.raises(ValueError, match="maxsize=2"):
        Queue(maxsize=2).put_many([1, 2, 3])
    assert q.empty()


def test_defaults_and_repr():
    q = Queue()
    assert q.maxsize == 0 and q.max_size_bytes == DEFAULT_MAX_SIZE_BYTES == 1 << 20
    assert Queue(maxsize=-5).maxsize == 0  # like multiprocessing.Queue: <= 0 means unlimited
    assert "max_size_bytes=1048576" in repr(q)
    s = q.stats()
    assert s["count"] == 0 and s["capacity"] == 1 << 20 and s["recoveries"] == 0
    q.join_thread()
    q.cancel_join_thread()


def test_close():
    q = Queue()
    q.put(1)
    q.close()
    assert q.closed and "closed" in repr(q)
    for call in (lambda: q.put(1), q.get_nowait, q.qsize, lambda: q.get_many(timeout=0)):
        with pytest.raises(ValueError, match="closed"):
            call()
    q.close()  # idempotent


def test_pickling_outside_process_spawning_is_refused():
    q = Queue()
    with pytest.raises(RuntimeError, match="inheritance"):
        pickle.dumps(q)


def test_threads_many_producers_and_consumers():
    q = Queue(max_size_bytes=4096)  # small: producers block on full, consumers on empty
    n_prod, n_cons, per = 4, 2, 5000
    received = [[] for _ in range(n_cons)]

    def produce(p):
        for s in range(0, per, 10):
            if s % 20:
                q.put_many([(p, s + i) for i in range(10)])
            else:
                for i in range(10):
                    q.put((p, s + i))

    errors = []

    def consume(c):
        try:
            while True:
                msgs = q.get_many(timeout=10)
                if None in msgs:  # one sentinel each: hand back any extra one we took
                    received[c] += msgs[:msgs.index(None)]
                    for _ in range(msgs.count(None) - 1):
                        q.put(None)
                    return
                received[c] += msgs
        except Exception as e:  # reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(n_prod)]
    threads += [threading.Thread(target=consume, args=(c,)) for c in range(n_cons)]
    for t in threads:
        t.start()
    for t in threads[:n_prod]:
        t.join(30)
    for _ in range(n_cons):
        q.put(None)
    for t in threads[n_prod:]:
        t.join(30)
    assert not any(t.is_alive() for t in threads) and not errors
    everything = sorted(m for r in received for m in r)
    assert everything == sorted((p, s) for p in range(n_prod) for s in range(per))
    for r in received:  # each consumer sees every producer's messages in order
        for p in range(n_prod):
            seqs = [s for (pp, s) in r if pp == p]
            assert seqs == sorted(seqs)


def test_blocked_get_releases_the_gil():
    q = Queue()
    result = []
    t = threading.Thread(target=lambda: result.append(q.get(timeout=10)))
    t.start()
    time.sleep(0.1)
    # If get() held the GIL while waiting, this thread could not run until it timed out.
    t0 = time.monotonic()
    q.put("wake")
    t.join(5)
    assert result == ["wake"] and time.monotonic() - t0 < 1.0


def test_close_while_another_thread_waits():
    q = Queue()
    errors = []

    def waiter():
        try:
            q.get(timeout=0.3)
        except Empty:
            pass
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    q.close()  # must not unmap under the waiting thread
    t.join(5)
    assert not errors and not t.is_alive()
    with pytest.raises(ValueError):
        q.get_nowait()


def _fail_to_load():
    raise RuntimeError("cannot be unpickled here")


class _Unloadable:
    """Pickles fine, fails when loaded (like a class missing in the consumer)."""

    def __reduce__(self):
        return _fail_to_load, ()


def test_undecodable_message_raises_but_loses_nothing_else():
    q = Queue()
    q.put_many([1, _Unloadable(), (2, 3), "four"])
    with pytest.raises(RuntimeError, match="cannot be unpickled"):
        q.get_many()
    assert q.get() == 1  # the rest of the batch is served first, in order
    assert q.get_many() == [(2, 3), "four"]
    q.put(5)
    assert q.get_many() == [5]
