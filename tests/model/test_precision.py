"""--precision: which arithmetic the observation encoder runs in (resolve_precision), and what bfloat16 changes: the
encoder's output only; the RNN, the heads and every output stay float32 (the learner's model; the policy workers' acting
copy, cast_for_inference, also computes the RNN's gate products in bfloat16: tested below)."""
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


def naive_low_precision_step(model, x, state):
    """The acting copy's core step from the equations of torch.nn.GRU / nn.LSTM (their documentation), in float64 on
    operands rounded to bfloat16 (x, h and the weights, as ActorCritic.cast_for_inference stores them); the gate
    products themselves are not rounded here, so the implementation differs from this by its bfloat16 gate outputs."""
    core = model.core
    r, width = core.rnn_size, (2 if core.is_lstm else 1) * core.rnn_size
    low = lambda t: t.to(torch.bfloat16).double()  # noqa: E731
    new = []
    x = x.double()
    for i in range(core.num_layers):
        w_ih, w_hh, b_ih, b_hh = (low(getattr(core.rnn, f"{n}_l{i}")) for n in ("weight_ih", "weight_hh", "bias_ih",
                                                                                  "bias_hh"))
        layer = state[:, i * width:(i + 1) * width].double()
        h = layer[:, :r]
        gx, gh = low(x) @ w_ih.T + b_ih, low(h) @ w_hh.T + b_hh
        if core.is_lstm:
            i_, f, g, o = (gx + gh).chunk(4, 1)
            c = torch.sigmoid(f) * layer[:, r:] + torch.sigmoid(i_) * torch.tanh(g)
            x = torch.sigmoid(o) * torch.tanh(c)
            new.append(torch.cat([x, c], 1))
        else:
            (xr, xz, xn), (hr, hz, hn) = gx.chunk(3, 1), gh.chunk(3, 1)
            rr, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
            n = torch.tanh(xn + rr * hn)
            x = (1 - z) * n + z * h
            new.append(x)
    return torch.cat(new, 1)


@pytest.mark.parametrize("rnn", [("gru", "1", "True"), ("lstm", "2", "False"), ("gru", "2", "False")])
def test_cast_for_inference_encoder_exact_core_by_its_equations(rnn):
    """The policy workers' acting copy (weights stored in bfloat16, loaded by a dtype-converting copy as
    SharedWeights.load_into does): the encoders compute exactly what autocast computes on float32 storage, the cores
    follow the GRU/LSTM equations with bfloat16 gate products, and outputs stay float32."""
    rnn_type, layers, shared = rnn
    cfg = parse_cfg(["--env", "test_image", "--device", "cpu", "--rnn_size", "32", "--hidden_size", "32",
                     "--rnn_type", rnn_type, "--rnn_num_layers", layers, "--actor_critic_share_weights", shared,
                     "--train_dir", "/tmp/unused"])
    torch.manual_seed(0)
    learner = create_actor_critic(cfg, IMAGE, ACTIONS)
    acting = create_actor_critic(cfg, IMAGE, ACTIONS)
    learner.compute_dtype = acting.compute_dtype = torch.bfloat16
    assert acting.cast_for_inference() is acting
    with torch.no_grad():
        for key, dst in acting.state_dict().items():  # what SharedWeights._copy_from_shared does
            dst.copy_(learner.state_dict()[key])
    low = {k for k, v in acting.state_dict().items() if v.dtype == torch.bfloat16}
    assert any(k.startswith("core.rnn.") for k in low) and any(".fc." in k for k in low)
    assert not any(k.startswith(("action_heads", "critic.")) or "normalizer" in k for k in low)
    for enc in (acting.encoder, acting.critic_encoder):  # the first conv's weights are scaled in float32 first
        if enc is not None:
            assert enc.obs_encoder.first_conv.weight.dtype == torch.float32

    g = torch.Generator().manual_seed(3)
    obs = {"obs": torch.randint(0, 256, (5, 3, 36, 64), dtype=torch.uint8, generator=g)}
    state = torch.randn((5, acting.rnn_state_size), generator=g) * 0.5
    with torch.inference_mode():
        for name in ("encoder", "critic_encoder"):
            if getattr(learner, name) is not None:
                ours, theirs = getattr(acting, name), getattr(learner, name)
                assert torch.equal(acting._encode(ours, obs), learner._encode(theirs, obs))
        features = acting._encode(acting.encoder, obs)
        actor_state = state[:, :acting.state_sizes[0]]
        out, new_state = acting.core.step(features, actor_state)
        expected = naive_low_precision_step(acting, features, actor_state).float()
        torch.testing.assert_close(new_state, expected, atol=0.02, rtol=0.0)
        assert new_state.dtype == out.dtype == torch.float32
        ref, got = learner.forward_step(obs, state), acting.forward_step(obs, state)
    for a, b in zip(ref, got):
        assert b.dtype == torch.float32
        torch.testing.assert_close(b, a, atol=0.03, rtol=0.0)  # the learner's float32 cores: bfloat16 rounding apart


def test_cast_for_inference_without_compute_dtype_changes_nothing():
    model = model_for(IMAGE)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.cast_for_inference()
    assert all(v.dtype == before[k].dtype and torch.equal(v, before[k]) for k, v in model.state_dict().items())


def _float32_frames_in_the_layout(self, x: torch.Tensor) -> torch.Tensor:
    """The oracle's first-conv input: the frames as float32 values in the memory format _conv_input hands the conv (NHWC
    on CPU), left for autocast to round to its dtype itself."""
    if self.channels_last and x.device.type == "cpu" and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x.to(torch.float32)


def check_first_conv_input(device: str, architecture: str, obs_dtype: torch.dtype) -> None:
    """ImageEncoder._conv_input hands the first convolution its input in the compute dtype (and NHWC on CPU) at once.
    The promise: one conversion pass instead of autocast's, and not one bit changed by it. Oracle: the same encoder fed
    float32 frames in the same memory format, which autocast rounds to bfloat16 itself: the conv's input values are
    then equal (bfloat16 rounding of the same float32 values), the same kernel runs, so forward bits and gradient bits
    are equal on any CPU. (Which layout, NHWC or NCHW, is a choice of kernels with another summation order: that
    comparison is test_nhwc_first_conv_within_summation_rounding's, within a bound. tests/gpu: the same on CUDA.)"""
    from sf.model.encoders import ImageEncoder, make_image_encoder
    cfg = parse_cfg(["--env", "test_image", "--device", device, "--hidden_size", "32", "--train_dir", "/tmp/unused",
                     "--encoder_conv_architecture", architecture])
    torch.manual_seed(0)
    enc = make_image_encoder(cfg, (3, 36, 64)).to(device)
    g = torch.Generator().manual_seed(2)
    frames = torch.randint(0, 256, (5, 3, 36, 64), dtype=torch.uint8, generator=g).to(obs_dtype)
    if obs_dtype.is_floating_point:  # not representable in bfloat16: one rounding, as autocast's
        frames += torch.rand(frames.shape, generator=g)
    frames = frames.to(device)
    results = []
    for conv_input in (ImageEncoder._conv_input, _float32_frames_in_the_layout):
        enc.zero_grad()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ImageEncoder, "_conv_input", conv_input)
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                first = conv_input(enc, frames)
                out = enc(frames).float()
        out.square().sum().backward()
        results.append((first.to(torch.bfloat16), out.detach(), enc.first_conv.weight.grad.clone(),
                        enc.fc.weight.grad.clone()))
    (first, out, w_grad, fc_grad), (ref_first, ref, ref_w_grad, ref_fc_grad) = results
    assert first.dtype == torch.bfloat16 and torch.equal(first, ref_first)  # the values the conv reads
    assert first.is_contiguous(memory_format=torch.channels_last) == (device == "cpu")
    assert torch.equal(out, ref)
    assert torch.equal(w_grad, ref_w_grad)
    assert torch.equal(fc_grad, ref_fc_grad)


@pytest.mark.parametrize("architecture", ["convnet_simple", "resnet_impala"])
@pytest.mark.parametrize("obs_dtype", [torch.uint8, torch.float32])
def test_autocast_first_conv_input_same_bits_as_float32_input(architecture, obs_dtype):
    check_first_conv_input("cpu", architecture, obs_dtype)


@pytest.mark.parametrize("obs_dtype", [torch.uint8, torch.float32])
def test_nhwc_first_conv_within_summation_rounding(obs_dtype):
    """On CPU the first conv reads NHWC where autocast alone would read NCHW: another oneDNN kernel, another order of
    summation (on an AVX2 CPU without bfloat16 instructions the two differ in the last bits; with AVX512-BF16 they may
    agree). The bound, derived: each output is a sum of K = C kh kw products of bfloat16 values, exact in float32; the
    two float32 sums differ by at most gamma_K * sum |w x| (gamma_K = K u / (1 - K u), u = 2^-24), and each is then
    rounded to bfloat16 (8 significant bits), which may move two sums on either side of a rounding boundary one unit of
    the last place apart: |a - b| <= gamma_K sum |w x| + ulp(max(|a|, |b|)), ulp(v) <= 2^-7 |v|."""
    from sf.model.encoders import make_image_encoder
    cfg = parse_cfg(["--env", "test_image", "--device", "cpu", "--hidden_size", "32", "--train_dir", "/tmp/unused"])
    torch.manual_seed(0)
    enc = make_image_encoder(cfg, (3, 36, 64))
    g = torch.Generator().manual_seed(2)
    frames = torch.randint(0, 256, (5, 3, 36, 64), dtype=torch.uint8, generator=g).to(obs_dtype)
    if obs_dtype.is_floating_point:
        frames += torch.rand(frames.shape, generator=g)
    conv = enc.first_conv
    weight, bias = enc._first_weight_bias()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        nhwc_input = enc._conv_input(frames)
        assert nhwc_input.is_contiguous(memory_format=torch.channels_last)
        nhwc = torch.nn.functional.conv2d(nhwc_input, weight, bias, stride=conv.stride, padding=conv.padding).float()
        nchw = torch.nn.functional.conv2d(frames.float(), weight, bias, stride=conv.stride,
                                          padding=conv.padding).float()
    with torch.no_grad():  # sum |w x| (+ |b|), in float64 from the bfloat16 values both kernels multiplied
        x64 = frames.to(torch.bfloat16).double().abs()
        w64 = weight.detach().to(torch.bfloat16).double().abs()
        b64 = bias.detach().to(torch.bfloat16).double().abs() if bias is not None else None
        magnitude = torch.nn.functional.conv2d(x64, w64, b64, stride=conv.stride, padding=conv.padding)
    k = weight[0].numel() + 1  # (+ 1: the bias)
    u = 2.0 ** -24
    bound = (k * u / (1 - k * u)) * magnitude + 2.0 ** -7 * torch.maximum(nhwc.abs(), nchw.abs()).double()
    assert ((nhwc.double() - nchw.double()).abs() <= bound).all()
