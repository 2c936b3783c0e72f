#!/usr/bin/env python
"""MuJoCo on EnvPool against our native MuJoCo engine (gymnasium's envs), in one invocation: full training runs of the
same env frames, their wall time, env frames/s and learning curve (TensorBoard reward/reward at each quarter).

Configurations (each: train.py --env ENV --num_workers 2 --device cpu --seed S --train_for_env_steps STEPS, the
preset configs/mujoco.json):
  ours_mujoco   the native engine: the preset's 16 envs per worker, 2 groups
  ours_envpool  --env_engine envpool --num_envs_per_worker 2 --env_agents 8: the same 16 envs per worker, one pool per
                double-buffered group
The configurations alternate in order per round (round 2 reversed). frames/s: the median of the steady 10-second
windows (sf_workloads.steady_fps) and env frames over the whole wall time; ratios against ours_mujoco, medians over
rounds.

    python benchmarks/envpool_mujoco.py                          # HalfCheetah, 1M env frames, 1 round, both
    python benchmarks/envpool_mujoco.py --env mujoco_hopper --steps 300000 --rounds 2
"""
from __future__ import annotations

import argparse
import shlex
import signal
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import header, table  # noqa: E402
from sf_workloads import fmt, parse, ratio, run  # noqa: E402

from sf.runner.stats import read_event_scalars  # noqa: E402

CONFIGS = {"ours_mujoco": [], "ours_envpool": ["--env_engine", "envpool", "--num_envs_per_worker", "2",
                                                "--env_agents", "8"]}


def command(name: str, args, scratch: Path, exp: str) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), "--env", args.env, "--num_workers", "2", "--device", "cpu",
            "--seed", str(args.seed), "--experiment", exp, "--train_dir", str(scratch), "--restart_behavior",
            "overwrite", "--train_for_env_steps", str(args.steps), *CONFIGS[name]]


def curve(exp_dir: Path, steps: int) -> list[float]:
    """reward/reward at the first summary at or past each quarter of `steps`."""
    points = read_event_scalars(exp_dir).get("reward/reward", [])
    out = []
    for q in (0.25, 0.5, 0.75, 1.0):
        later = [v for s, v in points if s >= q * steps * 0.98]  # (the last summary may stop just short of the end)
        out.append(later[0] if later else float("nan"))
    return out


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # (run() stops its run on the way out)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="mujoco_halfcheetah")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--steps", type=int, default=1_000_000, help="env frames per run (default 1M)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stall_sec", type=float, default=300.0)
    ap.add_argument("--scratch", default=None, help="directory for the runs (default: a new one under /tmp, kept)")
    args = ap.parse_args()
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="envpool_mujoco_"))
    scratch.mkdir(parents=True, exist_ok=True)
    header(f"MuJoCo on EnvPool: {args.env}, {args.steps} env frames per run")
    print(f"scratch (logs, train dirs): {scratch}")
    for name in args.configs:
        print(f"{name}: {shlex.join(command(name, args, scratch, f'{name}_rN'))}")
    print()
    results: dict[str, list[dict]] = {name: [] for name in args.configs}
    rows = []
    for r in range(1, args.rounds + 1):
        for name in args.configs if r % 2 else reversed(args.configs):
            exp = f"{name}_r{r}"
            out = run(command(name, args, scratch, exp), ROOT, scratch / f"{exp}.log", args.stall_sec)
            res = parse("ours", out, scratch / exp)
            res["curve"] = curve(scratch / exp, args.steps)
            results[name].append(res)
            rows.append([r, name, res["frames"], fmt(res["wall"]), fmt(res["fps"]), fmt(res["overall"]),
                         " / ".join(fmt(v) for v in res["curve"]), fmt(res["load"], 1), res["error"]])
            print(f"round {r} {name}: {rows[-1][2:]}", flush=True)
    print("\n" + table(rows, ["round", "config", "env frames", "wall s", "frames/s (median 10-s)",
                              "frames/s (whole run)", "reward at 1/4, 1/2, 3/4, all frames", "load avg", "error"]))

    def med(name: str, key: str) -> float:
        values = [x[key] for x in results.get(name, []) if not x["error"] and x[key] == x[key]]
        return statistics.median(values) if values else float("nan")

    base = args.configs[0]
    print(f"\nRatios against {base} (medians over rounds):\n" + table(
        [[name, fmt(med(name, "wall")), fmt(med(name, "fps")), ratio(med(name, "fps"), med(base, "fps")),
          fmt(med(name, "overall")), ratio(med(name, "overall"), med(base, "overall"))] for name in args.configs],
        ["config", "wall s", "frames/s (median 10-s)", "ratio", "frames/s (whole run)", "ratio"]))


if __name__ == "__main__":
    main()
