#!/usr/bin/env python
"""System throughput against pure simulation, measured in one invocation.

For each env: pure simulation (random actions, N processes: benchmarks/env_throughput.py's measurement),
then the sampler alone (learner off) with random actions and with the real policy forward, then full
training with the default configuration (the paper's model and batch: configs/doom.json "defaults"; for
doom_basic, whose preset trades throughput for sample efficiency, they are passed explicitly). Prints env frames/s
(median of the 10-s windows after warm-up), ratios to pure simulation, the average policy lag, and the peak RSS of
each process of every system run.
Two baselines, both pure simulation with the same number of processes: the fastest layout (--sim_envs_per_worker,
default 1 env per process) and the run's own layout (the same envs per process as its rollout workers: what these
processes do without the system; 16 envs of one core cost ~25% in pure simulation alone on a 2-core machine, engine
caches). The machines are shared and noisy: with --rounds R everything is measured R times, each ratio against the
pure simulation of its own round, and the median is reported. --sampler_envs_per_worker sweeps the sampler's envs per
worker.

    python benchmarks/system_throughput.py --envs doom_basic doom_battle --num_workers 2 --duration 90
    python benchmarks/system_throughput.py --modes random --sampler_envs_per_worker 4 8 16 --rounds 3 --duration 45
    python benchmarks/system_throughput.py --envs doom_battle --modes policy train --device cuda   # on a GPU machine
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


def run_envs_per_worker(flags: list[str], train_dir: str) -> int:
    """--num_envs_per_worker of the train.py run with these flags (its preset and flags resolved): the layout of the
    pure simulation it is compared with."""
    from sf.cfg import parse_cfg
    return parse_cfg([*flags, "--train_dir", train_dir]).num_envs_per_worker


def run_train_rss(args: list[str], train_dir: str, timeout: float) -> dict:
    """Run train.py; FPS (steady-state 10-s windows), average lag, peak RSS per process (MiB)."""
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
    # the first two 10-s windows include start-up, the last one the stop: the steady state is in between
    fps = [float(m.group(1)) for m in FPS_RE.finditer(log) if m.group(1) != "nan"]
    fps = fps[2:-1] if len(fps) > 4 else fps[1:]
    lags = [float(m.group(2)) for m in LAG_RE.finditer(log) if m.group(2) != "nan"]
    return {"fps_median": statistics.median(fps) if fps else float("nan"), "fps_samples": fps,
            "lag_avg": statistics.mean(lags) if lags else float("nan"), "log": log, "rss": rss,
            "returncode": proc.returncode}


def train_flags(args, env: str, mode: str, envs_per_worker: int | None) -> list[str]:
    """train.py flags of one system run: mode "random"/"policy" (sampler only) or "train"; None: the config's envs."""
    flags = ["--env", env, "--num_workers", str(args.num_workers), "--train_for_seconds", str(args.duration),
             "--experiment", f"bench_{env}_{mode}", "--device", args.device,
             *(PAPER_DOOM if env.startswith("doom_") else []), *args.extra]
    if envs_per_worker is not None:
        flags += ["--num_envs_per_worker", str(envs_per_worker)]
    if mode in ("random", "policy"):
        flags += ["--sampler_only", "True", "--random_policy", str(mode == "random")]
    return flags


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", nargs="+", default=["doom_basic", "doom_battle"])
    ap.add_argument("--num_workers", type=int, default=2)
    ap.add_argument("--duration", type=int, default=90, help="seconds per system run")
    ap.add_argument("--sim_envs_per_worker", type=int, default=1, help="envs per process of the pure simulation")
    ap.add_argument("--modes", nargs="+", default=["random", "policy", "train"], choices=["random", "policy", "train"])
    ap.add_argument("--sampler_envs_per_worker", type=int, nargs="+", default=None,
                    help="envs per rollout worker of the sampler-only runs, one run each "
                         "(default: the config's, 16 for Doom)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat pure simulation + every run this many times; ratios are taken within a round, "
                         "medians reported")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="train.py --device of every system run (policy workers and learner); default auto, train.py's "
                         "own: CUDA where torch sees a device, else CPU")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more train.py flags for every run")
    args = ap.parse_args()
    if "--device" in args.extra:
        ap.exit(2, "system_throughput.py: --extra --device: use --device (auto, cpu or cuda) instead\n")
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.exit(2, f"system_throughput.py: --device cuda: torch {torch.__version__} sees no CUDA device here "
                   "(use --device cpu or auto)\n")
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    header("System throughput vs pure simulation")
    print(f"device of the system runs: {device} (--device {args.device})")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    results: dict[tuple, list[dict]] = {}  # (env, mode, envs per worker) -> one result per round
    mem_rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for env in args.envs:
            for rnd in range(args.rounds):
                runs = [(mode, k) for mode in args.modes
                        for k in (args.sampler_envs_per_worker if mode != "train" and args.sampler_envs_per_worker
                                  else [None])]
                layouts = {(mode, k): run_envs_per_worker(train_flags(args, env, mode, k), tmp) for mode, k in runs}
                sims = {}  # envs per process -> pure-simulation frames/s of this round
                for n in sorted({args.sim_envs_per_worker, *layouts.values()}):
                    sims[n] = pure_simulation(env, args.num_workers, n, min(30, args.duration))
                    results.setdefault((env, "sim", n), []).append(
                        {"fps": sims[n], "ratio": sims[n] / sims[args.sim_envs_per_worker], "lag": math.nan})
                    print(f"... {env} round {rnd + 1} simulation, {n} envs/process: {sims[n]:.0f} frames/s",
                          file=sys.stderr, flush=True)
                best = sims[args.sim_envs_per_worker]
                for mode, k in runs:
                    n = layouts[(mode, k)]
                    res = run_train_rss(train_flags(args, env, mode, k), tmp, timeout=args.duration + 120)
                    fps = res["fps_median"]
                    results.setdefault((env, mode, n), []).append(
                        {"fps": fps, "ratio": fps / best, "ratio_same": fps / sims[n], "lag": res["lag_avg"]})
                    if rnd == 0:
                        mem_rows.append([env, mode, n,
                                         ", ".join(f"{p} {v:.0f}" for p, v in sorted(res["rss"].items()))])
                    print(f"... {env} {mode} ({n} envs/worker): {fps:.0f} frames/s = {fps / best:.2f} "
                          f"({fps / sims[n]:.2f} of the same layout; 10-s windows: {res['fps_samples']}, "
                          f"exit {res['returncode']})", file=sys.stderr, flush=True)
                    if res["returncode"] != 0:
                        print(res["log"][-3000:], file=sys.stderr)
    labels = {"sim": f"pure simulation (random actions, {args.num_workers} processes)",
              "random": "sampler only, random actions", "policy": f"sampler only, policy forward ({device})",
              "train": f"full training (default config, {device})"}
    rows = []
    for (env, mode, k), runs in results.items():
        ratios = [r["ratio"] for r in runs]
        lags = [r["lag"] for r in runs if not math.isnan(r["lag"])]
        rows.append([env, labels[mode], k, f"{statistics.median(r['fps'] for r in runs):.0f}",
                     f"{statistics.median(ratios):.2f}", " ".join(f"{x:.2f}" for x in ratios) if len(runs) > 1 else "-",
                     f"{statistics.median(r['ratio_same'] for r in runs):.2f}" if mode != "sim" else "-",
                     f"{statistics.mean(lags):.1f}" if mode == "train" and lags else "-"])
    best = args.sim_envs_per_worker
    print(table(rows, ["env", "mode", "envs/worker", "env frames/s (median)",
                       f"ratio to simulation, {best} env{'s' if best > 1 else ''}/process (median)", "ratio per round",
                       "ratio to simulation, same envs/process (median)", "policy lag avg"]))
    print()
    print(table(mem_rows, ["env", "mode", "envs/worker",
                           "peak RSS per process (MiB; shared trajectory buffers counted in each)"]))


if __name__ == "__main__":
    main()
