"""Pure-simulation throughput of the multi-agent Doom envs against single-player Doom: random actions, no model, no
training system, all in this one process (a multi-agent env steps its agents' engines from threads of its own).

    python benchmarks/doom_multiplayer.py --duration 20 --rounds 3
    python benchmarks/doom_multiplayer.py --envs doom_duel,doom_battle,doom_duel_bots,doom_deathmatch_full

Each round measures every env in turn for --duration seconds (after --warmup seconds), so a busy machine slows them
alike; the table gives the median over rounds of env frames/s per agent (agent steps x frameskip / s, the unit the
training system reports) and for all agents of the env together, and the ratio of each env's per-agent rate to the
first env's.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from common import header, table  # noqa: E402  (benchmarks/ is sys.path[0] when run as a script)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def measure(env, actions, seconds: float) -> tuple[int, float, int]:
    """(agent steps per agent, elapsed s, episodes) of random play for `seconds`."""
    multi = getattr(env, "is_multiagent", False)
    steps = episodes = k = 0
    t0 = time.perf_counter()
    t_end = t0 + seconds
    while time.perf_counter() < t_end:
        if multi:
            _, _, term, trunc, _ = env.step([actions[(k + i) % len(actions)] for i in range(env.num_agents)])
            done = term[0] or trunc[0]  # a match ends for every agent at once (and restarts inside step)
        else:
            _, _, term, trunc, _ = env.step(actions[k % len(actions)])
            done = term or trunc
            if done:
                env.reset()
        k += 1
        steps += 1
        episodes += int(done)
    return steps, time.perf_counter() - t0, episodes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", default="doom_duel,doom_battle", help="comma-separated env names (ratios: to the first)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per measurement")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from sf_envs.params import env_cfg
    from sf_envs.registry import make_env

    header("VizDoom multi-agent vs single-player env throughput (random actions, one process)")
    names = [n.strip() for n in args.envs.split(",") if n.strip()]
    envs, actions, rates = {}, {}, {n: [] for n in names}
    try:
        for n in names:
            envs[n] = make_env(env_cfg(n, seed=args.seed))
            space = envs[n].action_space
            space.seed(args.seed)
            actions[n] = [space.sample() for _ in range(4096)]
            envs[n].reset()
            measure(envs[n], actions[n], args.warmup)
        for r in range(args.rounds):
            for n in names:
                steps, elapsed, episodes = measure(envs[n], actions[n], args.duration)
                rates[n].append(steps * envs[n].frameskip / elapsed)
                print(f"round {r + 1}/{args.rounds} {n}: {rates[n][-1]:.0f} env frames/s per agent ({episodes} "
                      f"episode ends)", flush=True)
    finally:
        for env in envs.values():
            env.close()

    base = statistics.median(rates[names[0]])
    rows = []
    for n in names:
        env, med = envs[n], statistics.median(rates[n])
        agents = getattr(env, "num_agents", 1)
        rows.append([n, agents, env.frameskip, f"{med:.0f}", f"{med * agents:.0f}", f"{med / base:.2f}",
                     " ".join(f"{x:.0f}" for x in rates[n])])
    print()
    print(table(rows, ["env", "agents", "frameskip", "frames/s per agent (median)", "frames/s all agents",
                       f"per-agent ratio to {names[0]}", "rounds"]))
    if len(names) > 1:
        ratio = base / statistics.median(rates[names[1]])
        print(f"\n{names[0]} / {names[1]}, env frames/s per agent: {ratio:.3f}")
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
