"""Child-process bodies shared by the tests/ipc tests.

They live in a module (not in the test files) so that children started with the spawn method can
import them by name; tests/ipc is on sys.path when pytest runs, and spawn copies sys.path to children.
"""
from __future__ import annotations

import os
import queue
import struct
import time
import zlib

import numpy as np

from sf.ipc import Empty, Queue

SENTINEL = -1


def produce_tuples(q: Queue, producer_id: int, n: int, batch: int, n_sentinels: int = 1) -> None:
    """Put (producer_id, seq) for seq in 0..n-1 in put_many batches, then `n_sentinels` SENTINELs."""
    for start in range(0, n, batch):
        q.put_many([(producer_id, s) for s in range(start, min(start + batch, n))])
    for _ in range(n_sentinels):
        q.put(SENTINEL)


def consume_to_file(q: Queue, path: str, timeout: float = 20.0) -> None:
    """Receive (producer, seq) tuples until a SENTINEL; save [producers, seqs] in arrival order to `path`.

    Used with one producer that puts all data before one sentinel per consumer. A get_many may
    return more than one sentinel: the extras are put back for the other consumers.
    """
    producers: list[int] = []
    seqs: list[int] = []
    sentinels = 0
    while not sentinels:
        for m in q.get_many(timeout=timeout):
            if m == SENTINEL:
                sentinels += 1
            elif sentinels:
                raise AssertionError(f"data {m!r} after a sentinel")
            else:
                producers.append(m[0])
                seqs.append(m[1])
    for _ in range(sentinels - 1):
        q.put(SENTINEL)
    np.save(path, np.array([producers, seqs], dtype=np.int64).reshape(2, -1))


def echo(q_in: Queue, q_out: Queue, n: int) -> None:
    """Receive n messages from q_in and send each back on q_out (used for fork/spawn round trips)."""
    for _ in range(n):
        q_out.put(q_in.get(timeout=20))


def spawn_grandchild_echo(q_in: Queue, q_out: Queue, n: int) -> None:
    """Spawn another process that echoes: the queue must survive being pickled a second time."""
    import multiprocessing as mp

    p = mp.get_context("spawn").Process(target=echo, args=(q_in, q_out, n))
    p.start()
    p.join(60)


def block_in_get(q: Queue, ready=None) -> None:
    """Block in get() for a long time (idle-CPU and killed-sleeper tests)."""
    if ready is not None:
        ready.set()
    try:
        q.get(timeout=60)
    except queue.Empty:
        pass


def drain_forever(q: Queue) -> None:
    """get_many() in a loop until killed."""
    while True:
        try:
            q.get_many(timeout=1.0)
        except Empty:
            pass


def get_one_and_report(q: Queue, out: Queue, timeout: float) -> None:
    """get() one message and report (message, seconds waited) on `out`."""
    t0 = time.monotonic()
    try:
        m = q.get(timeout=timeout)
    except Empty:
        m = "EMPTY"
    out.put((m, time.monotonic() - t0))


# ---- SIGKILL test -----------------------------------------------------------------------------------

def kill_msg(producer: int, seq: int):
    """Self-checking message: odd seqs are int tuples (fast path), even seqs are bytes with a CRC."""
    if seq % 2:
        return (producer, seq, (producer * 1000003 + seq * 7919) % 2147483647)
    size = 2000 + (seq * 7919 + producer) % 14000
    body = bytes([(producer * 7 + seq) & 0xFF]) * size
    head = struct.pack("<II", producer, seq)
    return head + body + struct.pack("<I", zlib.crc32(head + body))


def check_kill_msg(m):
    """Return (producer, seq) if m is intact, else None."""
    if isinstance(m, tuple):
        if len(m) != 3:
            return None
        p, s, c = m
        return (p, s) if c == (p * 1000003 + s * 7919) % 2147483647 and s % 2 else None
    if isinstance(m, bytes) and len(m) >= 12:
        head, body, crc = m[:8], m[8:-4], m[-4:]
        p, s = struct.unpack("<II", head)
        if struct.unpack("<I", crc)[0] != zlib.crc32(head + body) or s % 2:
            return None
        if body != bytes([(p * 7 + s) & 0xFF]) * (2000 + (s * 7919 + p) % 14000):
            return None
        return p, s
    return None


def tight_put_loop(q: Queue, producer: int) -> None:
    """Put self-checking messages as fast as possible (batches of 8) until killed."""
    seq = 0
    while True:
        batch = [kill_msg(producer, s) for s in range(seq, seq + 8)]
        q.put_many(batch)
        seq += 8


def verifying_consumer(q: Queue, report: Queue) -> None:
    """Receive until SENTINEL; check every message and that each producer's seqs form a gap-free
    prefix 0, 1, 2, ... (a put that did not complete must not show up, one that did must not vanish
    behind a later one). Report a summary dict."""
    nxt: dict[int, int] = {}
    bad = disorder = total = 0
    last_progress = time.monotonic()
    max_stall = 0.0
    while True:
        try:
            msgs = q.get_many(timeout=1.0)
        except Empty:
            msgs = []
        now = time.monotonic()
        if msgs:
            max_stall = max(max_stall, now - last_progress)
            last_progress = now
        for m in msgs:
            if m == SENTINEL:
                report.put({"total": total, "bad": bad, "disorder": disorder, "per_producer": nxt,
                            "max_stall": max_stall})
                return
            ok = check_kill_msg(m)
            if ok is None:
                bad += 1
                continue
            p, s = ok
            if s != nxt.get(p, 0):
                disorder += 1
            nxt[p] = s + 1
            total += 1


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds used so far by process `pid`."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def shm_entries() -> set[str]:
    """Names currently in /dev/shm."""
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()
