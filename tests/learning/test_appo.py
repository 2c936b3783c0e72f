"""APPO.train on synthetic batches: loss decreases, versions and callbacks, lag masking, normalizers."""
import copy

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
    logits, values = model.forward_sequence(exp["obs"], exp["rnn_states"], torch.nn.functional.pad(exp["dones"], (0, 1)),
                                            cfg.recurrence)
    logits, values = logits.transpose(0, 1)[:t], values.transpose(0, 1)
    dist = model.action_distribution(logits)
    lp = dist.log_prob(exp["actions"].transpose(0, 1))
    beh = exp["log_probs"].t()
    if not hasattr(model, "_frozen"):
        model._frozen = vtrace(beh, lp.detach(), exp["rewards"].t(), values[:t].detach(), values[t].detach(),
                               cfg.gamma * (1 - exp["dones"].t()))
    vs, adv = model._frozen
    return float(appo_loss(lp, beh, adv, values[:t], exp["values"].t(), vs, dist.entropy(), None,
                           clip_ratio=cfg.ppo_clip_ratio, clip_value=cfg.ppo_clip_value,
                           value_loss_coeff=cfg.value_loss_coeff, exploration_loss_coeff=cfg.exploration_loss_coeff)["loss"])


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
    stats = APPO(model, cfg, "cpu").train(exp, policy_version=10, on_sgd_step=seen.append)
    assert seen == [11, 12, 13, 14, 15, 16]
    assert [s["policy_version"] for s in stats] == [11.0, 12.0, 13.0, 14.0, 15.0, 16.0]
    for s in stats:
        for k in STAT_KEYS:
            assert isinstance(s[k], float), k
        assert s["num_samples"] == 4 * 8
        assert s["learning_rate"] == pytest.approx(cfg.learning_rate)
        assert s["grad_norm"] > 0
    # the behaviour policy is the learner's: lag = version at each step - 0
    assert [s["lag_min"] for s in stats] == [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    assert stats[0]["kl_divergence"] == pytest.approx(0.0, abs=1e-5)
    assert stats[0]["clip_fraction"] == 0.0


def test_lag_masking_counted_and_excluded():
    """Trajectories older than max_policy_lag (filled with NaN garbage) contribute nothing: the update
    equals training on the fresh trajectories alone."""
    cfg, model, exp = setup(DOOM_OBS, spaces.Discrete(4), n=6, t=4, max_policy_lag=5, learning_rate=1e-3)
    fresh = {k: ({kk: vv[:4] for kk, vv in v.items()} if isinstance(v, dict) else v[:4]) for k, v in exp.items()}
    stale = exp
    stale["policy_versions"][:4] = 95  # lag 5 at version 100: valid
    stale["policy_versions"][4:] = 90  # lag 10 > 5: masked
    for k in ("rewards", "log_probs", "values"):
        stale[k][4:] = float("nan")
    stale["action_logits"][4:] = float("nan")
    fresh["policy_versions"] = stale["policy_versions"][:4].clone()

    model_b = copy.deepcopy(model)
    s_mixed = APPO(model, cfg, "cpu").train(stale, policy_version=100)[0]
    cfg_b = copy.deepcopy(cfg)
    cfg_b.batch_size = 4 * 4
    s_fresh = APPO(model_b, cfg_b, "cpu").train(fresh, policy_version=100)[0]

    assert s_mixed["num_masked"] == 2 * 4
    assert s_mixed["masked_fraction"] == pytest.approx(8 / 24)
    assert (s_mixed["lag_min"], s_mixed["lag_max"]) == (5.0, 10.0)
    assert s_mixed["lag_avg"] == pytest.approx((16 * 5 + 8 * 10) / 24)
    assert s_fresh["masked_fraction"] == 0.0
    for k in ("loss", "policy_loss", "value_loss", "entropy", "kl_divergence", "grad_norm"):
        assert s_mixed[k] == pytest.approx(s_fresh[k], rel=1e-4, abs=1e-6), k
    for (name, p), q in zip(model.named_parameters(), model_b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_fully_masked_minibatch_does_not_step():
    cfg, model, exp = setup(max_policy_lag=3)
    before = copy.deepcopy(model.state_dict())
    seen = []
    stats = APPO(model, cfg, "cpu").train(exp, policy_version=50, on_sgd_step=seen.append)
    assert seen == [] and stats[0]["masked_fraction"] == 1.0 and stats[0]["policy_version"] == 50.0
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


def test_nonfinite_gradient_skips_the_step():
    cfg, model, exp = setup()
    exp["rewards"][0, 0] = float("nan")  # a valid sample with a NaN reward
    before = copy.deepcopy(model.state_dict())
    seen = []
    stats = APPO(model, cfg, "cpu").train(exp, policy_version=0, on_sgd_step=seen.append)
    assert seen == [] and stats[0]["policy_version"] == 0.0
    assert not torch.isfinite(torch.tensor(stats[0]["grad_norm"]))
    for k, v in model.named_parameters():
        assert torch.equal(v, before[k]), k
