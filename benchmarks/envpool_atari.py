#!/usr/bin/env python
"""Atari on EnvPool against our ALE engine and Sample Factory 2.1.1's EnvPool example, in one invocation: env frames/s,
policy lag and reward of full training runs of the same length.

Configurations (each: --num_workers 2 --device cpu --seed S, training --seconds after its first frames, then SIGINT):
  ours_ale        train.py --env GAME: our defaults (configs/atari.json: 8 envs per worker, 2 groups)
  ours_envpool    the same with --env_engine envpool: our defaults there (8 pools of --env_agents 4 per worker)
  ours_envpool_8  --env_engine envpool --num_envs_per_worker 2 --env_agents 4: the ALE preset's 8 games per worker,
                  one pool per double-buffered group
  sf_envpool      Sample Factory 2.1.1's `sf_examples.envpool.atari.train_envpool_atari` with its defaults (1 pool of
                  64 games per worker); its Python needs envpool (pip install envpool==0.8.4 'shimmy<1' in .venv-sf)
  cleanrl_envpool CleanRL's ppo_atari_envpool.py (--cleanrl_script: the file from its repository, which has no release
                  on PyPI with it) with its defaults (8 games, one EnvPool pool, synchronous PPO) and --no-cuda; its
                  Python (--cleanrl_python) needs torch, envpool==0.8.4 (its script sets the pool's num_envs, which
                  1.x refuses), gym==0.23.1, numpy<2, tyro and tensorboard. Its frames: global_step x 4 (agent steps
                  at frameskip 4), its frames/s its last SPS x 4 (the average since its envs were made)
The configurations alternate in order per round (round 2 reversed). frames/s: the median of the steady 10-second
windows of each run's reports and the frames between the first and last steady report over their time
(sf_workloads.steady_fps); ratios against ours_ale, medians over rounds.

    python benchmarks/envpool_atari.py --cleanrl_script S --cleanrl_python P   # Breakout, 150 s each, all five
    python benchmarks/envpool_atari.py --configs ours_ale ours_envpool --seconds 60 --rounds 2
"""
from __future__ import annotations

import argparse
import re
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

from sf_envs.envpool.atari import envpool_task  # noqa: E402

CONFIGS = ("ours_ale", "ours_envpool", "ours_envpool_8", "sf_envpool", "cleanrl_envpool")
CLEANRL_STEP_RE = re.compile(r"global_step=(\d+)")
CLEANRL_SPS_RE = re.compile(r"SPS: (\d+)")
CLEANRL_RETURN_RE = re.compile(r"episodic_return=([-\d.]+)")


def parse_cleanrl(result: dict) -> dict:
    """frames, frames/s and the average return of its last 100 games out of CleanRL's output (frameskip 4)."""
    log = result["log"]
    steps, sps = CLEANRL_STEP_RE.findall(log), CLEANRL_SPS_RE.findall(log)
    returns = [float(x) for x in CLEANRL_RETURN_RE.findall(log)][-100:]
    frames = 4 * int(steps[-1]) if steps else 0
    fps = 4.0 * int(sps[-1]) if sps else float("nan")
    error = "" if result["rc"] == 0 or result.get("interrupted") else f"exit {result['rc']}: {log.strip()[-160:]}"
    return {"frames": frames, "lag": 0.0, "fps": fps, "steady": fps, "overall": frames / result["wall"],
            "reward": sum(returns) / len(returns) if returns else float("nan"), "wall": result["wall"],
            "load": result["load"], "error": error}


def command(name: str, args, scratch: Path, exp: str) -> tuple[list[str], Path]:
    """The command of configuration `name` and its working directory."""
    both = ["--env", args.env, "--num_workers", "2", "--device", "cpu", "--seed", str(args.seed),
            "--experiment", exp]
    if name == "cleanrl_envpool":
        return ([args.cleanrl_python, str(Path(args.cleanrl_script).resolve()), "--env-id",
                 envpool_task(args.env[len("atari_"):]), "--no-cuda", "--seed", str(args.seed),
                 "--total-timesteps", "1000000000", "--exp-name", exp], scratch / "cleanrl")
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
    ap.add_argument("--cleanrl_script", default=None, help="cleanrl_envpool: CleanRL's ppo_atari_envpool.py")
    ap.add_argument("--cleanrl_python", default=sys.executable, help="cleanrl_envpool: a Python that runs it")
    args = ap.parse_args()
    if "cleanrl_envpool" in args.configs and not (args.cleanrl_script and Path(args.cleanrl_script).is_file()):
        if args.configs == list(CONFIGS):  # (the default: all of them) without the script: the others
            args.configs.remove("cleanrl_envpool")
        else:
            print("--cleanrl_script: the path of CleanRL's ppo_atari_envpool.py is needed for cleanrl_envpool",
                  file=sys.stderr)
            sys.exit(2)
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
            sf, cleanrl = name.startswith("sf"), name.startswith("cleanrl")
            cwd.mkdir(parents=True, exist_ok=True)
            out = run(cmd, cwd, scratch / f"{exp}.log", args.stall_sec, sf_env if sf else None, seconds=args.seconds,
                      **({"frames_re": CLEANRL_STEP_RE} if cleanrl else {}))
            res = parse_cleanrl(out) if cleanrl else parse("sf" if sf else "ours", out, scratch / "sf" / "td" / exp /
                                                           ".summary" / "0" if sf else scratch / "ours" / exp)
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
