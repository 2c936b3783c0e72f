"""Model contract: output shapes for Doom (simplified and full), Atari, vector observations, feed-forward,
LSTM; encoders' architecture and input scaling; normalizers in the state_dict."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gymnasium import spaces

from model_test_helpers import ATARI_OBS, DOOM_FULL_ACTIONS, DOOM_FULL_OBS, DOOM_OBS, VECTOR_OBS, make_cfg, make_obs
from sf.model.actor_critic import create_actor_critic
from sf.model.encoders import ConvEncoder

SMALL = dict(rnn_size=16, hidden_size=32, encoder_mlp_layers=[24, 24])


def check_contract(model, obs_space, action_space, B=3, S=5, recurrence=2):
    L = sum(action_space.nvec) if isinstance(action_space, spaces.MultiDiscrete) else (
        action_space.n if isinstance(action_space, spaces.Discrete) else 2 * action_space.shape[0])
    A = len(action_space.nvec) if isinstance(action_space, spaces.MultiDiscrete) else (
        1 if isinstance(action_space, spaces.Discrete) else action_space.shape[0])
    H = model.rnn_state_size
    with torch.no_grad():
        out = model.forward_step(make_obs(obs_space, (B,)), torch.zeros(B, H))
        assert out.action_logits.shape == (B, L) and out.action_logits.dtype == torch.float32
        assert out.values.shape == (B,)
        assert out.new_rnn_states.shape == (B, H)
        logits, values = model.forward_sequence(make_obs(obs_space, (B, S)), torch.zeros(B, S, H),
                                                torch.zeros(B, S), recurrence)
        assert logits.shape == (B, S, L) and values.shape == (B, S)
        dist = model.action_distribution(out.action_logits)
        a = dist.sample()
        assert a.shape == (B, A)
        assert dist.log_prob(a).shape == (B,) and dist.entropy().shape == (B,) and dist.mode().shape == (B, A)
    return out


def test_doom_simplified_paper_sizes():
    cfg = make_cfg()  # paper sizes: hidden 512, GRU 512
    model = create_actor_critic(cfg, DOOM_OBS, spaces.Discrete(7))
    enc = model.encoder.obs_encoder
    assert enc.architecture == "convnet_simple"
    assert [(c.out_channels, c.kernel_size[0], c.stride[0]) for c in enc.convs] == [(32, 8, 4), (64, 4, 2), (128, 3, 2)]
    assert enc.conv_out_shape == (128, 3, 6)
    assert enc.fc.out_features == 512
    assert model.rnn_state_size == 512 and isinstance(model.core.rnn, torch.nn.GRU)
    check_contract(model, DOOM_OBS, spaces.Discrete(7), B=2, S=3)


def test_doom_full_measurements_and_seven_heads():
    cfg = make_cfg(**SMALL)
    model = create_actor_critic(cfg, DOOM_FULL_OBS, DOOM_FULL_ACTIONS)
    assert model.encoder.measurements_encoder is not None
    assert model.encoder.out_size == 32 + 128
    assert len(model.action_heads) == 7
    assert [h.out_features for h in model.action_heads] == [3, 3, 2, 2, 2, 8, 21]
    out = check_contract(model, DOOM_FULL_OBS, DOOM_FULL_ACTIONS)
    a = model.action_distribution(out.action_logits).sample()
    assert ((a >= 0) & (a < torch.as_tensor(DOOM_FULL_ACTIONS.nvec))).all()


def test_measurements_change_the_output():
    cfg = make_cfg(**SMALL)
    model = create_actor_critic(cfg, DOOM_FULL_OBS, DOOM_FULL_ACTIONS)
    obs = make_obs(DOOM_FULL_OBS, (2,))
    h = torch.zeros(2, model.rnn_state_size)
    with torch.no_grad():
        v1 = model.forward_step(obs, h).values
        obs["measurements"] = obs["measurements"] + 1.0
        v2 = model.forward_step(obs, h).values
    assert not torch.allclose(v1, v2)


def test_atari_nature_cnn():
    cfg = make_cfg(**SMALL)
    model = create_actor_critic(cfg, ATARI_OBS, spaces.Discrete(6))
    enc = model.encoder.obs_encoder
    assert enc.architecture == "convnet_atari"
    assert enc.conv_out_shape == (64, 7, 7)
    check_contract(model, ATARI_OBS, spaces.Discrete(6))


def test_explicit_architecture_choice():
    cfg = make_cfg(encoder_conv_architecture="convnet_atari", **SMALL)
    model = create_actor_critic(cfg, DOOM_OBS, spaces.Discrete(3))
    assert model.encoder.obs_encoder.architecture == "convnet_atari"
    check_contract(model, DOOM_OBS, spaces.Discrete(3))


@pytest.mark.parametrize("action_space", [spaces.Discrete(4), spaces.Box(-1, 1, (2,), np.float32),
                                          spaces.MultiDiscrete([2, 3])])
def test_vector_obs_mlp(action_space):
    cfg = make_cfg(**SMALL)
    model = create_actor_critic(cfg, VECTOR_OBS, action_space)
    assert model.encoder.out_size == 24
    check_contract(model, VECTOR_OBS, action_space)


@pytest.mark.parametrize("obs_space", [VECTOR_OBS, DOOM_OBS])
def test_feed_forward(obs_space):
    cfg = make_cfg(use_rnn=False, **SMALL)
    model = create_actor_critic(cfg, obs_space, spaces.Discrete(3))
    assert model.rnn_state_size == 1
    out = check_contract(model, obs_space, spaces.Discrete(3))
    assert (out.new_rnn_states == 0).all()
    # sequence = step by step (no state)
    obs = make_obs(obs_space, (2, 4))
    with torch.no_grad():
        logits, values = model.forward_sequence(obs, torch.zeros(2, 4, 1), torch.zeros(2, 4), 2)
        for t in range(4):
            o = model.forward_step({k: v[:, t] for k, v in obs.items()}, torch.zeros(2, 1))
            torch.testing.assert_close(logits[:, t], o.action_logits, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(values[:, t], o.values, rtol=1e-5, atol=1e-5)


def test_lstm_state_packing():
    cfg = make_cfg(rnn_type="lstm", **SMALL)
    model = create_actor_critic(cfg, DOOM_OBS, spaces.Discrete(3))
    assert model.rnn_state_size == 32 and isinstance(model.core.rnn, torch.nn.LSTM)
    check_contract(model, DOOM_OBS, spaces.Discrete(3))


def test_uint8_scaling_and_cpu_blocks():
    """The encoder on uint8 frames equals the plain conv stack on frames / 255; blocking changes nothing."""
    torch.manual_seed(0)
    enc = ConvEncoder((3, 72, 128), "convnet_simple", [32], "elu")
    x = torch.randint(0, 256, (7, 3, 72, 128), dtype=torch.uint8)
    y = x.float() / 255.0
    for conv in enc.convs:
        y = F.elu(conv(y))
    ref = F.elu(enc.fc(y.flatten(1)))
    torch.testing.assert_close(enc(x), ref, rtol=1e-4, atol=1e-5)
    enc.cpu_block = 3  # 7 frames in blocks of 3
    torch.testing.assert_close(enc(x), ref, rtol=1e-4, atol=1e-5)
    enc.channels_last = False
    torch.testing.assert_close(enc(x), ref, rtol=1e-4, atol=1e-5)


def test_input_normalizers_in_state_dict_and_applied():
    cfg = make_cfg(**SMALL)
    model = create_actor_critic(cfg, DOOM_FULL_OBS, DOOM_FULL_ACTIONS)
    keys = model.state_dict().keys()
    assert "encoder.measurements_normalizer.mean" in keys and "encoder.measurements_normalizer.var" in keys
    obs = make_obs(DOOM_FULL_OBS, (50, 4))
    model.update_normalizers(obs)
    m = obs["measurements"].reshape(-1, 23).double()
    torch.testing.assert_close(model.encoder.measurements_normalizer.mean, m.mean(0).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.encoder.measurements_normalizer.var, m.var(0, unbiased=False).float(),
                               rtol=1e-4, atol=1e-4)
    # a fresh model loading the state_dict (a policy worker) computes the same outputs
    other = create_actor_critic(cfg, DOOM_FULL_OBS, DOOM_FULL_ACTIONS)
    other.load_state_dict(model.state_dict())
    step_obs = {k: v[:, 0] for k, v in obs.items()}
    h = torch.zeros(50, model.rnn_state_size)
    with torch.no_grad():
        torch.testing.assert_close(other.forward_step(step_obs, h).values, model.forward_step(step_obs, h).values)


def test_running_mean_std_merges_batches():
    from sf.model.normalization import RunningMeanStd
    rms = RunningMeanStd((3,))
    data = torch.randn(1000, 3) * torch.tensor([1.0, 5.0, 0.1]) + torch.tensor([2.0, -1.0, 0.0])
    for chunk in data.split(137):
        rms.update(chunk)
    torch.testing.assert_close(rms.mean, data.mean(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rms.var, data.var(0, unbiased=False), rtol=1e-4, atol=1e-4)
    assert float(rms.count) == 1000
    y = rms.normalize(data)
    assert y.abs().max() <= 5.0
    torch.testing.assert_close(rms.denormalize(rms.normalize(torch.zeros(3))), torch.zeros(3), rtol=0, atol=1e-5)


def test_returns_normalizer_denormalizes_values():
    cfg = make_cfg(normalize_returns=True, **SMALL)
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(2))
    assert "returns_normalizer.mean" in model.state_dict()
    obs = make_obs(VECTOR_OBS, (4, 3))
    h = torch.zeros(4, 3, model.rnn_state_size)
    d = torch.zeros(4, 3)
    with torch.no_grad():
        _, raw = model.forward_sequence(obs, h, d, 3, normalized_values=True)
        model.returns_normalizer.mean.fill_(10.0)
        model.returns_normalizer.var.fill_(4.0)
        _, values = model.forward_sequence(obs, h, d, 3)
        step = model.forward_step({k: v[:, 0] for k, v in obs.items()}, h[:, 0]).values
    torch.testing.assert_close(values, raw * (4.0 + 1e-5) ** 0.5 + 10.0)
    torch.testing.assert_close(step, values[:, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("width,outputs", [(64, 2), (64, 3), (512, 6), (128, 1), (100, 21)])
def test_row_independent_heads_give_each_row_the_same_bits_wherever_it_is(width, outputs):
    """The hts/ppo policy workers' heads: a row's output is the same bits alone, first or last among other rows (a
    plain Linear may round it by its place: seen with MKL on an AVX-512 Xeon for Linear(64 -> 2) on 4 rows), and the
    values are the Linear's within rounding."""
    from sf.model.actor_critic import _row_independent
    torch.manual_seed(width + outputs)
    layer = torch.nn.Linear(width, outputs)
    x = torch.randn(width)
    alone = _row_independent(layer, x.unsqueeze(0))[0]
    for rows in (2, 4, 7, 16):
        for place in (0, rows // 2, rows - 1):
            batch = torch.randn(rows, width)
            batch[place] = x
            assert torch.equal(_row_independent(layer, batch)[place], alone), (rows, place)
    torch.testing.assert_close(alone, layer(x), rtol=1e-5, atol=1e-6)
