#!/usr/bin/env python
"""Learning benchmark: PettingZoo envs trained from train.py with the preset of configs/pettingzoo.json.

For each env: the average episode return per agent of a uniformly random policy (measured here, in this process, over
--random_episodes episodes of the same env), the first average train.py reports (the untrained policy's first
episodes) and the final one (its last 100 episodes), the env frames (every agent's steps) and the wall time.

    python benchmarks/pettingzoo_learning.py                                  # MPE simple_spread_v3 and simple_v3
    python benchmarks/pettingzoo_learning.py --envs pettingzoo_simple_spread_v3 --frames 300000 --seed 1
    python benchmarks/pettingzoo_learning.py --extra --num_workers 4          # more train.py flags
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import header, table  # noqa: E402

REPORT_RE = re.compile(r"Total num frames: (\d+)\..*Avg episode reward: ([-\d.]+) \((\d+) episodes\)")
DONE_RE = re.compile(r"Done: (\d+) env frames in")


def random_return(env_name: str, episodes: int, seed: int) -> float:
    """The average episode return per agent of uniformly random actions (every agent's episodes)."""
    from sf_envs.params import env_cfg
    from sf_envs.registry import make_env
    env = make_env(env_cfg(env_name, seed=seed))
    env.action_space.seed(seed)
    multi = env.is_multiagent
    returns: list[float] = []
    env.reset(seed=seed)
    while len(returns) < episodes:
        if multi:
            _, _, _, _, infos = env.step([env.action_space.sample() for _ in range(env.num_agents)])
            returns += [i["episode"]["reward"] for i in infos if "episode" in i]
        else:
            _, _, terminated, truncated, info = env.step(env.action_space.sample())
            if terminated or truncated:
                returns.append(info["episode"]["reward"])
                env.reset()
    env.close()
    return float(np.mean(returns[:episodes]))


def learning_run(env_name: str, args) -> tuple:
    """One train.py run: (first reported average, final average, env frames, wall time s, its console curve)."""
    with tempfile.TemporaryDirectory() as tmp:
        train_dir = args.train_dir or tmp
        cmd = [sys.executable, str(ROOT / "train.py"), "--env", env_name, "--experiment", f"learn_{env_name}",
               "--train_dir", train_dir, "--restart_behavior", "overwrite", "--train_for_env_steps", str(args.frames),
               "--num_workers", str(args.num_workers), "--seed", str(args.seed), *args.extra]
        t0 = time.time()
        out = subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True).stdout
        wall = time.time() - t0
    curve = [(int(f), float(r), int(n)) for f, r, n in REPORT_RE.findall(out)]
    done = DONE_RE.search(out)
    frames = int(done.group(1)) if done else (curve[-1][0] if curve else 0)
    first = next((r for f, r, n in curve if n > 0), float("nan"))
    final = curve[-1][1] if curve else float("nan")
    return first, final, frames, wall, curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", nargs="+", default=["pettingzoo_simple_spread_v3", "pettingzoo_simple_v3"])
    ap.add_argument("--frames", type=int, default=500_000, help="env frames (every agent's steps) per run")
    ap.add_argument("--num_workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--random_episodes", type=int, default=300)
    ap.add_argument("--train_dir", default=None, help="keep the experiment dirs here (learn_<env>, for "
                    "python -m sf.plot); default: a temporary directory")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more train.py flags")
    args = ap.parse_args()
    header(f"Learning: {', '.join(args.envs)}, {args.frames} env frames each, configs/pettingzoo.json")
    rows = []
    for env_name in args.envs:
        rand = random_return(env_name, args.random_episodes, args.seed)
        first, final, frames, wall, curve = learning_run(env_name, args)
        print(f"\n## {env_name}")
        step_every = max(1, len(curve) // 12)
        print(table([[f, f"{r:.2f}", n] for i, (f, r, n) in enumerate(curve) if i % step_every == 0 or
                     i == len(curve) - 1], ["env frames", "avg episode return per agent (last 100)", "episodes"]))
        rows.append([env_name, frames, f"{wall:.0f}", f"{rand:.2f}", f"{first:.2f}", f"{final:.2f}"])
    print()
    print(table(rows, ["env", "env frames", "wall time (s)", "random policy", "first report", "final (last 100)"]))


if __name__ == "__main__":
    main()
