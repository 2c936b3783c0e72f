#!/usr/bin/env python
"""Atari on EnvPool against our ALE engine and Sample Factory 2.1.1's EnvPool example, in one invocation: env frames/s,
policy lag and reward of full training runs of the same length.

Configurations (each: --num_workers 2 --device cpu --seed S, training --seconds after its first frames, then SIGINT):
  ours_ale        train.py --env GAME: our defaults (configs/atari.json: 8 envs per worker, 2 groups)
  ours_envpool    the same with --env_engine envpool: our defaults there (8 pools of --env_agents 4 per worker)
  ours_envpool_8  --env_engine envpool --num_envs_per_worker 2 --env_agents 4: the ALE preset's 8 games per worker,
                  one pool per double-buffered group
  sf_envpool      Sample Factory 2.1.1's `sf_examples.envpool.atari.train_envpool_atari` with its defaults (1 pool of
                  64 games per worker); its Python needs envpool (pip install envpool==1.2.5 in .venv-sf)
The configurations alternate in order per round (round 2 reversed). frames/s: the median of the steady 10-second
windows of each run's reports and the frames between the first and last steady report over their time
(sf_workloads.steady_fps); ratios against ours_ale, medians over rounds.

    python benchmarks/envpool_atari.py                               # Breakout, 150 s each, 1 round, all four
    python benchmarks/envpool_atari.py --configs ours_ale ours_envpool --seconds 60 --rounds 2
"""
from __future__ import annotations

import argparse
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import header, table  # noqa: E402
from sf_workloads import fmt, parse, ratio, run, sf_environment  # noqa: E402

CONFIGS = ("ours_ale", "ours_envpool", "ours_envpool_8", "sf_envpool")


def command(name: str, args, scratch: Path, exp: str) -> tuple[list[str], Path]:
    """The command of configuration `name` and its working directory."""
    both = ["--env", args.env, "--num_workers", "2", "--device", "cpu", "--seed", str(args.seed),
            "--experiment", exp]
    if name == "sf_envpool":
        return ([args.sf_python, "-m", "sf_examples.envpool.atari.train_envpool_atari", *both, "--train_dir",
                 str(scratch / "sf" / "td")], scratch / "sf")
    extra = {"ours_ale": [], "ours_envpool": ["--env_engine", "envpool"],
             "ours_envpool_8": ["--env_engine", "envpool", "--num_envs_per_worker", "2", "--env_agents", "4"]}[name]
    return ([sys.executable, str(ROOT / "train.py"), *both, "--train_dir", str(scratch / "ours"),
             "--restart_behavior", "overwrite", "--train_for_seconds", str(10 * args.seconds), *extra], ROOT)


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # (run() stops its run on the way out)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="atari_breakout")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--seconds", type=int, default=150, help="training seconds of each run after its first frames")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sf_python", default=str(ROOT / ".venv-sf" / "bin" / "python"),
                    help="sf_envpool: a Python with sample-factory 2.1.1 and envpool")
    ap.add_argument("--stall_sec", type=float, default=300.0)
    ap.add_argument("--scratch", default=None, help="directory for the runs (default: a new one under /tmp, kept)")
    args = ap.parse_args()
    if "sf_envpool" in args.configs:
        ok = Path(args.sf_python).exists() and subprocess.run(
            [args.sf_python, "-c", "import envpool, sample_factory"], capture_output=True).returncode == 0
        if not ok:
            print(f"--sf_python {args.sf_python}: needs sample-factory 2.1.1 and EnvPool (pip install "
                  "envpool==0.8.4 'shimmy<1' there), or leave sf_envpool out of --configs", file=sys.stderr)
            sys.exit(2)
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="envpool_atari_"))
    sf_env = sf_environment(scratch)
    header(f"Atari on EnvPool: {args.env}, {args.seconds} s of training per run")
    print(f"scratch (logs, train dirs): {scratch}")
    for name in args.configs:
        cmd, cwd = command(name, args, scratch, f"{name}_rN")
        print(f"{name} (cwd {cwd}): {shlex.join(cmd)}")
    print()
    results: dict[str, list[dict]] = {name: [] for name in args.configs}
    rows = []
    for r in range(1, args.rounds + 1):
        for name in args.configs if r % 2 else reversed(args.configs):
            exp = f"{name}_r{r}"
            cmd, cwd = command(name, args, scratch, exp)
            sf = name.startswith("sf")
            out = run(cmd, cwd, scratch / f"{exp}.log", args.stall_sec, sf_env if sf else None, seconds=args.seconds)
            res = parse("sf" if sf else "ours", out, scratch / "sf" / "td" / exp / ".summary" / "0" if sf
                        else scratch / "ours" / exp)
            results[name].append(res)
            rows.append([r, name, res["frames"], fmt(res["wall"]), fmt(res["fps"]), fmt(res["steady"]),
                         fmt(res["reward"], 1), fmt(res["lag"], 1), fmt(res["load"], 1), res["error"]])
            print(f"round {r} {name}: {rows[-1][2:]}", flush=True)
    print("\n" + table(rows, ["round", "config", "env frames", "wall s", "frames/s (median 10-s)",
                              "frames/s (steady)", "avg episode reward", "policy lag avg", "load avg", "error"]))

    def med(name: str, key: str) -> float:
        values = [x[key] for x in results.get(name, []) if not x["error"] and x[key] == x[key]]
        return statistics.median(values) if values else float("nan")

    base = args.configs[0]
    print(f"\nRatios against {base} (medians over rounds):\n" + table(
        [[name, fmt(med(name, "fps")), ratio(med(name, "fps"), med(base, "fps")), fmt(med(name, "steady")),
          ratio(med(name, "steady"), med(base, "steady"))] for name in args.configs],
        ["config", "frames/s (median 10-s)", "ratio", "frames/s (steady)", "ratio"]))


if __name__ == "__main__":
    main()
