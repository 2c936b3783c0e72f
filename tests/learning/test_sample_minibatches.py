"""--sample_minibatches: minibatches of single samples with the batch's GAE targets, against a naive oracle written from
the definitions (GAE per trajectory from the behaviour values, then per sample: the clipped PPO surrogate on advantages
normalized over the minibatch, the clipped value loss, the entropy bonus, one Adam step)."""
import copy
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from model_test_helpers import VECTOR_OBS, make_cfg, random_experience
from sf.cfg import ConfigError, parse_cfg
from sf.learning.appo import APPO
from sf.learning.sample_minibatches import TARGET_KEYS, sample_minibatch
from sf.model.actor_critic import create_actor_critic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_vtrace_gae import gae_oracle  # noqa: E402

N, T = 6, 5
SMALL = dict(hidden_size=16, encoder_mlp_layers=[32, 32], use_rnn=False, with_vtrace=False, rollout=T, recurrence=1)


def _setup(**overrides):
    torch.manual_seed(0)
    cfg = make_cfg(**{**SMALL, "sample_minibatches": True, "num_epochs": 2, "num_batches_per_epoch": 4,
                      "batch_size": T, "normalize_input": False, "learning_rate": 3e-3, **overrides})
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
    exp = random_experience(model, VECTOR_OBS, model.action_space, N, T, done_prob=0.2, seed=1)
    return cfg, model, exp


def _oracle_train(cfg, model, exp, perm_generator) -> torch.nn.Module:
    """The weights after cfg.num_epochs epochs of cfg.num_batches_per_epoch minibatches of samples, computed naively
    (perm_generator: the samples' order; None: storage order)."""
    ref = copy.deepcopy(model)
    opt = torch.optim.Adam(ref.parameters(), lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                           eps=cfg.adam_eps)
    with torch.no_grad():
        boot = ref.forward_step({"obs": exp["obs"]["obs"][:, T]}, exp["rnn_states"][:, T]).values
    adv, ret = gae_oracle(exp["rewards"].t().numpy(), exp["values"].t().numpy(), boot.numpy(),
                          (cfg.gamma * (1 - exp["dones"])).t().numpy(), cfg.gae_lambda)  # [T, N]
    eps = cfg.ppo_clip_ratio
    for _ in range(cfg.num_epochs):
        perm = torch.randperm(N * T, generator=perm_generator).tolist() if perm_generator else list(range(N * T))
        for chunk in np.array_split(perm, cfg.num_batches_per_epoch):
            samples = [(s // T, s % T) for s in chunk]
            a = np.array([adv[t, i] for i, t in samples])
            a = (a - a.mean()) / (math.sqrt(((a - a.mean()) ** 2).mean()) + 1e-8)
            policy, value, entropy = 0.0, 0.0, 0.0
            for (i, t), a_s in zip(samples, a):
                out = ref.forward_step({"obs": exp["obs"]["obs"][i, t:t + 1]}, exp["rnn_states"][i, t:t + 1])
                logp = torch.log_softmax(out.action_logits[0], -1)
                ratio = torch.exp(logp[exp["actions"][i, t]].squeeze() - exp["log_probs"][i, t])
                policy = policy - torch.min(ratio * a_s, torch.clamp(ratio, 1 / (1 + eps), 1 + eps) * a_s)
                v, old, r = out.values[0], exp["values"][i, t], float(ret[t, i])
                v_clip = old + torch.clamp(v - old, -cfg.ppo_clip_value, cfg.ppo_clip_value)
                value = value + torch.max((v - r) ** 2, (v_clip - r) ** 2)
                entropy = entropy - (logp.exp() * logp).sum()
            m = len(samples)
            loss = policy / m + cfg.value_loss_coeff * value / m - cfg.exploration_loss_coeff * entropy / m
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), cfg.max_grad_norm)
            opt.step()
    return ref


@pytest.mark.parametrize("shuffle", [True, False])
def test_training_on_samples_is_the_naive_oracle(shuffle):
    """With --shuffle_minibatches False the samples are taken in storage order (Sample Factory's contiguous slices)."""
    cfg, model, exp = _setup(shuffle_minibatches=shuffle)
    appo = APPO(model, cfg, "cpu")
    generator = torch.Generator()
    generator.set_state(appo.generator.get_state())
    ref = _oracle_train(cfg, model, exp, generator if shuffle else None)
    stats = appo.train(exp, policy_version=0)
    assert [s["num_samples"] for s in stats] == [8, 8, 7, 7] * 2  # 30 samples in 4 minibatches, twice
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
    # the oracle is not vacuous: training on whole trajectories (4 minibatches of 2 or 1) ends elsewhere
    cfg2, model2, exp2 = _setup(sample_minibatches=False, shuffle_minibatches=shuffle)
    APPO(model2, cfg2, "cpu").train(exp2, policy_version=0)
    assert max(float((p - q).detach().abs().max()) for p, q in zip(model2.parameters(), ref.parameters())) > 1e-3


def test_a_minibatch_of_samples_holds_each_sample_own_step():
    cfg, model, exp = _setup()
    targets = {k: torch.randn(N, T) for k in TARGET_KEYS}
    idx = torch.tensor([0, 4, 5, 29, 13])
    mb = sample_minibatch(exp, targets, idx)
    assert "final_obs" not in mb and "final_t" not in mb
    for j, s in enumerate(idx.tolist()):
        i, t = divmod(s, T)
        assert torch.equal(mb["obs"]["obs"][j, 0], exp["obs"]["obs"][i, t])  # [N, T+1] keys: step t, not s's row
        assert torch.equal(mb["rnn_states"][j, 0], exp["rnn_states"][i, t])
        assert torch.equal(mb["actions"][j, 0], exp["actions"][i, t])
        for k in ("log_probs", "values", "rewards", "dones", "policy_versions"):
            assert mb[k][j, 0] == exp[k][i, t], k
        for k in TARGET_KEYS:
            assert mb[k][j, 0] == targets[k][i, t], k
    assert mb["obs"]["obs"].shape == (5, 1, 10) and mb["rewards"].shape == (5, 1)


@pytest.mark.parametrize("flags", [["--use_rnn", "True"], ["--with_vtrace", "True"]])
def test_sample_minibatches_need_a_feed_forward_policy_with_gae(tmp_path, flags):
    base = ["--env", "test_corridor", "--train_dir", str(tmp_path), "--sample_minibatches", "True", "--use_rnn",
            "False", "--with_vtrace", "False"]
    parse_cfg(base, mode="train")  # accepted as it is
    with pytest.raises(ConfigError) as e:
        parse_cfg(base + flags, mode="train")
    assert "--sample_minibatches" in str(e.value) and "\n" not in str(e.value)


def test_the_presets_sample_minibatches_give_way_to_a_recurrent_policy_or_v_trace(tmp_path):
    """The Atari preset's --sample_minibatches True under --use_rnn True or --with_vtrace True (Sample Factory's Atari
    LSTM command, say): trajectories, and a line in the log; given on the command line it is a one-line error."""
    base = ["--env", "atari_pong", "--train_dir", str(tmp_path)]
    assert parse_cfg(base, mode="train").sample_minibatches is True
    for flags in (["--use_rnn", "True"], ["--with_vtrace", "True"]):
        cfg = parse_cfg(base + flags, mode="train")
        assert cfg.sample_minibatches is False
        assert any(n.startswith("--sample_minibatches False") and flags[0] in n for n in cfg._notes), cfg._notes
        with pytest.raises(ConfigError):
            parse_cfg(base + flags + ["--sample_minibatches", "True"], mode="train")
