#!/usr/bin/env python
"""Memory over a long training run: RSS of every process of train.py, sampled periodically.

Prints, per process, RSS in the first sample after warm-up, at the middle and at the end, and the growth
between the first and the last; plus the total. Shared trajectory buffers are counted in each process's
RSS once touched (USS, the memory private to a process, is shown too: that is what would reveal a leak).
Processes an env starts (VizDoom's game engines) are summed in a row under the worker that owns them.

    python benchmarks/memory_soak.py --env doom_battle --minutes 20 --num_workers 2
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import header, table  # noqa: E402


def sample(proc: psutil.Process, names: dict) -> dict:
    out = {}
    for p in [proc, *proc.children(recursive=False)]:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped: no memory to report
                continue
            mem = p.memory_full_info()
            name = names.get(p.pid) or ("runner" if p.pid == proc.pid else helper_name(p))
            engines = [] if p.pid == proc.pid else [c.memory_full_info() for c in p.children(recursive=True)]
        except psutil.Error:  # exited between the listing and the reading
            continue
        out[name] = (mem.rss / 2**20, mem.uss / 2**20)
        if engines:  # e.g. VizDoom runs each game as a child process of the rollout worker that owns the env
            out[f"{name}: {len(engines)} env processes"] = (sum(m.rss for m in engines) / 2**20,
                                                          sum(m.uss for m in engines) / 2**20)
    return out


def helper_name(p: psutil.Process) -> str:
    """A child the runner did not name: Python's own helpers (multiprocessing's resource tracker), by module."""
    cmd = " ".join(p.cmdline())
    for known in ("resource_tracker", "forkserver", "semaphore_tracker"):
        if known in cmd:
            return known
    return "helper " + cmd[-30:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="doom_battle")
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--num_workers", type=int, default=2)
    ap.add_argument("--interval", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=60, help="seconds before the first sample")
    args = ap.parse_args()
    header(f"Memory soak: {args.env}, {args.minutes} minutes")
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "log.txt"
        cmd = [sys.executable, str(ROOT / "train.py"), "--env", args.env, "--experiment", "soak", "--train_dir", tmp,
               "--num_workers", str(args.num_workers), "--train_for_seconds", str(int(args.minutes * 60))]
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        ps = psutil.Process(proc.pid)
        samples = []
        start = time.time()
        while proc.poll() is None:
            time.sleep(1)
            if time.time() - start >= args.warmup and (not samples or time.time() - samples[-1][0] >= args.interval):
                names = {}
                for line in log_path.read_text().splitlines():
                    if "Started " in line and "(pid " in line:
                        names[int(line.split("(pid ")[1].rstrip(")"))] = line.split("Started ")[1].split(" (pid")[0]
                s = sample(ps, names)
                if s:
                    samples.append((time.time(), s))
                    print(f"{(time.time() - start) / 60:5.1f} min  " +
                          "  ".join(f"{k}: {v[0]:.0f}/{v[1]:.0f}" for k, v in sorted(s.items())),
                          file=sys.stderr, flush=True)
        rc = proc.wait()
    if len(samples) < 2:
        print(f"not enough samples (train.py exit code {rc})")
        return
    # Samples taken while train.py shuts down miss the processes that already exited: keep those with all of them.
    samples = [s for s in samples if set(samples[0][1]) <= set(s[1])]
    first, mid, last = samples[0][1], samples[len(samples) // 2][1], samples[-1][1]
    rows = []
    for name in sorted(first):
        if name in last:
            rows.append([name, f"{first[name][0]:.0f}", f"{mid.get(name, (float('nan'),))[0]:.0f}",
                         f"{last[name][0]:.0f}", f"{last[name][0] - first[name][0]:+.0f}", f"{first[name][1]:.0f}",
                         f"{last[name][1]:.0f}", f"{last[name][1] - first[name][1]:+.0f}"])
    tot = lambda s, i: sum(v[i] for v in s.values())  # noqa: E731
    rows.append(["total", f"{tot(first, 0):.0f}", f"{tot(mid, 0):.0f}", f"{tot(last, 0):.0f}",
                 f"{tot(last, 0) - tot(first, 0):+.0f}", f"{tot(first, 1):.0f}", f"{tot(last, 1):.0f}",
                 f"{tot(last, 1) - tot(first, 1):+.0f}"])
    span = (samples[-1][0] - samples[0][0]) / 60
    print(table(rows, ["process", "RSS first (MiB)", "RSS middle", "RSS last", "RSS growth", "USS first", "USS last",
                       "USS growth"]))
    print(f"\n{len(samples)} samples over {span:.1f} minutes after a {args.warmup:.0f}-s warm-up; "
          f"train.py exit code {rc}")


if __name__ == "__main__":
    main()
