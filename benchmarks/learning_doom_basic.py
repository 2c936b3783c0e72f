#!/usr/bin/env python
"""Learning benchmark: doom_basic average episode reward against env frames and wall time.

Target: average reward (scenario reward x 0.01, Sample Factory's units) >= 0.75 within
600k env frames, with the doom_basic preset of configs/doom.json (feed-forward model, 4 epochs x 4
minibatches of 128 samples per training batch, lr 3e-4) on this machine. `--extra` passes more train.py
flags, e.g. the paper's setup for comparison:

    python benchmarks/learning_doom_basic.py --extra --use_rnn True --batch_size 2048 --num_batches_per_epoch 1 \
        --num_epochs 1 --learning_rate 1e-4 --exploration_loss_coeff 0.003 --num_envs_per_worker 16

    python benchmarks/learning_doom_basic.py --frames 600000 --num_workers 2
    python benchmarks/learning_doom_basic.py --sync_modes async hts ppo --seed 1   # one run per mode, one table each
    python benchmarks/learning_doom_basic.py --num_policies 2 --seed 1   # a population: every policy's own curve, each
                                                                          # to --frames frames of its own
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
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import header, table  # noqa: E402
from sf.runner.stats import read_event_scalars  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="doom_basic")
    ap.add_argument("--frames", type=int, default=600_000)
    ap.add_argument("--num_workers", type=int, default=2)
    ap.add_argument("--target", type=float, default=0.75)
    ap.add_argument("--sync_modes", nargs="+", default=["async"], choices=["async", "hts", "ppo"],
                    help="one run per --sync_mode, in this order")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--num_policies", type=int, default=1, help="a population: each policy trains on --frames frames "
                    "(agents mapped to policies at random, the paper's setup); one table per policy")
    ap.add_argument("--train_dir", default=None, help="keep each run's experiment dir here, as learn_<mode> (for "
                    "python -m sf.plot); default: a temporary directory")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[])
    args = ap.parse_args()
    header(f"Learning curve: {args.env}")
    summary = []
    for mode in args.sync_modes:
        print(f"\n## --sync_mode {mode}")
        if args.num_policies > 1:
            summary += [[mode, f"policy {p}", *row] for p, row in enumerate(population_run(args, mode))]
        else:
            summary.append([mode, "-", *learning_run(args, mode)])
    print()
    print(table(summary, ["mode", "policy", "wall time (s)", "final avg reward", f"frames to reach {args.target}"]))


REPORT_RE = re.compile(r"Total num frames: (\d+)\..*Avg episode reward: ([-\d.]+) \((\d+) episodes\)")


def first_reached(log: Path, target: float, min_episodes: int = 100) -> int | None:
    """Env frames of the first report line whose average reward reaches `target` over a full window of episodes (an
    average of the first two lucky episodes does not count). From the run's sf_log.txt."""
    for line in log.read_text().splitlines():
        m = REPORT_RE.search(line)
        if m and int(m.group(3)) >= min_episodes and float(m.group(2)) >= target:
            return int(m.group(1))
    return None


POLICY_RE = re.compile(r"policy (\d+): version \d+, (\d+) frames trained\..*"
                       r"Avg episode reward: ([-\d.]+) \((\d+) episodes\)")


def population_run(args, mode: str) -> list[tuple]:
    """One run of a population; prints each policy's curve against the frames it trained on (from the console's
    per-policy report lines); returns per policy (wall time, final average reward, its frames to the target)."""
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tmp, name = (args.train_dir, f"learn_{mode}_pop{args.num_policies}") if args.train_dir else (tmp, "learn")
        cmd = [sys.executable, str(ROOT / "train.py"), "--env", args.env, "--experiment", name, "--train_dir", tmp,
               "--restart_behavior", "overwrite", "--num_workers", str(args.num_workers),
               "--train_for_env_steps", str(args.frames), "--num_policies", str(args.num_policies),
               "--experiment_summaries_interval", "5", "--sync_mode", mode, *args.extra]
        if args.seed is not None:
            cmd += ["--seed", str(args.seed)]
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        lines = (Path(tmp) / name / "sf_log.txt").read_text().splitlines()
    wall = time.time() - t0
    curves: dict[int, list] = {p: [] for p in range(args.num_policies)}
    for line in lines:
        m = POLICY_RE.search(line)
        if m:
            curves[int(m.group(1))].append((int(m.group(2)), float(m.group(3)), int(m.group(4))))
    out = []
    for p, curve in curves.items():
        step_every = max(1, len(curve) // 15)
        rows = [[f, f"{r:.3f}", n] for i, (f, r, n) in enumerate(curve) if i % step_every == 0 or i == len(curve) - 1]
        print(f"\npolicy {p}")
        print(table(rows, ["its env frames", "avg reward (its last 100 episodes)", "its episodes"]))
        hit = next((f for f, r, n in curve if n >= 100 and r >= args.target), "never")
        final = curve[-1][1] if curve else float("nan")
        print(f"policy {p}: final average reward {final:.3f}; "
              f"target {args.target} first reached at {hit} of its frames")
        out.append((f"{wall:.0f}", f"{final:.3f}", hit))
    return out


def learning_run(args, mode: str) -> tuple:
    """One training run; prints its curve; returns (wall time, final average reward, frames to the target)."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp, name = (args.train_dir, f"learn_{mode}") if args.train_dir else (tmp, "learn")
        t0 = time.time()
        cmd = [sys.executable, str(ROOT / "train.py"), "--env", args.env, "--experiment", name, "--train_dir", tmp,
               "--restart_behavior", "overwrite",
               "--num_workers", str(args.num_workers), "--train_for_env_steps", str(args.frames),
               "--experiment_summaries_interval", "5", "--sync_mode", mode, *args.extra]
        if args.seed is not None:
            cmd += ["--seed", str(args.seed)]
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        wall = time.time() - t0
        scalars = read_event_scalars(Path(tmp) / name)
        first_hit = first_reached(Path(tmp) / name / "sf_log.txt", args.target)
    rewards = scalars.get("reward/reward", [])
    fps = dict(scalars.get("perf/_fps", []))
    rows = []
    step_every = max(1, len(rewards) // 20)
    for i, (frames, r) in enumerate(rewards):
        if i % step_every == 0 or i == len(rewards) - 1:
            rows.append([frames, f"{r:.3f}", f"{fps.get(frames, float('nan')):.0f}"])
    print(table(rows, ["env frames", "avg reward (last 100 episodes)", "fps"]))
    final = rewards[-1][1] if rewards else float("nan")
    print(f"\nwall time {wall:.0f} s for {args.frames} frames; final average reward {final:.3f}; "
          f"target {args.target} first reached at {first_hit if first_hit is not None else 'never'} frames")
    return f"{wall:.0f}", f"{final:.3f}", first_hit if first_hit is not None else "never"


if __name__ == "__main__":
    main()
