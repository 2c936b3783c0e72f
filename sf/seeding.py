"""Every random stream of a run derives from `--seed` (HTS-RL section 4: randomness deferred to the data).

    stream          seeded where                    drives
    MODEL           learner, before the model       initial weights
    MINIBATCH       learner (torch.Generator)       minibatch order (state saved in checkpoints)
    POLICY_WORKER   each policy worker (index)      action sampling in async mode
    ACTION_NOISE    each env (global env index)     action sampling in hts/ppo modes: one noise vector per
                                                    observation, drawn by the env's rollout worker
    POLICY_MAPPING  each rollout worker (index)     which policy plays which agent (--policy_mapping random)
                    the run (no index)              the permutations of --policy_mapping groups, shared by all
    PBT             the runner                      population-based training's mutations and choices of source
    Envs keep their own seeds (sf_envs.utils.derive_seed of the seed and the global env index).

Seeds are mixed with numpy's SeedSequence, so nearby streams and nearby seeds are unrelated.
"""
from __future__ import annotations

import os

import numpy as np

MODEL, MINIBATCH, POLICY_WORKER, ACTION_NOISE, POLICY_MAPPING, PBT = 1, 2, 3, 4, 5, 6


def run_seed(cfg) -> int:
    """The run's seed (train.py always resolves one; a cfg built by hand without one counts as seed 0)."""
    return getattr(cfg, "seed", None) or 0


def stream_seed(seed: int, stream: int, *index: int) -> int:
    """A 63-bit seed for `stream` (one of the constants above) and its index (worker or env), from the run's seed."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, stream, *(int(i) for i in index)]).generate_state(2)
    return int((int(state[0]) << 32 | int(state[1])) & 0x7FFF_FFFF_FFFF_FFFF)


def policy_stream(policy_id: int, *index: int) -> tuple:
    """The stream index of policy `policy_id`'s copy of a stream: policy 0 keeps the one-policy run's (so a one-policy
    run draws exactly as before populations existed), the others get their own."""
    return (policy_id, *index) if policy_id else index


def action_noise_rng(seed: int, global_env_index: int) -> np.random.Generator:
    """The generator of one env's action noise: the same env index gives the same stream whatever the layout of
    workers and envs per worker."""
    return np.random.default_rng(stream_seed(seed, ACTION_NOISE, global_env_index))


def deterministic_kernels(device) -> None:
    """hts/ppo on CUDA: deterministic cuDNN/cuBLAS kernels (autotuning picks kernels per run; cuBLAS needs a fixed
    workspace). Call before the process's first CUDA work. On CPU nothing is needed beyond fixed batch compositions
    (see sf.sampling.policy_worker) and a fixed number of threads: that is what the tests show bit for bit."""
    import torch
    if torch.device(device).type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
