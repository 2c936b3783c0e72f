#!/usr/bin/env python
"""System throughput against pure simulation, measured in one invocation.

For each env: pure simulation (random actions, N processes: benchmarks/env_throughput.py's measurement),
then the sampler alone (learner off) with random actions and with the real policy forward, then full
training with the default configuration (the paper's model and batch: configs/doom.json "defaults"; for
doom_basic, whose preset trades throughput for sample efficiency, they are passed explicitly). Prints env frames/s (median of the 10-s windows after warm-up),
ratios to pure simulation, the average policy lag, and the peak RSS of each process of every system run.

    python benchmarks/system_throughput.py --envs doom_basic doom_battle --num_workers 2 --duration 90
"""
from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil  # noqa: E402

from common import FPS_RE, LAG_RE, ROOT, header, table  # noqa: E402

# The paper's Doom setup (configs/doom.json "defaults"), also for envs whose preset departs from it (doom_basic).
PAPER_DOOM = ["--use_rnn", "True", "--batch_size", "2048", "--num_batches_per_epoch", "1", "--num_epochs", "1",
              "--learning_rate", "1e-4", "--exploration_loss_coeff", "0.003", "--num_envs_per_worker", "16"]
import env_throughput  # noqa: E402

STARTED_RE = re.compile(r"Started (\S+) \(pid (\d+)\)")


def pure_simulation(env: str, num_workers: int, envs_per_worker: int, duration: float) -> float:
    """env frames/s of `num_workers` processes stepping random actions (env_throughput.measure)."""
    args = types.SimpleNamespace(env=env, num_workers=num_workers, num_envs_per_worker=envs_per_worker,
                                 duration=duration, warmup=2.0, seed=0, affinity=True)
    return env_throughput.measure(args, num_workers)["frames_per_s"]


def run_train_rss(args: list[str], train_dir: str, timeout: float) -> dict:
    """Run train.py; FPS (10 s windows after the first report), average lag, peak RSS per process (MiB)."""
    cmd = [sys.executable, str(ROOT / "train.py"), "--train_dir", train_dir, "--restart_behavior", "overwrite",
           "--report_interval_sec", "5", *args]
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        peak: dict[int, float] = {}
        parent = psutil.Process(proc.pid)
        deadline = time.time() + timeout
        while proc.poll() is None:
            if time.time() > deadline:
                proc.kill()
                break
            try:
                for p in [parent, *parent.children(recursive=True)]:
                    try:
                        peak[p.pid] = max(peak.get(p.pid, 0.0), p.memory_info().rss / 2**20)
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
            time.sleep(1.0)
        proc.wait()
        out.seek(0)
        log = out.read()
    names = {int(pid): name for name, pid in STARTED_RE.findall(log)}
    names[proc.pid] = "runner"
    rss = {names[pid]: mb for pid, mb in peak.items() if pid in names}
    fps = [float(m.group(1)) for m in FPS_RE.finditer(log) if m.group(1) != "nan"][1:]
    lags = [float(m.group(2)) for m in LAG_RE.finditer(log) if m.group(2) != "nan"]
    return {"fps_median": statistics.median(fps) if fps else float("nan"), "fps_samples": fps,
            "lag_avg": statistics.mean(lags) if lags else float("nan"), "log": log, "rss": rss,
            "returncode": proc.returncode}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", nargs="+", default=["doom_basic", "doom_battle"])
    ap.add_argument("--num_workers", type=int, default=2)
    ap.add_argument("--duration", type=int, default=90, help="seconds per system run")
    ap.add_argument("--sim_envs_per_worker", type=int, default=1, help="envs per process of the pure simulation")
    ap.add_argument("--modes", nargs="+", default=["random", "policy", "train"], choices=["random", "policy", "train"])
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more train.py flags for every run")
    args = ap.parse_args()
    header("System throughput vs pure simulation")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    rows, mem_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for env in args.envs:
            sim = pure_simulation(env, args.num_workers, args.sim_envs_per_worker, min(30, args.duration))
            rows.append([env, f"pure simulation (random actions, {args.num_workers} processes)", f"{sim:.0f}", "1.00", "-"])
            print(f"... {env} simulation: {sim:.0f} frames/s", file=sys.stderr, flush=True)
            for mode in args.modes:
                flags = ["--env", env, "--num_workers", str(args.num_workers), "--train_for_seconds", str(args.duration),
                         "--experiment", f"bench_{env}_{mode}", *(PAPER_DOOM if env.startswith("doom_") else []),
                         *args.extra]
                if mode in ("random", "policy"):
                    flags += ["--sampler_only", "True", "--random_policy", str(mode == "random")]
                res = run_train_rss(flags, tmp, timeout=args.duration + 120)
                fps = res["fps_median"]
                label = {"random": "sampler only, random actions", "policy": "sampler only, policy forward (CPU)",
                         "train": "full training (default config)"}[mode]
                lag = "-" if mode != "train" or math.isnan(res["lag_avg"]) else f"{res['lag_avg']:.1f}"
                rows.append([env, label, f"{fps:.0f}", f"{fps / sim:.2f}", lag])
                mem_rows.append([env, mode, ", ".join(f"{k} {v:.0f}" for k, v in sorted(res["rss"].items()))])
                print(f"... {env} {mode}: {fps:.0f} frames/s (10-s windows: {res['fps_samples']}, exit {res['returncode']})",
                      file=sys.stderr, flush=True)
                if res["returncode"] != 0:
                    print(res["log"][-3000:], file=sys.stderr)
    print(table(rows, ["env", "mode", "env frames/s", "ratio to simulation", "policy lag avg"]))
    print()
    print(table(mem_rows, ["env", "mode", "peak RSS per process (MiB; shared trajectory buffers counted in each)"]))


if __name__ == "__main__":
    main()
