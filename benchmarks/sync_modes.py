#!/usr/bin/env python
"""Throughput of the three modes with the same workers and model, measured in one invocation.

For each env: full training runs with --sync_mode async (the baseline), hts and ppo, each for --duration seconds, the
same flags otherwise (for Doom the paper's model and batch: configs/doom.json "defaults"; in hts/ppo a training batch is
one rollout of every env). Prints env frames/s (median of the steady-state 10-s windows), the ratio to async of the same
round, and the policy lag each mode reported. The machines are shared and noisy: with --rounds R the modes run in turn R
times and the median ratio is reported. Target: hts >= 70% of async.

    python benchmarks/sync_modes.py --envs doom_basic doom_battle --num_workers 2 --duration 90 --rounds 2
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import header, table  # noqa: E402
from system_throughput import PAPER_DOOM, run_train_rss  # noqa: E402

MODES = ("async", "hts", "ppo")
ASYNC_LAG_RE = re.compile(r"Policy lag \(min: [\d.na-]+, avg: ([\d.na-]+), max: [\d.na-]+\)")
SYNC_LAG_RE = re.compile(r"Mode \w+: policy lag (\S+) batch\w* \(in SGD steps: min: [\d.na-]+, avg: ([\d.na-]+)")


def lag_text(log: str, mode: str) -> str:
    """The lag the run reported last: SGD steps (async), batches and SGD steps (hts/ppo)."""
    if mode == "async":
        lags = [m.group(1) for m in ASYNC_LAG_RE.finditer(log) if m.group(1) != "nan"]
        return f"{float(lags[-1]):.1f} SGD steps (avg)" if lags else "n/a"
    lags = [m.groups() for m in SYNC_LAG_RE.finditer(log) if m.group(1) != "nan"]
    return f"{lags[-1][0]} batch ({float(lags[-1][1]):.1f} SGD steps avg)" if lags else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", nargs="+", default=["doom_basic", "doom_battle"])
    ap.add_argument("--num_workers", type=int, default=2)
    ap.add_argument("--duration", type=int, default=90, help="seconds per run")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--train_dir", default=None, help="keep the runs' experiment dirs here (for python -m sf.plot); "
                    "default: a temporary directory")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more train.py flags for every run")
    args = ap.parse_args()
    header("Modes: async / hts / ppo, env frames/s with the same workers")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.train_dir or tmp
        for env in args.envs:
            fps: dict[str, list[float]] = {m: [] for m in MODES}
            ratios: dict[str, list[float]] = {m: [] for m in MODES}
            lags: dict[str, str] = {}
            for r in range(args.rounds):
                for mode in MODES:
                    flags = ["--env", env, "--experiment", f"{env}_{mode}", "--num_workers", str(args.num_workers),
                             "--train_for_seconds", str(args.duration), "--sync_mode", mode, "--seed", "1",
                             *(PAPER_DOOM if env.startswith("doom_") else []), *args.extra]
                    res = run_train_rss(flags, tmp, timeout=args.duration + 180)
                    if res["returncode"] != 0:
                        raise SystemExit(f"{env} {mode} failed:\n{res['log'][-3000:]}")
                    fps[mode].append(res["fps_median"])
                    lags[mode] = lag_text(res["log"], mode)
                    print(f"round {r + 1} {env} {mode}: {res['fps_median']:.0f} frames/s ({len(res['fps_samples'])} "
                          f"windows), lag {lags[mode]}", flush=True)
                for mode in MODES:
                    ratios[mode].append(fps[mode][-1] / fps["async"][-1])
            for mode in MODES:
                rows.append([env, mode, f"{statistics.median(fps[mode]):.0f}",
                             f"{statistics.median(ratios[mode]):.2f}", " ".join(f"{x:.2f}" for x in ratios[mode]),
                             lags[mode]])
    print()
    print(table(rows, ["env", "mode", "frames/s (median)", "ratio to async (median)", "ratio per round", "policy lag"]))


if __name__ == "__main__":
    main()
