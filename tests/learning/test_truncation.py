"""Truncation is not termination: V-trace and GAE bootstrap an episode cut by a time limit from the value of its final
observation. Oracles written per episode from the definitions (no reward augmentation, no recursion), and APPO's wiring
of final_obs into the targets."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

from model_test_helpers import VECTOR_OBS, make_cfg, make_obs, random_experience
from sf.learning.appo import APPO
from sf.learning.gae import gae
from sf.learning.vtrace import truncation_bootstrap, vtrace
from sf.model.actor_critic import create_actor_critic


def episode_inputs(T, B, seed, gamma=0.95):
    """Random rollouts with terminations and truncations (and at least one of each)."""
    rng = np.random.default_rng(seed)
    beh = rng.normal(size=(T, B)) * 0.6 - 1.0
    tgt = beh + rng.normal(size=(T, B)) * 0.6
    rewards, values, boot = rng.normal(size=(T, B)), rng.normal(size=(T, B)), rng.normal(size=B)
    end = rng.random((T, B))
    terminated = (end < 0.12).astype(np.float64)
    truncated = ((end >= 0.12) & (end < 0.25)).astype(np.float64)
    terminated[1, 0], truncated[1, 0] = 1.0, 0.0
    truncated[T - 3, B - 1], terminated[T - 3, B - 1] = 1.0, 0.0
    final_values = np.where(truncated > 0, rng.normal(size=(T, B)) * 3.0, np.nan)  # NaN where there is none
    return beh, tgt, rewards, values, boot, terminated, truncated, final_values, gamma


def next_state_value(V, boot, terminated, truncated, final_values, t, b, T):
    """What follows step t: nothing after a termination, the unseen final state after a truncation, else x_{t+1}."""
    if terminated[t, b]:
        return 0.0, False
    if truncated[t, b]:
        return final_values[t, b], False
    return (V[t + 1, b] if t + 1 < T else boot[b]), True  # (value, episode continues inside the rollout)


def episode_vtrace_oracle(beh, tgt, rewards, V, boot, terminated, truncated, final_values, gamma, rho_bar, c_bar):
    """IMPALA eq. (1) per episode: v_s = V(x_s) + sum_t (prod_{i<t} gamma c_i) delta_t over the steps of s's episode
    inside the rollout, delta_t = rho_t (r_t + gamma V(next_t) - V(x_t)) with V(next_t) = 0 after a termination and
    V(final observation) after a truncation; pg_s = rho_s (r_s + gamma v(next_s) - V(x_s)), v(next) being the next
    step's target inside the episode, the final observation's value after a truncation."""
    T, B = rewards.shape
    ratio = np.exp(tgt - beh)
    vs, pg = np.zeros((T, B)), np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total, prod, t = V[s, b], 1.0, s
            while True:
                nv, cont = next_state_value(V, boot, terminated, truncated, final_values, t, b, T)
                total += prod * min(rho_bar, ratio[t, b]) * (rewards[t, b] + gamma * nv - V[t, b])
                if not cont or t + 1 == T:
                    break
                prod *= gamma * min(c_bar, ratio[t, b])
                t += 1
            vs[s, b] = total
        for s in range(T):
            nv, cont = next_state_value(V, boot, terminated, truncated, final_values, s, b, T)
            if cont and s + 1 < T:
                nv = vs[s + 1, b]
            pg[s, b] = min(rho_bar, ratio[s, b]) * (rewards[s, b] + gamma * nv - V[s, b])
    return vs, pg


def episode_gae_oracle(rewards, V, boot, terminated, truncated, final_values, gamma, lam):
    """A_t = sum over the steps s >= t of t's episode inside the rollout of (gamma lambda)^(s-t) delta_s, with the
    same next-state values as episode_vtrace_oracle."""
    T, B = rewards.shape
    adv = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            s, weight = t, 1.0
            while True:
                nv, cont = next_state_value(V, boot, terminated, truncated, final_values, s, b, T)
                adv[t, b] += weight * (rewards[s, b] + gamma * nv - V[s, b])
                if not cont or s + 1 == T:
                    break
                weight *= gamma * lam
                s += 1
    return adv, adv + V


def as_inputs(beh, tgt, rewards, values, boot, terminated, truncated, final_values, gamma):
    f = lambda x: torch.from_numpy(np.asarray(x, dtype=np.float32))  # noqa: E731
    dones = np.maximum(terminated, truncated)
    return (f(beh), f(tgt), f(rewards), f(values), f(boot), f(gamma * (1 - dones)),
            truncation_bootstrap(f(truncated), f(final_values), gamma))


@pytest.mark.parametrize("T,B,seed", [(1, 4, 0), (6, 3, 1), (16, 5, 2)])
@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (0.7, 0.9), (2.0, 1.5)])
def test_vtrace_truncation_matches_per_episode_oracle(T, B, seed, rho_bar, c_bar):
    args = episode_inputs(max(T, 4), B, seed)
    beh, tgt, r, v, boot, disc, extra = as_inputs(*args)
    out = vtrace(beh, tgt, r, v, boot, disc, rho_bar=rho_bar, c_bar=c_bar, truncation_bootstrap=extra)
    vs_ref, pg_ref = episode_vtrace_oracle(*args, rho_bar, c_bar)
    np.testing.assert_allclose(out.vs.numpy(), vs_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.advantages.numpy(), pg_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("T,B,seed,lam", [(4, 3, 3, 0.95), (12, 4, 4, 0.5), (9, 2, 5, 1.0)])
def test_gae_truncation_matches_per_episode_oracle(T, B, seed, lam):
    args = episode_inputs(T, B, seed)
    _, _, r, v, boot, disc, extra = as_inputs(*args)
    out = gae(r, v, boot, disc, lam, truncation_bootstrap=extra)
    _, _, rewards, values, boot_np, terminated, truncated, final_values, gamma = args
    adv_ref, ret_ref = episode_gae_oracle(rewards, values, boot_np, terminated, truncated, final_values, gamma, lam)
    np.testing.assert_allclose(out.advantages.numpy(), adv_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.returns.numpy(), ret_ref, rtol=1e-4, atol=1e-4)


def test_truncation_is_not_termination():
    """The same rollout read as terminated and as truncated: the truncated step's target includes gamma V(final)."""
    args = list(episode_inputs(8, 3, 6))
    beh, tgt, r, v, boot, disc, extra = as_inputs(*args)
    vs_trunc = vtrace(beh, tgt, r, v, boot, disc, truncation_bootstrap=extra).vs
    vs_term = vtrace(beh, tgt, r, v, boot, disc).vs
    truncated = args[6] > 0
    diff = (vs_trunc - vs_term).abs().numpy()
    assert (diff[truncated] > 1e-3).all()  # every truncated step (and the steps before it in its episode) moved


# --- APPO: final observations reach the targets ---
SMALL = dict(rnn_size=16, hidden_size=16, encoder_mlp_layers=[32, 32], gamma=0.9)


def setup_batch(seed=0, n=6, t=8, use_rnn=True):
    torch.manual_seed(seed)
    cfg = make_cfg(**SMALL, rollout=t, recurrence=t, batch_size=n * t, use_rnn=use_rnn)
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
    exp = random_experience(model, VECTOR_OBS, spaces.Discrete(3), n, t, done_prob=0.0, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    # trajectory 0 truncated at step 2 (final obs kept) and again at step 5 (kept none: V(x_5) stands in);
    # trajectory 3 truncated at step 6
    for row, step in ((0, 2), (0, 5), (3, 6)):
        exp["dones"][row, step] = exp["truncated"][row, step] = 1.0
    exp["final_t"][0], exp["final_t"][3] = 2, 6
    exp["final_obs"] = make_obs(VECTOR_OBS, (n,), g)
    exp["final_rnn"] = torch.randn((n, model.rnn_state_size), generator=g)
    return cfg, model, exp


@pytest.mark.parametrize("use_rnn", [True, False])
def test_final_values_come_from_the_final_observations(use_rnn):
    cfg, model, exp = setup_batch(use_rnn=use_rnn)
    appo = APPO(model, cfg, "cpu")
    values = torch.randn(8, 6)  # [T, n] stand-in for V(x_t)
    out = appo._final_values(exp, values)
    with torch.no_grad():
        direct = model.forward_step({k: v[[0, 3]] for k, v in exp["final_obs"].items()},
                                    exp["final_rnn"][[0, 3]]).values
    assert torch.equal(out[2, 0], direct[0]) and torch.equal(out[6, 3], direct[1])
    mask = torch.ones_like(values, dtype=torch.bool)
    mask[2, 0] = mask[6, 3] = False
    assert torch.equal(out[mask], values[mask])  # elsewhere (the second truncation of row 0 included): V(x_t)


def grads(cfg, model_state, exp):
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
    model.load_state_dict(model_state)
    appo = APPO(model, cfg, "cpu")
    appo._sgd_step(exp, 0)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def copy_batch(exp):
    return {k: copy_batch(v) if isinstance(v, dict) else v.clone() for k, v in exp.items()}


def test_appo_targets_use_the_final_observation_of_truncated_steps_only():
    cfg, model, exp = setup_batch(seed=3)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    base = grads(cfg, state, exp)

    other_final = copy_batch(exp)
    other_final["final_obs"]["obs"][0] += 5.0  # the kept final observation of trajectory 0
    assert not torch.allclose(grads(cfg, state, other_final), base)

    unused = copy_batch(exp)
    unused["final_obs"]["obs"][1] += 5.0  # trajectory 1 kept no final observation (final_t -1): never read
    assert torch.equal(grads(cfg, state, unused), base)

    terminated = copy_batch(exp)
    terminated["truncated"] = torch.zeros_like(exp["truncated"])  # the same ends read as terminations
    assert not torch.allclose(grads(cfg, state, terminated), base)
