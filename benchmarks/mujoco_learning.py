#!/usr/bin/env python
"""Learning benchmark: mujoco_halfcheetah (gymnasium's HalfCheetah-v4) with the MuJoCo preset of configs/mujoco.json
(Sample Factory v2's: synchronous PPO, [64, 64] tanh MLP, normalized observations and returns, lr 2.95e-3).

Prints the average episode return (last 100 episodes) against env frames, the first and the final one, and the
frames/s of the whole run. A random policy scores about -300 (1000-step episodes); the reward grows with the
preset from the first few hundred thousand frames on.

    python benchmarks/mujoco_learning.py                          # 1M env frames
    python benchmarks/mujoco_learning.py --steps 100000 --seed 1  # a short check
    python benchmarks/mujoco_learning.py --extra --num_workers 8  # more train.py flags
    python benchmarks/mujoco_learning.py --sf_python /path/to/sf-venv/bin/python   # also Sample Factory 2.x's run
                                                                  # (sf_examples.mujoco.train_mujoco), same budget
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

DONE_RE = re.compile(r"Done: (\d+) env frames in (.+?) \((\d+) frames/s\)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="mujoco_halfcheetah")
    ap.add_argument("--steps", type=int, default=1_000_000, help="env frames to train for")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--train_dir", default=None, help="keep the experiment dir here (as learn_mujoco, for "
                    "python -m sf.plot); default: a temporary directory")
    ap.add_argument("--sf_python", default=None, help="a Python with sample-factory 2.x installed: also run its "
                    "MuJoCo example on the same budget and print its last reported average return")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more train.py flags")
    args = ap.parse_args()
    header(f"Learning curve: {args.env}, {args.steps} env frames, configs/mujoco.json")
    with tempfile.TemporaryDirectory() as tmp:
        train_dir = args.train_dir or tmp
        t0 = time.time()
        cmd = [sys.executable, str(ROOT / "train.py"), "--env", args.env, "--experiment", "learn_mujoco",
               "--train_dir", train_dir, "--restart_behavior", "overwrite", "--train_for_env_steps", str(args.steps),
               *(["--seed", str(args.seed)] if args.seed is not None else []), *args.extra]
        out = subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True).stdout
        wall = time.time() - t0
        scalars = read_event_scalars(Path(train_dir) / "learn_mujoco")
    rewards = scalars.get("reward/reward", [])
    fps = dict(scalars.get("perf/_fps", []))
    step_every = max(1, len(rewards) // 20)
    rows = [[f, f"{r:.1f}", f"{fps.get(f, float('nan')):.0f}"] for i, (f, r) in enumerate(rewards)
            if i % step_every == 0 or i == len(rewards) - 1]
    print(table(rows, ["env frames", "avg return (last 100 episodes)", "fps"]))
    done = DONE_RE.search(out)
    overall = f"{done.group(3)} frames/s ({done.group(1)} frames in {done.group(2)})" if done else "n/a"
    if rewards:
        print(f"\nreward: {rewards[0][1]:.1f} at {rewards[0][0]} frames -> {rewards[-1][1]:.1f} at {rewards[-1][0]} "
              f"frames")
    print(f"throughput: {overall}; wall time {wall:.0f} s with start-up")
    if args.sf_python:
        sf_run(args)


SF_FRAMES_RE = re.compile(r"Total num frames: (\d+)")
SF_REWARD_RE = re.compile(r"Avg episode reward: \[\(0, '([-\d.]+)'\)\]")


def sf_run(args) -> None:
    """Sample Factory's own MuJoCo example (its preset: sf_examples/mujoco/mujoco_params.py) on the same budget."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        cmd = [args.sf_python, "-m", "sf_examples.mujoco.train_mujoco", "--env", args.env, "--experiment", "sf",
               "--train_dir", tmp, "--train_for_env_steps", str(args.steps), "--device", "cpu",
               *(["--seed", str(args.seed)] if args.seed is not None else [])]
        proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
        wall = time.time() - t0
    log = proc.stdout + proc.stderr
    frames, rewards = SF_FRAMES_RE.findall(log), SF_REWARD_RE.findall(log)
    last = f"{float(rewards[-1]):.1f}" if rewards else "n/a"
    print(f"\nSample Factory: last reported avg return {last} at {frames[-1] if frames else 'n/a'} frames; "
          f"wall time {wall:.0f} s with start-up")


if __name__ == "__main__":
    main()
