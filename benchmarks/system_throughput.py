#!/usr/bin/env python
"""System throughput against pure simulation, measured in one invocation.

For each env: pure simulation (random actions, N processes: benchmarks/env_throughput.py's measurement),
then the sampler alone (learner off) with random actions and with the real policy forward, then full
training with the default configuration. Prints env frames/s (median of the 10-s windows after warm-up),
ratios to pure simulation, and the average policy lag.

    python benchmarks/system_throughput.py --envs doom_basic doom_battle --num_workers 2 --duration 90
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import header, run_train, table  # noqa: E402
from env_throughput import measure_throughput  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", nargs="+", default=["doom_basic", "doom_battle"])
    ap.add_argument("--num_workers", type=int, default=2)
    ap.add_argument("--duration", type=int, default=90, help="seconds per system run")
    ap.add_argument("--modes", nargs="+", default=["random", "policy", "train"], choices=["random", "policy", "train"])
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more train.py flags for every run")
    args = ap.parse_args()
    header("System throughput vs pure simulation")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for env in args.envs:
            sim = measure_throughput(env, args.num_workers, duration=min(30, args.duration))["frames_per_sec"]
            rows.append([env, "pure simulation (random actions)", f"{sim:.0f}", "1.00", "-"])
            for mode in args.modes:
                flags = ["--env", env, "--num_workers", str(args.num_workers), "--train_for_seconds", str(args.duration),
                         "--experiment", f"bench_{env}_{mode}", *args.extra]
                if mode in ("random", "policy"):
                    flags += ["--sampler_only", "True", "--random_policy", str(mode == "random")]
                res = run_train(flags, tmp, timeout=args.duration + 120)
                fps = res["fps_median"]
                label = {"random": "sampler only, random actions", "policy": "sampler only, policy forward (CPU)",
                         "train": "full training (default config)"}[mode]
                lag = "-" if mode != "train" or math.isnan(res["lag_avg"]) else f"{res['lag_avg']:.1f}"
                rows.append([env, label, f"{fps:.0f}", f"{fps / sim:.2f}", lag])
                print(f"... {env} {mode}: {fps:.0f} frames/s", file=sys.stderr, flush=True)
    print(table(rows, ["env", "mode", "env frames/s", "ratio to simulation", "policy lag avg"]))


if __name__ == "__main__":
    main()
