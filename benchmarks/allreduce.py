#!/usr/bin/env python
"""Cost of data-parallel learners (torchrun): the gradient all-reduce of one SGD step against the step itself.

For the model of --env (default doom_battle: configs/doom.json, convnet_simple on [3, 72, 128] frames plus the
measurements MLP, GRU 512, 5 action heads):

- all-reduce: 2 ranks (spawned processes) on gloo over 127.0.0.1 run sf.learning.collectives.GradientAllReduce on the
  model's gradients (one flat buffer: copy in, all_reduce SUM, divide, copy back), --steps times after --warmup;
  the ranks meet at a barrier before each call so that the time is the all-reduce's, not one rank waiting for
  the other; per call the slower rank's time counts. The bare dist.all_reduce of the buffer is timed too.
- SGD step: one process, APPO.train on one batch of the preset's batch_size (num_epochs 1, num_batches_per_epoch
  1: one SGD step), --threads torch threads, median of --sgd_iters after --sgd_warmup.

Then an extrapolation for k ranks on a network: a ring all-reduce sends and receives 2 (k - 1) / k of the buffer per
rank, so t ~ 2 (k - 1) / k * bytes / bandwidth (latency terms, 2 (k - 1) hops of a few microseconds, neglected).

    python benchmarks/allreduce.py                       # ~1 minute on the 2-core dev VM
    python benchmarks/allreduce.py --steps 100 --threads 1 --sgd_iters 5

Both ranks share this machine's cores and loopback: the measured all-reduce is a memory-copy benchmark more than a
network one; the extrapolation lines are the ones to read for several machines.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from common import header, table  # noqa: E402
from sf.cfg import parse_cfg  # noqa: E402
from sf.learning.appo import APPO  # noqa: E402
from sf.model.actor_critic import create_actor_critic  # noqa: E402

BANDWIDTHS = {"10 GbE": 1.25e9, "100 Gb IB": 12.5e9, "NVLink 4": 450e9}  # bytes/s per direction, nominal


def spaces_for(cfg):
    """The env's observation and action spaces, as the runner gets them (one env made and closed)."""
    from sf_envs.registry import make_env
    env = make_env(cfg, env_index=0)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def make_batch(model, obs_space, n: int, t: int, seed: int = 0) -> dict:
    """A training batch in the storage layout (docs/architecture.md) of n trajectories of t steps: random
    observations, actions sampled from random logits, every sample at policy version 0, a few episode ends."""
    g = torch.Generator().manual_seed(seed)
    h = model.rnn_state_size

    def obs(lead):
        out = {}
        for k, s in obs_space.spaces.items():
            shape = (*lead, *s.shape)
            out[k] = (torch.randint(0, 256, shape, dtype=torch.uint8, generator=g) if s.dtype == np.uint8
                      else torch.randn(shape, generator=g))
        return out

    o = obs((n, t + 1))
    with torch.no_grad():
        num_logits = model.forward_step({k: v[:1, 0] for k, v in o.items()}, torch.zeros(1, h)).action_logits.shape[-1]
    logits = torch.randn((n, t, num_logits), generator=g)
    dist = model.action_distribution(logits)
    actions = dist.sample()
    return {
        "obs": o, "rnn_states": torch.randn((n, t + 1, h), generator=g) * 0.1, "actions": actions,
        "action_logits": logits, "log_probs": dist.log_prob(actions), "values": torch.randn((n, t), generator=g),
        "policy_versions": torch.zeros((n, t), dtype=torch.int64), "rewards": torch.randn((n, t), generator=g),
        "dones": (torch.rand((n, t), generator=g) < 0.02).float(), "truncated": torch.zeros((n, t)),
        "final_obs": obs((n,)), "final_rnn": torch.zeros((n, h)), "final_t": torch.full((n,), -1, dtype=torch.int64),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _allreduce_rank(rank: int, port: int, cfg, obs_space, action_space, warmup: int, steps: int, results) -> None:
    import torch.distributed as dist

    from sf.learning.collectives import GradientAllReduce, init_learner_group
    from sf.processes.ranks import World
    torch.set_num_threads(1)
    init_learner_group(World(rank=rank, world_size=2, local_rank=rank, local_world_size=2, master_addr="127.0.0.1",
                             master_port=port), "cpu", timeout_sec=120)
    model = create_actor_critic(cfg, obs_space, action_space)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    hook = GradientAllReduce(params)
    hook_times, bare_times = [], []
    for i in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        hook()
        if i >= warmup:
            hook_times.append(time.perf_counter() - start)
    for i in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(hook.buffer)
        if i >= warmup:
            bare_times.append(time.perf_counter() - start)
    results.put((rank, hook_times, bare_times, hook.nbytes))
    dist.destroy_process_group()


def measure_allreduce(cfg, obs_space, action_space, warmup: int, steps: int, timeout: float = 300.0):
    """Per call (the slower rank's): hook seconds, bare all_reduce seconds; and the bytes all-reduced."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_allreduce_rank, args=(r, port, cfg, obs_space, action_space, warmup, steps, results))
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict((r, rest) for r, *rest in (results.get(timeout=timeout) for _ in procs))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    hook = [max(a, b) for a, b in zip(got[0][0], got[1][0])]
    bare = [max(a, b) for a, b in zip(got[0][1], got[1][1])]
    return hook, bare, got[0][2]


def measure_sgd_step(cfg, obs_space, action_space, threads: int, warmup: int, iters: int) -> float:
    """Median seconds of one APPO.train call doing one SGD step on a batch of cfg.batch_size samples."""
    torch.set_num_threads(threads)
    model = create_actor_critic(cfg, obs_space, action_space)
    appo = APPO(model, cfg, "cpu")
    batch = make_batch(model, obs_space, cfg.batch_size // cfg.rollout, cfg.rollout)
    times = []
    for i in range(warmup + iters):
        start = time.perf_counter()
        stats = appo.train(batch, policy_version=i)
        if i >= warmup:
            times.append(time.perf_counter() - start)
        assert len(stats) == 1, "one SGD step per batch expected (num_epochs 1, num_batches_per_epoch 1)"
    return statistics.median(times)


def quantile(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="doom_battle")
    ap.add_argument("--steps", type=int, default=50, help="timed all-reduces")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads of the SGD step "
                    "(the learner's default, learner_torch_threads 0, is the number of cores)")
    ap.add_argument("--sgd_iters", type=int, default=3)
    ap.add_argument("--sgd_warmup", type=int, default=1)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16], help="k of the extrapolation")
    args = ap.parse_args()

    header(f"gradient all-reduce (gloo, 2 ranks) vs the SGD step, {args.env}")
    cfg = parse_cfg(["--env", args.env, "--train_dir", "/tmp/allreduce_bench"])
    obs_space, action_space = spaces_for(cfg)
    model = create_actor_critic(cfg, obs_space, action_space)
    num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    shapes = {k: tuple(s.shape) for k, s in obs_space.spaces.items()}
    print(f"torch {torch.__version__}; model: {cfg.encoder_conv_architecture} on {shapes}, "
          f"{cfg.rnn_type.upper()} {cfg.rnn_size}, actions {action_space}; batch {cfg.batch_size} = "
          f"{cfg.batch_size // cfg.rollout} x T {cfg.rollout}\n", flush=True)

    hook, bare, nbytes = measure_allreduce(cfg, obs_space, action_space, args.warmup, args.steps)
    sgd = measure_sgd_step(cfg, obs_space, action_space, args.threads, args.sgd_warmup, args.sgd_iters)
    med, p90 = statistics.median(hook), quantile(hook, 0.9)
    loop_bw = 2 * (2 - 1) / 2 * nbytes / statistics.median(bare)
    print(table([
        ["model parameters", f"{num_params:,} ({num_params * 4 / 2**20:.1f} MiB float32)"],
        ["all-reduced per step", f"{nbytes / 2**20:.2f} MiB (gradients + {nbytes // 4 - num_params} flags)"],
        [f"all-reduce, hook (ms, {args.steps} steps)", f"median {1e3 * med:.2f}, p90 {1e3 * p90:.2f}"],
        ["  of which dist.all_reduce (ms)",
         f"median {1e3 * statistics.median(bare):.2f}, p90 {1e3 * quantile(bare, 0.9):.2f} "
         f"(loopback ring bandwidth {loop_bw / 1e9:.2f} GB/s)"],
        [f"SGD step, 1 rank, {args.threads} threads (ms)", f"median {1e3 * sgd:.0f} ({args.sgd_iters} steps)"],
        ["all-reduce share of a step", f"{100 * med / (sgd + med):.2f} %"],
    ], ["quantity", "value"]))

    print("\nextrapolation, ring all-reduce: t ~ 2 (k-1)/k * bytes / bandwidth (latency neglected); share of a "
          "step = t / (SGD step + t), with this machine's SGD step")
    rows = []
    for k in args.ranks:
        row = [k]
        for bw in BANDWIDTHS.values():
            t = 2 * (k - 1) / k * nbytes / bw
            row.append(f"{1e3 * t:.2f} ms ({100 * t / (sgd + t):.2f} %)")
        rows.append(row)
    print(table(rows, ["ranks k"] + list(BANDWIDTHS)))
    print("(bandwidths nominal, per direction; a GPU learner's step is ~10-100x shorter than this CPU one, so its "
          "share is that much larger)")


if __name__ == "__main__":
    main()
