#!/usr/bin/env python
"""Policy-worker inference cost on CPU: ms per batch / per sample of `forward_step` for the Doom model.

    python benchmarks/policy_forward.py --env doom_battle --batches 8 16 32 --threads 1
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from sf.cfg import parse_cfg  # noqa: E402
from sf.model.actor_critic import create_actor_critic  # noqa: E402
from sf_envs.registry import make_env  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", default="doom_battle")
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--no_channels_last", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = parse_cfg(["--env", args.env, "--train_dir", "/tmp/pf"])
    env = make_env(cfg, env_index=0)
    model = create_actor_critic(cfg, env.observation_space, env.action_space,
                                channels_last=not args.no_channels_last).eval()
    for b in args.batches:
        obs = {k: torch.from_numpy(s.sample()).unsqueeze(0).repeat(b, *([1] * len(s.shape)))
               for k, s in env.observation_space.spaces.items()}
        rnn = torch.zeros(b, model.rnn_state_size)
        times = []
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            for i in range(args.iters + 5):
                t0 = time.perf_counter()
                model.forward_step(obs, rnn)
                if i >= 5:
                    times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        print(f"{args.env} batch {b:3d} threads {args.threads} bf16 {args.bf16}: {1000 * med:.2f} ms/batch, "
              f"{1000 * med / b:.3f} ms/sample, {b / med:.0f} samples/s")


if __name__ == "__main__":
    main()
