#!/usr/bin/env python
"""The measured layout against the preset's, in full training on this machine: env frames/s, policy lag, the ratio.

    python benchmarks/autolayout_vs_preset.py --env doom_battle --seconds 300 --rounds 3
    python benchmarks/autolayout_vs_preset.py --env doom_battle --seconds 60 --rounds 1 --minutes 1   # a quick look

First `python -m sf.autolayout --env ENV --minutes M` measures this machine and caches its layout (--use_cache: the
cached one, if there is one). Then each round runs train.py twice for --seconds each (start-up included, the steady
reports measured: sf.autolayout.measure.steady_rate): with the preset's layout (configs/<family>.json; --num_workers =
the cores) and with `--num_workers auto` (the cached layout), alternating which goes first. Flags after the script's
own go to every run (e.g. --device cpu). The ratio is of the medians over rounds.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import header, table  # noqa: E402  (benchmarks/ is sys.path[0] when run as a script)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sf import autolayout  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="doom_battle")
    ap.add_argument("--seconds", type=float, default=300.0, help="each training run's budget (start-up included)")
    ap.add_argument("--rounds", type=int, default=3, help="pairs of runs (preset, auto), alternating the order")
    ap.add_argument("--minutes", type=float, default=2.0, help="sf.autolayout's budget (its check run included)")
    ap.add_argument("--use_cache", action="store_true", help="use the cached layout if there is one")
    ap.add_argument("--train_dir", default="/tmp/autolayout_vs_preset")
    args, flags = ap.parse_known_args(argv)
    if args.seconds <= 0 or args.rounds < 1 or args.minutes <= 0:
        print("autolayout_vs_preset: --seconds and --minutes must be > 0, --rounds >= 1", file=sys.stderr)
        return 2
    header(f"measured layout (sf.autolayout) vs the preset's: {args.env}, {args.rounds} round(s) of "
           f"{args.seconds:.0f} s per run")
    cache = autolayout.cache_path(args.env)
    if not (args.use_cache and cache.exists()):
        rc = subprocess.run([sys.executable, "-m", "sf.autolayout", "--env", args.env, "--minutes", str(args.minutes),
                             *flags], cwd=ROOT).returncode
        if rc != 0:
            print(f"autolayout_vs_preset: sf.autolayout failed (exit {rc})", file=sys.stderr)
            return rc
        print()
    print(f"layout cache: {cache}\n", flush=True)
    runs = {"preset": ["--env", args.env, *flags], "auto": ["--env", args.env, "--num_workers", "auto", *flags]}
    results: dict[str, list[dict]] = {"preset": [], "auto": []}
    rows = []
    for r in range(args.rounds):
        for name in (("preset", "auto") if r % 2 == 0 else ("auto", "preset")):
            res = autolayout.run_training(runs[name], args.seconds, args.train_dir, experiment=f"{name}_{r}")
            results[name].append(res)
            layout = next((ln.split("--num_workers auto: ", 1)[1].split(" (")[0] for ln in res["log"].splitlines()
                           if "--num_workers auto: " in ln), "configs preset, --num_workers default")
            err = "" if res["rc"] == 0 else f"exit {res['rc']}"
            rows.append([r + 1, name, f"{res['frames_per_s']:,.0f}", f"{res['lag']:.1f}", res["reports"],
                         f"{os.getloadavg()[0]:.1f}", layout, err])
            print(table(rows[-1:], ["round", "layout", "env frames/s", "avg lag", "reports", "load", "what", "error"]),
                  flush=True)
    print()
    print(table(rows, ["round", "layout", "env frames/s", "avg lag", "reports", "load", "what", "error"]))

    def median(name: str, key: str) -> float:
        xs = [x[key] for x in results[name] if not math.isnan(x[key])]
        return statistics.median(xs) if xs else math.nan
    fa, fp = median("auto", "frames_per_s"), median("preset", "frames_per_s")
    print(f"\nmedian env frames/s: auto {fa:,.0f} (lag {median('auto', 'lag'):.1f}), preset {fp:,.0f} "
          f"(lag {median('preset', 'lag'):.1f}); ratio auto / preset {fa / fp if fp else math.nan:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
