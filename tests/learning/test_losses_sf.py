"""Sample Factory's loss options and LAMB, each against an oracle written from its definition (float64, loops over
samples): --exploration_loss symmetric_kl (symmetric KL of each categorical head from the uniform distribution),
--kl_loss_coeff (KL(pi || mu) of the current policy from the behaviour policy), --optimizer lamb (one and several
steps), --value_bootstrap (what a truncated step's target is)."""
import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from model_test_helpers import VECTOR_OBS, make_cfg, random_experience
from sf.learning.appo import APPO
from sf.learning.gae import gae
from sf.learning.losses import SYMMETRIC_KL_MAX, appo_loss, kl_loss, symmetric_kl_loss, symmetric_kl_with_uniform
from sf.learning.optimizers import Lamb
from sf.learning.vtrace import truncation_bootstrap, vtrace
from sf.model.action_spaces import action_distribution
from sf.model.actor_critic import create_actor_critic

SMALL = dict(rnn_size=16, hidden_size=16, encoder_mlp_layers=[32, 32])


def log_softmax_np(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - m - math.log(np.exp(x - m).sum())


def naive_symmetric_kl(logits, heads, allowed=None):
    """0.5 (KL(p || u) + KL(u || p)) per head, u uniform over the head's (allowed) actions, summed over the heads; one
    sample (a [L] vector) at a time."""
    total, start = 0.0, 0
    for h, k in enumerate(heads):
        lp = log_softmax_np(logits[start:start + k])
        ok = np.ones(k, bool) if allowed is None else np.asarray(allowed[start:start + k], bool)
        if not ok.any():
            ok[:] = True
        u = 1.0 / ok.sum()
        kl_pu = sum(math.exp(lp[a]) * (lp[a] - math.log(u)) for a in range(k) if ok[a])
        kl_up = sum(u * (math.log(u) - lp[a]) for a in range(k) if ok[a])
        total += 0.5 * (kl_pu + kl_up)
        start += k
    return total


@pytest.mark.parametrize("space", [spaces.Discrete(5), spaces.MultiDiscrete([3, 2, 21])])
def test_symmetric_kl_equals_its_definition(space):
    heads = [int(space.n)] if isinstance(space, spaces.Discrete) else [int(n) for n in space.nvec]
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 4, sum(heads), generator=g) * 3.0
    logits[0, 0, :heads[0]] = torch.tensor([40.0] + [0.0] * (heads[0] - 1))  # a nearly deterministic head
    logits[0, 1] = 0.0  # uniform: 0
    got = symmetric_kl_with_uniform(action_distribution(space, logits).log_probs_per_head)
    want = [[naive_symmetric_kl(logits[t, b].tolist(), heads) for b in range(4)] for t in range(6)]
    np.testing.assert_allclose(got.numpy(), np.array(want), rtol=1e-5, atol=1e-6)
    assert float(got[0, 1]) == pytest.approx(0.0, abs=1e-6)


def test_symmetric_kl_with_action_masks_is_over_the_allowed_actions():
    """With masks (the model gives masked actions the logit MASKED_LOGIT), the uniform prior is over the allowed
    actions; a head with none allowed counts them all."""
    from sf.model.action_spaces import MASKED_LOGIT
    space = spaces.MultiDiscrete([4, 3])
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 7, generator=g)
    allowed = torch.rand(5, 7, generator=g) > 0.4
    allowed[0, 4:] = False  # every action of the second head masked
    masked = torch.where(allowed, logits, torch.full_like(logits, MASKED_LOGIT))
    dist = action_distribution(space, masked)
    got = symmetric_kl_with_uniform(dist.log_probs_per_head, list(torch.split(masked != MASKED_LOGIT, [4, 3], -1)))
    want = [naive_symmetric_kl(masked[i].tolist(), [4, 3], allowed[i].tolist()) for i in range(5)]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    assert torch.isfinite(got).all()


def test_symmetric_kl_loss_is_sample_factorys_mean_clamped_and_finite():
    x = torch.tensor([1.0, 2.0, 100.0, float("nan")])
    valid = torch.tensor([True, True, False, False])
    assert float(symmetric_kl_loss(x, valid)) == pytest.approx(1.5)
    assert float(symmetric_kl_loss(x, torch.tensor([True, True, True, False]))) == SYMMETRIC_KL_MAX  # clamped
    assert float(symmetric_kl_loss(torch.tensor([float("inf"), 1.0]))) == 0.0  # not finite: 0


def loss_inputs(seed=0, T=5, B=4, L=3):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    logits = r(T, B, L).requires_grad_()
    behaviour = r(T, B, L)
    actions = torch.randint(0, L, (T, B, 1), generator=g)
    valid = torch.rand(T, B, generator=g) > 0.3
    behaviour[~valid] = 1e3 * torch.sign(behaviour[~valid])  # masked steps: extreme values, which must not count
    return logits, behaviour, actions, valid, r(T, B), r(T, B), r(T, B), r(T, B)


def naive_kl(new_logits, old_logits):
    p, q = log_softmax_np(new_logits), log_softmax_np(old_logits)
    return float(sum(math.exp(p[a]) * (p[a] - q[a]) for a in range(len(p))))


def test_kl_loss_term_is_coeff_times_the_mean_kl_of_the_policy_from_the_behaviour_policy():
    logits, behaviour, actions, valid, adv, values, beh_values, targets = loss_inputs()
    space = spaces.Discrete(3)
    dist, beh = action_distribution(space, logits), action_distribution(space, behaviour)
    lp, blp = dist.log_prob(actions), beh.log_prob(actions)
    kl = dist.kl_divergence(beh)
    kw = dict(clip_ratio=0.2, clip_value=1.0, value_loss_coeff=0.5, exploration_loss_coeff=0.003)
    without = appo_loss(lp, blp, adv, values, beh_values, targets, dist.entropy(), valid, **kw)
    with_kl = appo_loss(lp, blp, adv, values, beh_values, targets, dist.entropy(), valid, **kw, kl=kl,
                        kl_loss_coeff=0.1)
    T, B = valid.shape
    naive = np.mean([naive_kl(logits[t, b].tolist(), behaviour[t, b].tolist())
                     for t in range(T) for b in range(B) if valid[t, b]])
    assert float(with_kl["kl_loss"]) == pytest.approx(0.1 * naive, rel=1e-9)
    assert float((with_kl["loss"] - without["loss"]).detach()) == pytest.approx(0.1 * naive, rel=1e-9)
    assert float(kl_loss(kl, valid).detach()) == pytest.approx(naive, rel=1e-9)
    with_kl["loss"].backward()  # the penalty has a gradient, none at masked steps
    assert torch.isfinite(logits.grad).all() and logits.grad[~valid].abs().sum() == 0


def test_symmetric_kl_exploration_term_replaces_the_entropy_bonus():
    logits, behaviour, actions, valid, adv, values, beh_values, targets = loss_inputs(seed=2)
    dist = action_distribution(spaces.Discrete(3), logits)
    lp, blp = dist.log_prob(actions), action_distribution(spaces.Discrete(3), behaviour).log_prob(actions)
    kw = dict(clip_ratio=0.2, clip_value=1.0, value_loss_coeff=0.5, normalize_advantage=True)
    sym = symmetric_kl_with_uniform(dist.log_probs_per_head)
    none = appo_loss(lp, blp, adv, values, beh_values, targets, dist.entropy(), valid, exploration_loss_coeff=0.0, **kw)
    ent = appo_loss(lp, blp, adv, values, beh_values, targets, dist.entropy(), valid, exploration_loss_coeff=0.01, **kw)
    skl = appo_loss(lp, blp, adv, values, beh_values, targets, dist.entropy(), valid, exploration_loss_coeff=0.01,
                    symmetric_kl=sym, **kw)
    T, B = valid.shape
    naive = np.mean([naive_symmetric_kl(logits[t, b].tolist(), [3]) for t in range(T) for b in range(B) if valid[t, b]])
    entropy = np.mean([-sum(math.exp(x) * x for x in log_softmax_np(logits[t, b].tolist()))
                       for t in range(T) for b in range(B) if valid[t, b]])
    assert float((skl["loss"] - none["loss"]).detach()) == pytest.approx(0.01 * naive, rel=1e-9)
    assert float(skl["exploration_loss"]) == pytest.approx(0.01 * naive, rel=1e-9)
    assert float((ent["loss"] - none["loss"]).detach()) == pytest.approx(-0.01 * entropy, rel=1e-9)
    assert float(none["exploration_loss"]) == 0.0


def naive_gaussian_kl(new_logits, old_logits):
    """KL(N(m1, s1) || N(m2, s2)) summed over the dimensions; logits = [means, log-stds] (clamped as the model's)."""
    from sf.model.action_spaces import LOG_STD_MAX, LOG_STD_MIN
    d = len(new_logits) // 2
    total = 0.0
    for i in range(d):
        m1, m2 = new_logits[i], old_logits[i]
        s1 = math.exp(min(max(new_logits[d + i], LOG_STD_MIN), LOG_STD_MAX))
        s2 = math.exp(min(max(old_logits[d + i], LOG_STD_MIN), LOG_STD_MAX))
        total += math.log(s2 / s1) + (s1 * s1 + (m1 - m2) ** 2) / (2 * s2 * s2) - 0.5
    return total


@pytest.mark.parametrize("space", [spaces.Discrete(4), spaces.Box(-1, 1, (2,))])
def test_appo_applies_the_kl_penalty_and_reports_it(space):
    """APPO's SGD step on a batch acted by another policy: the reported KL is KL(pi || mu) from the model's logits and
    the stored behaviour logits (naive oracle), the kl_loss stat is coeff x it, and the penalty changes the gradient
    (continuous actions: Sample Factory's MuJoCo settings use --kl_loss_coeff 0.1)."""
    torch.manual_seed(0)
    cfg = make_cfg(**SMALL, rollout=6, recurrence=6, batch_size=36, use_rnn=False, kl_loss_coeff=0.1)
    model = create_actor_critic(cfg, VECTOR_OBS, space)
    other = create_actor_critic(cfg, VECTOR_OBS, space)
    with torch.no_grad():
        for p in other.action_heads.parameters():
            p.normal_(0, 0.5)
    exp = random_experience(other, VECTOR_OBS, space, 6, 6, seed=3)  # behaviour: another policy
    with torch.no_grad():
        logits, _ = model.forward_sequence(exp["obs"], exp["rnn_states"], torch.nn.functional.pad(exp["dones"], (0, 1)),
                                           cfg.recurrence)
    oracle = naive_kl if isinstance(space, spaces.Discrete) else naive_gaussian_kl
    naive = np.mean([oracle(logits[b, t].tolist(), exp["action_logits"][b, t].tolist())
                     for b in range(6) for t in range(6)])
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def grads(coeff):
        model.load_state_dict(state)
        appo = APPO(model, make_cfg(**SMALL, rollout=6, recurrence=6, batch_size=36, use_rnn=False,
                                    kl_loss_coeff=coeff), "cpu")
        stats, _, kl = appo._sgd_step(exp, 0)
        return stats, kl, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    stats, kl, g_kl = grads(0.1)
    stats0, _, g0 = grads(0.0)
    assert stats["kl_divergence"] == pytest.approx(naive, rel=1e-4)
    assert stats0["kl_divergence"] == stats["kl_divergence"]
    assert stats["kl_loss"] == pytest.approx(0.1 * naive, rel=1e-4) and stats0["kl_loss"] == 0.0
    assert kl is None  # (a constant schedule measures no KL for itself)
    assert not torch.allclose(g_kl, g0)
    # steps masked out (too old) whose stored behaviour logits are NaN: no NaN in the KL, its penalty or the gradient
    exp["policy_versions"][:2] = -1000
    exp["action_logits"][:2] = float("nan")
    stats, _, g_nan = grads(0.1)
    assert math.isfinite(stats["kl_divergence"]) and math.isfinite(stats["kl_loss"]) and torch.isfinite(g_nan).all()


# --- LAMB -----------------------------------------------------------------------------------------------------------
def naive_lamb(params, grads_per_step, lr, betas, eps, weight_decay=1e-4, min_trust=0.01):
    """LAMB from the formula (Sample Factory's Lamb, bias correction on): float64 numpy, one tensor at a time."""
    b1, b2 = betas
    params = [np.array(p, dtype=np.float64) for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t, grads in enumerate(grads_per_step, start=1):
        for i, (p, g) in enumerate(zip(params, grads)):
            g = np.asarray(g, dtype=np.float64)
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            u = (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i]) / math.sqrt(1 - b2 ** t) + eps) + weight_decay * p
            wn, un = np.linalg.norm(p), np.linalg.norm(u)
            trust = 1.0 if wn == 0 or un == 0 else min(max(min(wn, 10.0) / un, min_trust), 1.0 / min_trust)
            params[i] = p - lr * trust * u
    return params


@pytest.mark.parametrize("steps", [1, 4])
def test_lamb_matches_the_formula(steps):
    """Tensors of ordinary, tiny and large norm (the trust ratio clipped to [min_trust, 1/min_trust], the weight norm
    capped at 10) and a zero one (trust 1), gradients of several scales."""
    g = torch.Generator().manual_seed(0)
    init = [torch.randn(5, 3, generator=g), torch.randn(4, generator=g) * 1e-4, torch.randn(6, 2, generator=g) * 30.0,
            torch.zeros(3)]
    grads = [[torch.randn(p.shape, generator=g) * 10.0 ** (i - 2) for i, p in enumerate(init)] for _ in range(steps)]
    params = [torch.nn.Parameter(p.clone()) for p in init]
    opt = Lamb(params, lr=3e-3, betas=(0.9, 0.99), eps=1e-6)
    for step_grads in grads:
        for p, gr in zip(params, step_grads):
            p.grad = gr.clone()
        opt.step()
    want = naive_lamb([p.numpy() for p in init], [[gr.numpy() for gr in s] for s in grads], 3e-3, (0.9, 0.99), 1e-6)
    for p, w in zip(params, want):
        np.testing.assert_allclose(p.detach().numpy(), w, rtol=2e-5, atol=1e-7)
    assert all(not torch.equal(p, q) for p, q in zip(params, init))
    assert opt.state[params[0]]["step"] == steps + 1  # (Sample Factory's counter: the next step's t)


def test_lamb_state_survives_a_weights_only_checkpoint(tmp_path):
    p = torch.nn.Parameter(torch.randn(3))
    opt = Lamb([p], lr=1e-3)
    p.grad = torch.ones(3)
    opt.step()
    torch.save(opt.state_dict(), tmp_path / "o.pt")
    q = torch.nn.Parameter(p.detach().clone())
    again = Lamb([q], lr=1e-3)
    again.load_state_dict(torch.load(tmp_path / "o.pt", weights_only=True))
    p.grad, q.grad = torch.full((3,), 0.5), torch.full((3,), 0.5)
    opt.step(), again.step()
    assert torch.equal(p, q)


# --- value_bootstrap --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("with_vtrace", [True, False])
def test_value_bootstrap_decides_what_follows_a_truncation(with_vtrace):
    """True: a truncated step is bootstrapped from V(final observation) (reward + gamma V(x')); False: it is a
    termination (nothing after it). Both against V-trace / GAE called with exactly those inputs."""
    torch.manual_seed(0)
    T, n = 8, 4
    targets = {}
    for vb in (True, False):
        cfg = make_cfg(**SMALL, rollout=T, recurrence=T, batch_size=T * n, use_rnn=False, with_vtrace=with_vtrace,
                       value_bootstrap=vb, gamma=0.9)
        torch.manual_seed(0)
        model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
        exp = random_experience(model, VECTOR_OBS, spaces.Discrete(3), n, T, done_prob=0.0, seed=1)
        exp["dones"][1, 3] = exp["truncated"][1, 3] = 1.0
        exp["final_t"][1] = 3
        appo = APPO(model, cfg, "cpu")
        with torch.no_grad():
            _, values = model.forward_sequence(exp["obs"], exp["rnn_states"],
                                               torch.nn.functional.pad(exp["dones"], (0, 1)), T)
            values = values.transpose(0, 1)
            behaviour = model.action_distribution(exp["action_logits"].transpose(0, 1))
            lp = behaviour.log_prob(exp["actions"].transpose(0, 1))
            final_v = model.forward_step({k: v[[1]] for k, v in exp["final_obs"].items()}, exp["final_rnn"][[1]]).values
        valid = torch.ones(T, n, dtype=torch.bool)
        got, _, _ = appo._targets(exp, values, lp, exp["log_probs"].t(), valid, False)
        boot = None
        if vb:
            final = torch.zeros(T, n)
            final[3, 1] = final_v[0]
            boot = truncation_bootstrap(exp["truncated"].t(), final, cfg.gamma)
        discounts = cfg.gamma * (1.0 - exp["dones"].t())
        if with_vtrace:
            want = vtrace(exp["log_probs"].t(), lp, exp["rewards"].t(), values[:T], values[T], discounts,
                          truncation_bootstrap=boot).vs
        else:
            want = gae(exp["rewards"].t(), values[:T], values[T], discounts, cfg.gae_lambda,
                       truncation_bootstrap=boot).returns
        torch.testing.assert_close(got, want)
        targets[vb] = got
    # only the truncated trajectory's steps up to the truncation differ
    differ = (targets[True] - targets[False]).abs() > 1e-6
    assert differ[3, 1] and not differ[:, [0, 2, 3]].any() and not differ[4:, 1].any()
    assert float(targets[True][3, 1] - targets[False][3, 1]) == pytest.approx(0.9 * float(final_v[0]), rel=1e-5)
