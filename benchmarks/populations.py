#!/usr/bin/env python
"""Populations: what several policies and networked multiplayer games cost, measured in one invocation.

1. Population overhead: the same rollout workers and envs with 1 policy and N policies (a learner and a policy worker
   each, agents mapped to policies at random: per env as in the paper, and per group of envs stepped together,
   --mappings): total env frames/s of the whole run, N vs 1; for the sampler alone with random actions (what routing
   costs), with the policy forward, and for full training.
   The paper's Table A.3 shows ~4% loss from 4 to 12 agents (4 GPUs); here everything shares 2 CPU cores.
2. Multiplayer cost (--multiplayer): doom_duel (2 learning agents per match over VizDoom's network mode on localhost,
   frameskip 2) against single-player doom_battle (frameskip 4), sampler only with random actions and full training:
   env frames/s per agent (each agent's steps x its frameskip: what the run's FPS counts) and per game (engine tics of
   a match, counted once). The paper reports networked games 2-3x slower.

Every configuration runs --rounds times, alternating, and each ratio is taken within its round (the machine is shared
and noisy): medians are reported.

    python benchmarks/populations.py --env doom_battle --policies 1 4 --duration 120 --rounds 2 --pop_modes random train
    python benchmarks/populations.py --policies 1 4 --duration 100 --rounds 2 --pop_modes train --mappings random groups
    python benchmarks/populations.py --multiplayer --duration 60 --rounds 2 --skip_population
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import header, table  # noqa: E402
from system_throughput import PAPER_DOOM, run_train_rss  # noqa: E402
from sf.sampling.policy_mapping import MODES as MAPPINGS  # noqa: E402


def run(flags: list[str], tmp: str, duration: int, what: str) -> dict:
    res = run_train_rss([*flags, "--train_for_seconds", str(duration)], tmp, timeout=duration + 180)
    print(f"... {what}: {res['fps_median']:.0f} frames/s (10-s windows {res['fps_samples']}), exit {res['returncode']}",
          file=sys.stderr, flush=True)
    if res["returncode"] != 0:
        print(res["log"][-3000:], file=sys.stderr)
    return res


POP_MODES = {"random": ("sampler only, random actions", ["--sampler_only", "True", "--random_policy", "True"]),
             "policy": ("sampler only, policy forward", ["--sampler_only", "True"]),
             "train": ("full training", [])}


def population_overhead(args, tmp: str) -> None:
    """Every population size above the first once per --mappings (the baseline's mapping does not matter)."""
    base = ["--env", args.env, "--num_workers", str(args.num_workers), *PAPER_DOOM, *args.extra]
    ref = args.policies[0]
    confs = [(n, m) for n in args.policies for m in ([args.mappings[0]] if n == ref else args.mappings)]
    fps: dict[tuple, list[float]] = {}
    for rnd in range(args.rounds):
        for mode in args.pop_modes:
            for n, mapping in confs:
                res = run([*base, *POP_MODES[mode][1], "--num_policies", str(n), "--policy_mapping", mapping,
                           "--experiment", f"pop{n}_{mapping}"], tmp, args.duration,
                          f"round {rnd + 1}, {POP_MODES[mode][0]}, {n} {'policy' if n == 1 else 'policies'}, "
                          f"mapping {mapping}")
                fps.setdefault((mode, n, mapping), []).append(res["fps_median"])
    rows = []
    for mode in args.pop_modes:
        for n, mapping in confs:
            ratios = [f / r for f, r in zip(fps[(mode, n, mapping)], fps[(mode, ref, args.mappings[0])])]
            rows.append([POP_MODES[mode][0], n, mapping if n != ref else "-",
                         f"{statistics.median(fps[(mode, n, mapping)]):.0f}", f"{statistics.median(ratios):.2f}",
                         " ".join(f"{x:.2f}" for x in ratios)])
    print(f"\n## Population overhead: {args.env}, {args.num_workers} rollout workers x the preset's envs, the paper's "
          f"model and batch (configs/doom.json), one learner and one policy worker per policy\n")
    print(table(rows, ["mode", "policies", "--policy_mapping", "env frames/s, all policies (median)",
                       f"ratio to {ref} (median)", "ratio per round"]))


def multiplayer_cost(args, tmp: str) -> None:
    from sf_envs.registry import env_spec
    modes = {"sampler, random actions": ["--sampler_only", "True", "--random_policy", "True"], "full training": []}
    envs = ("doom_battle", "doom_duel")
    fps: dict[tuple, list[float]] = {}
    for rnd in range(args.rounds):
        for mode, flags in modes.items():
            for env in envs:
                res = run(["--env", env, "--num_workers", str(args.num_workers), "--num_envs_per_worker",
                           str(args.mp_envs_per_worker), *flags, "--experiment", f"mp_{env}", *args.extra], tmp,
                          args.duration, f"round {rnd + 1}, {env}, {mode}")
                fps.setdefault((mode, env), []).append(res["fps_median"])
    rows = []
    for mode in modes:
        for env in envs:
            agents = env_spec(env).num_agents
            per_agent = fps[(mode, env)]
            ratios = [d / b for d, b in zip(per_agent, fps[(mode, "doom_battle")])]
            rows.append([mode, env, agents, env_spec(env).frameskip, f"{statistics.median(per_agent):.0f}",
                         f"{statistics.median(per_agent) / agents:.0f}", f"{statistics.median(ratios):.2f}",
                         " ".join(f"{x:.2f}" for x in ratios)])
    print(f"\n## Multiplayer cost: {args.num_workers} rollout workers x {args.mp_envs_per_worker} envs "
          f"(a duel env is a match of 2 engines)\n")
    print(table(rows, ["mode", "env", "agents/env", "frameskip", "env frames/s, every agent counted (median)",
                       "per game (/ agents)", "ratio to doom_battle (median)", "ratio per round"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="doom_battle")
    ap.add_argument("--policies", type=int, nargs="+", default=[1, 4],
                    help="population sizes; the first is the baseline")
    ap.add_argument("--num_workers", type=int, default=2)
    ap.add_argument("--duration", type=int, default=120, help="seconds per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mappings", nargs="+", default=["random", "groups"], choices=MAPPINGS,
                    help="--policy_mapping of the populations (random: the paper's draw per env; groups: per group)")
    ap.add_argument("--pop_modes", nargs="+", default=["random", "policy", "train"], choices=list(POP_MODES))
    ap.add_argument("--multiplayer", action="store_true", help="also measure doom_duel against doom_battle")
    ap.add_argument("--mp_envs_per_worker", type=int, default=4, help="envs per rollout worker of the multiplayer runs")
    ap.add_argument("--skip_population", action="store_true", help="only the multiplayer measurement")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more train.py flags for every run")
    args = ap.parse_args()
    header("Populations: overhead of several policies, cost of multiplayer games")
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_population:
            population_overhead(args, tmp)
        if args.multiplayer:
            multiplayer_cost(args, tmp)


if __name__ == "__main__":
    main()
