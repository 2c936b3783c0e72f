"""The command line: `python -m sf.autolayout --env ENV [--minutes 2] [--tune_batch_size] [train.py flags...]`
measures this machine, prints the preset's layout and the chosen one, checks the choice with a short training run
and caches it (--help: sf.autolayout's docstring)."""
from __future__ import annotations

import argparse
import math
import socket
import sys
import tempfile
import time

from sf import autolayout
from sf.autolayout.cache import cache_path, layout_key, save
from sf.autolayout.measure import measure, preset_layout, run_training
from sf.autolayout.model import LAYOUT_KEYS, Layout, Measurements, choose, layout_flags, predict
from sf.cfg import ConfigError, parse_cfg, run_guarded
from sf.processes.control import usable_cores


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f} ms" if x < 0.01 else f"{x * 1e3:.1f} ms"


def _report_lines(m: Measurements, rows: list[tuple[str, Layout, dict]]) -> list[str]:
    lines = [f"measured in {m.seconds:.0f} s ({m.cores} cores, {'GPU' if m.gpu else 'CPU'}):",
             "  env step, per process: " + ", ".join(f"{k} envs {_ms(v)}" for k, v in m.env.items()),
             f"  rollout worker beside its envs {_ms(m.step)} per sample; policy worker beside the forward "
             f"{_ms(m.call)} per call; queue round trip between processes {_ms(m.msg)}",
             f"  policy forward ({m.policy_threads} thread(s)): " + ", ".join(f"{b} rows {_ms(v)}"
                                                                               for b, v in m.fwd.items()),
             "  learner APPO.train: " + ", ".join(f"batch {k.split('/')[0]} x {k.split('/')[1]} thread(s) "
                                                   f"{1 / v:,.0f} samples/s" for k, v in m.learn.items()),
             "", f"{'layout':<8} workers envs/worker splits policy_workers learner_threads batch | rows/fwd | "
                 f"samples/s: sampler learner cores | frames/s  lag  bound"]
    for name, lay, p in rows:
        lines.append(f"{name:<8} {lay.num_workers:>7} {lay.num_envs_per_worker:>11} {lay.worker_num_splits:>6} "
                     f"{lay.policy_workers_per_policy:>14} {lay.learner_torch_threads:>15} {lay.batch_size:>5} | "
                     f"{p['rows_per_forward']:>8.0f} | {p['sampler']:>17,.0f} {p['learner']:>7,.0f} {p['cores']:>5,.0f}"
                     f" | {p['frames_per_s']:>8,.0f} {p['lag']:>4.1f}  {p['bound']}")
    return lines


def main(argv=None, prog: str = "python -m sf.autolayout") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_guarded(prog, lambda: _main(argv))


def _main(argv: list[str]) -> int:
    own = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    own.add_argument("--minutes", default="2")
    own.add_argument("--tune_batch_size", action="store_true")
    own.add_argument("-h", "--help", action="store_true")
    args, train_flags = own.parse_known_args(argv)
    if args.help:
        print(autolayout.__doc__)
        return 0
    try:
        minutes = float(args.minutes)
    except ValueError:
        minutes = math.nan
    if not (math.isfinite(minutes) and minutes > 0):
        raise ConfigError(f"--minutes must be a number of minutes > 0 (got {args.minutes!r})")
    if "--num_workers=auto" in train_flags:  # the layout is what this measures
        train_flags.remove("--num_workers=auto")
    if "--num_workers" in train_flags and train_flags[train_flags.index("--num_workers") + 1:][:1] == ["auto"]:
        i = train_flags.index("--num_workers")
        del train_flags[i:i + 2]
    with tempfile.TemporaryDirectory(prefix="sf-autolayout-") as tmp:
        cfg = parse_cfg([*train_flags, "--train_dir", tmp], mode="train", prog="python -m sf.autolayout")
        total, t_start = minutes * 60.0, time.time()
        check_s = 0.55 * total
        print(f"sf.autolayout: {cfg.env} on {socket.gethostname()} ({usable_cores()} cores), budget "
              f"{minutes:g} min: measuring {total - check_s:.0f} s, then a {check_s:.0f} s training run", flush=True)
        m = measure(cfg, total - check_s, args.tune_batch_size, log=lambda s: print(s, flush=True))
        preset = preset_layout(cfg)
        fixed = {k: getattr(cfg, k) for k in LAYOUT_KEYS + ("batch_size",) if k in cfg._explicit}
        if "learner_torch_threads" in fixed:
            fixed["learner_torch_threads"] = preset.learner_torch_threads  # 0 means the default (learner_threads)
        chosen, pred, bound = choose(m, preset, fixed, args.tune_batch_size)
        preset_pred = predict(preset, m)
        for line in _report_lines(m, [("preset", preset, preset_pred), ("chosen", chosen, pred)]):
            print(line)
        print(f"chosen: the highest predicted env frames/s with predicted policy lag <= {bound:.1f} SGD steps "
              f"({pred['frames_per_s'] / preset_pred['frames_per_s']:.2f}x the preset's prediction)")
        if chosen.batch_size != cfg.batch_size:
            print(f"batch size: {cfg.batch_size} -> {chosen.batch_size} (--tune_batch_size; this changes learning: "
                  "SGD steps per sample and the gradient's noise)")
        else:
            print(f"batch size: kept at {cfg.batch_size} (it changes learning; --tune_batch_size lets it change)")
        flags = [*train_flags, *layout_flags(chosen, args.tune_batch_size)]
        budget_left = max(total - (time.time() - t_start), 0.25 * total)  # measuring may overrun its share a little
        print(f"checking: python -m sf.train {' '.join(flags)} for {budget_left:.0f} s", flush=True)
        check = run_training(flags, budget_left, tmp)
        if check["rc"] != 0 and math.isnan(check["frames_per_s"]):
            tail = [ln for ln in check["log"].splitlines() if ln.strip()][-1:] or ["no output"]
            print(f"check run failed (exit {check['rc']}): {tail[0][:200]}")
        print(f"measured: {check['frames_per_s']:,.0f} env frames/s (predicted {pred['frames_per_s']:,.0f}), average "
              f"policy lag {check['lag']:.1f} (predicted {pred['lag']:.1f}) over {check['reports']} steady reports"
              + ("" if check["reports"] >= 2 else " (too short a run for a steady figure: give more --minutes)"))
    path = cache_path(layout_key(cfg))
    save(path, cfg, m, chosen, pred, preset, preset_pred, args.tune_batch_size, check)
    print(f"saved {path}: train.py --env {cfg.env} --num_workers auto uses this layout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
