"""Sample Factory's model options: --rnn_num_layers, --actor_critic_share_weights, --adaptive_stddev /
--initial_stddev / --continuous_tanh_scale, --policy_initialization / --policy_init_gain (Sample Factory 2.1.1's
sample_factory/model: core.py ModelCoreRNN, actor_critic.py ActorCriticSeparateWeights and initialize_weights,
action_parameterization.py ActionParameterizationContinuousNonAdaptiveStddev). Sizes against hand arithmetic, sequences
against naive loops, initializations against their definitions, the flags, the checkpoint's model options, and one real
run that trains, resumes and plays."""
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from model_test_helpers import VECTOR_OBS, make_cfg, make_obs
from sf.cfg import ConfigError, parse_cfg
from sf.learning.checkpoint import CheckpointError, check_compatible
from sf.learning.learner import checkpoint_meta, model_options
from sf.model.actor_critic import create_actor_critic
from sf.model.cores import chunk_starts

D, F, R = 10, 12, 8  # VECTOR_OBS size, encoder width, rnn_size
SMALL = dict(rnn_size=R, encoder_mlp_layers=[F], hidden_size=F)


def n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def rnn_params(kind: str, in_size: int, layers: int) -> int:
    """nn.GRU / nn.LSTM: per layer G*R*(input + R) weights and 2*G*R biases, G = 3 gates (GRU) or 4 (LSTM)."""
    g = 3 if kind == "gru" else 4
    return sum(g * R * ((in_size if i == 0 else R) + R) + 2 * g * R for i in range(layers))


@pytest.mark.parametrize("use_rnn, rnn_type, layers", [(True, "gru", 1), (True, "gru", 3), (True, "lstm", 2),
                                                       (False, "gru", 2)])
@pytest.mark.parametrize("share", [True, False])
def test_parameter_counts_and_state_sizes(use_rnn, rnn_type, layers, share):
    cfg = make_cfg(**SMALL, use_rnn=use_rnn, rnn_type=rnn_type, rnn_num_layers=layers, actor_critic_share_weights=share)
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
    encoder = D * F + F  # one Linear layer
    core = rnn_params(rnn_type, F, layers) if use_rnn else 0
    out = R if use_rnn else F
    heads = out * 3 + 3 + out + 1  # action head (3 logits) and critic
    copies = 1 if share else 2
    assert n_params(model) == copies * (encoder + core) + heads
    # Sample Factory's get_rnn_size: rnn_size * layers (x2 LSTM) (x2 separate weights); feed-forward 1 (x2)
    state = (R * layers * (2 if rnn_type == "lstm" else 1)) if use_rnn else 1
    assert model.rnn_state_size == copies * state
    out = model.forward_step(make_obs(VECTOR_OBS, (4,)), torch.zeros(4, model.rnn_state_size))
    assert out.new_rnn_states.shape == (4, copies * state) and out.action_logits.shape == (4, 3)


def test_shared_weights_keep_the_state_dict_names():
    """The default model is the one of earlier checkpoints: same entries (an old checkpoint loads)."""
    model = create_actor_critic(make_cfg(**SMALL), VECTOR_OBS, spaces.Discrete(3))
    assert sorted(k for k in model.state_dict() if "normalizer" not in k) == [
        "action_heads.0.bias", "action_heads.0.weight", "core.rnn.bias_hh_l0", "core.rnn.bias_ih_l0",
        "core.rnn.weight_hh_l0", "core.rnn.weight_ih_l0", "critic.bias", "critic.weight",
        "encoder.obs_encoder.net.0.bias", "encoder.obs_encoder.net.0.weight"]
    separate = create_actor_critic(make_cfg(**SMALL, actor_critic_share_weights=False), VECTOR_OBS, spaces.Discrete(3))
    extra = set(separate.state_dict()) - set(model.state_dict())
    assert extra and all(k.startswith(("critic_encoder.", "critic_core.")) for k in extra)


def test_adaptive_stddev_false_parameter_count():
    box = spaces.Box(-1, 1, (2,))
    adaptive = create_actor_critic(make_cfg(**SMALL), VECTOR_OBS, box)
    learned = create_actor_critic(make_cfg(**SMALL, adaptive_stddev=False), VECTOR_OBS, box)
    assert n_params(adaptive) - n_params(learned) == (R * 4 + 4) - (R * 2 + 2 + 2)  # head of means + 2 log-stds
    assert learned.action_log_std.shape == (2,)


# --- recurrence: a stacked GRU/LSTM against the equations, step by step -------------------------------------------
def gru_cell(x, h, w_ih, w_hh, b_ih, b_hh):
    """torch.nn.GRU's equations (gates r, z, n)."""
    ir, iz, inn = (x @ w_ih.t() + b_ih).chunk(3, -1)
    hr, hz, hn = (h @ w_hh.t() + b_hh).chunk(3, -1)
    r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
    n = torch.tanh(inn + r * hn)
    return (1 - z) * n + z * h


def lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh):
    """torch.nn.LSTM's equations (gates i, f, g, o)."""
    i, f, g, o = (x @ w_ih.t() + b_ih + h @ w_hh.t() + b_hh).chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def naive_core_step(core, x, state):
    """One step of a stacked core from its packed state [B, H]: layer l's h (GRU) or (h, c) (LSTM) at
    [l * size, (l + 1) * size), size = R (GRU) or 2R (LSTM): Sample Factory's ModelCoreRNN packing."""
    per_layer = state.chunk(core.num_layers, dim=-1)
    new = []
    for layer, (w_ih, w_hh, b_ih, b_hh) in zip(per_layer, core.rnn.all_weights):
        if core.is_lstm:
            h, c = layer.chunk(2, dim=-1)
            x, c = lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh)
            new.append(torch.cat([x, c], -1))
        else:
            x = gru_cell(x, layer, w_ih, w_hh, b_ih, b_hh)
            new.append(x)
    return x, torch.cat(new, -1)


def naive_sequence(model, obs, rnn_states, dones, recurrence):
    """The definition, one step at a time: stored state at chunk starts, state * (1 - done) after a done; the actor's
    and the critic's state side by side (separate weights)."""
    B, S = dones.shape
    starts = set(chunk_starts(S, recurrence))
    parts = [(model.encoder, model.core)] + ([(model.critic_encoder, model.critic_core)] if model.critic_core else [])
    logits, values, state = [], [], None
    for t in range(S):
        if t in starts:
            state = rnn_states[:, t]
        if t > 0:
            state = state * (1.0 - dones[:, t - 1:t])
        o = {k: v[:, t] for k, v in obs.items()}
        outs, new = [], []
        for (enc, core), s in zip(parts, state.split(model.state_sizes, dim=-1)):
            x, s = naive_core_step(core, enc(o), s)
            outs.append(x)
            new.append(s)
        lg, v = model._heads(outs[0], outs[-1])
        logits.append(lg)
        values.append(v)
        state = torch.cat(new, -1)
    return torch.stack(logits, 1), torch.stack(values, 1)


@pytest.mark.parametrize("rnn_type, layers, share", [("gru", 2, True), ("gru", 3, False), ("lstm", 2, True),
                                                     ("lstm", 2, False), ("gru", 1, False)])
@pytest.mark.parametrize("S, recurrence", [(9, 4), (9, 3), (5, 16)])
def test_stacked_sequence_with_resets_equals_naive_loop(rnn_type, layers, share, S, recurrence):
    torch.manual_seed(S * 7 + recurrence + layers)
    cfg = make_cfg(**SMALL, rnn_type=rnn_type, rnn_num_layers=layers, actor_critic_share_weights=share)
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
    B = 5
    obs = make_obs(VECTOR_OBS, (B, S))
    rnn_states = torch.randn(B, S, model.rnn_state_size)  # arbitrary stored states: chunk starts must read them
    dones = (torch.rand(B, S) < 0.25).float()
    dones[0, 1] = dones[1, S - 2] = 1.0
    dones[2] = 0.0
    with torch.no_grad():
        logits, values = model.forward_sequence(obs, rnn_states, dones, recurrence)
        ref_logits, ref_values = naive_sequence(model, obs, rnn_states, dones, recurrence)
        step = model.forward_step({k: v[:, 0] for k, v in obs.items()}, rnn_states[:, 0])  # the policy worker's path
        ref_state = naive_step_state(model, {k: v[:, 0] for k, v in obs.items()}, rnn_states[:, 0])
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values, ref_values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step.new_rnn_states, ref_state, rtol=1e-5, atol=1e-5)


def naive_step_state(model, obs, state):
    """The packed state [B, H] after one naive step from `state` [B, H] on obs (key -> [B, ...])."""
    parts = [(model.encoder, model.core)] + ([(model.critic_encoder, model.critic_core)] if model.critic_core else [])
    new = [naive_core_step(core, enc(obs), s)[1] for (enc, core), s in zip(parts, state.split(model.state_sizes, -1))]
    return torch.cat(new, -1)


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_stacked_gradient_truncation_and_reset(rnn_type):
    """Two layers, separate weights: no gradient crosses a chunk start or a reset, in either the actor or the critic."""
    torch.manual_seed(4)
    cfg = make_cfg(**SMALL, rnn_type=rnn_type, rnn_num_layers=2, actor_critic_share_weights=False,
                   normalize_input=False)
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
    assert model.core.rnn.num_layers == model.critic_core.rnn.num_layers == 2
    B, S = 2, 9
    obs = make_obs(VECTOR_OBS, (B, S))
    obs["obs"].requires_grad_(True)
    dones = torch.zeros(B, S)
    dones[1, 1] = 1.0
    logits, values = model.forward_sequence(obs, torch.zeros(B, S, model.rnn_state_size), dones, 4)
    for out in (values[0, 5], logits[0, 5].sum()):
        g, = torch.autograd.grad(out, obs["obs"], retain_graph=True)
        assert g[0, 4:6].abs().sum() > 0 and (g[0, :4] == 0).all() and (g[1] == 0).all()
    for out in (values[1, 3], logits[1, 3].sum()):
        g, = torch.autograd.grad(out, obs["obs"], retain_graph=True)
        assert g[1, 2:4].abs().sum() > 0 and (g[1, :2] == 0).all()


# --- separate weights -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("use_rnn", [True, False])
def test_separate_weights_gradients_stay_apart(use_rnn):
    torch.manual_seed(0)
    cfg = make_cfg(**SMALL, use_rnn=use_rnn, rnn_num_layers=2, actor_critic_share_weights=False)
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
    B, S = 3, 4
    logits, values = model.forward_sequence(make_obs(VECTOR_OBS, (B, S)), torch.randn(B, S, model.rnn_state_size),
                                            torch.zeros(B, S), 2)
    actor = list(model.encoder.parameters()) + list(model.core.parameters()) + list(model.action_heads.parameters())
    critic = (list(model.critic_encoder.parameters()) + list(model.critic_core.parameters())
              + list(model.critic.parameters()))
    for loss, reached, untouched in ((values.sum(), critic, actor), (logits.sum(), actor, critic)):
        grads = torch.autograd.grad(loss, reached + untouched, retain_graph=True, allow_unused=True)
        assert all(g is not None and g.abs().sum() > 0 for g in grads[:len(reached)])
        assert all(g is None or (g == 0).all() for g in grads[len(reached):])


def test_separate_encoders_keep_the_same_input_statistics():
    cfg = make_cfg(**SMALL, actor_critic_share_weights=False)
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
    obs = make_obs(VECTOR_OBS, (6, 5))
    model.update_normalizers(obs)
    a, c = model.encoder.obs_normalizer, model.critic_encoder.obs_normalizer
    assert float(a.count) == 30 and torch.equal(a.mean, c.mean) and torch.equal(a.var, c.var) and a is not c


# --- continuous actions: a learned state-independent std --------------------------------------------------------
def test_non_adaptive_stddev_is_independent_of_the_input_and_starts_at_initial_stddev():
    torch.manual_seed(1)
    box = spaces.Box(-1, 1, (3,))
    cfg = make_cfg(**SMALL, adaptive_stddev=False, initial_stddev=0.3)
    model = create_actor_critic(cfg, VECTOR_OBS, box)
    out = model.forward_step(make_obs(VECTOR_OBS, (5,)), torch.randn(5, model.rnn_state_size))
    dist = model.action_distribution(out.action_logits)
    torch.testing.assert_close(dist.std, torch.full((5, 3), 0.3))
    assert (dist.mean.std(0) > 0).all()  # the means do depend on the input
    dist.log_prob(torch.zeros(5, 3)).sum().backward()
    assert model.action_log_std.grad.abs().sum() > 0  # the std is learned
    adaptive = create_actor_critic(make_cfg(**SMALL), VECTOR_OBS, box)
    out = adaptive.forward_step(make_obs(VECTOR_OBS, (5,)), torch.randn(5, adaptive.rnn_state_size))
    assert (adaptive.action_distribution(out.action_logits).std.std(0) > 0).all()  # state-dependent


def test_continuous_tanh_scale_squashes_the_means():
    torch.manual_seed(2)
    cfg = make_cfg(**SMALL, adaptive_stddev=False, continuous_tanh_scale=0.5, policy_init_gain=50.0)
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Box(-1, 1, (2,)))
    obs, h = make_obs(VECTOR_OBS, (64,)), torch.randn(64, model.rnn_state_size)
    mean = model.forward_step(obs, h).action_logits[:, :2]
    core_out, _ = model.core.step(model.encoder(obs), h)
    raw = model.action_heads[0](core_out)
    torch.testing.assert_close(mean, torch.tanh(raw / 0.5) * 0.5)
    assert raw.abs().max() > 1.0 and mean.abs().max() <= 0.5  # large raw means, squashed into [-s, s]


# --- initialization schemes -------------------------------------------------------------------------------------
def layers_of(model):
    return [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]


def assert_orthogonal(w, gain):
    """Orthogonal init: the rows (fewer rows than columns) or the columns are orthogonal with norm `gain`."""
    w = w.reshape(w.shape[0], -1).double()
    gram = w @ w.t() if w.shape[0] <= w.shape[1] else w.t() @ w
    torch.testing.assert_close(gram, gain ** 2 * torch.eye(gram.shape[0], dtype=torch.float64), rtol=0, atol=1e-5)


IMAGE_OBS = spaces.Dict({"obs": spaces.Box(0, 255, (3, 36, 36), "uint8")})


def init_kinds(named_weights) -> list:
    """[(shape, kind)] sorted, one per Linear/Conv2d weight (name, w) outside the RNN: kind the orthogonal gain g
    (w w^T = g^2 I on the rows or columns, rounded), or "torch_default" (not orthogonal, |w| <= 1/sqrt(fan_in): torch's
    kaiming-uniform bound)."""
    out = []
    for name, w in named_weights:
        w2 = w.detach().reshape(w.shape[0], -1).double()
        gram = w2 @ w2.t() if w2.shape[0] <= w2.shape[1] else w2.t() @ w2
        g2 = float(gram.diagonal().mean())
        if torch.allclose(gram, g2 * torch.eye(gram.shape[0], dtype=torch.float64), atol=1e-5):
            out.append((tuple(w.shape), round(g2 ** 0.5, 4)))
        else:
            assert float(w2.abs().max()) <= 1 / math.sqrt(w2.shape[1]) + 1e-7, name
            out.append((tuple(w.shape), "torch_default"))
    return sorted(out, key=str)


# (our options, the observation spec and flags of tests/sf_reference.py init): Doom's conv encoder with measurements,
# a vector MLP encoder with separate actor and critic, the IMPALA ResNet
GAIN_CASES = {
    "doom_measurements": (dict(rnn_size=512, hidden_size=512, policy_init_gain=1.0),
                          "obs=3,72,128;measurements=23", ["--env", "doom_battle", "--policy_init_gain", "1.0"]),
    "vector_separate": (dict(rnn_size=R, encoder_mlp_layers=[16, 16], policy_init_gain=0.5,
                             actor_critic_share_weights=False),
                        "obs=10", ["--env", "x", "--rnn_size", str(R), "--encoder_mlp_layers", "16", "16",
                                   "--policy_init_gain", "0.5", "--actor_critic_share_weights", "False"]),
    "resnet": (dict(rnn_size=R, hidden_size=32, policy_init_gain=2.0, encoder_conv_architecture="resnet_impala"),
               "obs=3,36,36", ["--env", "x", "--rnn_size", str(R), "--encoder_conv_mlp_layers", "32",
                               "--policy_init_gain", "2.0", "--encoder_conv_architecture", "resnet_impala"]),
}


@pytest.mark.parametrize("case", GAIN_CASES)
def test_a_gain_initializes_the_layers_sample_factory_initializes(case, tmp_path):
    """policy_init_gain given: each Linear/Conv2d weight initialized as Sample Factory 2.1.1's own model of the same
    options has it (its scripted conv and MLP encoders at torch's default, every other layer orthogonal with the
    gain), read from the model its create_actor_critic builds (tests/sf_reference.py init, in .venv-sf); biases 0, the
    RNN at torch's default."""
    from test_import_sf import SF_PYTHON
    if not SF_PYTHON.exists():
        pytest.skip(f"{SF_PYTHON} is absent (make setup-sf)")
    ours_options, spec, flags = GAIN_CASES[case]
    out = tmp_path / "sf_init.npz"
    proc = subprocess.run([str(SF_PYTHON), str(Path(__file__).resolve().parents[1] / "sf_reference.py"), "init",
                           str(out), spec, *flags], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with np.load(out) as weights:
        theirs = init_kinds((name, torch.from_numpy(weights[name])) for name in weights.files)
    obs = {}
    for item in spec.split(";"):
        key, shape = item.split("=")
        shape = tuple(int(x) for x in shape.split(","))
        obs[key] = spaces.Box(0, 255, shape, np.uint8) if len(shape) == 3 else spaces.Box(-1.0, 1.0, shape, np.float32)
    torch.manual_seed(3)
    model = create_actor_critic(make_cfg(**ours_options), spaces.Dict(obs), spaces.Discrete(5))
    ours = init_kinds((n, p) for n, p in model.named_parameters()
                      if n.endswith("weight") and p.dim() in (2, 4) and ".rnn." not in n)
    assert ours == theirs
    assert {k for _, k in ours} == {"torch_default", ours_options["policy_init_gain"]} or case == "resnet"
    assert all((m.bias == 0).all() for m in layers_of(model))
    for name, p in model.core.rnn.named_parameters():  # Sample Factory leaves the RNN at torch's default
        assert 0 < p.abs().max() <= 1 / math.sqrt(ours_options["rnn_size"]), name


def test_default_per_layer_gains():
    """policy_init_gain None: sqrt(2) for the encoder's layers, 0.01 for the action heads, 1 for the critic, and the
    RNN orthogonal per gate with zero biases."""
    torch.manual_seed(4)
    model = create_actor_critic(make_cfg(**SMALL, rnn_num_layers=2), IMAGE_OBS, spaces.MultiDiscrete([3, 4]))
    for m in layers_of(model.encoder):
        assert_orthogonal(m.weight, math.sqrt(2))
    for head in model.action_heads:
        assert_orthogonal(head.weight, 0.01)
    assert_orthogonal(model.critic.weight, 1.0)
    for name, p in model.core.rnn.named_parameters():
        if "weight" in name:
            for block in p.split(R):
                assert_orthogonal(block, 1.0)
        else:
            assert (p == 0).all(), name
    assert all((m.bias == 0).all() for m in layers_of(model))


@pytest.mark.parametrize("gain", [None, 2.0])
def test_xavier_uniform(gain):
    """U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)): every weight within a, variance a^2 / 3 (with a gain, the
    layers Sample Factory initializes: not its scripted conv encoder, which keeps torch's default)."""
    torch.manual_seed(5)
    cfg = make_cfg(rnn_size=64, hidden_size=256, policy_initialization="xavier_uniform", policy_init_gain=gain)
    model = create_actor_critic(cfg, IMAGE_OBS, spaces.Discrete(5))
    expected = {id(model.action_heads[0]): 0.01, id(model.critic): 1.0}
    kept = {id(m) for m in model.encoder.scripted_in_sample_factory()} if gain is not None else set()
    assert len(kept) == (4 if gain is not None else 0)  # 3 convs + FC
    for m in layers_of(model):
        if id(m) in kept:
            assert m.weight.abs().max() <= 1 / math.sqrt(m.weight[0].numel()) and (m.bias == 0).all()
            continue
        g = gain if gain is not None else expected.get(id(m), math.sqrt(2))
        fan_out, fan_in = m.weight.shape[0], m.weight[0].numel()
        fan_out *= m.weight[0, 0].numel() if m.weight.dim() == 4 else 1
        a = g * math.sqrt(6.0 / (fan_in + fan_out))
        assert m.weight.abs().max() <= a and (m.bias == 0).all()
        if m.weight.numel() >= 10_000:  # enough samples for the variance (within 5%)
            assert abs(float(m.weight.detach().var()) / (a * a / 3) - 1) < 0.05
    for p in model.core.rnn.parameters():  # torch's default: U(-1/sqrt(R), 1/sqrt(R)), biases too
        assert p.abs().max() <= 1 / math.sqrt(64) and (p != 0).any()


def test_torch_default_keeps_torch_weights_and_zeroes_biases():
    """Sample Factory's torch_default: the weights as torch made them (same draws), the Linear/Conv biases 0."""
    cfg = make_cfg(**SMALL, policy_initialization="torch_default")
    torch.manual_seed(6)
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
    torch.manual_seed(6)
    reference = torch.nn.Linear(D, F)  # the first module the model constructs
    assert torch.equal(model.encoder.obs_encoder.net[0].weight, reference.weight)
    assert all((m.bias == 0).all() for m in layers_of(model))
    assert all((p != 0).any() for p in model.core.rnn.parameters())


# --- flags, validation, checkpoints ----------------------------------------------------------------------------
def _parse(tmp_path, *args):
    return parse_cfg(["--env", "test_box", "--train_dir", str(tmp_path), *args])


def test_flags_defaults_and_values(tmp_path):
    cfg = _parse(tmp_path)
    assert (cfg.rnn_num_layers, cfg.actor_critic_share_weights, cfg.adaptive_stddev, cfg.initial_stddev,
            cfg.continuous_tanh_scale, cfg.policy_initialization, cfg.policy_init_gain) == \
        (1, True, True, 1.0, 0.0, "orthogonal", None)
    cfg = _parse(tmp_path, "--rnn_num_layers=3", "--actor_critic_share_weights=False", "--adaptive_stddev=False",
                 "--initial_stddev=0.5", "--continuous_tanh_scale=2", "--policy_initialization=xavier_uniform",
                 "--policy_init_gain=1.0")
    assert (cfg.rnn_num_layers, cfg.actor_critic_share_weights, cfg.adaptive_stddev, cfg.initial_stddev,
            cfg.continuous_tanh_scale, cfg.policy_initialization, cfg.policy_init_gain) == \
        (3, False, False, 0.5, 2.0, "xavier_uniform", 1.0)
    assert _parse(tmp_path, "--policy_init_gain", "None").policy_init_gain is None


@pytest.mark.parametrize("args, message", [
    (["--rnn_num_layers=0"], "--rnn_num_layers must be in [1, 64] (got 0)"),
    (["--policy_initialization=kaiming"], "--policy_initialization must be one of orthogonal, xavier_uniform, "
                                          "torch_default (got 'kaiming')"),
    (["--policy_init_gain=0"], "--policy_init_gain must be in (0, 1000] or None (got 0.0)"),
    (["--policy_init_gain=x"], "--policy_init_gain: expected a number, got 'x'"),
    (["--adaptive_stddev=False", "--initial_stddev=0"], "--initial_stddev must be in (0, 7.389] (got 0.0)"),
    (["--adaptive_stddev=False", "--continuous_tanh_scale=-1"], "--continuous_tanh_scale must be in [0, 1000000]"),
    (["--actor_critic_share_weights=maybe"], "--actor_critic_share_weights: expected True or False, got 'maybe'"),
    (["--initial_stddev=0.5"], "--initial_stddev 0.5 applies to the learned state-independent std of "
                               "--adaptive_stddev False"),
    (["--continuous_tanh_scale=1"], "--continuous_tanh_scale 1.0 applies to the learned state-independent std"),
])
def test_bad_values_are_one_line(tmp_path, args, message):
    with pytest.raises(ConfigError) as e:
        _parse(tmp_path, *args)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_model_options_in_checkpoints():
    """Recorded only where they differ from the model that older checkpoints hold: those still load."""
    default = make_cfg()
    assert model_options(default) == {"nonlinearity": "elu"}  # what older checkpoints recorded
    cfg = make_cfg(rnn_num_layers=2, actor_critic_share_weights=False, adaptive_stddev=False,
                   continuous_tanh_scale=1.5, policy_initialization="xavier_uniform")
    assert model_options(cfg) == {"nonlinearity": "elu", "rnn_num_layers": 2, "actor_critic_share_weights": False,
                                  "adaptive_stddev": False, "continuous_tanh_scale": 1.5}
    box = spaces.Box(-1, 1, (2,))
    small = dict(SMALL, adaptive_stddev=False)
    meta = checkpoint_meta(make_cfg(**small), VECTOR_OBS, box,
                           create_actor_critic(make_cfg(**small), VECTOR_OBS, box))
    squashed = make_cfg(**small, continuous_tanh_scale=1.0)  # same shapes, another function
    with pytest.raises(CheckpointError, match="has model options"):
        check_compatible(meta, checkpoint_meta(squashed, VECTOR_OBS, box,
                                               create_actor_critic(squashed, VECTOR_OBS, box)), "ckpt.pth")
    current = checkpoint_meta(make_cfg(**SMALL), VECTOR_OBS, box,
                              create_actor_critic(make_cfg(**SMALL), VECTOR_OBS, box))
    check_compatible(dict(current, model_options={"nonlinearity": "elu"}), current, "old.pth")  # an older checkpoint


# --- a real run: train, resume, play ----------------------------------------------------------------------------
OPTIONS = ["--rnn_num_layers", "2", "--actor_critic_share_weights", "False", "--policy_initialization",
           "xavier_uniform", "--adaptive_stddev", "False", "--initial_stddev", "0.5"]
TINY = ["--num_workers", "1", "--num_envs_per_worker", "2", "--rollout", "8", "--recurrence", "4", "--batch_size", "32",
        "--rnn_size", "16", "--hidden_size", "16", "--encoder_mlp_layers", "16", "--device", "cpu", "--seed", "1"]


@pytest.mark.e2e
def test_train_resume_enjoy_with_model_options(tmp_path, entry):
    base = ["--env", "test_box", "--experiment", "opts", "--train_dir", tmp_path]
    res = entry("train.py", *base, *TINY, *OPTIONS, "--train_for_env_steps", "300", timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    from sf.learning.checkpoint_store import CheckpointManager
    first = CheckpointManager(tmp_path / "opts").load("latest")
    assert first["meta"]["model_options"] == {"nonlinearity": "elu", "rnn_num_layers": 2,
                                              "actor_critic_share_weights": False, "adaptive_stddev": False}
    assert "critic_core.rnn.weight_hh_l1" in first["model"] and first["model"]["action_log_std"].shape == (1,)

    res = entry("train.py", *base, "--train_for_env_steps", str(int(first["env_steps"]) + 300), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Resumed from checkpoint" in res.stdout + res.stderr  # the saved config.json rebuilt the same model
    second = CheckpointManager(tmp_path / "opts").load("latest")
    assert second["policy_version"] > first["policy_version"]

    res = entry("enjoy.py", *base, "--no_render", "--max_num_episodes", "2", timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "2 episodes: reward mean" in res.stdout
    res = entry("enjoy.py", *base, "--no_render", "--max_num_episodes", "1", "--rnn_num_layers", "1", timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "checkpoint" in lines[0], res.stderr
