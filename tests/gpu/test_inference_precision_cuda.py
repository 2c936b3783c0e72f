"""A CUDA policy worker's acting copy in bfloat16 (ActorCritic.cast_for_inference; the CPU side:
tests/model/test_precision.py): the learner's float32 weights published through CUDA shared memory and converted by
SharedWeights.load_into's copy, the encoder's output against the float32-stored model under autocast, the core step
against the GRU/LSTM equations. tests/gpu/conftest.py skips it, with the reason, where torch sees no CUDA device."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

from sf.buffers.shared_weights import SharedWeights
from sf.cfg import parse_cfg
from sf.model.actor_critic import create_actor_critic, native_bfloat16
from test_precision import check_first_conv_input, naive_low_precision_step  # tests/model (on the path: conftest)

IMAGE = spaces.Dict({"obs": spaces.Box(0, 255, (3, 36, 64), np.uint8)})


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_acting_copy_on_cuda_loads_converted_weights_and_follows_the_equations(rnn_type):
    if not native_bfloat16("cuda"):
        pytest.skip("this GPU has no native bfloat16: --precision auto keeps float32 there")
    cfg = parse_cfg(["--env", "test_image", "--device", "cuda", "--rnn_size", "32", "--hidden_size", "32",
                     "--rnn_type", rnn_type, "--train_dir", "/tmp/unused"])
    torch.manual_seed(0)
    learner = create_actor_critic(cfg, IMAGE, spaces.Discrete(5)).cuda()
    acting = create_actor_critic(cfg, IMAGE, spaces.Discrete(5)).cuda()
    learner.compute_dtype = acting.compute_dtype = torch.bfloat16
    acting.cast_for_inference()
    weights = SharedWeights(learner, device="cuda")
    weights.publish(learner, 1)
    assert weights.load_into(acting, -1) == 1
    assert acting.core.rnn.weight_ih_l0.dtype == torch.bfloat16
    assert torch.equal(acting.core.rnn.weight_ih_l0, learner.core.rnn.weight_ih_l0.to(torch.bfloat16))

    g = torch.Generator().manual_seed(3)
    obs = {"obs": torch.randint(0, 256, (5, 3, 36, 64), dtype=torch.uint8, generator=g).cuda()}
    state = (torch.randn((5, acting.rnn_state_size), generator=g) * 0.5).cuda()
    with torch.inference_mode():
        features = acting._encode(acting.encoder, obs)
        torch.testing.assert_close(features, learner._encode(learner.encoder, obs), atol=1e-2, rtol=1e-2)
        out, new_state = acting.core.step(features, state)
        expected = naive_low_precision_step(acting, features, state).float()
        torch.testing.assert_close(new_state, expected, atol=0.02, rtol=0.0)
        ref, got = learner.forward_step(obs, state), acting.forward_step(obs, state)
    for a, b in zip(ref, got):
        assert b.dtype == torch.float32 and b.is_cuda
        torch.testing.assert_close(b, a, atol=0.03, rtol=0.0)


@pytest.mark.parametrize("architecture", ["convnet_simple", "resnet_impala"])
@pytest.mark.parametrize("obs_dtype", [torch.uint8, torch.float32])
def test_autocast_first_conv_input_on_cuda(architecture, obs_dtype):
    """On CUDA the frames go to the first convolution converted once, to bfloat16 (NCHW, as before): the same bits as
    float32 frames rounded by autocast."""
    if not native_bfloat16("cuda"):
        pytest.skip("this GPU has no native bfloat16: --precision auto keeps float32 there")
    check_first_conv_input("cuda", architecture, obs_dtype)
