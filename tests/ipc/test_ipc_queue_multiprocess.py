"""sf.ipc.Queue across processes: fork and spawn children, 4->1 and 1->4 with 10^6 messages, big messages."""
import multiprocessing as mp
import time

import numpy as np
import pytest

import ipc_helpers as H
from sf.ipc import Empty, Queue

pytestmark = pytest.mark.e2e


def _join_all(procs, timeout):
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "child processes did not finish in time"
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_round_trip_through_a_child(method):
    """The queue is a Process argument (pickled with its memfd under spawn); both directions work."""
    ctx = mp.get_context(method)
    to_child, from_child = Queue(), Queue(maxsize=4)
    msgs = [1, (3, 17, 42), b"\x00" * 5000, {"k": "v"}, None] * 20
    p = ctx.Process(target=H.echo, args=(to_child, from_child, len(msgs)))
    p.start()
    for m in msgs:  # maxsize=4 on the way back: the child blocks on Full until we get
        to_child.put(m)
    got = [from_child.get(timeout=30) for _ in msgs]
    _join_all([p], 30)
    assert got == msgs


@pytest.mark.timeout(120)
def test_spawned_child_can_pass_the_queue_to_its_own_spawned_child():
    ctx = mp.get_context("spawn")
    a, b = Queue(), Queue()
    p = ctx.Process(target=H.spawn_grandchild_echo, args=(a, b, 3))
    p.start()
    a.put_many([(1, 2), "two", b"3"])
    assert [b.get(timeout=60) for _ in range(3)] == [(1, 2), "two", b"3"]
    _join_all([p], 60)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_two_producers_two_consumers(method, tmp_path):
    ctx = mp.get_context(method)
    q = Queue(max_size_bytes=1 << 14)
    n = 20_000
    cons = [ctx.Process(target=H.consume_to_file, args=(q, str(tmp_path / f"c{i}.npy"))) for i in range(2)]
    prods = [ctx.Process(target=H.produce_tuples, args=(q, p, n, 100, 0)) for p in range(2)]
    for p in cons + prods:
        p.start()
    _join_all(prods, 60)
    q.put_many([H.SENTINEL] * 2)
    _join_all(cons, 60)
    data = np.concatenate([np.load(tmp_path / f"c{i}.npy") for i in range(2)], axis=1)
    for p in range(2):
        assert sorted(data[1][data[0] == p].tolist()) == list(range(n))


@pytest.mark.timeout(120)
def test_four_producers_one_consumer_million_messages():
    """10^6 messages from 4 forked producers: none lost, none duplicated, each producer's in order."""
    ctx = mp.get_context("fork")
    q = Queue(max_size_bytes=1 << 20)
    n_prod, per = 4, 250_000
    prods = [ctx.Process(target=H.produce_tuples, args=(q, p, per, 1000)) for p in range(n_prod)]
    t0 = time.monotonic()
    for p in prods:
        p.start()
    nxt = [0] * n_prod
    sentinels = 0
    while sentinels < n_prod:
        for m in q.get_many(timeout=20):
            if m == H.SENTINEL:
                sentinels += 1
                continue
            p, s = m
            assert s == nxt[p], f"producer {p}: expected seq {nxt[p]}, got {s}"
            nxt[p] = s + 1
    elapsed = time.monotonic() - t0
    _join_all(prods, 30)
    assert nxt == [per] * n_prod
    assert q.empty()
    print(f"4->1: 10^6 messages in {elapsed:.2f} s")
    assert elapsed < 30


@pytest.mark.timeout(120)
def test_one_producer_four_consumers_million_messages(tmp_path):
    ctx = mp.get_context("fork")
    q = Queue(max_size_bytes=1 << 20)
    n = 1_000_000
    cons = [ctx.Process(target=H.consume_to_file, args=(q, str(tmp_path / f"c{i}.npy"))) for i in range(4)]
    t0 = time.monotonic()
    for p in cons:
        p.start()
    H.produce_tuples(q, 0, n, 1000, n_sentinels=4)
    _join_all(cons, 60)
    elapsed = time.monotonic() - t0
    parts = [np.load(tmp_path / f"c{i}.npy")[1] for i in range(4)]
    for seqs in parts:  # each consumer sees an increasing subsequence
        assert np.all(np.diff(seqs) > 0)
    counts = np.bincount(np.concatenate(parts), minlength=n)
    assert counts.shape == (n,) and np.all(counts == 1), "lost or duplicated messages"
    print(f"1->4: 10^6 messages in {elapsed:.2f} s, split {[len(s) for s in parts]}")
    assert elapsed < 30


@pytest.mark.timeout(120)
def test_large_messages_between_processes():
    """Messages up to ~90% of the capacity, straddling the ring's wrap point, arrive intact."""
    ctx = mp.get_context("fork")
    q_in, q_out = Queue(max_size_bytes=1 << 20), Queue(max_size_bytes=1 << 20)
    rng = np.random.default_rng(1)
    msgs = [rng.integers(0, 255, size=int(s), dtype=np.uint8).tobytes()
            for s in rng.integers(100_000, 900_000, size=12)]
    msgs.append(np.arange(50_000, dtype=np.float64))  # pickled path, 400 KB
    p = ctx.Process(target=H.echo, args=(q_in, q_out, len(msgs)))
    p.start()
    got = []
    for m in msgs:
        q_in.put(m, timeout=30)
        got.append(q_out.get(timeout=30))
    _join_all([p], 30)
    assert all(g == m for g, m in zip(got[:-1], msgs[:-1]))
    assert np.array_equal(got[-1], msgs[-1])


@pytest.mark.timeout(60)
def test_blocked_consumer_in_another_process_wakes_promptly():
    ctx = mp.get_context("fork")
    q, out = Queue(), Queue()
    p = ctx.Process(target=H.get_one_and_report, args=(q, out, 10.0))
    p.start()
    time.sleep(0.3)  # the child is asleep in get() by now
    q.put((1, 2, 3))
    msg, waited = out.get(timeout=10)
    _join_all([p], 10)
    assert msg == (1, 2, 3)
    assert waited < 2.0  # woken by the put (not by its 10 s timeout)


@pytest.mark.timeout(60)
def test_timeout_in_child_raises_empty():
    ctx = mp.get_context("spawn")
    q, out = Queue(), Queue()
    p = ctx.Process(target=H.get_one_and_report, args=(q, out, 0.3))
    p.start()
    msg, waited = out.get(timeout=30)
    _join_all([p], 10)
    assert msg == "EMPTY" and 0.3 <= waited < 0.8
    with pytest.raises(Empty):
        out.get_nowait()
