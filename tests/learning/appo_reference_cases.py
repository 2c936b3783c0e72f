"""APPO.train cases whose stats and weights are pinned (tests/learning/test_appo_device_stats.py): each case is a small
batch on CPU covering one branch of the SGD step (minibatches over epochs, populations' own-step masks, lag masking,
fully stale minibatches, truncation bootstrap, non-finite gradients, returns normalization, symmetric KL, KL penalty
and KL-adaptive rates, LAMB). `python tests/learning/appo_reference_cases.py` writes their reference values
(REFERENCE_FILE: every case but feed_forward, which the device tests use).

The references are values within rounding, not digests of bits: the same float32 code gives other bits on another CPU
(matrix kernels chosen by the instruction set: the digests taken on an AMD EPYC all differed on an Intel Xeon)."""
from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

import torch
from gymnasium import spaces

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model_test_helpers import VECTOR_OBS, make_cfg, random_experience  # noqa: E402
from sf.buffers.trajectory_buffers import DONES_HOST  # noqa: E402
from sf.learning.appo import APPO, STAT_KEYS  # noqa: E402
from sf.learning.checkpoint import weights_sha256  # noqa: E402
from sf.model.actor_critic import create_actor_critic  # noqa: E402

SMALL = dict(rnn_size=16, hidden_size=16, encoder_mlp_layers=[32, 32])
N, T = 8, 8


def _batch(case: str, cfg, model) -> tuple[dict, int]:
    """(experience, policy version) of `case`."""
    exp = random_experience(model, VECTOR_OBS, model.action_space, N, T, done_prob=0.1, seed=3)
    version = 4
    if case == "lag":  # trajectories 0..3 too old (lag 9 > 5), the others fresh: both minibatches of 4 are mixed
        exp["policy_versions"][[0, 2, 4, 6]] = -5
    if case == "stale":  # the first epoch's minibatches: one fully stale one, one fresh (no shuffle)
        exp["policy_versions"][:4] = -5
    if case in ("own", "own_none"):  # a population: steps another policy acted, a trajectory with none of this
        # policy's; own_none: a whole minibatch with none (trajectories 4, 5)
        own = torch.ones((N, T), dtype=torch.bool)
        own[1, 3:] = False
        own[5, :] = False
        if case == "own_none":
            own[4, :] = False
        exp["own"] = own
        exp["policy_versions"][~own] = 1000  # another policy's versions: no lag of this policy
    if case in ("truncated", "gae_truncated", "feed_forward", "samples"):
        exp["dones"][[0, 3], 4] = 1.0
        exp["truncated"][[0, 3], 4] = 1.0
        exp["truncated"][6, 7], exp["dones"][6, 7] = 1.0, 1.0
        exp["final_t"][[0, 3, 6]] = torch.tensor([4, 4, 7])
    if case == "nonfinite":
        exp["rewards"][2, 1] = float("nan")
    return exp, version


CASES = {
    "default": dict(num_epochs=2, num_batches_per_epoch=2),
    "lag": dict(num_epochs=1, num_batches_per_epoch=2, max_policy_lag=5, shuffle_minibatches=False),
    "stale": dict(num_epochs=2, num_batches_per_epoch=2, max_policy_lag=5, shuffle_minibatches=False),
    "own": dict(num_epochs=1, num_batches_per_epoch=2),
    "own_none": dict(num_epochs=1, num_batches_per_epoch=4, shuffle_minibatches=False),
    "feed_forward": dict(num_epochs=2, num_batches_per_epoch=2, use_rnn=False, value_bootstrap=True),
    "truncated": dict(num_epochs=1, num_batches_per_epoch=1, value_bootstrap=True),
    "gae_truncated": dict(num_epochs=2, num_batches_per_epoch=1, value_bootstrap=True, with_vtrace=False),
    "nonfinite": dict(num_epochs=1, num_batches_per_epoch=2, shuffle_minibatches=False),
    "normalize_returns": dict(num_epochs=2, num_batches_per_epoch=2, normalize_returns=True),
    "symmetric_kl_kl_penalty": dict(num_epochs=1, num_batches_per_epoch=2, exploration_loss="symmetric_kl",
                                    kl_loss_coeff=0.1),
    "kl_adaptive": dict(num_epochs=2, num_batches_per_epoch=2, lr_schedule="kl_adaptive_minibatch",
                        learning_rate=1e-2, lr_schedule_kl_threshold=1e-4),
    "lamb": dict(num_epochs=1, num_batches_per_epoch=2, optimizer="lamb"),
    # minibatches of samples (sf.learning.sample_minibatches), the batch's GAE targets with truncations
    "samples": dict(num_epochs=2, num_batches_per_epoch=4, use_rnn=False, with_vtrace=False, value_bootstrap=True,
                    sample_minibatches=True),
}


def run_case(case: str, device: str = "cpu", configure=None) -> tuple[list[dict], torch.nn.Module, APPO]:
    """APPO.train on `case`, twice (the second batch goes on from the first's optimizer state). configure(appo): a hook
    before training (tests choose the path there)."""
    torch.manual_seed(0)
    cfg = make_cfg(**SMALL, rollout=T, recurrence=T, batch_size=N * T // CASES[case].get("num_batches_per_epoch", 1),
                   **CASES[case])
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
    exp, version = _batch(case, cfg, model)
    model.to(device)
    host_dones = exp["dones"].clone()
    exp = {k: ({kk: vv.to(device) for kk, vv in v.items()} if isinstance(v, dict) else v.to(device))
           for k, v in exp.items()}
    if torch.device(device).type == "cuda":  # as the learner's gather gives a CUDA batch (GatherStaging.to_device)
        exp[DONES_HOST] = host_dones
    appo = APPO(model, cfg, device)
    if configure is not None:
        configure(appo)
    stats = appo.train(exp, version)
    stats += appo.train(exp, int(stats[-1]["policy_version"]))
    return stats, model, appo


def digest(stats: list[dict], model) -> str:
    """SHA-256 over every stat's exact bits (STAT_KEYS, in order) and the weights' digest."""
    h = hashlib.sha256()
    for s in stats:
        assert set(s) == set(STAT_KEYS) and all(type(s[k]) is float for k in STAT_KEYS), s
        h.update(struct.pack(f"<{len(STAT_KEYS)}d", *(s[k] for k in STAT_KEYS)))
    h.update(weights_sha256(model.cpu()).encode())
    return h.hexdigest()


REFERENCE_FILE = Path(__file__).resolve().parent / "appo_reference_values.json"
PROJECTIONS = 3  # random projections of each weight tensor in its reference values


def reference_values(stats: list[dict], model) -> dict:
    """What a case is compared by: every stat (STAT_KEYS, in order) of every step, and per weight tensor its sum, its
    sum of squares and PROJECTIONS dot products with fixed random vectors (a change anywhere in it moves them)."""
    weights = {}
    for name, p in model.cpu().named_parameters():
        flat = p.detach().double().flatten()
        g = torch.Generator().manual_seed(len(flat))
        proj = torch.randn((PROJECTIONS, len(flat)), generator=g, dtype=torch.float64) @ flat
        weights[name] = [float(flat.sum()), float((flat * flat).sum()), *proj.tolist()]
    return {"stats": [[s[k] for k in STAT_KEYS] for s in stats], "weights": weights}


if __name__ == "__main__":
    torch.set_num_threads(1)
    refs = {name: reference_values(*run_case(name)[:2]) for name in CASES if name != "feed_forward"}
    REFERENCE_FILE.write_text(json.dumps(refs, indent=0, sort_keys=True) + "\n")
    print(f"wrote {REFERENCE_FILE} ({len(refs)} cases)")
