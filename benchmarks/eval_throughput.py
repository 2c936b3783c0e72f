#!/usr/bin/env python
"""Throughput of python -m sf.eval against the sampler it runs on and against enjoy.py, measured in one invocation.

1. A tiny experiment is trained (or --experiment names one under --train_dir), with the layout below.
2. (a) The training sampler of the same layout and model: train.py --sampler_only True (the policy forward runs, the
   learner returns the trajectories unused) for --duration seconds; env frames/s = the median of its steady-state
   10-s windows (the first report dropped).
3. sf.eval of the experiment, --episodes episodes on the same layout: env frames of the evaluated episodes / seconds
   from the moment every process had started to the last episode (what it prints; frames of discarded episodes, still
   running when their agent met its quota, do not count).
4. (b) enjoy.py --no_render, one env in one process: run twice, to --enjoy_frames and to twice that, env frames/s =
   the extra frames / the extra seconds (start-up cancels out).
Prints a table of the three rates and the ratio of sf.eval to each.

    python benchmarks/eval_throughput.py --env doom_basic --num_workers 2 --num_envs_per_worker 8 --duration 40 \\
        --episodes 200
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, header, run_train, table  # noqa: E402

EVAL_RE = re.compile(r"Evaluated (\d+) episodes \((\d+) env frames\) in ([\d.]+) s: (\d+) env frames/s")


def run(cmd: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    start = time.time()
    res = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
    return res, time.time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="doom_basic")
    ap.add_argument("--num_workers", type=int, default=2)
    ap.add_argument("--num_envs_per_worker", type=int, default=8)
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of the sampler-only run")
    ap.add_argument("--episodes", type=int, default=200, help="episodes sf.eval evaluates")
    ap.add_argument("--enjoy_frames", type=int, default=2000, help="env frames of enjoy.py's shorter run")
    ap.add_argument("--train_steps", type=int, default=4000, help="env frames trained for the experiment")
    ap.add_argument("--train_dir", default=None, help="default: a temporary directory")
    ap.add_argument("--experiment", default=None, help="an experiment of --train_dir to evaluate (default: train one)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    header("sf.eval throughput vs the training sampler (--sampler_only) and enjoy.py")
    with tempfile.TemporaryDirectory() as tmp:
        train_dir = args.train_dir or tmp
        layout = ["--num_workers", str(args.num_workers), "--num_envs_per_worker", str(args.num_envs_per_worker)]
        common = ["--env", args.env, "--device", args.device, *layout]
        exp = args.experiment
        if exp is None:
            exp = "eval_throughput"
            run(["train.py", *common, "--experiment", exp, "--train_dir", train_dir, "--restart_behavior", "overwrite",
                 "--train_for_env_steps", str(args.train_steps), "--seed", "1"], timeout=600)
        # (a) the sampler of the same layout and model
        sampler = run_train([*common, "--experiment", f"{exp}_sampler", "--sampler_only", "True",
                             "--train_for_seconds", str(int(args.duration))], train_dir, timeout=args.duration + 300)
        # sf.eval
        res, _ = run(["-m", "sf.eval", exp, "--train_dir", train_dir, "--episodes", str(args.episodes), *layout,
                      "--csv", str(Path(tmp) / "eval.csv"), "--device", args.device], timeout=900)
        m = EVAL_RE.search(res.stdout)
        if m is None:
            raise SystemExit(f"sf.eval printed no throughput line:\n{res.stdout[-3000:]}")
        eval_fps = float(m.group(4))
        # (b) enjoy.py's one-env loop: the extra frames of a run twice as long over its extra seconds
        enjoy = ["enjoy.py", "--env", args.env, "--experiment", exp, "--train_dir", train_dir, "--no_render",
                 "--device", args.device]
        _, t1 = run([*enjoy, "--max_num_frames", str(args.enjoy_frames)], timeout=900)
        _, t2 = run([*enjoy, "--max_num_frames", str(2 * args.enjoy_frames)], timeout=900)
        enjoy_fps = args.enjoy_frames / max(t2 - t1, 1e-9)
    rows = [["sf.eval", f"{eval_fps:.0f}", "1.00", f"{m.group(1)} episodes, {m.group(2)} frames in {m.group(3)} s"],
            ["(a) train.py --sampler_only True", f"{sampler['fps_median']:.0f}",
             f"{eval_fps / sampler['fps_median']:.2f}", f"10-s windows {sampler['fps_samples']}"],
            ["(b) enjoy.py --no_render (1 env)", f"{enjoy_fps:.0f}", f"{eval_fps / enjoy_fps:.2f}",
             f"{args.enjoy_frames} extra frames in {t2 - t1:.1f} s"]]
    print(f"{args.env}, {args.num_workers} rollout workers x {args.num_envs_per_worker} envs, device {args.device}\n")
    print(table(rows, ["run", "env frames/s", "sf.eval / this", "measured"]))


if __name__ == "__main__":
    main()
