"""Every random stream of a run derives from `--seed` (HTS-RL section 4: randomness deferred to the data), one way:

    stream_seed(seed, KIND, *index) = 63 bits of np.random.SeedSequence(seed, spawn_key=(KIND, *index))

    kind            index (ARITY)                   seeded where                drives
    MODEL           policy                          learner, before the model   initial weights
    MINIBATCH       policy                          learner (torch.Generator)   minibatch order (state in checkpoints)
    POLICY_WORKER   policy, policy worker           each policy worker          action sampling in async mode (torch),
                                                                                --random_policy's actions (numpy)
    ACTION_NOISE    global agent                    the agent's rollout worker  action sampling in hts/ppo modes: one
                                                                                noise vector per observation
    ENV             global env, worker epoch,       rollout worker: an env's    the env's episodes; an env reset
                    env replacements                first reset, a replacement  without a seed (sf_envs.utils.
                                                                                derive_seed) takes (env, 0, 0)
    POLICY_MAPPING  rollout worker                  each rollout worker         which policy plays which agent
                                                                                (--policy_mapping random)
    POLICY_GROUPS   draw                            every rollout worker        the permutation of --policy_mapping
                                                                                groups' draw r, the same everywhere
    PBT             (none)                          the runner                  population-based training's mutations
                                                                                and choices of source

Indexes: global agent = global env x agents per env + agent; global env = rollout worker x envs per worker + env; the
worker epoch counts the replacements of that rollout worker, env replacements the envs that worker replaced. A
one-policy run is policy 0 of a population, so a population's policy 0 draws as the one-policy run does. An env draws
its internal streams (engine restarts, the ALE's seed, DMLab's maps) from its ENV seed. A data-parallel rank r > 0
runs with seed rank_seed(seed, r). The learner draws from no global generator but torch's (seeded by MODEL): Python's
`random` and numpy's global generator are neither seeded nor saved.

No two streams hash the same words. Every kind has a fixed number of index components (ARITY), each below 2**32, and
the seed (below 2**32, plus a rank in its second 32-bit word) is below 2**64. SeedSequence pads the seed's words with
zeros to its pool of 4 words when a spawn key follows, then appends the key's words, so it hashes exactly the words
(seed, rank, 0, 0, KIND, *index): one fixed length per kind, and another kind, index, seed or rank is other words.
Two 63-bit seeds then coincide only by a hash collision: about n**2 / 2**64 among n streams (tests/test_seeding.py
derives every stream of a large layout, of adjacent seeds and of two ranks, and finds them distinct). Why this form:
an entropy list such as [seed, KIND, *index] is padded with zeros ([s, 3, k] and [s, 3, k, 0] are one seed, so keys
of different lengths alias), and arithmetic on seeds aliases too (with seed * 10_000 + env, env 10_000 of seed s is
env 0 of seed s + 1).
"""
from __future__ import annotations

import os

import numpy as np

MODEL, MINIBATCH, POLICY_WORKER, ACTION_NOISE, ENV, POLICY_MAPPING, POLICY_GROUPS, PBT = 1, 2, 3, 4, 5, 6, 7, 8
ARITY = {MODEL: 1, MINIBATCH: 1, POLICY_WORKER: 2, ACTION_NOISE: 1, ENV: 3, POLICY_MAPPING: 1, POLICY_GROUPS: 1, PBT: 0}
WORD = 2**32


def run_seed(cfg) -> int:
    """The run's seed (train.py always resolves one; a cfg built by hand without one counts as seed 0)."""
    return cfg.seed or 0


def rank_seed(seed: int, rank: int) -> int:
    """The seed of data-parallel rank `rank` of a run seeded with `seed` (below 2**32): the rank is the seed's second
    32-bit word, so rank 0 is the one-rank run and no rank's streams are another rank's or another seed's."""
    if not (0 <= seed < WORD and 0 <= rank < WORD):
        raise ValueError(f"seed {seed} and rank {rank} must be in [0, {WORD - 1}]")
    return seed + rank * WORD


def stream_seed(seed: int, kind: int, *index: int) -> int:
    """The 63-bit seed of stream `kind` (one of the constants above, with ARITY[kind] index components, each in
    [0, 2**32)) of a run seeded with `seed` (in [0, 2**64): --seed, or rank_seed's)."""
    if kind not in ARITY or len(index) != ARITY[kind]:
        raise ValueError(f"stream {kind}: takes {ARITY.get(kind, 'no')} index components, got {index}")
    if not 0 <= seed < WORD * WORD or not all(0 <= i < WORD for i in index):
        raise ValueError(f"stream {kind}: seed {seed} must be in [0, 2**64), index {index} in [0, 2**32)")
    state = np.random.SeedSequence(int(seed), spawn_key=(kind, *map(int, index))).generate_state(1, np.uint64)
    return int(state[0]) >> 1


def action_noise_rng(seed: int, global_agent: int) -> np.random.Generator:
    """The generator of one agent's action noise: the same global agent index gives the same stream whatever the
    layout of workers and envs per worker."""
    return np.random.default_rng(stream_seed(seed, ACTION_NOISE, global_agent))


def deterministic_kernels(device) -> None:
    """hts/ppo on CUDA: deterministic kernels only. cuDNN without autotuning (it picks kernels per run), cuBLAS with a
    fixed workspace, and torch.use_deterministic_algorithms(True): an op whose CUDA kernel is nondeterministic (atomic
    adds, e.g. some index/scatter backward passes) runs its deterministic version, and one that has none raises a
    RuntimeError naming it (the run stops: silently different bits would break the mode's guarantee). Call before the
    process's first CUDA work. On CPU nothing is needed beyond fixed batch compositions (see sf.sampling.policy_worker)
    and a fixed number of threads: that is what the tests show bit for bit, and nothing is changed there."""
    import torch
    if torch.device(device).type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first cuBLAS handle is made
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)
