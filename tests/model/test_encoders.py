"""Encoders as Sample Factory 2.1.1's (sample_factory/model/encoder.py): every --encoder_conv_architecture with its
layer sizes and parameter counts, --encoder_conv_mlp_layers, Dict observations (one encoder per key, outputs
concatenated), the input preprocessing --obs_subtract_mean / --obs_scale / --normalize_input_keys against naive
oracles, the state_dict of older checkpoints, and one real run with resnet_impala (train, resume, enjoy)."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gymnasium import spaces

from model_test_helpers import DOOM_FULL_OBS, make_cfg, make_obs
from sf.cfg import ConfigError, parse_cfg
from sf.model.encoders import ConvEncoder, ObsEncoder, ResnetEncoder, make_image_encoder

ATARI, DOOM = (4, 84, 84), (3, 72, 128)
ARCHS = ("convnet_simple", "convnet_impala", "convnet_atari", "resnet_impala")
SF_FILTERS = {  # Sample Factory 2.1.1 ConvEncoder: [out_channels, kernel, stride] per conv + nonlinearity
    "convnet_simple": [(32, 8, 4), (64, 4, 2), (128, 3, 2)],
    "convnet_impala": [(16, 8, 4), (32, 4, 2)],
    "convnet_atari": [(32, 8, 4), (64, 4, 2), (64, 3, 1)],
}
SF_RESNET = [(16, 2), (32, 2), (32, 2)]  # Sample Factory 2.1.1 ResnetEncoder "resnet_impala": [channels, res blocks]
# Sample Factory 2.1.1's own encoders, built once with encoder_conv_mlp_layers [512] (sum of parameters().numel(), the
# conv head's output shape): the numbers `sf_layout` computes by hand below.
SF_BUILT = {
    ("convnet_simple", ATARI): (1164000, (128, 4, 4)), ("convnet_simple", DOOM): (1293024, (128, 3, 6)),
    ("convnet_impala", ATARI): (1339952, (32, 9, 9)), ("convnet_impala", DOOM): (1617456, (32, 7, 14)),
    ("convnet_atari", ATARI): (1684128, (64, 7, 7)), ("convnet_atari", DOOM): (2042528, (64, 5, 12)),
    ("resnet_impala", ATARI): (2080720, (32, 11, 11)), ("resnet_impala", DOOM): (2457408, (32, 9, 16)),
}


def sf_layout(arch, shape, mlp_layers):
    """(parameter count, conv output shape) of Sample Factory's encoder, from its layer definitions."""
    def conv(cin, cout, k):
        return cout * cin * k * k + cout
    c, h, w = shape
    n = 0
    if arch == "resnet_impala":  # per stage: conv 3x3 pad 1, max-pool 3 stride 2 pad 1, blocks of two 3x3 convs
        for cout, blocks in SF_RESNET:
            n += conv(c, cout, 3) + blocks * 2 * conv(cout, cout, 3)
            c, h, w = cout, (h + 1) // 2, (w + 1) // 2  # the pool: floor((h + 2 - 3) / 2) + 1 = ceil(h / 2)
    else:
        for cout, k, s in SF_FILTERS[arch]:
            n += conv(c, cout, k)
            c, h, w = cout, (h - k) // s + 1, (w - k) // s + 1
    d = c * h * w
    for size in mlp_layers:
        n += d * size + size
        d = size
    return n, (c, h, w)


def n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_resnet_impala_has_sample_factorys_shape_and_parameter_count():
    """The IMPALA ResNet, counted by hand from Sample Factory's ResnetEncoder, [4, 84, 84] frames:
    stage 1 (4 -> 16): conv 16*4*9+16 = 592, 2 blocks x 2 convs x (16*16*9+16 = 2320) = 9280;
    stage 2 (16 -> 32): conv 32*16*9+32 = 4640, 4 x (32*32*9+32 = 9248) = 36992; stage 3 (32 -> 32): 9248 + 36992;
    conv layers 97744; 84 -> 42 -> 21 -> 11: [32, 11, 11] = 3872 features; FC 3872*512+512 = 1982976; total 2080720.
    Doom [3, 72, 128]: stage 1 conv 16*3*9+16 = 448, conv layers 97600; 72x128 -> 36x64 -> 18x32 -> 9x16: 4608 features;
    FC 4608*512+512 = 2359808; total 2457408."""
    cfg = make_cfg(encoder_conv_architecture="resnet_impala", hidden_size=512)
    for shape, total, out_shape in [(ATARI, 2080720, (32, 11, 11)), (DOOM, 2457408, (32, 9, 16))]:
        enc = make_image_encoder(cfg, shape)
        assert isinstance(enc, ResnetEncoder) and enc.architecture == "resnet_impala"
        assert n_params(enc) == total and enc.conv_out_shape == out_shape and enc.out_size == 512
        assert enc(torch.zeros(2, *shape, dtype=torch.uint8)).shape == (2, 512)


@pytest.mark.parametrize("shape", [ATARI, DOOM], ids=["atari", "doom"])
@pytest.mark.parametrize("arch", ARCHS)
def test_each_architecture_has_sample_factorys_sizes(arch, shape):
    cfg = make_cfg(encoder_conv_architecture=arch, encoder_conv_mlp_layers=[512])
    enc = make_image_encoder(cfg, shape)
    assert enc.architecture == arch
    assert (n_params(enc), enc.conv_out_shape) == sf_layout(arch, shape, [512]) == SF_BUILT[arch, shape]
    with torch.no_grad():
        assert enc(torch.zeros(3, *shape, dtype=torch.uint8)).shape == (3, 512)


def naive_image_encoder(enc, x, mean: float = 0.0, scale: float = 255.0, nonlin=F.elu):
    """`enc`'s function written out in float64 with plain torch ops on the preprocessed frames, in Sample Factory's
    order: (x - mean) / scale, the conv net, flatten, the fully connected layers (each + nonlinearity)."""
    def conv(m, y, **kw):
        return F.conv2d(y, m.weight.double(), m.bias.double(), stride=m.stride, **kw)
    y = (x.double() - mean) / scale
    if isinstance(enc, ConvEncoder):
        for c in enc.convs:
            y = nonlin(conv(c, y))
    else:
        for stage in enc.stages:
            y = F.max_pool2d(conv(stage.conv, y, padding=1), 3, stride=2, padding=1)
            for block in stage.blocks:
                y = y + conv(block.conv2, nonlin(conv(block.conv1, nonlin(y), padding=1)), padding=1)
        y = nonlin(y)
    y = y.flatten(1)
    for fc in enc.fc_layers:
        y = nonlin(F.linear(y, fc.weight.double(), fc.bias.double()))
    return y.float()


@pytest.mark.parametrize("channels", [3, 4], ids=["rgb", "stacked4"])  # (4: the first convolution reads NHWC)
@pytest.mark.parametrize("mean, scale", [(0.0, 255.0), (77.0, 128.0), (-3.0, 1.0)])
@pytest.mark.parametrize("arch", ARCHS)
def test_obs_subtract_mean_and_obs_scale_are_honoured_exactly(arch, mean, scale, channels):
    """uint8 frames through the encoder (the preprocessing folded into its first convolution, the mean padded in
    for resnet_impala's padded first convolution) = the plain network on (x - mean) / scale; the CPU blocks and
    the channels_last layout change nothing."""
    torch.manual_seed(0)
    cfg = make_cfg(encoder_conv_architecture=arch, encoder_conv_mlp_layers=[32], obs_subtract_mean=mean,
                   obs_scale=scale)
    enc = make_image_encoder(cfg, (channels, 36, 48))
    x = torch.randint(0, 256, (7, channels, 36, 48), dtype=torch.uint8)
    ref = naive_image_encoder(enc, x, mean, scale)
    with torch.no_grad():
        torch.testing.assert_close(enc(x), ref, rtol=1e-4, atol=1e-4)
        enc.cpu_block = 3  # 7 frames in blocks of 3
        torch.testing.assert_close(enc(x), ref, rtol=1e-4, atol=1e-4)
        enc.channels_last = False
        torch.testing.assert_close(enc(x), ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(enc(x.float()), ref, rtol=1e-4, atol=1e-4)  # float frames: the same scaling


@pytest.mark.parametrize("arch", ARCHS)
def test_nhwc_input_gives_the_gradients_of_nchw(arch):
    """The learner's backward through a 4-channel input read NHWC (on CPU) = the one through NCHW."""
    torch.manual_seed(0)
    enc = make_image_encoder(make_cfg(encoder_conv_architecture=arch, encoder_conv_mlp_layers=[32]), (4, 36, 48))
    x = torch.randint(0, 256, (7, 4, 36, 48), dtype=torch.uint8)
    grads = []
    for channels_last in (True, False):
        enc.channels_last = channels_last
        enc.zero_grad()
        enc(x).square().sum().backward()
        grads.append([p.grad.clone() for p in enc.parameters()])
    for nhwc, nchw in zip(*grads):
        torch.testing.assert_close(nhwc, nchw, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layers, out, names", [(None, 48, ["fc"]), ([64, 16], 16, ["fc", "fc2"]),
                                                ([], 128 * 1 * 1, [])])
def test_encoder_conv_mlp_layers(layers, out, names):
    """None: one layer of --hidden_size (the single-layer encoder of older checkpoints, named `fc`); any number of
    layers, none included (the flattened conv output, as Sample Factory's empty list)."""
    cfg = make_cfg(encoder_conv_architecture="convnet_simple", hidden_size=48, encoder_conv_mlp_layers=layers)
    enc = make_image_encoder(cfg, (3, 36, 48))
    assert enc.out_size == out and [n for n, _ in enc.named_children() if n.startswith("fc")] == names
    x = torch.randint(0, 256, (2, 3, 36, 48), dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(enc(x), naive_image_encoder(enc, x), rtol=1e-4, atol=1e-4)


def test_too_small_observation_is_one_line_naming_the_flag():
    cfg = make_cfg(encoder_conv_architecture="convnet_atari")
    with pytest.raises(ConfigError, match=r"^--encoder_conv_architecture convnet_atari: observation \[3, 30, 30\] is "
                                          r"too small for it"):
        make_image_encoder(cfg, (3, 30, 30))


# --- Dict observations ------------------------------------------------------------------------------------------
MULTI = spaces.Dict({"state": spaces.Box(-np.inf, np.inf, (5,), np.float32),
                     "depth": spaces.Box(0, 255, (1, 36, 48), np.uint8),
                     "obs": spaces.Box(0, 255, (3, 36, 48), np.uint8),
                     "action_mask": spaces.Box(0, 1, (4,), np.int8)})
SMALL = dict(hidden_size=32, encoder_mlp_layers=[16, 8], encoder_conv_architecture="convnet_simple")


def naive_vector(enc, x):
    y = x.double()
    for layer in enc.net:
        y = F.linear(y, layer.weight.double(), layer.bias.double()) if isinstance(layer, torch.nn.Linear) else F.elu(y)
    return y.float()


def naive_normalized(norm, x):
    """Sample Factory's running mean/std normalization of `x` (clip 5, eps 1e-5)."""
    return ((x.double() - norm.mean.double()) / torch.sqrt(norm.var.double() + 1e-5)).clamp(-5, 5)


def test_dict_observation_two_images_and_a_vector():
    """Each key its own encoder, outputs concatenated ("obs" first, then the other keys sorted); "action_mask" is
    not an input; the vector key has its running mean/std normalizer (--normalize_input_keys None)."""
    torch.manual_seed(0)
    enc = ObsEncoder(make_cfg(**SMALL), MULTI)
    assert enc.keys == ["obs", "depth", "state"]
    assert enc.out_size == 32 + 32 + 8
    assert not any(k.startswith("action_mask") for k in enc.state_dict())
    assert {k.split(".")[0] for k in enc.state_dict()} == {"obs_encoder", "depth_encoder", "state_encoder",
                                                          "state_normalizer"}
    obs = make_obs(MULTI, (6,))
    enc.update_normalizers(obs)
    ref = torch.cat([naive_image_encoder(enc.obs_encoder, obs["obs"]),
                     naive_image_encoder(enc.depth_encoder, obs["depth"]),
                     naive_vector(enc.state_encoder, naive_normalized(enc.state_normalizer, obs["state"]))], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(enc(obs), ref, rtol=1e-4, atol=1e-4)


def test_normalize_input_keys_normalize_exactly_those_keys():
    """A listed image key is preprocessed ((x - mean) / scale), then normalized per element by statistics of the
    preprocessed frames (Sample Factory's ObservationNormalizer), then goes through the plain conv net."""
    torch.manual_seed(0)
    cfg = make_cfg(normalize_input_keys=["obs", "state"], obs_subtract_mean=10.0, obs_scale=100.0, **SMALL)
    enc = ObsEncoder(cfg, MULTI)
    assert enc.obs_normalizer.mean.shape == (3, 36, 48) and not hasattr(enc, "depth_normalizer")
    obs = make_obs(MULTI, (4, 5))  # [B, T, ...] as the learner updates them
    enc.update_normalizers(obs)
    pre = (obs["obs"].double() - 10.0) / 100.0
    torch.testing.assert_close(enc.obs_normalizer.mean, pre.reshape(-1, 3, 36, 48).mean(0).float())
    torch.testing.assert_close(enc.obs_normalizer.var, pre.reshape(-1, 3, 36, 48).var(0, unbiased=False).float())
    step = {k: v[:, 0] for k, v in obs.items()}
    ref = torch.cat([
        naive_image_encoder(enc.obs_encoder, naive_normalized(enc.obs_normalizer, (step["obs"].double() - 10) / 100),
                            mean=0.0, scale=1.0),
        naive_image_encoder(enc.depth_encoder, step["depth"], mean=10.0, scale=100.0),
        naive_vector(enc.state_encoder, naive_normalized(enc.state_normalizer, step["state"]))], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(enc(step), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("keys, normalize_input, normalized", [
    (None, True, {"state"}),  # the default: every vector key
    ([], True, set()),
    (["depth"], True, {"depth"}),
    (["obs", "state"], False, set()),  # --normalize_input False: none
])
def test_which_keys_get_a_normalizer(keys, normalize_input, normalized):
    enc = ObsEncoder(make_cfg(normalize_input_keys=keys, normalize_input=normalize_input, **SMALL), MULTI)
    assert {k.split("_normalizer")[0] for k in dict(enc.named_children()) if k.endswith("_normalizer")} == normalized


@pytest.mark.parametrize("keys", [["nope"], ["obs", "action_mask"]])
def test_unknown_normalize_input_key_is_one_line(keys):
    with pytest.raises(ConfigError) as e:
        ObsEncoder(make_cfg(normalize_input_keys=keys, **SMALL), MULTI)
    assert str(e.value) == (f"--normalize_input_keys {keys[-1]}: not an input of this env's observations (its keys: "
                            "obs depth state)")


# --- checkpoints of older runs -------------------------------------------------------------------------------------
# The encoder's state_dict of the Doom full architecture before encoders were configurable (hidden_size 32), in the
# order of its parameters (the optimizer's state in a checkpoint follows that order), and its buffers.
OLD_DOOM_FULL_PARAMS = [
    ("obs_encoder.convs.0.weight", [32, 3, 8, 8]), ("obs_encoder.convs.0.bias", [32]),
    ("obs_encoder.convs.1.weight", [64, 32, 4, 4]), ("obs_encoder.convs.1.bias", [64]),
    ("obs_encoder.convs.2.weight", [128, 64, 3, 3]), ("obs_encoder.convs.2.bias", [128]),
    ("obs_encoder.fc.weight", [32, 2304]), ("obs_encoder.fc.bias", [32]),
    ("measurements_encoder.net.0.weight", [128, 23]), ("measurements_encoder.net.0.bias", [128]),
    ("measurements_encoder.net.2.weight", [128, 128]), ("measurements_encoder.net.2.bias", [128]),
]
OLD_DOOM_FULL_BUFFERS = {"measurements_normalizer.mean": [23], "measurements_normalizer.var": [23],
                         "measurements_normalizer.count": []}


def test_old_state_dict_loads_and_computes_the_old_function():
    cfg = make_cfg(hidden_size=32)
    enc = ObsEncoder(cfg, DOOM_FULL_OBS)
    assert [(n, list(p.shape)) for n, p in enc.named_parameters()] == OLD_DOOM_FULL_PARAMS
    assert {n: list(b.shape) for n, b in enc.named_buffers()} == OLD_DOOM_FULL_BUFFERS
    g = torch.Generator().manual_seed(1)
    old = {n: torch.randn(s, generator=g) * 0.05 for n, s in OLD_DOOM_FULL_PARAMS}
    old.update({"measurements_normalizer.mean": torch.randn(23, generator=g),
                "measurements_normalizer.var": torch.rand(23, generator=g) + 0.5,
                "measurements_normalizer.count": torch.tensor(100.0, dtype=torch.float64)})
    enc.load_state_dict(old)  # strict: the same names and shapes
    obs = make_obs(DOOM_FULL_OBS, (3,))
    y = obs["obs"].double() / 255.0  # the old encoder: frames / 255, 3 convs, FC, then the measurements MLP
    for i in range(3):
        w, b = old[f"obs_encoder.convs.{i}.weight"].double(), old[f"obs_encoder.convs.{i}.bias"].double()
        y = F.elu(F.conv2d(y, w, b, stride=[4, 2, 2][i]))
    y = F.elu(F.linear(y.flatten(1), old["obs_encoder.fc.weight"].double(), old["obs_encoder.fc.bias"].double()))
    m = ((obs["measurements"].double() - old["measurements_normalizer.mean"].double())
         / torch.sqrt(old["measurements_normalizer.var"].double() + 1e-5)).clamp(-5, 5)
    for i in (0, 2):
        m = F.elu(F.linear(m, old[f"measurements_encoder.net.{i}.weight"].double(),
                           old[f"measurements_encoder.net.{i}.bias"].double()))
    with torch.no_grad():
        torch.testing.assert_close(enc(obs), torch.cat([y, m], 1).float(), rtol=1e-4, atol=1e-4)


def test_checkpoint_without_the_new_options_loads_with_the_defaults_only():
    """model_options records --obs_scale / --obs_subtract_mean only when they are not the defaults (what older
    checkpoints, which lack them, computed): an older checkpoint loads into a default run and is refused by a run
    that would feed it other inputs."""
    from sf.learning.checkpoint import CheckpointError, check_compatible
    from sf.learning.learner import checkpoint_meta, model_options
    from sf.model.actor_critic import create_actor_critic
    space, actions = spaces.Dict({"obs": spaces.Box(0, 255, (3, 36, 48), np.uint8)}), spaces.Discrete(3)
    def meta(cfg):
        return checkpoint_meta(cfg, space, actions, create_actor_critic(cfg, space, actions))
    old_meta = meta(make_cfg(**SMALL))
    old_meta["model_options"] = {"nonlinearity": "elu"}  # what older runs recorded
    for cfg in (make_cfg(**SMALL), make_cfg(normalize_input_keys=["obs"], normalize_input=False, **SMALL)):
        check_compatible(old_meta, meta(cfg), "ckpt")
    cfg = make_cfg(obs_scale=128.0, **SMALL)
    assert model_options(cfg)["obs_scale"] == 128.0
    with pytest.raises(CheckpointError, match="model options"):
        check_compatible(old_meta, meta(cfg), "ckpt")


# --- the flags -----------------------------------------------------------------------------------------------------
def _parse(tmp_path, *args):
    return parse_cfg(["--env", "test_image", "--train_dir", str(tmp_path), *args])


def test_flags_defaults_and_values(tmp_path):
    cfg = _parse(tmp_path)
    assert (cfg.encoder_conv_mlp_layers, cfg.obs_subtract_mean, cfg.obs_scale, cfg.normalize_input_keys) == \
        (None, 0.0, 255.0, None)
    cfg = _parse(tmp_path, "--encoder_conv_mlp_layers", "256", "128", "--obs_subtract_mean=128", "--obs_scale=128",
                 "--normalize_input_keys", "obs", "--encoder_conv_architecture=resnet_impala", "--encoder_mlp_layers")
    assert (cfg.encoder_conv_mlp_layers, cfg.obs_subtract_mean, cfg.obs_scale, cfg.normalize_input_keys) == \
        ([256, 128], 128.0, 128.0, ["obs"])
    assert cfg.encoder_conv_architecture == "resnet_impala" and cfg.encoder_mlp_layers == []
    assert _parse(tmp_path, "--encoder_conv_mlp_layers").encoder_conv_mlp_layers == []
    assert _parse(tmp_path, "--normalize_input_keys").normalize_input_keys == []
    for args, needle in [(["--obs_scale=0"], "--obs_scale must be in (0, 1000000000] (got 0.0)"),
                         (["--encoder_conv_mlp_layers", "0"],
                          "--encoder_conv_mlp_layers entries must be in [1, 65536]"),
                         (["--encoder_conv_architecture=resnet"], "--encoder_conv_architecture must be one of auto, "
                          "convnet_simple, convnet_impala, convnet_atari, resnet_impala")]:
        with pytest.raises(ConfigError) as e:
            _parse(tmp_path, *args)
        assert str(e.value).startswith(needle) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("family, arch", [("atari", "convnet_atari"), ("dmlab", "resnet_impala"),
                                          ("doom", "convnet_simple")])
def test_presets_use_sample_factorys_encoders(family, arch):
    """Sample Factory's examples: Atari convnet_atari (atari_params.py), DMLab-30 resnet_impala (its documented
    runs), VizDoom convnet_simple (its default); images divided by 255 (their obs_scale) and one FC layer of 512."""
    from sf.cfg.parse import load_preset
    preset = load_preset(f"{family}_x", family)
    assert preset["encoder_conv_architecture"] == arch and preset["hidden_size"] == 512
    assert "obs_scale" not in preset and "encoder_conv_mlp_layers" not in preset  # the defaults: 255, [hidden_size]


# --- one real run ----------------------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_resnet_impala_trains_resumes_and_enjoys(tmp_path, entry):
    from e2e_helpers import train_args
    args = train_args(tmp_path, "test_image", "--num_workers", "1", "--encoder_conv_architecture", "resnet_impala",
                      "--encoder_conv_mlp_layers", "32", "16")
    res = entry("train.py", *args, "--train_for_env_steps", "300", timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    exp = tmp_path / "e2e"
    saved = json.loads((exp / "config.json").read_text())
    assert saved["encoder_conv_architecture"] == "resnet_impala" and saved["encoder_conv_mlp_layers"] == [32, 16]
    state = torch.load(next((exp / "checkpoint_p0").glob("checkpoint_*.pth")), weights_only=True)
    assert "encoder.obs_encoder.stages.2.blocks.1.conv2.weight" in state["model"]
    assert "encoder.obs_encoder.fc2.weight" in state["model"]

    res = entry("train.py", *args, "--train_for_env_steps", "600", timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Resumed from checkpoint" in res.stdout

    res = entry("enjoy.py", "--env", "test_image", "--experiment", "e2e", "--train_dir", tmp_path, "--no_render",
                "--max_num_episodes", "1", "--device", "cpu", timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Loaded" in res.stdout and "Episode 1: reward" in res.stdout


@pytest.mark.e2e
def test_unknown_normalize_input_key_exits_2_writing_nothing(tmp_path, entry):
    res = entry("train.py", "--env", "test_image", "--train_dir", tmp_path, "--normalize_input_keys", "obs", "pixels",
                "--device", "cpu")
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "--normalize_input_keys pixels: not an input of this env's observations (its keys: obs)" in lines[0]
    assert not list(tmp_path.iterdir())
