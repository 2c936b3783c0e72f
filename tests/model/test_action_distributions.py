"""Action space helpers and distributions against torch.distributions oracles."""
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.distributions import Categorical, Normal, kl_divergence

from sf.model.action_spaces import action_distribution, action_dtype, action_shape, num_action_logits

DOOM_FULL = spaces.MultiDiscrete([3, 3, 2, 2, 2, 8, 21])


def test_space_helpers():
    assert action_shape(spaces.Discrete(7)) == (1,)
    assert action_dtype(spaces.Discrete(7)) == torch.int64
    assert num_action_logits(spaces.Discrete(7)) == 7
    assert action_shape(DOOM_FULL) == (7,)
    assert action_dtype(DOOM_FULL) == torch.int64
    assert num_action_logits(DOOM_FULL) == 41
    box = spaces.Box(-1.0, 1.0, (3,), np.float32)
    assert action_shape(box) == (3,)
    assert action_dtype(box) == torch.float32
    assert num_action_logits(box) == 6
    with pytest.raises(TypeError):
        action_shape(spaces.MultiBinary(3))


def test_categorical_vs_torch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 6, generator=g) * 2
    dist = action_distribution(spaces.Discrete(6), logits)
    ref = Categorical(logits=logits)
    actions = torch.randint(0, 6, (5, 1), generator=g)
    torch.testing.assert_close(dist.log_prob(actions), ref.log_prob(actions[:, 0]))
    torch.testing.assert_close(dist.entropy(), ref.entropy())
    assert dist.mode().shape == (5, 1) and (dist.mode()[:, 0] == logits.argmax(-1)).all()
    s = dist.sample()
    assert s.shape == (5, 1) and s.dtype == torch.int64
    other = torch.randn(5, 6, generator=g)
    torch.testing.assert_close(dist.kl_divergence(action_distribution(spaces.Discrete(6), other)),
                               kl_divergence(ref, Categorical(logits=other)))


def test_multidiscrete_vs_torch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 41, generator=g)
    dist = action_distribution(DOOM_FULL, logits)
    refs = [Categorical(logits=lg) for lg in torch.split(logits, list(DOOM_FULL.nvec), dim=-1)]
    actions = torch.stack([torch.randint(0, int(n), (4,), generator=g) for n in DOOM_FULL.nvec], dim=-1)
    torch.testing.assert_close(dist.log_prob(actions), sum(r.log_prob(actions[:, i]) for i, r in enumerate(refs)))
    torch.testing.assert_close(dist.entropy(), sum(r.entropy() for r in refs))
    s = dist.sample()
    assert s.shape == (4, 7) and s.dtype == torch.int64
    assert ((s >= 0) & (s < torch.as_tensor(DOOM_FULL.nvec))).all()
    other = torch.randn(4, 41, generator=g)
    refs_o = [Categorical(logits=lg) for lg in torch.split(other, list(DOOM_FULL.nvec), dim=-1)]
    torch.testing.assert_close(dist.kl_divergence(action_distribution(DOOM_FULL, other)),
                               sum(kl_divergence(p, q) for p, q in zip(refs, refs_o)))


def test_gaussian_vs_torch():
    g = torch.Generator().manual_seed(2)
    box = spaces.Box(-1.0, 1.0, (3,), np.float32)
    logits = torch.randn(6, 6, generator=g)
    dist = action_distribution(box, logits)
    ref = Normal(logits[:, :3], logits[:, 3:].exp())
    actions = torch.randn(6, 3, generator=g)
    torch.testing.assert_close(dist.log_prob(actions), ref.log_prob(actions).sum(-1))
    torch.testing.assert_close(dist.entropy(), ref.entropy().sum(-1))
    torch.testing.assert_close(dist.mode(), logits[:, :3])
    assert dist.sample().shape == (6, 3) and dist.sample().dtype == torch.float32
    other = torch.randn(6, 6, generator=g)
    torch.testing.assert_close(dist.kl_divergence(action_distribution(box, other)),
                               kl_divergence(ref, Normal(other[:, :3], other[:, 3:].exp())).sum(-1))


def test_leading_dims():
    logits = torch.randn(3, 4, 41)
    dist = action_distribution(DOOM_FULL, logits)
    a = dist.sample()
    assert a.shape == (3, 4, 7)
    flat = action_distribution(DOOM_FULL, logits.view(12, 41))
    torch.testing.assert_close(dist.log_prob(a).view(12), flat.log_prob(a.view(12, 7)))


def test_categorical_sampling_frequencies():
    torch.manual_seed(0)
    probs = torch.tensor([0.1, 0.6, 0.05, 0.25])
    logits = probs.log().expand(40000, 4)
    s = action_distribution(spaces.Discrete(4), logits).sample()[:, 0]
    freq = torch.bincount(s, minlength=4).float() / len(s)
    assert torch.allclose(freq, probs, atol=0.01), freq


def test_gaussian_sampling_moments():
    torch.manual_seed(0)
    logits = torch.tensor([[1.0, -2.0, float(np.log(0.5)), float(np.log(2.0))]], dtype=torch.float32).expand(40000, 4)
    s = action_distribution(spaces.Box(-5, 5, (2,), np.float32), logits).sample()
    assert torch.allclose(s.mean(0), torch.tensor([1.0, -2.0]), atol=0.05)
    assert torch.allclose(s.std(0), torch.tensor([0.5, 2.0]), atol=0.05)


# --- sampling from per-observation noise (hts/ppo modes) ---
def noise_for(space, n, seed=0):
    from sf.model.action_spaces import draw_action_noise
    rng = np.random.default_rng(seed)
    out = np.empty((n, action_shape(space)[0]), np.float32)
    for row in out:
        draw_action_noise(space, rng, row)
    return torch.from_numpy(out)


def test_noise_sampling_frequencies_per_head():
    """Inverse-CDF sampling from uniforms gives each head's probabilities (MultiDiscrete: heads independent)."""
    probs = [torch.tensor([0.1, 0.6, 0.05, 0.25]), torch.tensor([0.7, 0.3]), torch.tensor([0.0, 0.5, 0.5])]
    logits = torch.cat([p.log() for p in probs]).expand(60000, 9)
    space = spaces.MultiDiscrete([4, 2, 3])
    s = action_distribution(space, logits).sample(noise_for(space, 60000))
    for i, p in enumerate(probs):
        freq = torch.bincount(s[:, i], minlength=len(p)).float() / len(s)
        assert torch.allclose(freq, p, atol=0.01), (i, freq)
    assert (s[:, 2] != 0).all()  # probability 0 is never drawn
    joint = ((s[:, 0] == 1) & (s[:, 1] == 0)).float().mean()
    assert abs(float(joint) - 0.6 * 0.7) < 0.01


def test_noise_sampling_is_a_function_of_logits_and_noise():
    """The same (logits, noise) rows give the same actions whatever batch they are in, and the boundaries are exact:
    u just below a cumulative probability picks that action, u at it the next one."""
    space = spaces.Discrete(3)
    logits = torch.log(torch.tensor([[0.25, 0.25, 0.5]]))
    cdf = torch.cumsum(torch.softmax(logits, -1), -1)[0]
    u = torch.tensor([[0.0], [float(cdf[0]) - 1e-4], [float(cdf[0])], [float(cdf[1]) + 1e-4], [0.9999]])
    a = action_distribution(space, logits.expand(5, 3)).sample(u)[:, 0]
    assert a.tolist() == [0, 0, 1, 2, 2]
    big = torch.randn(64, 3)
    noise = noise_for(space, 64, seed=3)
    whole = action_distribution(space, big).sample(noise)
    parts = torch.cat([action_distribution(space, big[i:i + 5]).sample(noise[i:i + 5]) for i in range(0, 64, 5)])
    assert torch.equal(whole, parts)


def test_noise_sampling_gaussian_uses_the_noise():
    space = spaces.Box(-5, 5, (2,), np.float32)
    logits = torch.tensor([[1.0, -2.0, float(np.log(0.5)), float(np.log(2.0))]]).expand(40000, 4)
    noise = noise_for(space, 40000)
    s = action_distribution(space, logits).sample(noise)
    torch.testing.assert_close(s, torch.tensor([1.0, -2.0]) + torch.tensor([0.5, 2.0]) * noise)
    assert torch.allclose(s.std(0), torch.tensor([0.5, 2.0]), atol=0.05)
