#!/usr/bin/env python
"""Policy lag, KL and clip fraction against collection pacing (--num_batches_to_accumulate), with Sample Factory 2.1.1
on the same task and settings in the same invocation: what the learner trains on, how stale it is, and what it costs.

    python benchmarks/policy_lag.py                                      # health gathering supreme, 700k frames
    python benchmarks/policy_lag.py --accumulate 1000 2 1 --with_sf      # unpaced (1000), the default, the least
    python benchmarks/policy_lag.py --env doom_defend_the_center --frames 1000000 --seed 101
    python benchmarks/policy_lag.py --env doom_health_gathering --frames 400000 --accumulate 2 --with_sf --step_kl

Each configuration trains one run from scratch, one after another, alone on the machine (run nothing beside it). Per
run, from its TensorBoard series: the medians over the run's second half of the policy lag (SGD steps between the
weights that acted and those that train), the KL divergence from the behaviour policy and the clip fraction; frames/s
(its Done line: env frames over wall time, start-up included); the last average episode reward. Ratios are against the
first configuration. Sample Factory (--with_sf): its VizDoom trainer with our run's settings (those of our run with
--num_batches_to_accumulate 2, its default, else the first; translated by benchmarks/sf_same_settings.py; its
version_diff, kl_divergence and fraction_clipped series), the same frames, seed and rollout workers.

--step_kl: each run also under benchmarks/step_kl_probe (its sitecustomize.py; Discrete actions), which measures
how far each SGD step moves the policy on its own minibatch, KL(after || before) (one more forward pass per step:
frames/s is then not the trainer's). Columns: its median over the run's second half, and the median KL from the
behaviour policy of the samples one step old (lag 1).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import header, table  # noqa: E402
from sf.utils.events import read_scalar_events  # noqa: E402

DONE_RE = re.compile(r"Done: (\d+) env frames in .*? \(([\d.]+) frames/s\)")
OURS = {"lag": "train/policy_lag_avg", "kl": "train/kl_divergence", "clip": "train/clip_fraction",
        "reward": "reward/reward"}
THEIRS = {"lag": "train/version_diff_avg", "kl": "train/kl_divergence", "clip": "train/fraction_clipped",
          "reward": "reward/reward"}
SF_PYTHON = ROOT / ".venv-sf" / "bin" / "python"
# configs/doom.json: these scenarios train with Sample Factory 2's Doom defaults; what our preset changes of them


def second_half_median(points: list) -> float:
    values = [v for _, _, v in points]
    return statistics.median(values[len(values) // 2:]) if values else float("nan")


def figures(series: dict, tags: dict) -> dict:
    out = {k: second_half_median(series.get(tag, [])) for k, tag in tags.items() if k != "reward"}
    rewards = series.get(tags["reward"], [])
    out["reward"] = rewards[-1][2] if rewards else float("nan")
    return out


def probe_env(workdir: Path, name: str, step_kl: bool) -> dict | None:
    """The environment of a run under the step-KL probe (None: without it)."""
    if not step_kl:
        return None
    paths = [str(ROOT / "benchmarks" / "step_kl_probe"), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, STEP_KL_LOG=str(workdir / f"{name}.step_kl.jsonl"),
                PYTHONPATH=os.pathsep.join(filter(None, paths)))


def step_figures(path: Path) -> dict:
    """The probe's medians over the second half of a run's steps: step_kl, and the KL at lag 1 (NaN without)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    rows = rows[len(rows) // 2:]
    lag1 = [r["by_lag"]["1"][0] for r in rows if r["by_lag"].get("1", [0, 0])[1] > 0]
    return {"step_kl": statistics.median(r["step_kl"] for r in rows) if rows else float("nan"),
            "lag1_kl": statistics.median(lag1) if lag1 else float("nan")}


def ours(env: str, frames: int, seed: int, accumulate: int, workdir: Path, extra: list, step_kl: bool) -> dict:
    exp = f"acc{accumulate}"
    cmd = [sys.executable, str(ROOT / "train.py"), "--env", env, "--experiment", exp, "--train_dir", str(workdir),
           "--train_for_env_steps", str(frames), "--seed", str(seed), "--num_batches_to_accumulate", str(accumulate),
           *extra]
    print(f"$ {' '.join(cmd[1:])}", flush=True)
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=probe_env(workdir, exp, step_kl)).stdout
    done = DONE_RE.findall(out)
    res = {**figures(read_scalar_events(workdir / exp), OURS), **step_figures(workdir / f"{exp}.step_kl.jsonl")}
    res["fps"] = float(done[-1][1]) if done else float("nan")
    res["wall"] = time.time() - t0
    return res


def sample_factory(env: str, frames: int, seed: int, workdir: Path, sf_args: list, step_kl: bool) -> dict:
    import sf_workloads
    cmd = [str(SF_PYTHON), "-m", "sf_examples.vizdoom.train_vizdoom", "--env", env, "--train_for_env_steps",
           str(frames), "--seed", str(seed), "--experiment", "sf", "--train_dir", str(workdir / "sf_td"),
           "--device", "cpu", *sf_args]
    print(f"$ {' '.join(cmd)}", flush=True)
    t0 = time.time()
    out = sf_workloads.run(cmd, workdir, workdir / "sf.log", stall_sec=300.0, env=probe_env(workdir, "sf", step_kl))
    wall = time.time() - t0
    summary = workdir / "sf_td" / "sf" / ".summary" / "0"
    res = {**figures(read_scalar_events(summary), THEIRS), **step_figures(workdir / "sf.step_kl.jsonl")}
    res["fps"] = sf_workloads.parse("sf", out, summary)["frames"] / wall
    res["wall"] = wall
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="doom_health_gathering_supreme")
    p.add_argument("--frames", type=int, default=700_000)
    p.add_argument("--seed", type=int, default=100, help="a tuning seed (100-102); reports use 0-2")
    p.add_argument("--accumulate", type=int, nargs="+", default=[1000, 2], help="--num_batches_to_accumulate values; "
                   "1000: unpaced (every spare slot fills ahead, as before the pause existed)")
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--with_sf", action="store_true", help="Sample Factory 2.1.1 (.venv-sf) with the same settings")
    p.add_argument("--step_kl", action="store_true", help="measure each SGD step's KL (benchmarks/step_kl_probe)")
    p.add_argument("--keep", help="keep the runs in this directory (default: a temporary one, removed)")
    args = p.parse_args()
    header(f"policy lag against collection pacing: {args.env}, {args.frames} frames, seed {args.seed}")
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="policy_lag_"))
    rows, base = [], None
    try:
        results = [(f"ours, --num_batches_to_accumulate {n}",
                    ours(args.env, args.frames, args.seed, n, workdir, ["--num_workers", str(args.num_workers)],
                         args.step_kl))
                   for n in args.accumulate]
        if args.with_sf:
            import sf_same_settings
            like = 2 if 2 in args.accumulate else args.accumulate[0]
            config = json.loads((workdir / f"acc{like}" / "config.json").read_text())
            sf_args, _ = sf_same_settings.translate(config, sf_same_settings.sf_defaults(
                str(SF_PYTHON), "sf_examples.vizdoom.train_vizdoom", args.env))
            sf_args += ["--num_workers", str(args.num_workers)]
            results.append(("Sample Factory 2.1.1, same settings", sample_factory(args.env, args.frames, args.seed,
                                                                                 workdir, sf_args, args.step_kl)))
        for name, r in results:
            base = base or r
            rows.append([name, f"{r['lag']:.2f}", f"{r['kl']:.5f} ({r['kl'] / base['kl']:.2f}x)",
                         f"{r['clip']:.3f} ({r['clip'] / base['clip']:.2f}x)",
                         f"{r['fps']:.0f} ({r['fps'] / base['fps']:.2f}x)", f"{r['reward']:.2f}", f"{r['wall']:.0f}",
                         *([f"{r['step_kl']:.2e}", f"{r['lag1_kl']:.2e}"] if args.step_kl else [])])
        print()
        print(table(rows, ["configuration", "lag (SGD steps)", "KL, median", "clip fraction, median", "frames/s",
                           "last reward", "wall s", *(["KL of one SGD step", "KL at lag 1"] if args.step_kl else [])]))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
