"""Pure-simulation throughput of a registered env: random actions, no model, no training system.

    python benchmarks/env_throughput.py --env doom_basic --num_workers 2 --duration 20

Runs 1 process, then --num_workers processes (each stepping --num_envs_per_worker envs in turn, pinned to a
core when there are enough), and prints env frames/s and samples/s (frames = samples x frameskip, the
unit the training system reports). This is the ceiling the training system is compared against.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import sys
import time
from pathlib import Path

from common import machine  # noqa: E402  (benchmarks/ is sys.path[0] when run as a script)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _random_actions(space, rng, n):
    import gymnasium as gym
    import numpy as np
    if isinstance(space, gym.spaces.Discrete):
        return list(rng.integers(space.n, size=n))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return list(rng.integers(space.nvec, size=(n, len(space.nvec))))
    return list(rng.uniform(space.low, space.high, size=(n, *space.shape)).astype(np.float32))


def worker(idx: int, args, start_evt, result_q, pin: bool) -> None:
    envs = []
    try:
        if pin and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {idx % os.cpu_count()})
        import numpy as np
        from sf_envs.params import env_cfg
        from sf_envs.registry import env_spec, make_env
        cfg = env_cfg(args.env, seed=args.seed)
        spec = env_spec(args.env, cfg)
        for e in range(args.num_envs_per_worker):
            envs.append(make_env(cfg, env_index=idx * args.num_envs_per_worker + e))
        for env in envs:
            env.reset()
        rng = np.random.default_rng(idx)
        actions = _random_actions(envs[0].action_space, rng, 4096)
        k = 0

        def run(seconds):
            nonlocal k
            samples = episodes = 0
            t_end = time.perf_counter() + seconds
            while time.perf_counter() < t_end:
                for env in envs:
                    _, _, terminated, truncated, _ = env.step(actions[k % 4096])
                    k += 1
                    samples += 1
                    if terminated or truncated:
                        episodes += 1
                        env.reset()
            return samples, episodes

        run(args.warmup)
        result_q.put(("ready", idx))
        start_evt.wait()
        t0 = time.perf_counter()
        samples, episodes = run(args.duration)
        elapsed = time.perf_counter() - t0
        result_q.put(("done", idx, samples, samples * spec.frameskip, episodes, elapsed))
    except Exception as e:  # report instead of hanging the parent
        result_q.put(("error", idx, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
    finally:
        for env in envs:  # an env's engine process (VizDoom) must not outlive this worker
            env.close()


def measure(args, num_workers: int) -> dict:
    """Start `num_workers` processes, let each make and warm up its envs, measure one common window. Raises
    RuntimeError naming the worker when one fails or does not report in time (an env stuck in its engine)."""
    from sf.processes.control import kill_tree
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    start_evt, result_q = ctx.Event(), ctx.Queue()
    pin = args.affinity and num_workers <= (os.cpu_count() or 1)
    procs = [ctx.Process(target=worker, args=(i, args, start_evt, result_q, pin), daemon=True)
             for i in range(num_workers)]
    for p in procs:
        p.start()

    def receive(what: str, timeout: float, pending: set) -> tuple:
        try:
            msg = result_q.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"worker(s) {sorted(pending)} did not {what} within {timeout:.0f} s "
                               f"(an env stuck in its engine?)") from None
        if msg[0] == "error":
            raise RuntimeError(f"worker {msg[1]}: {msg[2]}")
        pending.discard(msg[1])
        return msg

    results = []
    try:
        pending = set(range(num_workers))
        while pending:
            receive("make and warm up their envs", args.warmup + 120 + 5 * args.num_envs_per_worker, pending)
        start_evt.set()  # every worker measures the same window
        pending = set(range(num_workers))
        while pending:
            results.append(receive("finish the measurement", args.duration + 120, pending))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():  # stuck: it and its env engines (with their shared memory) are killed
                kill_tree(p)
    samples = sum(r[2] for r in results)
    frames = sum(r[3] for r in results)
    elapsed = max(r[5] for r in results)
    return {"workers": num_workers, "samples_per_s": samples / elapsed, "frames_per_s": frames / elapsed,
            "episodes": sum(r[4] for r in results), "seconds": elapsed}


def table(rows, headers) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    fmt = " | ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*headers), "-|-".join("-" * w for w in widths)]
                     + [fmt.format(*map(str, r)) for r in rows])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True, help="any registered env, e.g. doom_basic, doom_battle, atari_breakout")
    parser.add_argument("--num_workers", type=int, default=os.cpu_count() or 1, help="processes of the N-process run")
    parser.add_argument("--num_envs_per_worker", type=int, default=1, help="envs stepped in turn by each process")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no_single", action="store_true", help="skip the 1-process run")
    parser.add_argument("--affinity", type=lambda s: s.lower() in ("1", "true", "yes"), default=True,
                        help="pin each process to a core when there are enough cores (default True)")
    args = parser.parse_args(argv)

    from sf_envs.params import env_cfg
    from sf_envs.registry import check_env_available
    try:
        spec = check_env_available(env_cfg(args.env, seed=args.seed))
    except ValueError as e:
        print(f"env_throughput: {e}", file=sys.stderr)
        return 2
    print(f"# Env throughput (random actions, simulation only): {spec.name}")
    print(f"machine: {machine()}")
    print(f"command: {' '.join([Path(sys.executable).name] + sys.argv)}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M:%S')}, load average before: {os.getloadavg()[0]:.2f}")
    print(f"frameskip {spec.frameskip}, {args.num_envs_per_worker} env(s) per process, {args.duration:.0f} s per run\n")
    rows = []
    counts = ([] if args.no_single or args.num_workers == 1 else [1]) + [args.num_workers]
    for n in counts:
        try:
            r = measure(args, n)
        except RuntimeError as e:
            print(f"env_throughput: {e}", file=sys.stderr)
            return 1
        rows.append([spec.name, r["workers"], args.num_envs_per_worker, f"{r['samples_per_s']:,.0f}",
                     f"{r['frames_per_s']:,.0f}", r["episodes"]])
    print(table(rows, ["env", "processes", "envs/process", "samples/s", "env frames/s", "episodes"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
