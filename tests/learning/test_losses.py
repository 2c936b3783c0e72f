"""PPO clipping, value clipping, advantage normalization and masking of the loss terms."""
import math

import pytest
import torch

from sf.learning.losses import appo_loss, entropy_loss, masked_mean, normalize_advantages, policy_loss, value_loss

EPS = 0.1


def _policy_grad(ratio: float, adv: float) -> float:
    behavior = torch.tensor([-1.0])
    log_probs = (behavior + math.log(ratio)).requires_grad_(True)
    loss, _ = policy_loss(log_probs, behavior, torch.tensor([adv]), EPS)
    loss.backward()
    return float(log_probs.grad[0])


@pytest.mark.parametrize("ratio,adv", [(1.2, 1.0), (1.0 + EPS + 1e-3, 2.0), (0.85, -1.0), (1 / (1 + EPS) - 1e-3, -0.5)])
def test_ppo_clip_zero_gradient_outside_range(ratio, adv):
    """Positive advantage with ratio > 1+eps, negative advantage with ratio < 1/(1+eps): no gradient."""
    assert _policy_grad(ratio, adv) == 0.0


@pytest.mark.parametrize("ratio,adv", [(1.05, 1.0), (0.95, -1.0), (1.0, 1.0), (0.7, 1.0), (1.5, -1.0)])
def test_ppo_gradient_inside_range_or_wrong_side(ratio, adv):
    """Inside the range, and on the side where clipping does not bind (the min picks r*A): d loss/d log pi = -r*A."""
    assert _policy_grad(ratio, adv) == pytest.approx(-ratio * adv, rel=1e-5)


def test_ppo_clip_range_is_inverse_symmetric():
    """Clipped to [1/(1+eps), 1+eps] = [0.909, 1.1], not [1-eps, 1+eps] = [0.9, 1.1]."""
    assert _policy_grad(0.905, -1.0) == 0.0  # below 1/1.1: clipped (it would be inside [0.9, 1.1])
    assert _policy_grad(0.92, -1.0) != 0.0  # inside


def test_ppo_loss_value():
    behavior = torch.zeros(4)
    ratios = torch.tensor([1.3, 0.5, 1.05, 0.8])
    adv = torch.tensor([1.0, -2.0, 3.0, 1.0])
    loss, r = policy_loss(torch.log(ratios), behavior, adv, EPS)
    clipped = torch.clamp(ratios, 1 / (1 + EPS), 1 + EPS)
    expected = -torch.min(ratios * adv, clipped * adv).mean()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(r, ratios)


def test_value_loss_clipping():
    values = torch.tensor([0.0, 3.0, -1.0, 0.5], requires_grad=True)
    old = torch.tensor([0.0, 1.0, 1.0, 0.4])
    targets = torch.tensor([1.0, 4.0, -3.0, 0.0])
    loss = value_loss(values, old, targets, clip_value=1.0)
    v_clip = old + torch.clamp(values.detach() - old, -1.0, 1.0)
    expected = torch.max((values.detach() - targets) ** 2, (v_clip - targets) ** 2).mean()
    torch.testing.assert_close(loss.detach(), expected)
    loss.backward()
    # sample 1: v=3 moved +2 from old=1, target 4: clipped error (2-4)^2=4 > (3-4)^2=1 -> clipped term binds, no grad
    assert values.grad[1] == 0.0
    # sample 0: inside the clip range -> gradient of (v-R)^2/N = 2(v-R)/N (Sample Factory's: no 1/2 in front)
    assert values.grad[0] == pytest.approx(2 * (0.0 - 1.0) / 4)


def test_normalize_advantages_uses_valid_samples_only():
    adv = torch.tensor([1.0, 2.0, 3.0, 1e6, float("nan")])
    valid = torch.tensor([True, True, True, False, False])
    out = normalize_advantages(adv, valid)
    ref = torch.tensor([1.0, 2.0, 3.0])
    ref = (ref - ref.mean()) / (ref.std(unbiased=False) + 1e-8)
    torch.testing.assert_close(out[:3], ref)
    assert out[3] == 0 and out[4] == 0


def test_masked_mean_all_masked_is_zero():
    x = torch.tensor([float("nan"), 5.0])
    assert masked_mean(x, torch.tensor([False, False])) == 0.0
    assert masked_mean(x, torch.tensor([False, True])) == 5.0


def _inputs(n, seed, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    lp = (torch.randn(n, generator=g) * 0.1 - 1.0)
    beh = lp + torch.randn(n, generator=g) * 0.1
    adv = torch.randn(n, generator=g)
    v = torch.randn(n, generator=g)
    old_v = v + torch.randn(n, generator=g) * 0.5
    ret = torch.randn(n, generator=g) * 2
    ent = torch.rand(n, generator=g) + 0.5
    return lp, beh, adv, v, old_v, ret, ent


KW = dict(clip_ratio=0.1, clip_value=1.0, value_loss_coeff=0.5, exploration_loss_coeff=0.003)


GARBAGE = [1e6, float("inf"), float("nan"), -1e9]


def _with_garbage(clean, fill):
    """The clean [T, B] inputs with 4 masked steps inserted at time 2 and a masked trajectory appended:
    [T+4, B+1] tensors; `fill(i, k)` gives the value of input i in masked slot k (garbage pattern k)."""
    T, B = clean[0].shape
    valid = torch.zeros(T + 4, B + 1, dtype=torch.bool)
    valid[:2, :B] = True
    valid[6:, :B] = True
    big = []
    for i, x in enumerate(clean):
        y = torch.empty(T + 4, B + 1, dtype=x.dtype)
        y[:2, :B], y[6:, :B] = x[:2], x[2:]
        for k in range(4):
            y[2 + k, :] = fill(i, k)
        y[:, B] = fill(i, i)
        big.append(y)
    return big, valid


def _loss_and_grads(inputs, valid, normalize_advantage):
    lp, v, ent = (inputs[i].clone().requires_grad_(True) for i in (0, 3, 6))
    out = appo_loss(lp, inputs[1], inputs[2], v, inputs[4], inputs[5], ent, valid,
                    normalize_advantage=normalize_advantage, **KW)
    out["loss"].backward()
    return out, (lp.grad, v.grad, ent.grad)


@pytest.mark.parametrize("normalize_advantage", [True, False])
def test_masking_invariance_with_garbage_steps(normalize_advantage):
    """Inserting masked garbage samples (huge values, inf, NaN) changes no loss term and no gradient.

    Neither comparison is at the mercy of float rounding: (a) same layout, float32: the garbage slots
    holding NaN/inf/huge values or other finite values give bit-identical loss terms and gradients (the
    valid entries go through the same operations, masked ones add exact zeros to the sums); (b) against
    the clean batch without the garbage slots (another shape, whose sums group the valid terms
    differently): in float64, where that regrouping costs ~1e-16 relative, far below the 1e-6 tolerance
    (in float32 it cost up to a third of it, more on other SIMD widths)."""
    T, B = 6, 3
    model_outputs = (0, 3, 6)  # a network gives finite numbers at masked positions: finite garbage there

    def garbage(i, k):
        return 123.0 if i in model_outputs else GARBAGE[(k + i) % 4]

    def other(i, k):
        return -7.5 + k - 0.25 * i

    # (a) float32, same shape: garbage vs other finite values in the masked slots
    clean32 = [x.view(T, B) for x in _inputs(T * B, seed=0)]
    big, valid = _with_garbage(clean32, garbage)
    big_other, _ = _with_garbage(clean32, other)
    out, grads = _loss_and_grads(big, valid, normalize_advantage)
    out_o, grads_o = _loss_and_grads(big_other, valid, normalize_advantage)
    for k in ("loss", "policy_loss", "value_loss", "entropy"):
        assert torch.isfinite(out[k]) and torch.equal(out[k], out_o[k]), k
    for g, g_o in zip(grads, grads_o):
        assert torch.isfinite(g).all()
        assert (g[~valid] == 0).all()
        assert torch.equal(g, g_o)

    # (b) float64, clean [T, B] batch vs the garbage-inserted [T+4, B+1] one
    clean = [x.double() for x in clean32]
    ref, ref_grads = _loss_and_grads(clean, None, normalize_advantage)
    big, valid = _with_garbage(clean, garbage)
    out, grads = _loss_and_grads(big, valid, normalize_advantage)
    for k in ("loss", "policy_loss", "value_loss", "entropy"):
        torch.testing.assert_close(out[k], ref[k], rtol=1e-6, atol=1e-7)
    for g_big, g_ref in zip(grads, ref_grads):
        assert torch.isfinite(g_big).all()
        assert (g_big[~valid] == 0).all()
        torch.testing.assert_close(g_big[valid], g_ref.reshape(-1), rtol=1e-6, atol=1e-7)


def test_each_term_masked_mean():
    lp, beh, adv, v, old_v, ret, ent = _inputs(10, seed=1)
    valid = torch.tensor([True, False] * 5)
    pl, _ = policy_loss(lp, beh, adv, 0.1, valid)
    pl_ref, _ = policy_loss(lp[valid], beh[valid], adv[valid], 0.1)
    torch.testing.assert_close(pl, pl_ref)
    torch.testing.assert_close(value_loss(v, old_v, ret, 1.0, valid),
                               value_loss(v[valid], old_v[valid], ret[valid], 1.0))
    torch.testing.assert_close(entropy_loss(ent, valid), -ent[valid].mean())


def test_total_loss_composition():
    lp, beh, adv, v, old_v, ret, ent = _inputs(8, seed=2)
    out = appo_loss(lp, beh, adv, v, old_v, ret, ent, None, normalize_advantage=True, **KW)
    pl, _ = policy_loss(lp, beh, normalize_advantages(adv, None), 0.1)
    vl = value_loss(v, old_v, ret, 1.0)
    expected = pl + 0.5 * vl - 0.003 * ent.mean()
    torch.testing.assert_close(out["loss"], expected)
    torch.testing.assert_close(out["entropy"], ent.mean())
