#!/usr/bin/env python
"""KL from the behaviour policy and clip fraction at equal learning progress, ours against Sample Factory 2.1.1, over
the runs of a learning suite (`benchmarks/learning_suite.py ... --with_sf same defaults`) that are already there.

    python benchmarks/kl_at_equal_reward.py --train_dir /work/suite_heldout_v2 \\
        --band doom_defend_the_line=15:20 --band doom_health_gathering=6.5:15 --band doom_deadly_corridor=2.5:4.5

A run's KL and clip fraction grow as its policy leaves the random one (health gathering: ~1e-4 while the reward sits at
the random policy's, ~7e-4 once it climbs), so a run that learns earlier shows more of both over its second half
whatever its steps are like. Here each side's statistics are taken only from the summaries logged while its running
average reward (TensorBoard's reward/reward, the last one logged before the statistic) lay in the task's --band, a
range every configuration passes through: medians over those summaries, the seeds pooled. Reads only; trains nothing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import header, table  # noqa: E402
from learning_suite import sf_mode_dir, sf_summary  # noqa: E402
from policy_lag import OURS, THEIRS  # noqa: E402
from sf.utils.events import read_scalar_events  # noqa: E402

SIDES = (("ours", None, OURS), ("SF 2.1.1, same", "same", THEIRS), ("SF 2.1.1, defaults", "defaults", THEIRS))


def band(text: str) -> tuple[str, float, float]:
    try:
        task, rng = text.split("=")
        lo, hi = (float(x) for x in rng.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--band {text!r}: write TASK=LOW:HIGH, e.g. doom_defend_the_line=15:20") \
            from None
    if not lo < hi:
        raise argparse.ArgumentTypeError(f"--band {text!r}: LOW must be below HIGH")
    return task, lo, hi


def in_band(series: dict, tag: str, reward_tag: str, lo: float, hi: float) -> list[float]:
    """The values of `tag` logged while the last reward logged before them lay in [lo, hi]."""
    rewards = sorted((step, v) for step, _, v in series.get(reward_tag, []))
    out, i, last = [], 0, None
    for step, _, v in sorted(series.get(tag, []), key=lambda p: p[0]):
        while i < len(rewards) and rewards[i][0] <= step:
            last = rewards[i][1]
            i += 1
        if last is not None and lo <= last <= hi:
            out.append(v)
    return out


def side_dirs(suite: Path, task: str, mode: str | None) -> list[Path]:
    """The runs of `task` of one side: ours (NN_<task>_see_S/), or Sample Factory's of --with_sf `mode`
    (learning_suite's layout) for the same names."""
    ours = sorted(p for p in suite.glob(f"[0-9][0-9]_{task}_see_*") if p.is_dir())
    if mode is None:
        return ours
    return [d for d in (sf_summary(sf_mode_dir(suite, mode), p) for p in ours) if d.is_dir()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--train_dir", type=Path, required=True, help="the learning suite's --train_dir")
    ap.add_argument("--band", type=band, action="append", required=True,
                    help="TASK=LOW:HIGH, the reward range of a task (repeat for each task)")
    args = ap.parse_args(argv)
    suite = args.train_dir / "learning_suite"
    if not suite.is_dir():
        ap.error(f"--train_dir {args.train_dir}: no learning_suite/ in it (a benchmarks/learning_suite.py --train_dir)")
    header("KL and clip fraction at equal learning progress")
    rows = []
    for task, lo, hi in args.band:
        for name, mode, tags in SIDES:
            dirs = side_dirs(suite, task, mode)
            kl, clip = [], []
            for d in dirs:
                series = read_scalar_events(d)
                kl += in_band(series, tags["kl"], tags["reward"], lo, hi)
                clip += in_band(series, tags["clip"], tags["reward"], lo, hi)
            med = lambda xs, f: f.format(statistics.median(xs)) if xs else "-"  # noqa: E731
            rows.append([task, f"{lo:g}..{hi:g}", name, len(dirs), len(kl), med(kl, "{:.2e}"), med(clip, "{:.4f}")])
    print(table(rows, ["task", "reward band", "side", "runs", "summaries in band", "KL median",
                       "clip fraction median"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
