"""Every random stream of a run derives from --seed one way (sf/seeding.py): no two streams of a large layout share a
seed, nor do two adjacent seeds or two data-parallel ranks; the aliases of the earlier formulas are gone; and two
identical hts runs save identical RNG states in their checkpoints."""
import numpy as np
import pytest
import torch

from sf.seeding import (ACTION_NOISE, ARITY, ENV, MINIBATCH, MODEL, PBT, POLICY_GROUPS, POLICY_MAPPING, POLICY_WORKER,
                        rank_seed, stream_seed)
from sf_envs.utils import ENV_STREAM, derive_seed

# A large layout: policies x policy workers per policy, rollout workers x envs per worker x agents per env, the worker
# epochs and env replacements of a long run with failures, and draws of --policy_mapping groups
POLICIES, POLICY_WORKERS, ROLLOUT_WORKERS, ENVS, AGENTS = 4, 4, 64, 16, 2
EPOCHS, REPLACEMENTS, DRAWS = 2, 3, 50
MAX_ENVS = 65_536  # --num_workers x --num_envs_per_worker allowed


def layout_keys() -> list[tuple]:
    """(KIND, *index) of every stream of a run of the layout above, the indexes as the call sites compute them."""
    envs = ROLLOUT_WORKERS * ENVS  # global env = worker * ENVS + env
    keys = [(MODEL, p) for p in range(POLICIES)] + [(MINIBATCH, p) for p in range(POLICIES)]
    keys += [(POLICY_WORKER, p, w) for p in range(POLICIES) for w in range(POLICY_WORKERS)]
    keys += [(ACTION_NOISE, a) for a in range(envs * AGENTS)]  # global agent = global env * AGENTS + agent
    keys += [(ENV, g, epoch, r) for g in range(envs) for epoch in range(EPOCHS) for r in range(REPLACEMENTS)]
    keys += [(POLICY_MAPPING, w) for w in range(ROLLOUT_WORKERS)] + [(POLICY_GROUPS, r) for r in range(DRAWS)]
    keys += [(PBT,)]
    assert {k[0] for k in keys} == set(ARITY)  # every kind there is (a new kind must be listed here)
    return keys


@pytest.mark.parametrize("seed", [0, 12_345, 2**32 - 2])
def test_every_stream_of_a_large_layout_seeds_s_and_s1_and_two_ranks_is_distinct(seed):
    keys = layout_keys()
    runs = {"seed": seed, "seed + 1": seed + 1, "rank 1": rank_seed(seed, 1), "rank 2": rank_seed(seed, 2)}
    seen: dict[int, tuple] = {}
    for run, s in runs.items():
        for key in keys:
            value = stream_seed(s, *key)
            assert 0 <= value < 2**63
            assert value not in seen, f"{run} {key} has the seed of {seen[value]}"
            seen[value] = (run, key)
    assert len(seen) == len(runs) * len(keys)


def test_the_words_hashed_are_seed_rank_zeros_kind_index():
    """What makes different streams provably different inputs: SeedSequence hashes the seed's words padded to 4, then
    the spawn key's words, so stream (seed, rank, KIND, index) hashes (seed, rank, 0, 0, KIND, *index), a fixed length
    per kind. Checked here against the installed numpy (another assembly would fail it)."""
    for rank in (0, 1, 7):
        for kind, arity in ARITY.items():
            index = tuple(range(5, 5 + arity))
            words = np.random.SeedSequence([3, rank, 0, 0, kind, *index]).generate_state(1, np.uint64)
            assert stream_seed(rank_seed(3, rank), kind, *index) == int(words[0]) >> 1, (rank, kind)


def test_the_aliases_of_the_earlier_formulas_are_gone():
    s = 7
    # numpy pads entropy with zeros: the earlier [seed, POLICY_WORKER, k] (policy 0's worker k) and
    # [seed, POLICY_WORKER, k, 0] (policy k's worker 0) were one seed
    for k in (1, 2, 3):
        a = np.random.SeedSequence([s, POLICY_WORKER, k]).generate_state(2)
        assert np.array_equal(a, np.random.SeedSequence([s, POLICY_WORKER, k, 0]).generate_state(2))
        assert stream_seed(s, POLICY_WORKER, 0, k) != stream_seed(s, POLICY_WORKER, k, 0)
    # seed * 10_000 + env: env 10_000 of seed s reset like env 0 of seed s + 1; now no env of seed s (of the 65,536
    # allowed) shares a seed with one of seed s + 1
    first = {stream_seed(s, ENV, g, 0, 0) for g in range(MAX_ENVS)}
    second = {stream_seed(s + 1, ENV, g, 0, 0) for g in range(MAX_ENVS)}
    assert len(first) == len(second) == MAX_ENVS and not first & second
    # seed + 1_000_003 * rank: rank 1 of seed 5 was the one-rank run of seed 1_000_008
    for kind in ARITY:
        index = (0,) * ARITY[kind]
        assert stream_seed(rank_seed(5, 1), kind, *index) != stream_seed(1_000_008, kind, *index)


def test_env_first_seed_is_the_worker_first_reset_seed():
    """An env made outside training (make_env(cfg, env_index=g), reset() without a seed) starts as env g of the run;
    unseeded stays unseeded."""
    for seed in (0, 5, 2**32 - 1, rank_seed(7, 3)):  # (a data-parallel rank's seed too)
        for g in (0, 1, 1023, 65535):
            assert derive_seed(seed, g) == stream_seed(seed, ENV, g, 0, 0)
    assert ENV_STREAM == ENV  # sf_envs spells the derivation out (it imports nothing of sf)
    assert derive_seed(None, 3) is None


@pytest.mark.parametrize("call", [
    lambda: stream_seed(1, POLICY_WORKER, 3),  # a key of another length than its kind's
    lambda: stream_seed(1, POLICY_WORKER, 3, 0, 0),
    lambda: stream_seed(1, PBT, 0),
    lambda: stream_seed(1, 99, 0),  # no such kind
    lambda: stream_seed(1, MODEL, 2**32),  # an index of two words
    lambda: stream_seed(1, MODEL, -1),
    lambda: stream_seed(2**64, MODEL, 0),
    lambda: stream_seed(-1, MODEL, 0),
    lambda: rank_seed(2**32, 0),
])
def test_keys_that_could_alias_are_refused(call):
    with pytest.raises(ValueError):
        call()


def test_data_parallel_rank_is_part_of_the_seed(tmp_path, monkeypatch):
    from sf.cfg import parse_cfg
    from sf.runner.startup.preflight import data_parallel_world
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("LOCAL_RANK", "0")  # one rank per machine: the test process keeps its cores
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        cfg = parse_cfg(["--env", "test_corridor", "--experiment", "dp", "--train_dir", str(tmp_path), "--seed", "5"])
        rank_cfg, world = data_parallel_world(cfg)
        assert world.rank == rank
        assert rank_cfg.seed == rank_seed(5, rank) == 5 + rank * 2**32 and cfg.seed == 5  # (a new cfg: frozen)


SMALL = ["--rollout", "8", "--recurrence", "8", "--batch_size", "64", "--rnn_size", "32", "--hidden_size", "32",
         "--encoder_mlp_layers", "32", "--num_workers", "2", "--num_envs_per_worker", "4", "--device", "cpu"]


@pytest.mark.e2e
def test_two_identical_hts_runs_save_identical_rng_states(entry, tmp_path):
    """The learner's global generators in checkpoints: torch's is seeded (MODEL stream), and numpy's and Python's,
    which nothing in the learner draws from and nothing seeded, are not saved."""
    states = []
    for name in ("a", "b"):
        res = entry("train.py", "--env", "test_corridor", "--experiment", name, "--train_dir", str(tmp_path),
                    "--sync_mode", "hts", "--seed", "3", "--train_for_env_steps", "256", *SMALL, timeout=240)
        assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
        newest = max((tmp_path / name / "checkpoint_p0").glob("checkpoint_*.pth"))
        states.append(torch.load(newest, weights_only=True)["rng"])
    a, b = states
    assert set(a) == set(b)
    for key in a:
        assert same(a[key], b[key]), f"rng {key!r} differs between two identical runs"
    assert set(a) == {"torch"}


def same(x, y) -> bool:
    if torch.is_tensor(x):
        return torch.is_tensor(y) and torch.equal(x, y)
    if isinstance(x, (list, tuple)):
        return isinstance(y, (list, tuple)) and len(x) == len(y) and all(map(same, x, y))
    return x == y
