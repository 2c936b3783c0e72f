"""Queue throughput: sf.ipc.Queue vs faster-fifo vs multiprocessing.Queue, all in one run.

Patterns 1->1, 4->1 and 1->4 (producer -> consumer processes, started with fork), two message kinds
(a 3-int tuple -- the index messages the training system sends -- and 1 KB bytes), and for each queue
the plain put/get API and, where there is one, the batched put_many/get_many API. Every measurement is
repeated and the median reported, with ratios against faster-fifo (same API style) and mp.Queue.

    python benchmarks/queue_throughput.py                  # ~1.5 min on 2 cores
    python benchmarks/queue_throughput.py --duration 1 --repeats 5
    python benchmarks/queue_throughput.py --messages 200000  # fixed message count instead of duration

Throughput = messages consumed / (time the last one was consumed - start), all consumers together.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sf.ipc import Empty as SfEmpty  # noqa: E402
from sf.ipc import Queue as SfQueue  # noqa: E402

from common import machine  # noqa: E402  (benchmarks/ is sys.path[0] when run as a script)

try:
    import faster_fifo
except ImportError:  # the table then simply has no faster-fifo rows
    faster_fifo = None

PATTERNS = {"1->1": (1, 1), "4->1": (4, 1), "1->4": (1, 4)}
MESSAGES = {"3-int tuple": (3, 17, 42), "1 KB bytes": b"\xab" * 1024}
CAPACITY = 1 << 20  # bytes of ring for the shared-memory queues
MP_MAXSIZE = 10_000  # bounds mp.Queue's backlog the way the byte capacity bounds the others
BATCH = 64  # put_many batch size
CHECK_EVERY = 64  # producers look at the stop flag every this many messages

# name -> (queue family, batched API?)
VARIANTS = {
    "sf.ipc put/get": ("sf", False),
    "sf.ipc put_many/get_many": ("sf", True),
    "faster-fifo put/get": ("ff", False),
    "faster-fifo put_many/get_many": ("ff", True),
    "mp.Queue put/get": ("mp", False),
}


def make_queue(family: str):
    if family == "sf":
        return SfQueue(max_size_bytes=CAPACITY)
    if family == "ff":
        return faster_fifo.Queue(max_size_bytes=CAPACITY)
    return mp.get_context("fork").Queue(maxsize=MP_MAXSIZE)


def empty_exc(family: str):
    import queue
    return SfEmpty if family == "sf" else queue.Empty


def producer(q, batched: bool, msg, quota: int, stop, barrier) -> None:
    """Put `msg` until `stop` is set (quota 0) or `quota` messages are put."""
    barrier.wait()
    n = 0
    if batched:
        batch = [msg] * BATCH
        put_many = q.put_many
        while (quota and n < quota) or (not quota and not stop.value):
            if quota and quota - n < BATCH:
                batch = batch[:quota - n]
            put_many(batch, True, 60.0)
            n += len(batch)
    else:
        put = q.put
        per_check = CHECK_EVERY if not quota else min(CHECK_EVERY, quota)
        while (quota and n < quota) or (not quota and not stop.value):
            k = per_check if not quota else min(per_check, quota - n)
            for _ in range(k):
                put(msg, True, 60.0)
            n += k


def consumer(q, family: str, batched: bool, idx: int, counts, ends, barrier) -> None:
    """Get until a None sentinel; record how many messages and when the last one arrived."""
    empty = empty_exc(family)
    barrier.wait()
    n = 0
    last = time.monotonic()
    while True:
        try:
            msgs = q.get_many(timeout=60.0) if batched else [q.get(timeout=60.0)]
        except empty:
            break
        done = False
        for m in msgs:
            if m is None:
                done = True
            else:
                n += 1
        if n:
            last = time.monotonic()
        if done:
            extra = sum(m is None for m in msgs) - 1
            for _ in range(extra):  # a batch may hold several sentinels: give the others back
                q.put(None)
            break
    counts[idx] = n
    ends[idx] = last


def run_once(variant: str, pattern: str, msg, duration: float, messages: int) -> float:
    family, batched = VARIANTS[variant]
    n_prod, n_cons = PATTERNS[pattern]
    ctx = mp.get_context("fork")
    q = make_queue(family)
    stop = ctx.RawValue("b", 0)
    counts = ctx.RawArray("q", n_cons)
    ends = ctx.RawArray("d", n_cons)
    barrier = ctx.Barrier(n_prod + n_cons + 1)
    quota = messages // n_prod if messages else 0
    prods = [ctx.Process(target=producer, args=(q, batched, msg, quota, stop, barrier)) for _ in range(n_prod)]
    cons = [ctx.Process(target=consumer, args=(q, family, batched, i, counts, ends, barrier)) for i in range(n_cons)]
    for p in cons + prods:
        p.start()
    barrier.wait()
    t0 = time.monotonic()
    if not messages:
        time.sleep(duration)
        stop.value = 1
    for p in prods:
        p.join()
    for _ in range(n_cons):
        q.put(None)
    for p in cons:
        p.join()
    if family == "mp":
        q.close()
        q.join_thread()
    total = sum(counts)
    return total / max(max(ends) - t0, 1e-9)


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.0f} k"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=0.75, help="seconds of producing per measurement")
    ap.add_argument("--messages", type=int, default=0, help="fixed total message count instead of --duration")
    ap.add_argument("--repeats", type=int, default=3, help="repeats per measurement (median reported)")
    ap.add_argument("--patterns", default=",".join(PATTERNS), help="comma-separated subset of " + ",".join(PATTERNS))
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of the queue/API variants")
    args = ap.parse_args()
    patterns = args.patterns.split(",")
    variants = [v for v in args.variants.split(",") if faster_fifo or VARIANTS[v][0] != "ff"]

    print("# Queue throughput (messages/s, all consumers together)")
    print(f"machine: {machine()}")
    print(f"command: {' '.join([Path(sys.executable).name] + sys.argv)}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M:%S')}")
    ffv = getattr(faster_fifo, "__version__", None) or _dist_version("faster-fifo")
    print(f"setup: fork, {'%d messages' % args.messages if args.messages else '%.2f s per run' % args.duration}, "
          f"median of {args.repeats}, put_many batch {BATCH}, capacity {CAPACITY} B "
          f"(mp.Queue maxsize {MP_MAXSIZE}), faster-fifo {ffv}\n")

    results: dict[tuple, float] = {}
    spreads: dict[tuple, tuple] = {}
    t_start = time.monotonic()
    for pattern in patterns:
        for mname, msg in MESSAGES.items():
            for v in variants:
                runs = [run_once(v, pattern, msg, args.duration, args.messages) for _ in range(args.repeats)]
                results[(pattern, mname, v)] = statistics.median(runs)
                spreads[(pattern, mname, v)] = (min(runs), max(runs))
                print(f"  {pattern:5} {mname:12} {v:30} {fmt_rate(results[(pattern, mname, v)]):>8}/s", file=sys.stderr)

    rows = []
    for (pattern, mname, v), rate in results.items():
        family, batched = VARIANTS[v]
        ff_key = (pattern, mname, "faster-fifo put_many/get_many" if batched else "faster-fifo put/get")
        mp_key = (pattern, mname, "mp.Queue put/get")
        vs_ff = f"{rate / results[ff_key]:.2f}x" if ff_key in results else "-"
        vs_mp = f"{rate / results[mp_key]:.2f}x" if mp_key in results else "-"
        lo, hi = spreads[(pattern, mname, v)]
        rows.append([pattern, mname, v, fmt_rate(rate), f"{fmt_rate(lo)}-{fmt_rate(hi)}", vs_ff, vs_mp])
    headers = ["pattern", "message", "queue / API", "msgs/s", "min-max", "vs faster-fifo", "vs mp.Queue"]
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = " | ".join(f"{{:<{w}}}" for w in widths)
    print(line.format(*headers))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(line.format(*r))
    print(f"\n(vs faster-fifo compares the same API style: put/get with put/get, put_many/get_many with "
          f"put_many/get_many; total time {time.monotonic() - t_start:.0f} s)")


def _dist_version(name: str) -> str:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return "?"


if __name__ == "__main__":
    main()
