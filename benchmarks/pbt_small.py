#!/usr/bin/env python
"""Population-based training on a small env: mutations and weight copies happen, and the population's best
objective does not fall after them.

One run of train.py with --num_policies N --with_pbt True and a short PBT period on a built-in env (default test_image:
a conv encoder and two action heads, random policy 6.67, optimal 16.0 per episode). Prints every PBT decision from
pbt_state.json (who, what, the objectives when decided) and the population's best objective (the best policy's average
reward in TensorBoard, p{i}/reward/reward) before each copy and mutation and at the end.

    python benchmarks/pbt_small.py --env test_image --num_policies 4 --frames 400000 --period 40000
"""
from __future__ import annotations

import argparse
import json
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


def best_curve(scalars: dict, num_policies: int) -> list[tuple[int, float]]:
    """(env frames of the run, the best policy's average reward then): the population's best objective over time."""
    latest: dict[int, float] = {}
    events = sorted((step, p, v) for p in range(num_policies) for step, v in scalars.get(f"p{p}/reward/reward", []))
    out = []
    for step, p, v in events:
        latest[p] = v
        out.append((step, max(latest.values())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="test_image")
    ap.add_argument("--num_policies", type=int, default=4)
    ap.add_argument("--frames", type=int, default=400_000, help="env frames per policy")
    ap.add_argument("--period", type=int, default=40_000, help="--pbt_period_env_steps (and --pbt_start_mutation)")
    ap.add_argument("--num_workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--train_dir", default=None, help="keep the experiment dir here (for python -m sf.plot)")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[])
    args = ap.parse_args()
    header(f"PBT on {args.env}: {args.num_policies} policies")
    with tempfile.TemporaryDirectory() as tmp:
        train_dir = args.train_dir or tmp
        exp = Path(train_dir) / f"pbt_{args.env}"
        cmd = [sys.executable, str(ROOT / "train.py"), "--env", args.env, "--experiment", exp.name, "--train_dir",
               train_dir, "--restart_behavior", "overwrite", "--num_workers", str(args.num_workers),
               "--num_policies", str(args.num_policies), "--with_pbt", "True", "--pbt_period_env_steps",
               str(args.period), "--pbt_start_mutation", str(args.period), "--train_for_env_steps", str(args.frames),
               "--seed", str(args.seed), "--experiment_summaries_interval", "2", *args.extra]
        print("train.py command:", " ".join(cmd[1:]))
        t0 = time.time()
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        wall = time.time() - t0
        history = json.loads((exp / "pbt_state.json").read_text())["history"]
        curve = best_curve(read_event_scalars(exp), args.num_policies)
    rows = []
    for d in history:
        objs = [o if o is not None else float("nan") for o in d["objectives"]]
        what = {"replace": f"copies policy {d['source']}", "keep": f"keeps (gap to {d['source']})",
                "skip": "skips"}.get(d["kind"], "mutates")
        changes = ", ".join(f"{k} {o:.3g}->{n:.3g}" for k, (o, n) in d["changes"].items()) or "-"
        rows.append([d["env_steps"], d["policy"], what, changes, " ".join(f"{o:.2f}" for o in objs),
                     f"{max(objs):.2f}"])
    print(f"\nwall time {wall:.0f} s; {len(history)} decisions "
          f"({sum(d['kind'] == 'replace' for d in history)} weight copies, "
          f"{sum(d['kind'] == 'mutate' and bool(d['changes']) for d in history)} mutations that changed something)\n")
    print(table(rows, ["policy's frames", "policy", "decision", "changes", "objectives (all policies)",
                       "best objective then"]))
    step_every = max(1, len(curve) // 20)
    print()
    print(table([[f, f"{b:.2f}"] for i, (f, b) in enumerate(curve) if i % step_every == 0 or i == len(curve) - 1],
                ["env frames (all policies)", "population's best average reward"]))
    decided = [max(o for o in d["objectives"] if o is not None) for d in history if d["kind"] in ("replace", "mutate")
               and any(o is not None for o in d["objectives"])]
    if decided and curve:
        second_half = [best for _, best in curve[len(curve) // 2:]]
        print(f"\nbest objective at the first decision {decided[0]:.2f}, at the last {decided[-1]:.2f}; "
              f"lowest of the population's best over the second half of the run {min(second_half):.2f}, at the end "
              f"{curve[-1][1]:.2f}")


if __name__ == "__main__":
    main()
