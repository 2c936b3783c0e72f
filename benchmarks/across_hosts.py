#!/usr/bin/env python
"""Data-parallel training across two hosts against one host with the same total workers (issue 42).

    python benchmarks/across_hosts.py                     # doom_basic, 2 x 1 workers, 60 s per run (~3 min)
    python benchmarks/across_hosts.py --env doom_battle --workers 4 --seconds 120

Three runs of `train.py`, each for --seconds, on the same machine:

- one host, one rank: --num_workers 2W, --batch_size 2B (the same samples per SGD step as the two ranks together);
- two hosts, one rank each (tests/two_hosts.py: two network namespaces joined by a veth pair, 198.18.0.0/15; each
  with its own train dir), `torchrun --nnodes 2 --rdzv-backend c10d`, --num_workers W and --batch_size B per rank, the
  link unshaped;
- the same with the link shaped as a data-centre network: --rate (default 10gbit) and --delay (default 1ms) on both
  ends with `tc netem`; where the kernel has no netem (sch_netem), the rate alone with `tbf`, said in the table.

Per run: env frames/s (each rank's frames over its run, summed over the ranks), SGD steps/s (policy versions per
second), and on two hosts the gradient all-reduce's time (rank 0's learner: calls, ms each) and its share of the run.
Both "hosts" share this machine's cores, so the two-host rows show what the network and the lockstep cost, not what a
second machine adds: on real machines each host brings its own cores (docs/distributed.md#what-scales). Needs root
(network namespaces).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

from common import header, table  # noqa: E402
from two_hosts import TwoHosts, why_not  # noqa: E402

# the last line of a run (of each rank): its env frames, their rate over the run, the policy version reached
DONE_RE = re.compile(r"Done(?: \(rank \d of 2\))?: (\d+) env frames in .*? \(([\d.]+) frames/s\), policy version (\d+)")
AR_RE = re.compile(r"Gradient all-reduce: (\d+) calls of (\d+) KiB, ([\d.]+) ms each, ([\d.]+) s in all")


def train_flags(args, workers: int, batch: int, train_dir: Path) -> list[str]:
    return ["--env", args.env, "--experiment", "bench", "--train_dir", str(train_dir), "--restart_behavior",
            "overwrite", "--num_workers", str(workers), "--batch_size", str(batch), "--device", "cpu", "--seed", "1",
            "--train_for_seconds", str(args.seconds), "--report_interval_sec", "5"]


def one_host(args, tmp: Path) -> dict:
    t0 = time.time()
    out = subprocess.run([sys.executable, str(ROOT / "train.py"),
                          *train_flags(args, 2 * args.workers, 2 * args.batch_size, tmp / "one")],
                         capture_output=True, text=True, timeout=args.seconds + 300, cwd=ROOT).stdout
    m = DONE_RE.search(out)
    if not m:
        raise SystemExit(f"the one-host run did not finish:\n{out[-3000:]}")
    return {"frames/s": float(m.group(2)), "versions": int(m.group(3)), "wall": time.time() - t0}


def shape(hosts, rate: str, delay: str) -> str:
    """Shape both ends of the link; returns what was applied."""
    for h in hosts:
        netem = subprocess.run(["ip", "netns", "exec", h.netns, "tc", "qdisc", "add", "dev", h.dev, "root", "netem",
                                "rate", rate, "delay", delay], capture_output=True, text=True)
        if netem.returncode != 0:
            subprocess.run(["ip", "netns", "exec", h.netns, "tc", "qdisc", "add", "dev", h.dev, "root", "tbf", "rate",
                            rate, "burst", "4mb", "latency", "50ms"], check=True, capture_output=True, text=True)
    return f"netem {rate} {delay}" if netem.returncode == 0 else f"tbf {rate} (no netem in this kernel: no delay)"


def two_hosts(args, tmp: Path, shaped: bool) -> dict:
    with TwoHosts() as (h0, h1):
        link = shape((h0, h1), args.rate, args.delay) if shaped else "unshaped veth"
        procs, logs = [], []
        for i, h in enumerate((h0, h1)):
            log = tmp / f"host{i}_{'shaped' if shaped else 'plain'}.log"
            cmd = h.torchrun(h0, "bench", [str(ROOT / "train.py"),
                                           *train_flags(args, args.workers, args.batch_size, tmp / f"host{i}")])
            procs.append(h.popen(cmd, log, cwd=ROOT))
            logs.append(log)
        t0 = time.time()
        rcs = [p.wait(timeout=args.seconds + 300) for p in procs]
        wall = time.time() - t0
    texts = [log.read_text() for log in logs]
    done, ar = [DONE_RE.search(t) for t in texts], AR_RE.search(texts[0])
    if rcs != [0, 0] or not (all(done) and ar):
        raise SystemExit(f"the two-host run failed (exit codes {rcs}):\n" + "\n".join(t[-2000:] for t in texts))
    calls, kib, ms, total = int(ar.group(1)), int(ar.group(2)), float(ar.group(3)), float(ar.group(4))
    return {"frames/s": sum(float(m.group(2)) for m in done), "versions": int(done[0].group(3)), "wall": wall,
            "link": link,
            "allreduce": f"{calls} x {kib} KiB, {ms:.1f} ms", "share": total / args.seconds}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="doom_basic")
    p.add_argument("--workers", type=int, default=1, help="rollout workers per host (one host: twice as many)")
    p.add_argument("--batch_size", type=int, default=1024, help="per rank (one host: twice as many)")
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--rate", default="10gbit")
    p.add_argument("--delay", default="1ms")
    args = p.parse_args()
    if args.seconds < 20:  # start-up takes seconds: a shorter run may report no frames at all
        p.error(f"--seconds {args.seconds}: give 20 or more")
    reason = why_not()
    if reason:
        print(f"across_hosts.py: cannot make two hosts here: {reason}", file=sys.stderr)
        return 2
    header(f"Two hosts against one: {args.env}, {args.seconds} s per run")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        one = one_host(args, tmp)
        plain = two_hosts(args, tmp, shaped=False)
        shaped = two_hosts(args, tmp, shaped=True)
    rows = [["one host, 1 rank", f"{2 * args.workers} workers, batch {2 * args.batch_size}", "-",
             f"{one['frames/s']:.0f}", "1.00", f"{one['versions'] / args.seconds:.2f}", "-", "-"]]
    for name, r in (("two hosts", plain), ("two hosts, shaped", shaped)):
        rows.append([name, f"{args.workers} workers, batch {args.batch_size} per rank", r["link"],
                     f"{r['frames/s']:.0f}", f"{r['frames/s'] / one['frames/s']:.2f}",
                     f"{r['versions'] / args.seconds:.2f}", r["allreduce"], f"{100 * r['share']:.1f}%"])
    print(table(rows, ["run", "layout", "link", "frames/s", "vs one host", "SGD steps/s", "all-reduce (rank 0)",
                       "all-reduce share"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
