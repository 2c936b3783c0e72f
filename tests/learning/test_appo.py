"""APPO.train on synthetic batches: loss decreases, versions and callbacks, lag masking, normalizers."""
import copy
import math

import pytest
import torch
from gymnasium import spaces

from model_test_helpers import DOOM_FULL_ACTIONS, DOOM_FULL_OBS, DOOM_OBS, VECTOR_OBS, make_cfg, random_experience
from sf.learning.appo import APPO, STAT_KEYS
from sf.model.actor_critic import create_actor_critic

SMALL = dict(rnn_size=16, hidden_size=16, encoder_mlp_layers=[32, 32])


def setup(obs_space=VECTOR_OBS, action_space=spaces.Discrete(3), n=8, t=8, seed=0, **overrides):
    torch.manual_seed(seed)
    kw = dict(SMALL, rollout=t, recurrence=t, batch_size=n * t)
    kw.update(overrides)
    cfg = make_cfg(**kw)
    model = create_actor_critic(cfg, obs_space, action_space)
    exp = random_experience(model, obs_space, action_space, n, t, done_prob=0.1, seed=seed)
    return cfg, model, exp


def fixed_target_loss(model, cfg, exp, version):
    """The APPO objective on `exp` with value targets and advantages frozen at their current values."""
    from sf.learning.losses import appo_loss
    from sf.learning.vtrace import vtrace
    n, t = exp["rewards"].shape
    logits, values = model.forward_sequence(exp["obs"], exp["rnn_states"],
                                            torch.nn.functional.pad(exp["dones"], (0, 1)), cfg.recurrence)
    logits, values = logits.transpose(0, 1)[:t], values.transpose(0, 1)
    dist = model.action_distribution(logits)
    lp = dist.log_prob(exp["actions"].transpose(0, 1))
    beh = exp["log_probs"].t()
    if not hasattr(model, "_frozen"):
        model._frozen = vtrace(beh, lp.detach(), exp["rewards"].t(), values[:t].detach(), values[t].detach(),
                               cfg.gamma * (1 - exp["dones"].t()))
    frozen = model._frozen
    return float(appo_loss(lp, beh, frozen.advantages, values[:t], exp["values"].t(), frozen.vs, dist.entropy(),
                           None,
                           clip_ratio=cfg.ppo_clip_ratio, clip_value=cfg.ppo_clip_value,
                           value_loss_coeff=cfg.value_loss_coeff,
                           exploration_loss_coeff=cfg.exploration_loss_coeff)["loss"])


@pytest.mark.parametrize("obs_space,action_space,use_rnn", [
    (VECTOR_OBS, spaces.Discrete(3), True),
    (VECTOR_OBS, spaces.Box(-1, 1, (2,)), False),
    (DOOM_FULL_OBS, DOOM_FULL_ACTIONS, True),
    (DOOM_OBS, spaces.Discrete(5), True),
])
def test_learner_step_decreases_loss_on_the_batch(obs_space, action_space, use_rnn):
    """One APPO.train step lowers the APPO objective of that batch (targets frozen at the pre-step values)."""
    cfg, model, exp = setup(obs_space, action_space, n=6, t=4, use_rnn=use_rnn, learning_rate=3e-4)
    appo = APPO(model, cfg, "cpu")
    model.update_normalizers({k: v[:, :4] for k, v in exp["obs"].items()})  # what train() does first
    with torch.no_grad():
        before = fixed_target_loss(model, cfg, exp, 0)
    # remove the normalizer update effect: train() would merge the same batch a second time
    norm_state = {k: v.clone() for k, v in model.state_dict().items() if "normalizer" in k}
    stats = appo.train(exp, policy_version=0)
    model.load_state_dict({**model.state_dict(), **norm_state})
    with torch.no_grad():
        after = fixed_target_loss(model, cfg, exp, 0)
    assert len(stats) == 1
    assert after < before


@pytest.mark.parametrize("with_vtrace", [True, False])
@pytest.mark.parametrize("use_rnn", [True, False])
def test_many_epochs_fit_the_batch(with_vtrace, use_rnn):
    """Repeated passes over one batch fit it: the loss reported at the last step is well below the first
    (value clipping relaxed so that the critic can reach the targets)."""
    cfg, model, exp = setup(with_vtrace=with_vtrace, use_rnn=use_rnn, learning_rate=1e-2, num_epochs=30,
                            ppo_clip_value=1000.0)
    stats = APPO(model, cfg, "cpu").train(exp, policy_version=0)
    assert len(stats) == 30
    first, last = stats[0], stats[-1]
    assert last["loss"] < 0.85 * first["loss"]
    assert last["value_loss"] < 0.85 * first["value_loss"]


def test_versions_callbacks_and_stats():
    cfg, model, exp = setup(n=12, t=8, num_epochs=2, num_batches_per_epoch=3, batch_size=4 * 8)
    seen = []
    appo = APPO(model, cfg, "cpu")
    stats = appo.train(exp, policy_version=10, on_sgd_step=seen.append)
    assert seen == [11, 12, 13, 14, 15, 16] and appo.last_skipped == 0
    assert [s["policy_version"] for s in stats] == [11.0, 12.0, 13.0, 14.0, 15.0, 16.0]
    for s in stats:
        for k in STAT_KEYS:
            assert isinstance(s[k], float), k
        assert s["num_samples"] == 4 * 8
        assert s["lr"] == pytest.approx(cfg.learning_rate)
        assert s["grad_norm"] > 0
    # the behaviour policy is the learner's: lag = version at each step - 0
    assert [s["lag_min"] for s in stats] == [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    assert stats[0]["kl_divergence"] == pytest.approx(0.0, abs=1e-5)
    assert stats[0]["clip_fraction"] == 0.0


LAG, VERSION = 5, 100
POISON = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e38, -3e38])
N_LAG, T_LAG = 6, 4


def lag_batch(obs_space, action_space, **overrides):
    """A batch at learner version VERSION with max_policy_lag LAG: trajectories 0, 1 at lag exactly LAG
    (valid: the bound is inclusive), 2 at lag 1, 3 with an older prefix (steps 0-1 at lag LAG + 3: masked,
    steps 2-3 at lag LAG), 4 and 5 at lag 2 * LAG (masked whole). Returns cfg, model, exp, masked [N, T]."""
    cfg, model, exp = setup(obs_space, action_space, n=N_LAG, t=T_LAG, max_policy_lag=LAG, **overrides)
    pv = exp["policy_versions"]
    pv[0:2] = VERSION - LAG
    pv[2] = VERSION - 1
    pv[3, :2], pv[3, 2:] = VERSION - LAG - 3, VERSION - LAG
    pv[4:] = VERSION - 2 * LAG
    masked = torch.zeros(N_LAG, T_LAG, dtype=torch.bool)
    masked[3, :2] = True
    masked[4:] = True
    # The RNN runs the batch in segments cut wherever *any* trajectory has an episode end, so the dones of
    # masked trajectories change how valid ones are split into GRU calls: the same math, another float
    # grouping (seen: grad_norm off in the last bit). Trajectory 0 ends an episode at every step: the cuts
    # are every step whatever the masked trajectories' dones are, and varying those changes no float
    # operation of valid samples.
    exp["dones"][0] = 1.0
    return cfg, model, exp, masked


def masked_replacements(exp, masked, action_space, kind, seed):
    """New values for everything a masked sample holds, as {key: full tensor}.

    What only the loss and the stats read (rewards, behaviour log-probs, values and logits, actions) is
    replaced at every masked sample. Inputs of the model's forward (observations, stored RNN states, dones) are
    replaced in the whole-masked trajectories only: in trajectory 3 the masked prefix is the RNN context of
    the valid steps after it, which is legitimately part of their computation.
    kind "other": arbitrary finite values (fresh random draws, unlike the originals);
    kind "poison": NaN, +-inf and +-3e38 in the loss inputs, extreme finite values in the forward inputs (a
    NaN can not go through a forward pass: a weight gradient sums activation * upstream gradient over the batch,
    and 0 * NaN is NaN however exactly the loss masks the upstream gradient)."""
    g = torch.Generator().manual_seed(seed)
    whole = masked.all(1)  # [N]
    out = {}
    for shift, key in enumerate(("rewards", "log_probs", "values", "action_logits")):
        v = exp[key].clone()
        shape = v[masked].shape
        if kind == "poison":  # NaN, both infinities and the largest floats, in a different pattern per key
            v[masked] = POISON.roll(shift).repeat(math.ceil(shape.numel() / len(POISON)))[:shape.numel()].view(shape)
        else:
            v[masked] = torch.randn(shape, generator=g) * 10.0 + 7.0
        out[key] = v
    actions = exp["actions"].clone()
    if isinstance(action_space, spaces.Box):
        new = torch.randn(actions[masked].shape, generator=g) * 10.0
        actions[masked] = new.sign() * 1e6 if kind == "poison" else new
    else:  # valid action indices, shifted by a random non-zero amount: every one differs from the original
        n_act = action_space.n
        shift = torch.randint(1, n_act, actions[masked].shape, generator=g)
        actions[masked] = (actions[masked] + shift) % n_act
    out["actions"] = actions
    obs = {}
    for k, v in exp["obs"].items():
        v = v.clone()
        shape = v[whole].shape
        if v.dtype == torch.uint8:
            v[whole] = (torch.randint(0, 2, shape, generator=g, dtype=torch.uint8) * 255 if kind == "poison"
                        else torch.randint(0, 256, shape, generator=g, dtype=torch.uint8))
        else:
            new = torch.randn(shape, generator=g)
            v[whole] = new.sign() * 1e6 if kind == "poison" else new * 5.0 - 2.0
        obs[k] = v
    out["obs"] = obs
    rnn = exp["rnn_states"].clone()
    new = torch.randn(rnn[whole].shape, generator=g)
    rnn[whole] = new.sign() * 1e6 if kind == "poison" else new * 3.0
    out["rnn_states"] = rnn
    dones = exp["dones"].clone()
    dones[whole] = 1.0 - dones[whole]  # every done of the masked trajectories flipped
    if kind == "poison":
        dones[whole] = 1.0
    out["dones"] = dones
    return out


def one_step(cfg, model, exp):
    """One APPO.train step at VERSION on a copy of `model`: (stats, gradients as the optimizer saw them
    (after clipping; train() leaves them in .grad), weights after the step, returns normalizer buffers)."""
    model = copy.deepcopy(model)
    appo = APPO(model, cfg, "cpu")
    stats = appo.train(copy.deepcopy(exp), policy_version=VERSION)
    assert len(stats) == 1
    grads = [p.grad.clone() for p in appo.params]
    weights = [p.detach().clone() for p in appo.params]
    rn = model.returns_normalizer
    norm = [] if rn is None else [b.clone() for b in (rn.mean, rn.var, rn.count)]
    return stats[0], grads, weights, norm


LOSS_STATS = ("loss", "policy_loss", "value_loss", "entropy", "kl_divergence", "clip_fraction", "grad_norm")
LAG_CASES = pytest.mark.parametrize("obs_space,action_space,overrides", [
    (DOOM_OBS, spaces.Discrete(4), dict()),
    # normalize_input off: train() merges the observations of the whole batch (masked samples included,
    # as documented in sf/learning/appo.py) into the input normalizer, which then normalizes valid samples
    # too; that is input statistics, not the loss, and is out of this test's claim
    (VECTOR_OBS, spaces.Box(-1, 1, (2,)), dict(normalize_input=False, normalize_returns=True, with_vtrace=False)),
], ids=["doom-discrete-vtrace", "vector-box-gae-normalized-returns"])


@LAG_CASES
def test_lag_masking_counted_and_excluded(obs_space, action_space, overrides):
    """Samples older than max_policy_lag are counted in the stats and contribute exactly nothing: the same
    batch (same size, same valid samples) with the masked samples' contents replaced by other finite values,
    or poisoned with NaN/inf, gives bit for bit the same gradient, loss stats, weights after the Adam step
    and returns normalizer, all finite. Exact equality is sound here: the valid samples go through the very
    same float operations (same shapes, same RNN cuts, see lag_batch), and a masked sample only adds exact
    zeros (0 * finite) to the batch sums of the backward pass."""
    cfg, model, exp, masked = lag_batch(obs_space, action_space, **overrides)
    variants = {"original": exp}
    for kind, seed in (("other", 1), ("poison", 2)):
        variants[kind] = {**exp, **masked_replacements(exp, masked, action_space, kind, seed)}
    runs = {name: one_step(cfg, model, e) for name, e in variants.items()}

    # (1) counted: 10 masked samples of 24 (2 of trajectory 3, all 8 of 4 and 5); lag LAG itself is valid
    stats = runs["original"][0]
    assert stats["num_samples"] == 24.0
    assert stats["num_masked"] == 10.0
    assert stats["masked_fraction"] == pytest.approx(10 / 24)
    assert (stats["lag_min"], stats["lag_max"]) == (1.0, 10.0)
    assert stats["lag_avg"] == pytest.approx((8 * 5 + 4 * 1 + 2 * 8 + 2 * 5 + 8 * 10) / 24)
    assert stats["policy_version"] == VERSION + 1  # the 14 valid samples made a step

    # (2) excluded, exactly
    ref_stats, ref_grads, ref_weights, ref_norm = runs["original"]
    assert all(torch.isfinite(g).all() for g in ref_grads)
    assert all(bool((g != 0).any()) for g in ref_grads)  # every parameter gets a gradient: nothing vacuous
    for name in ("other", "poison"):
        s, grads, weights, norm = runs[name]
        for k in ("num_samples", "num_masked", "masked_fraction", "lag_min", "lag_avg", "lag_max", "policy_version"):
            assert s[k] == stats[k], (name, k)
        for k in LOSS_STATS:
            assert s[k] == ref_stats[k], (name, k)  # exact, like the gradient
        for (pname, _), g, g_ref, w, w_ref in zip(model.named_parameters(), grads, ref_grads, weights, ref_weights):
            assert torch.isfinite(g).all() and torch.isfinite(w).all(), (name, pname)
            assert torch.equal(g, g_ref), (name, pname)
            assert torch.equal(w, w_ref), (name, pname)
        for b, b_ref in zip(norm, ref_norm):
            assert torch.isfinite(b).all() and torch.equal(b, b_ref), name


@LAG_CASES
def test_lag_masking_replaced_contents_would_matter_if_valid(obs_space, action_space, overrides):
    """The other half of the test above: with max_policy_lag raised so that nothing is masked, each of the
    replacements it makes changes the gradient (the behaviour logits: the KL statistic, their only use),
    and the poison makes it non-finite (the step is skipped). So the equalities there come from the
    masking, not from inputs that never reach the loss."""
    cfg, model, exp, masked = lag_batch(obs_space, action_space, **overrides)
    cfg = cfg.replace(max_policy_lag=10 ** 6)
    other = masked_replacements(exp, masked, action_space, "other", seed=1)
    ref_stats, ref_grads, _, _ = one_step(cfg, model, exp)
    assert ref_stats["masked_fraction"] == 0.0
    for key, value in other.items():
        s, grads, _, _ = one_step(cfg, model, {**exp, key: value})
        if key == "action_logits":
            assert s["kl_divergence"] != ref_stats["kl_divergence"], key
        else:
            assert any(not torch.equal(g, g_ref) for g, g_ref in zip(grads, ref_grads)), key
    s, _, _, _ = one_step(cfg, model, {**exp, **masked_replacements(exp, masked, action_space, "poison", seed=2)})
    assert not math.isfinite(s["grad_norm"]) and s["policy_version"] == VERSION


@LAG_CASES
def test_lag_masked_trajectories_dropped_gives_the_same_gradient(obs_space, action_space, overrides):
    """Means are over valid samples only (masked ones do not dilute them): dropping the two whole-masked
    trajectories from the batch gives the same gradient. The batches differ in size, so the float sums are
    grouped differently and only agree to rounding: float32 reductions of this size differ by ~1e-7
    relative (measured <= 4e-8 norm-wise over 20 seeds), hence a norm-wise relative bound of 1e-5 on
    the whole gradient vector (elementwise relative checks would be meaningless for elements near zero);
    a mean over all 24 samples instead of the 14 valid ones would be off by ~40%. The gradient is compared,
    not the weights after Adam, whose first step is ~lr * sign(gradient) and turns rounding noise of a
    near-zero element into a full lr-sized difference."""
    # no gradient clipping here: it rescales both gradients to the same norm and would hide a wrong scale
    cfg, model, exp, masked = lag_batch(obs_space, action_space, max_grad_norm=0.0, **overrides)
    keep = ~masked.all(1)
    fresh = {k: ({kk: vv[keep] for kk, vv in v.items()} if isinstance(v, dict) else v[keep]) for k, v in exp.items()}
    cfg_fresh = cfg.replace(batch_size=int(keep.sum()) * T_LAG)
    s_mixed, g_mixed, _, _ = one_step(cfg, model, exp)
    s_fresh, g_fresh, _, _ = one_step(cfg_fresh, model, fresh)
    assert s_fresh["num_masked"] == 2.0 and s_fresh["masked_fraction"] == pytest.approx(2 / 16)
    a, b = torch.cat([g.flatten() for g in g_mixed]), torch.cat([g.flatten() for g in g_fresh])
    assert torch.isfinite(a).all()
    assert float((a - b).norm()) <= 1e-5 * float(b.norm())
    # means of positive terms and a norm (no cancellation): relative rounding <= 24 * 2**-24 ~ 1.4e-6
    for k in ("value_loss", "entropy", "grad_norm"):
        assert s_mixed[k] == pytest.approx(s_fresh[k], rel=1e-5), k


def test_fully_masked_minibatch_does_not_step():
    cfg, model, exp = setup(max_policy_lag=3)
    before = copy.deepcopy(model.state_dict())
    seen = []
    appo = APPO(model, cfg, "cpu")
    stats = appo.train(exp, policy_version=50, on_sgd_step=seen.append)
    assert seen == [] and stats[0]["masked_fraction"] == 1.0 and stats[0]["policy_version"] == 50.0
    assert appo.last_skipped == 1 and set(stats[0]) == set(STAT_KEYS)  # counted, and not among the step's stats
    for k, v in model.named_parameters():
        assert torch.equal(v, before[k]), k


def test_input_normalizer_updated_by_train():
    cfg, model, exp = setup()
    norm = model.encoder.obs_normalizer
    assert float(norm.count) == 0
    APPO(model, cfg, "cpu").train(exp, 0)
    n, t = exp["rewards"].shape
    assert float(norm.count) == n * t  # steps 0..T-1 of every trajectory
    torch.testing.assert_close(norm.mean, exp["obs"]["obs"][:, :t].reshape(-1, 10).mean(0), rtol=1e-4, atol=1e-4)


def test_input_normalizer_learns_only_the_steps_this_policy_acted():
    """Populations and multi-agent envs (experience["own"]): the steps another policy acted, or none did (an inactive
    agent's zero observations), stay out of the input statistics; here they are poisoned, and the normalizer holds the
    own steps' mean and variance (the naive oracle: select them and take their moments)."""
    cfg, model, exp = setup()
    n, t = exp["rewards"].shape
    own = torch.rand(n, t, generator=torch.Generator().manual_seed(5)) < 0.6
    obs = exp["obs"]["obs"].clone()
    obs[:, :t][~own] = float("nan")
    obs[:, :t][~own.roll(1, 0) & ~own] = 0.0  # some of them zeros, as an inactive agent's
    APPO(model, cfg, "cpu").train({**exp, "obs": {"obs": obs}, "own": own}, 0)
    norm = model.encoder.obs_normalizer
    selected = exp["obs"]["obs"][:, :t][own].double()
    assert float(norm.count) == int(own.sum())
    torch.testing.assert_close(norm.mean.double(), selected.mean(0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm.var.double(), selected.var(0, unbiased=False), rtol=1e-5, atol=1e-6)


def test_normalize_returns_trains_on_normalized_targets():
    cfg, model, exp = setup(normalize_returns=True, learning_rate=3e-3, num_epochs=30, with_vtrace=False,
                            ppo_clip_value=1000.0)
    exp["rewards"] = exp["rewards"] * 100.0 + 500.0
    stats = APPO(model, cfg, "cpu").train(exp, 0)
    rn = model.returns_normalizer
    assert float(rn.count) > 0 and float(rn.mean) > 100.0
    assert "returns_normalizer.mean" in model.state_dict()
    assert stats[-1]["value_loss"] < 0.5 * stats[0]["value_loss"]
    assert all(torch.isfinite(torch.tensor(s["loss"])) for s in stats)


def test_adam_settings():
    cfg, model, _ = setup(learning_rate=2e-4, adam_beta1=0.8, adam_beta2=0.99, adam_eps=1e-5)
    opt = APPO(model, cfg, "cpu").optimizer
    assert isinstance(opt, torch.optim.Adam)
    g = opt.param_groups[0]
    assert g["lr"] == 2e-4 and g["betas"] == (0.8, 0.99) and g["eps"] == 1e-5


@pytest.mark.parametrize("sync_free", [False, True], ids=["host", "sync_free"])
def test_nonfinite_gradient_skips_the_step(sync_free):
    """The step is skipped, and counted as skipped (APPO.last_skipped: the run's Done line and train/skipped_steps):
    by the host, the version staying; sync-free (CUDA's path, forced here on the CPU), by the optimizer on the device,
    the version advancing with the weights unchanged."""
    cfg, model, exp = setup(num_batches_per_epoch=2, batch_size=4 * 8)
    exp["rewards"][:, 0] = float("nan")  # a valid sample with a NaN reward in every trajectory: both minibatches
    before = copy.deepcopy(model.state_dict())
    seen = []
    appo = APPO(model, cfg, "cpu")
    appo.sync_free = sync_free
    stats = appo.train(exp, policy_version=0, on_sgd_step=seen.append)
    assert seen == ([1, 2] if sync_free else []) and stats[-1]["policy_version"] == len(seen)
    assert appo.last_skipped == 2 and set(stats[0]) == set(STAT_KEYS)
    assert not torch.isfinite(torch.tensor(stats[0]["grad_norm"]))
    for k, v in model.named_parameters():
        assert torch.equal(v, before[k]), k


@LAG_CASES
def test_steps_of_another_policy_are_masked_exactly(obs_space, action_space, overrides):
    """Populations: a trajectory slot holds steps another policy acted after it took the agent over (mb["own"] False).
    The same samples as the lag test above, masked by ownership instead of lag (which masks nothing here): their
    contents, replaced or poisoned, change nothing bit for bit; they are counted as masked; the lag statistics are
    those of the own samples only."""
    cfg, model, exp, masked = lag_batch(obs_space, action_space, **overrides)
    cfg = cfg.replace(max_policy_lag=10 ** 6)
    own = ~masked
    runs = {name: one_step(cfg, model, {**e, "own": own}) for name, e in (
        ("original", exp), ("other", {**exp, **masked_replacements(exp, masked, action_space, "other", 1)}),
        ("poison", {**exp, **masked_replacements(exp, masked, action_space, "poison", 2)}))}
    stats, ref_grads, ref_weights, _ = runs["original"]
    assert (stats["num_samples"], stats["num_masked"]) == (24.0, 10.0)
    lags = (VERSION - exp["policy_versions"])[own].float()
    assert (stats["lag_min"], stats["lag_max"]) == (lags.min().item(), lags.max().item())
    assert all(bool((g != 0).any()) for g in ref_grads)
    for name in ("other", "poison"):
        s, grads, weights, _ = runs[name]
        for k in LOSS_STATS:
            assert s[k] == stats[k], (name, k)
        assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads)), name
        assert all(torch.equal(w, r) for w, r in zip(weights, ref_weights)), name
    unmasked, _, _, _ = one_step(cfg, model, {**exp, **masked_replacements(exp, masked, action_space, "other", 1)})
    assert unmasked["loss"] != stats["loss"]  # without the mask the replaced samples do count
