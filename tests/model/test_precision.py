"""--precision: which arithmetic the observation encoder runs in (resolve_precision), and what bfloat16 changes: the
encoder's output only; the RNN, the heads and every output stay float32."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gymnasium import spaces

from sf.cfg import ConfigError, parse_cfg
from sf.model.actor_critic import create_actor_critic, native_bfloat16, resolve_precision

IMAGE = spaces.Dict({"obs": spaces.Box(0, 255, (3, 36, 64), np.uint8)})
VECTOR = spaces.Dict({"obs": spaces.Box(-1, 1, (8,), np.float32)})
ACTIONS = spaces.Discrete(5)


def model_for(obs_space, use_rnn=True):
    cfg = parse_cfg(["--env", "test_image", "--device", "cpu", "--rnn_size", "32", "--hidden_size", "32",
                     "--use_rnn", str(use_rnn), "--train_dir", "/tmp/unused"])
    torch.manual_seed(0)
    return create_actor_critic(cfg, obs_space, ACTIONS)


def test_resolve_precision_against_its_rule():
    conv, mlp = model_for(IMAGE), model_for(VECTOR)
    native = native_bfloat16("cpu")
    for choice, model, deterministic, expected in [
            ("float32", conv, False, None), ("bfloat16", mlp, False, torch.bfloat16),
            ("bfloat16", conv, True, torch.bfloat16),  # explicit (sync modes refuse it in the configuration)
            ("auto", conv, True, None), ("auto", mlp, False, None),
            ("auto", conv, False, torch.bfloat16 if native else None)]:
        assert resolve_precision(choice, model, "cpu", deterministic) is expected, (choice, deterministic)


@pytest.mark.parametrize("use_rnn", [True, False])
def test_bfloat16_encoder_keeps_float32_outputs_close_to_float32(use_rnn):
    model = model_for(IMAGE, use_rnn)
    g = torch.Generator().manual_seed(1)
    obs = {"obs": torch.randint(0, 256, (6, 3, 36, 64), dtype=torch.uint8, generator=g)}
    rnn = torch.randn((6, model.rnn_state_size), generator=g) * 0.1
    seq_obs = {"obs": torch.randint(0, 256, (2, 5, 3, 36, 64), dtype=torch.uint8, generator=g)}
    seq_rnn = torch.randn((2, 5, model.rnn_state_size), generator=g) * 0.1
    dones = torch.zeros((2, 5))
    with torch.no_grad():
        ref_step = model.forward_step(obs, rnn)
        ref_seq = model.forward_sequence(seq_obs, seq_rnn, dones, 5)
        model.compute_dtype = torch.bfloat16
        low_step = model.forward_step(obs, rnn)
        low_seq = model.forward_sequence(seq_obs, seq_rnn, dones, 5)
    for ref, low in [*zip(ref_step, low_step), *zip(ref_seq, low_seq)]:
        assert low.dtype == torch.float32  # what the buffers, losses and V-trace get
        torch.testing.assert_close(low, ref, atol=0.05, rtol=0.05)
    assert not torch.equal(low_step.action_logits, ref_step.action_logits)  # bfloat16 did compute something


def test_bfloat16_is_refused_with_the_sync_modes():
    with pytest.raises(ConfigError, match="--precision bfloat16"):
        parse_cfg(["--env", "test_image", "--sync_mode", "hts", "--precision", "bfloat16", "--train_dir", "/tmp/u"])
    parse_cfg(["--env", "test_image", "--sync_mode", "hts", "--precision", "auto", "--train_dir", "/tmp/u"])
