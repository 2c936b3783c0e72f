"""V-trace and GAE against naive NumPy oracles written straight from the definitions."""
import numpy as np
import pytest
import torch

from sf.learning.gae import gae
from sf.learning.vtrace import vtrace


def vtrace_oracle(behavior_log_probs, target_log_probs, rewards, values, bootstrap, discounts, rho_bar, c_bar):
    """IMPALA eq. (1), literally: v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t V,
    delta_t V = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)); pg_adv_s = rho_s (r_s + gamma_s v_{s+1} - V(x_s)).
    No recursion: explicit products of c's for every (s, t). float64 throughout."""
    T, B = rewards.shape
    ratio = np.exp(target_log_probs.astype(np.float64) - behavior_log_probs.astype(np.float64))
    V = np.concatenate([values, bootstrap[None]], 0).astype(np.float64)  # V[T] = bootstrap
    vs = np.zeros((T + 1, B))
    pg = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total = V[s, b]
            for t in range(s, T):
                prod = 1.0
                for i in range(s, t):
                    prod *= discounts[i, b] * min(c_bar, ratio[i, b])
                rho_t = min(rho_bar, ratio[t, b])
                delta = rho_t * (rewards[t, b] + discounts[t, b] * V[t + 1, b] - V[t, b])
                total += prod * delta
            vs[s, b] = total
        vs[T, b] = V[T, b]
        for s in range(T):
            rho_s = min(rho_bar, ratio[s, b])
            pg[s, b] = rho_s * (rewards[s, b] + discounts[s, b] * vs[s + 1, b] - V[s, b])
    return vs[:T], pg


def gae_oracle(rewards, values, bootstrap, discounts, lam):
    """A_t = sum_{s=t}^{T-1} (prod_{i=t}^{s-1} gamma_i lambda) delta_s; returns = A + V. No recursion."""
    T, B = rewards.shape
    V = np.concatenate([values, bootstrap[None]], 0).astype(np.float64)
    adv = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            for s in range(t, T):
                prod = 1.0
                for i in range(t, s):
                    prod *= discounts[i, b] * lam
                delta = rewards[s, b] + discounts[s, b] * V[s + 1, b] - V[s, b]
                adv[t, b] += prod * delta
    return adv, adv + V[:T]


def random_inputs(T, B, seed, done_prob=0.2, gamma=0.97, spread=0.7):
    rng = np.random.default_rng(seed)
    beh = rng.normal(size=(T, B)) * spread - 1.0
    tgt = beh + rng.normal(size=(T, B)) * spread
    rewards = rng.normal(size=(T, B))
    values = rng.normal(size=(T, B))
    bootstrap = rng.normal(size=(B,))
    dones = (rng.random((T, B)) < done_prob).astype(np.float64)
    dones[T // 2, 0] = 1.0  # at least one episode end inside the rollout
    discounts = gamma * (1.0 - dones)
    return [x.astype(np.float32) for x in (beh, tgt, rewards, values, bootstrap, discounts)]


def t32(*arrays):
    return [torch.from_numpy(a) for a in arrays]


@pytest.mark.parametrize("T,B", [(1, 3), (5, 4), (16, 3)])
@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (0.5, 0.9), (2.0, 1.5), (1.0, 0.3)])
def test_vtrace_matches_naive_oracle(T, B, rho_bar, c_bar):
    beh, tgt, r, v, boot, disc = random_inputs(T, B, seed=T * 100 + B + int(rho_bar * 10 + c_bar * 1000))
    out = vtrace(*t32(beh, tgt, r, v, boot, disc), rho_bar=rho_bar, c_bar=c_bar)
    vs, pg = out.vs, out.advantages
    vs_ref, pg_ref = vtrace_oracle(beh, tgt, r, v, boot, disc, rho_bar, c_bar)
    assert vs.shape == (T, B) and pg.shape == (T, B)
    assert vs.dtype == torch.float32 and pg.dtype == torch.float32
    np.testing.assert_allclose(vs.numpy(), vs_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pg.numpy(), pg_ref, rtol=1e-4, atol=1e-4)


def test_vtrace_on_policy_equals_n_step_returns():
    """rho_bar = c_bar = 1 and pi = mu: v_s is the bootstrapped n-step return (stopping at episode ends)."""
    T, B = 12, 5
    beh, _, r, v, boot, disc = random_inputs(T, B, seed=7, done_prob=0.15)
    out = vtrace(*t32(beh, beh, r, v, boot, disc), rho_bar=1.0, c_bar=1.0)
    vs, pg = out.vs, out.advantages
    ret = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            g, discount = 0.0, 1.0
            for t in range(s, T):
                g += discount * r[t, b]
                discount *= disc[t, b]
            ret[s, b] = g + discount * boot[b]
    np.testing.assert_allclose(vs.numpy(), ret, rtol=1e-5, atol=1e-5)
    # on-policy advantages: r_s + gamma_s v_{s+1} - V(x_s)
    vs_next = np.concatenate([ret[1:], boot[None]], 0)
    np.testing.assert_allclose(pg.numpy(), r + disc * vs_next - v, rtol=1e-5, atol=1e-5)


def test_vtrace_episode_end_cuts_the_trace():
    """Rewards after an episode end never reach targets before it."""
    T, B = 6, 2
    beh, tgt, r, v, boot, disc = random_inputs(T, B, seed=3, done_prob=0.0)
    disc[2, :] = 0.0  # episode ended after step 2
    vs1 = vtrace(*t32(beh, tgt, r, v, boot, disc)).vs
    r2, v2, boot2 = r.copy(), v.copy(), boot + 100.0
    r2[3:] += 50.0
    v2[3:] -= 20.0
    vs2 = vtrace(*t32(beh, tgt, r2, v2, boot2, disc)).vs
    torch.testing.assert_close(vs1[:3], vs2[:3])


def test_vtrace_no_grad():
    beh, tgt, r, v, boot, disc = t32(*random_inputs(4, 2, seed=1))
    tgt.requires_grad_(True)
    v.requires_grad_(True)
    out = vtrace(beh, tgt, r, v, boot, disc)
    assert not out.vs.requires_grad and not out.advantages.requires_grad


@pytest.mark.parametrize("T,B,lam", [(1, 2, 0.95), (7, 3, 0.95), (10, 4, 0.5), (6, 2, 1.0), (6, 2, 0.0)])
def test_gae_matches_naive_oracle(T, B, lam):
    _, _, r, v, boot, disc = random_inputs(T, B, seed=T + B)
    out = gae(*t32(r, v, boot, disc), lam)
    adv, ret = out.advantages, out.returns
    adv_ref, ret_ref = gae_oracle(r, v, boot, disc, lam)
    assert adv.shape == (T, B) and ret.shape == (T, B)
    np.testing.assert_allclose(adv.numpy(), adv_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret.numpy(), ret_ref, rtol=1e-4, atol=1e-4)


def test_gae_lambda_one_equals_on_policy_vtrace_targets():
    T, B = 9, 3
    beh, _, r, v, boot, disc = random_inputs(T, B, seed=11)
    ret = gae(*t32(r, v, boot, disc), 1.0).returns
    vs = vtrace(*t32(beh, beh, r, v, boot, disc)).vs
    torch.testing.assert_close(ret, vs, rtol=1e-5, atol=1e-5)


def test_results_are_named():
    """vtrace gives (vs, advantages), gae (advantages, returns): callers take them by name, never by position."""
    beh, tgt, r, v, boot, disc = t32(*random_inputs(3, 2, seed=2))
    assert vtrace(beh, tgt, r, v, boot, disc)._fields == ("vs", "advantages")
    assert gae(r, v, boot, disc, 0.9)._fields == ("advantages", "returns")
