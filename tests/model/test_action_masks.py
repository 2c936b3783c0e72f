"""Action masks (observation key "action_mask", nonzero = valid): a masked action has probability exactly 0 when
sampling (Gumbel-max and the hts/ppo inverse-CDF noise), in the mode, the log-probs, the entropy and the KL; one valid
action gives log-prob 0 and entropy 0 without NaN; no gradient reaches a masked logit, through the distribution and
through the model and the APPO step; and train.py on test_masked (an env that raises on a masked action) trains, in the
asynchronous and the hts mode, and enjoy.py plays the result, deterministic and stochastic; an env whose mask cannot
mask its actions is refused in one line. --random_policy's uniform policy (numpy) draws among the valid actions only,
each with probability 1 / (number valid), and the sampler benchmark runs on test_masked."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from gymnasium import spaces

from e2e_helpers import ROOT, made_once
from model_test_helpers import make_cfg
from sf.model.action_spaces import MASKED_LOGIT, action_distribution, mask_logits, uniform_valid_actions
from sf.model.actor_critic import create_actor_critic

SPACES = [spaces.Discrete(6), spaces.MultiDiscrete([3, 5, 2])]
SMALL = dict(rnn_size=16, hidden_size=16, encoder_mlp_layers=[16])


def heads(space) -> list[int]:
    return [int(space.n)] if isinstance(space, spaces.Discrete) else [int(n) for n in space.nvec]


def random_masks(n: int, sizes, g, p_valid: float = 0.5) -> torch.Tensor:
    """[n, sum(sizes)] int8: each head has at least one valid action."""
    parts = []
    for size in sizes:
        m = torch.rand(n, size, generator=g) < p_valid
        m[torch.arange(n), torch.randint(0, size, (n,), generator=g)] = True
        parts.append(m)
    return torch.cat(parts, -1).to(torch.int8)


def adversarial_logits(mask: torch.Tensor, g) -> torch.Tensor:
    """Random logits whose masked entries are the largest (+10): an unmasked sampler would mostly pick them."""
    return torch.randn(mask.shape, generator=g) * 2 + 10.0 * (mask == 0)


def chosen_valid(mask: torch.Tensor, actions: torch.Tensor, sizes) -> torch.Tensor:
    """[n, heads] bool: whether each head's action is valid under `mask` [n, L]."""
    offsets = torch.tensor(np.cumsum([0] + list(sizes[:-1])))
    return mask.long().gather(1, actions + offsets).bool()


@pytest.mark.parametrize("space", SPACES, ids=["discrete", "multidiscrete"])
@pytest.mark.parametrize("hts_noise", [False, True])
def test_100k_samples_never_pick_a_masked_action(space, hts_noise):
    g = torch.Generator().manual_seed(0)
    sizes = heads(space)
    n = 100_000
    mask = random_masks(n, sizes, g)
    dist = action_distribution(space, mask_logits(adversarial_logits(mask, g), mask))
    noise = torch.rand(n, len(sizes), generator=g) if hts_noise else None
    if hts_noise:  # the edges: 0, the largest float32 below 1, and 1 (a product rounded up to the cdf's total)
        noise[:3] = torch.tensor([0.0, 1.0 - 2.0 ** -24, 1.0])[:, None]
    actions = dist.sample(noise)
    assert actions.shape == (n, len(sizes))
    assert chosen_valid(mask, actions, sizes).all()
    assert chosen_valid(mask, dist.mode(), sizes).all()
    # and the valid actions are drawn with their renormalized probabilities (one row repeated)
    row_mask = torch.zeros(sizes[0], dtype=torch.int8)
    row_mask[[0, sizes[0] - 2]] = 1
    row = torch.zeros(sum(sizes))
    row[:sizes[0]] = torch.arange(sizes[0], dtype=torch.float32) * 0.5
    full_mask = torch.ones(n, sum(sizes), dtype=torch.int8)
    full_mask[:, :sizes[0]] = row_mask
    rows = action_distribution(space, mask_logits(row.expand(n, -1), full_mask))
    counts = torch.bincount(rows.sample(noise)[:, 0], minlength=sizes[0]).double() / n
    expected = torch.zeros(sizes[0], dtype=torch.float64)
    expected[row_mask.bool()] = torch.softmax(row[:sizes[0]][row_mask.bool()].double(), 0)
    assert (counts[~row_mask.bool()] == 0).all()
    torch.testing.assert_close(counts, expected, atol=0.01, rtol=0)


@pytest.mark.parametrize("space", SPACES, ids=["discrete", "multidiscrete"])
def test_gradient_wrt_masked_logits_is_exactly_zero(space):
    """A loss made of every term the learner computes (log-prob, entropy, KL both ways) gives masked logits no
    gradient, also in rows with a single valid action per head; nothing is NaN or inf."""
    g = torch.Generator().manual_seed(1)
    sizes = heads(space)
    mask = random_masks(64, sizes, g)
    mask[:8] = random_masks(8, sizes, g, p_valid=0.0)  # exactly one valid action per head
    raw = adversarial_logits(mask, g).requires_grad_()
    other = mask_logits(torch.randn(mask.shape, generator=g), mask)
    dist = action_distribution(space, mask_logits(raw, mask))
    actions = dist.sample()
    adv = torch.randn(64, generator=g)
    loss = (-(dist.log_prob(actions) * adv).mean() - 0.01 * dist.entropy().mean()
            + dist.kl_divergence(action_distribution(space, other)).mean()
            + action_distribution(space, other).kl_divergence(dist).mean())
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(raw.grad).all()
    assert (raw.grad[mask == 0] == 0).all()
    assert (raw.grad[mask != 0] != 0).any()


def naive_masked(logits: np.ndarray, mask: np.ndarray):
    """(probabilities, entropy) of softmax over the valid entries only, float64, a loop per entry."""
    valid = [i for i in range(len(logits)) if mask[i]]
    z = max(logits[i] for i in valid)
    e = {i: math.exp(logits[i] - z) for i in valid}
    total = sum(e.values())
    p = np.zeros(len(logits))
    for i in valid:
        p[i] = e[i] / total
    return p, -sum(p[i] * math.log(p[i]) for i in valid)


def test_entropy_log_probs_and_kl_match_the_renormalized_distribution():
    g = torch.Generator().manual_seed(2)
    n, size = 200, 7
    mask = random_masks(n, [size], g)
    raw = adversarial_logits(mask, g)
    other_raw = torch.randn(n, size, generator=g)
    dist = action_distribution(spaces.Discrete(size), mask_logits(raw, mask))
    other = action_distribution(spaces.Discrete(size), mask_logits(other_raw, mask))
    entropy, kl = dist.entropy(), dist.kl_divergence(other)
    actions = dist.sample()
    log_probs = dist.log_prob(actions)
    for i in range(n):
        p, h = naive_masked(raw[i].double().tolist(), mask[i].tolist())
        q, _ = naive_masked(other_raw[i].double().tolist(), mask[i].tolist())
        assert entropy[i].item() == pytest.approx(h, abs=1e-5)
        assert log_probs[i].item() == pytest.approx(math.log(p[actions[i, 0]]), abs=1e-5)
        naive_kl = sum(p[j] * math.log(p[j] / q[j]) for j in range(size) if mask[i, j])
        assert kl[i].item() == pytest.approx(naive_kl, abs=1e-5)
        assert (dist.log_probs_per_head[0][i].exp()[mask[i] == 0] == 0).all()  # exactly 0, not just small


@pytest.mark.parametrize("space", SPACES, ids=["discrete", "multidiscrete"])
def test_one_valid_action_log_prob_and_entropy_are_zero(space):
    g = torch.Generator().manual_seed(3)
    sizes = heads(space)
    mask = random_masks(32, sizes, g, p_valid=0.0)
    raw = (torch.randn(mask.shape, generator=g) * 5).requires_grad_()
    dist = action_distribution(space, mask_logits(raw, mask))
    only = dist.mode()
    assert chosen_valid(mask, only, sizes).all()
    for noise in (None, torch.zeros(32, len(sizes)), torch.full((32, len(sizes)), 1.0 - 2.0 ** -24)):
        assert torch.equal(dist.sample(noise), only)
    log_prob, entropy = dist.log_prob(only), dist.entropy()
    assert (log_prob == 0).all() and (entropy == 0).all()
    (entropy.sum() - log_prob.sum()).backward()
    assert torch.isfinite(raw.grad).all() and (raw.grad[mask == 0] == 0).all()


def test_an_all_masked_head_is_uniform_not_nan():
    """What the policy worker's zero-padded rows (hts/ppo chunks) look like: a uniform distribution, no NaN."""
    mask = torch.zeros(4, 5, dtype=torch.int8)
    dist = action_distribution(spaces.Discrete(5), mask_logits(torch.randn(4, 5), mask))
    torch.testing.assert_close(dist.entropy(), torch.full((4,), math.log(5)))
    assert torch.isfinite(dist.log_prob(dist.sample(torch.rand(4, 1)))).all()


def masked_model(space, mask_space, use_rnn=True, **overrides):
    torch.manual_seed(0)
    cfg = make_cfg(**SMALL, use_rnn=use_rnn, **overrides)
    obs_space = spaces.Dict(obs=spaces.Box(-1.0, 1.0, (6,), np.float32), action_mask=mask_space)
    return create_actor_critic(cfg, obs_space, space), obs_space


@pytest.mark.parametrize("use_rnn, share_weights", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.float32])
def test_model_masks_its_logits_in_steps_and_sequences(use_rnn, share_weights, dtype):
    """forward_step and forward_sequence put MASKED_LOGIT at masked entries (MultiBinary int8, bool or 0/1 float
    masks), leave the valid ones as the network computed them (the encoders do not read the mask), and keep the
    sequence outputs time-major."""
    space = spaces.MultiDiscrete([3, 4])
    model, _ = masked_model(space, spaces.MultiBinary(7), use_rnn, actor_critic_share_weights=share_weights)
    g = torch.Generator().manual_seed(4)
    b, s = 3, 5
    obs = {"obs": torch.randn(b, s, 6, generator=g),
           "action_mask": random_masks(b * s, [3, 4], g).view(b, s, 7).to(dtype)}
    rnn = torch.zeros(b, s, model.rnn_state_size)
    with torch.no_grad():
        logits, _ = model.forward_sequence(obs, rnn, torch.zeros(b, s), recurrence=s)
        unmasked, _ = model.forward_sequence({"obs": obs["obs"], "action_mask": torch.ones(b, s, 7, dtype=dtype)}, rnn,
                                             torch.zeros(b, s), recurrence=s)
        state = rnn[:, 0]
        for t in range(s):
            out = model.forward_step({k: v[:, t] for k, v in obs.items()}, state)
            torch.testing.assert_close(out.action_logits, logits[:, t])
            state = out.new_rnn_states
    valid = obs["action_mask"] != 0
    assert (logits[~valid] == MASKED_LOGIT).all()
    assert torch.equal(logits[valid], unmasked[valid])
    if use_rnn:
        assert logits.transpose(0, 1).is_contiguous()


def test_model_refuses_a_mask_that_does_not_fit_the_actions():
    with pytest.raises(ValueError, match=r"needs \(5,\)"):
        masked_model(spaces.MultiDiscrete([3, 2]), spaces.MultiBinary(3))
    with pytest.raises(ValueError, match="not Box"):
        masked_model(spaces.Box(-1.0, 1.0, (2,), np.float32), spaces.MultiBinary(4))


def test_appo_step_gives_masked_actions_no_gradient():
    """The real learner step (V-trace, PPO loss, entropy bonus, KL stats) on a batch where action 0 is masked at every
    step: the head's bias for action 0 gets a gradient of exactly 0, the others do not, every statistic is finite."""
    from model_test_helpers import make_obs, random_experience
    from sf.learning.appo import APPO
    space, n, t = spaces.Discrete(4), 6, 8
    model, obs_space = masked_model(space, spaces.MultiBinary(4))
    cfg = make_cfg(**SMALL, rollout=t, recurrence=t, batch_size=n * t)
    g = torch.Generator().manual_seed(5)
    obs = make_obs(obs_space, (n, t + 1), g)
    masks = random_masks(n * (t + 1), [3], g)
    obs["action_mask"] = torch.cat([torch.zeros(n * (t + 1), 1, dtype=torch.int8), masks], -1).view(n, t + 1, 4)
    exp = random_experience(model, obs_space, space, n, t, seed=0, obs=obs)
    assert (exp["actions"] != 0).all() and (exp["action_logits"][..., 0] == MASKED_LOGIT).all()
    stats = APPO(model, cfg, "cpu").train(exp, 0)
    assert all(math.isfinite(v) for s in stats for v in s.values())
    bias_grad = model.action_heads[0].bias.grad
    assert bias_grad[0] == 0 and (bias_grad[1:] != 0).all()
    assert (model.action_heads[0].weight.grad[0] == 0).all()


@pytest.mark.parametrize("space", SPACES, ids=["discrete", "multidiscrete"])
def test_uniform_valid_actions_is_the_uniform_policy_over_valid_actions(space):
    """--random_policy with masks: frequencies against 1 / n_valid (the naive oracle: count the valid entries), the
    log-probs and logits exactly those of that distribution, the edges of u, and an all-masked head uniform."""
    g = torch.Generator().manual_seed(3)
    sizes = heads(space)
    n = 60_000
    mask = random_masks(n, sizes, g).numpy()
    mask[:50, :sizes[0]] = 0  # an all-masked head: uniform over all of its actions
    u = np.random.default_rng(0).random((n, len(sizes)), dtype=np.float32)
    u[50:53] = np.array([0.0, np.nextafter(np.float32(1), np.float32(0)), 0.5], dtype=np.float32)[:, None]
    actions, log_probs, logits = uniform_valid_actions(u, sizes, mask)
    start = 0
    expected_log_p = np.zeros(n)
    for k, size in enumerate(sizes):
        m = mask[:, start:start + size].astype(bool)
        m[~m.any(1)] = True
        valid_count = m.sum(1)
        a = actions[:, k]
        assert m[np.arange(n), a].all()  # never a masked action
        expected_log_p -= np.log(valid_count)
        assert (np.all(logits[:, start:start + size][m] == 0)
                and np.all(logits[:, start:start + size][~m] == MASKED_LOGIT))
        for count in range(1, size + 1):  # rows with `count` valid actions: the rank of the chosen one is uniform
            rows = np.nonzero(valid_count == count)[0]
            if len(rows) < 3000:
                continue
            ranks = np.cumsum(m[rows], 1)[np.arange(len(rows)), a[rows]] - 1
            freq = np.bincount(ranks, minlength=count) / len(rows)
            assert np.abs(freq - 1 / count).max() < 5 * math.sqrt(1 / count / len(rows)), (k, count, freq)
        start += size
    np.testing.assert_allclose(log_probs, expected_log_p, rtol=1e-6)
    # the distribution the stored logits describe gives the same log-probs to the actions drawn
    dist = action_distribution(space, torch.from_numpy(logits))
    np.testing.assert_allclose(dist.log_prob(torch.from_numpy(actions)).numpy(), log_probs, rtol=1e-5, atol=1e-6)
    # u = 0 picks the first valid action, u just below 1 the last
    for k, size in enumerate(sizes):
        m = mask[50:52, sum(sizes[:k]):sum(sizes[:k]) + size].astype(bool)
        m[~m.any(1)] = True
        assert actions[50, k] == np.argmax(m[0]) and actions[51, k] == size - 1 - np.argmax(m[1][::-1])


# --- end to end: test_masked raises on a masked action; --max_env_restarts 0 turns that into a failed run ---
TINY = ["--num_workers", "1", "--num_envs_per_worker", "4", "--rollout", "8", "--recurrence", "8", "--batch_size", "64",
        "--rnn_size", "16", "--hidden_size", "16", "--encoder_mlp_layers", "16", "--device", "cpu",
        "--max_env_restarts", "0", "--train_for_env_steps", "3000"]


def assert_no_masked_action(res):
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "is masked" not in out and "replacing it with a fresh env" not in out, out[-3000:]


@pytest.fixture(scope="module")
def masked_run(tmp_path_factory, entry):
    """test_masked trained asynchronously (recurrent policy) for 3000 env frames: train_dir/masked."""

    def make(train_dir):
        res = entry("train.py", "--env", "test_masked", "--experiment", "masked", "--train_dir", train_dir, *TINY,
                    timeout=300)
        assert_no_masked_action(res)
        assert "Avg episode reward" in res.stdout
    return made_once(tmp_path_factory, "masked", make)


@pytest.mark.e2e
def test_trains_test_masked_without_a_masked_action(masked_run):
    assert list((masked_run / "masked" / "checkpoint_p0").glob("checkpoint_*.pth"))


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["async", "hts"])
def test_random_policy_sampler_on_test_masked(tmp_path, entry, mode):
    """--random_policy on an env that raises on a masked action: the sampler benchmark (async, --sampler_only), and
    the learner trained on the uniform policy's steps (hts: their stored log-probs are the masked ones, or V-trace's
    ratios would be off by the masked share)."""
    extra = ["--sampler_only", "True"] if mode == "async" else []
    res = entry("train.py", "--env", "test_masked", "--experiment", "random", "--train_dir", tmp_path, *TINY,
                "--random_policy", "True", "--sync_mode", mode, "--seed", "1", *extra, timeout=300)
    assert_no_masked_action(res)
    assert "Total num frames" in res.stdout


@pytest.mark.e2e
def test_trains_test_masked_in_hts_mode(tmp_path, entry):
    """The hts mode samples with per-env noise (inverse CDF) over zero-padded chunks."""
    res = entry("train.py", "--env", "test_masked", "--experiment", "hts", "--train_dir", tmp_path, *TINY,
                "--sync_mode", "hts", "--seed", "1", timeout=300)
    assert_no_masked_action(res)
    assert "Final weights sha256" in res.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("deterministic", [True, False])
def test_enjoy_plays_test_masked(masked_run, entry, deterministic):
    res = entry("enjoy.py", "--env", "test_masked", "--experiment", "masked", "--train_dir", masked_run, "--no_render",
                "--device", "cpu", "--max_num_episodes", "4", "--eval_deterministic", str(deterministic), timeout=120)
    assert_no_masked_action(res)
    assert "4 episodes: reward mean" in res.stdout


BAD_MASK_TRAIN = """
import sys
import gymnasium as gym
from sf.cfg import cli_main
from sf.runner.startup.entry import run_training
from sf_envs.registry import register_env
from sf_envs.test_envs import TestMasked

class BadMask(TestMasked):  # a mask of 3 entries for 4 actions
    def __init__(self, *args):
        super().__init__(*args)
        self.observation_space = gym.spaces.Dict(obs=self.observation_space["obs"],
                                                 action_mask=gym.spaces.MultiBinary(3))

register_env("bad_mask", lambda cfg, env_index, render_mode=None: BadMask(cfg, env_index, render_mode))
sys.exit(cli_main(run_training, mode="train", prog="train.py", argv=sys.argv[1:]))
"""


@pytest.mark.e2e
def test_an_env_mask_that_cannot_mask_its_actions_is_one_line(tmp_path):
    """A user env whose mask does not fit its actions: one line, exit code 2, nothing written."""
    res = subprocess.run([sys.executable, "-c", BAD_MASK_TRAIN, "--env", "bad_mask", "--experiment", "bad",
                          "--train_dir", str(tmp_path / "td"), "--device", "cpu"], capture_output=True, text=True,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "env bad_mask: observation key 'action_mask' has shape (3,); Discrete(4) needs (4,)" in lines[0]
    assert not (tmp_path / "td").exists()
