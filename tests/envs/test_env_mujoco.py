"""MuJoCo envs for real (gymnasium's, on the mujoco package): Sample Factory's names, spaces, unclipped actions, the
preset of configs/mujoco.json, and a short train.py run played back by enjoy.py --save_video."""
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from e2e_helpers import ROOT, made_once
from env_test_helpers import check_contract, observation_trace
from sf.cfg import ConfigError, cli_main, parse_cfg
from sf_envs.errors import EnvUnavailableError
from sf_envs.mujoco.envs import MUJOCO_ENVS
from sf_envs.params import env_cfg
from sf_envs.registry import env_names, env_spec, make_env

# sf_examples/mujoco/mujoco_utils.py of Sample Factory 2.1.1 (MUJOCO_ENVS): its names and gymnasium ids
SF_NAMES = {"mujoco_hopper": "Hopper-v4", "mujoco_halfcheetah": "HalfCheetah-v4", "mujoco_humanoid": "Humanoid-v4",
            "mujoco_ant": "Ant-v4", "mujoco_standup": "HumanoidStandup-v4",
            "mujoco_doublependulum": "InvertedDoublePendulum-v4", "mujoco_pendulum": "InvertedPendulum-v4",
            "mujoco_reacher": "Reacher-v4", "mujoco_walker": "Walker2d-v4", "mujoco_pusher": "Pusher-v4",
            "mujoco_swimmer": "Swimmer-v4"}

# sf_examples/mujoco/mujoco_params.py of Sample Factory 2.1.1 (mujoco_override_defaults), under our parameter names
# (async_rl=False is synchronous PPO: --sync_mode ppo); its values that select nothing here (batched_sampling,
# shuffle_minibatches, serial_mode False, env_frameskip 1) are left out
SF_PRESET = dict(sync_mode="ppo", num_envs_per_worker=8, worker_num_splits=2, train_for_env_steps=10_000_000,
                 encoder_mlp_layers=[64, 64], nonlinearity="tanh", batch_size=1024, kl_loss_coeff=0.1, use_rnn=False,
                 adaptive_stddev=False, policy_initialization="torch_default", reward_scale=1.0, rollout=64,
                 max_grad_norm=3.5, num_epochs=2, num_batches_per_epoch=4, ppo_clip_ratio=0.2, value_loss_coeff=1.3,
                 exploration_loss_coeff=0.0, learning_rate=0.00295, lr_schedule="linear_decay", gamma=0.99,
                 gae_lambda=0.95, with_vtrace=False, recurrence=1, normalize_input=True, normalize_returns=True,
                 value_bootstrap=True, experiment_summaries_interval=3.0, save_every_sec=15,
                 initial_stddev=1.0, actor_critic_share_weights=True, shuffle_minibatches=False)  # (its defaults)


def raw_env(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return gym.make(env_id, disable_env_checker=True)


def test_sample_factory_names():
    assert set(MUJOCO_ENVS) == set(SF_NAMES)
    for name, env_id in MUJOCO_ENVS.items():
        # Pusher-v4 refuses mujoco>=3 (gymnasium): the one v5
        assert env_id == SF_NAMES[name] or (name == "mujoco_pusher" and env_id == "Pusher-v5"), name
        assert env_id in gym.registry and name in env_names()
        spec = env_spec(name)
        assert spec.family == "mujoco" and spec.frameskip == 1 and spec.num_agents == 1


def test_unknown_name_lists_the_valid_ones(tmp_path, capsys):
    rc = cli_main(lambda cfg: 0, mode="train", prog="train.py",
                  argv=["--env", "mujoco_cheetah", "--train_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "unknown env 'mujoco_cheetah'" in err, err
    assert all(name in err for name in SF_NAMES), err
    assert not list(tmp_path.iterdir())


def test_missing_mujoco_is_one_line(monkeypatch, tmp_path):
    from sf.runner.startup.preflight import probe_env
    cfg = parse_cfg(["--env", "mujoco_hopper", "--train_dir", str(tmp_path)])  # the preset needs no mujoco
    monkeypatch.setitem(sys.modules, "mujoco", None)  # as if not installed: find_spec() and import fail
    with pytest.raises(EnvUnavailableError) as e:
        make_env(cfg)
    assert str(e.value) == ("env mujoco_hopper needs mujoco (MuJoCo): pip install 'mujoco>=2.3.3' imageio "
                            "(or pip install -e '.[mujoco]')")
    with pytest.raises(ConfigError) as e:  # what train.py prints (one line, exit code 2) before starting anything
        probe_env(cfg)
    assert str(e.value).startswith("env mujoco_hopper needs mujoco") and "\n" not in str(e.value)


@pytest.mark.parametrize("name", sorted(SF_NAMES))
def test_spaces_and_contract(name):
    env = make_env(env_cfg(name, seed=0))
    raw = raw_env(MUJOCO_ENVS[name])
    obs_space, act_space = env.observation_space["obs"], env.action_space
    assert obs_space.dtype == np.float32 and obs_space.shape == raw.observation_space.shape
    assert isinstance(act_space, gym.spaces.Box) and act_space.dtype == np.float32
    assert act_space.shape == raw.action_space.shape  # the env's bounds (Humanoid +-0.4, InvertedPendulum +-3)
    assert np.array_equal(act_space.low, raw.action_space.low) and np.array_equal(act_space.high, raw.action_space.high)
    check_contract(env, steps=20)
    env.close()
    raw.close()


def test_actions_reach_the_env_as_sampled_as_in_sample_factory():
    """Sample Factory steps MuJoCo with the Gaussian's sample unclipped: the actuators clamp the control (same motion)
    and the control cost is charged for the sample. Returns then compare with Sample Factory's."""
    env = make_env(env_cfg("mujoco_halfcheetah", seed=0))
    big = np.array([3.0, -3.0, 0.5, 2.0, -0.2, 9.0], np.float32)  # what the Gaussian policy can sample
    clipped = np.clip(big, -1.0, 1.0)

    def first_step(e, action):
        e.reset(seed=5)
        obs, reward, *_ = e.step(action)
        return np.asarray(obs["obs"] if isinstance(obs, dict) else obs, np.float64), reward

    obs_big, r_big = first_step(env, big)
    raw = raw_env("HalfCheetah-v4")
    obs_raw, r_raw = first_step(raw, big)
    assert np.allclose(obs_raw, obs_big, atol=1e-5) and r_big == pytest.approx(r_raw, abs=1e-6)
    obs_clip, r_clip = first_step(env, clipped)
    assert np.allclose(obs_big, obs_clip, atol=1e-5)  # the same motion
    assert r_clip - r_big == pytest.approx(0.1 * (np.sum(big.astype(np.float64) ** 2) - np.sum(clipped ** 2)))
    env.close()
    raw.close()


def test_seeded_episodes_are_deterministic():
    def trace(seed):
        return observation_trace(make_env(env_cfg("mujoco_hopper", seed=seed)), 60, stop_at_episode_end=False)
    assert np.array_equal(trace(1), trace(1))
    assert not np.array_equal(trace(1), trace(2))


def test_episode_report_at_the_time_limit():
    env = make_env(env_cfg("mujoco_reacher", seed=0))  # 50-step episodes, never terminated early
    env.reset()
    total = 0.0
    for t in range(50):
        _, r, term, trunc, info = env.step(env.action_space.sample())
        total += r
        assert not term and trunc == (t == 49)
    assert info["episode"]["length"] == 50 and info["episode"]["reward"] == pytest.approx(total)
    env.close()


# the preset's own optimisation (configs/mujoco.json): CleanRL's ppo_continuous_action.py's, measured above CleanRL's
# published means at 1M steps (docs/benchmarks.md, Learning); the rest is Sample Factory's preset (value_loss_coeff
# 0.25: CleanRL's 0.5 x 0.5 MSE, our value loss being Sample Factory's, without the 1/2)
OURS = dict(num_envs_per_worker=16, batch_size=128, num_epochs=10, learning_rate=0.0003, kl_loss_coeff=0.0,
            value_loss_coeff=0.25, max_grad_norm=0.5, policy_initialization="orthogonal",
            actor_critic_share_weights=False, shuffle_minibatches=True)
# the flags that give Sample Factory's preset back (the preset's _comment names them)
SF_FLAGS = ["--num_envs_per_worker", "8", "--batch_size", "1024", "--num_epochs", "2", "--learning_rate", "0.00295",
            "--kl_loss_coeff", "0.1", "--value_loss_coeff", "1.3", "--max_grad_norm", "3.5",
            "--policy_initialization", "torch_default", "--actor_critic_share_weights", "True",
            "--shuffle_minibatches", "False"]


def test_preset_is_cleanrls_optimisation_over_sample_factorys(tmp_path):
    cfg = parse_cfg(["--env", "mujoco_halfcheetah", "--train_dir", str(tmp_path)])
    assert {k: getattr(cfg, k) for k in OURS} == OURS
    assert {k: getattr(cfg, k) for k in SF_PRESET if k not in OURS} == {k: v for k, v in SF_PRESET.items()
                                                                       if k not in OURS}
    cfg = parse_cfg(["--env", "mujoco_halfcheetah", "--train_dir", str(tmp_path), *SF_FLAGS])
    assert {k: getattr(cfg, k) for k in SF_PRESET} == SF_PRESET  # Sample Factory's documented preset, by flags
    cfg = parse_cfg(["--env", "mujoco_walker", "--train_dir", str(tmp_path), "--learning_rate", "0.001"])
    assert cfg.learning_rate == 0.001 and cfg.nonlinearity == "tanh"  # flags over the preset
    assert cfg.initial_stddev == 1.0  # every task: no task-only entry


@pytest.mark.e2e
def test_sample_factorys_flags_restore_every_setting_its_parser_gives():
    """Sample Factory 2.1.1's own parser (its MuJoCo trainer, in .venv-sf) against our configuration with SF_FLAGS:
    every flag that names a parameter of ours has its value, but for what does not change a synchronous
    single-policy run (the lag cut, unused by synchronous PPO; PBT's perturbation). With fewer workers the batch is
    smaller, and so are its minibatches per epoch (ours: one per --batch_size samples; its: --num_batches_per_epoch)."""
    import importlib.util

    from test_import_sf import SF_PYTHON
    if not SF_PYTHON.exists():
        pytest.skip(f"{SF_PYTHON} is absent (make setup-sf)")
    spec = importlib.util.spec_from_file_location("sf_same_settings", ROOT / "benchmarks" / "sf_same_settings.py")
    same = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(same)
    theirs = same.sf_defaults(str(SF_PYTHON), "sf_examples.mujoco.train_mujoco", "mujoco_hopper")
    for env in ("mujoco_hopper", "mujoco_halfcheetah"):
        # (its 8 workers: a ppo batch of one rollout of every env, whose minibatches its --num_batches_per_epoch gives)
        ours = parse_cfg(["--env", env, "--num_workers", str(theirs["num_workers"]), *SF_FLAGS]).as_dict()
        differing = {f.split("=")[0] for f in same.translate(ours, theirs)[0] if f.startswith("--")}
        assert differing <= {"--max_policy_lag", "--pbt_perturb_min", "--pbt_perturb_max"}, differing
        two = parse_cfg(["--env", env, "--num_workers", "2", *SF_FLAGS]).as_dict()  # a quarter of the batch: 1 step
        assert {"--num_workers=2", "--num_batches_per_epoch=1"} <= set(same.translate(two, theirs)[0])
        assert "--batch_size=128" in same.translate(parse_cfg(["--env", env]).as_dict(), theirs)[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, entry):
    """train_dir/tiny, and the run's console output."""
    def make(train_dir):
        res = entry("train.py", "--env", "mujoco_halfcheetah", "--experiment", "tiny", "--train_dir", train_dir,
                    "--num_workers", "1", "--train_for_env_steps", "3000", "--device", "cpu", "--seed", "1",
                    timeout=300)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        (train_dir / "console.txt").write_text(res.stdout)
    train_dir = made_once(tmp_path_factory, "mujoco", make)
    return train_dir, (train_dir / "console.txt").read_text()


@pytest.mark.e2e
def test_short_training_run(trained):
    train_dir, console = trained
    assert "Mode: ppo" in console  # the preset's synchronous PPO
    assert list((Path(train_dir) / "tiny" / "checkpoint_p0").glob("checkpoint_*.pth"))


@pytest.mark.e2e
def test_enjoy_writes_a_video_headless(trained, entry, monkeypatch):
    import av
    train_dir, _ = trained
    monkeypatch.delenv("MUJOCO_GL", raising=False)  # no display, no backend chosen: the env picks EGL or OSMesa
    monkeypatch.delenv("DISPLAY", raising=False)
    res = entry("enjoy.py", "--env", "mujoco_halfcheetah", "--experiment", "tiny", "--train_dir", train_dir,
                "--save_video", "--video_frames", "15", "--max_num_frames", "30", "--device", "cpu", timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    video = Path(train_dir) / "tiny" / "replay_tiny.mp4"
    assert f"Video: {video}" in res.stdout and video.stat().st_size > 0
    with av.open(str(video)) as c:
        rate = c.streams.video[0].average_rate
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == 15 and frames[0].shape == (480, 480, 3)
    assert rate == 20 and "at 20.0 fps" in res.stdout  # HalfCheetah's own rate (metadata render_fps: 1 / dt)
    assert frames[0].std() > 10  # the scene, not a blank frame


@pytest.mark.slow
def test_learns_halfcheetah(tmp_path, entry):
    """The preset learns: from about -300 (random) to a positive average return within 300k env frames."""
    from sf.runner.stats import read_event_scalars
    res = entry("train.py", "--env", "mujoco_halfcheetah", "--experiment", "learn", "--train_dir", tmp_path,
                "--train_for_env_steps", "300000", "--device", "cpu", "--seed", "1", timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    rewards = read_event_scalars(tmp_path / "learn")["reward/reward"]
    assert rewards[0][1] < -100 and rewards[-1][1] > 0, rewards
