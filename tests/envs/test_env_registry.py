"""The env registry: names, specs, one-line errors with close matches, gym:<id>, register_env, params."""
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest

from sf_envs.errors import EnvUnavailableError, UnknownEnvError
from sf_envs.params import ENV_PARAMS, env_cfg, get_param
from sf_envs.registry import check_env_available, env_names, env_spec, make_env, register_env, unregister_env

from env_test_helpers import check_contract

PAPER_DOOM = ["doom_basic", "doom_defend_the_center", "doom_defend_the_line", "doom_health_gathering",
              "doom_health_gathering_supreme", "doom_my_way_home", "doom_deadly_corridor", "doom_two_colors_easy",
              "doom_two_colors_hard", "doom_battle", "doom_battle2", "doom_duel_bots", "doom_deathmatch_bots",
              "doom_benchmark"]


def test_names_and_specs():
    names = env_names()
    assert len(names) == len(set(names))
    for n in PAPER_DOOM + ["atari_breakout", "atari_pong", "dmlab_rooms_collect_good_objects_train", "dmlab_30",
                           "test_corridor", "test_image"]:
        assert n in names, n
    assert sum(n.startswith("dmlab_") for n in names) >= 30
    assert sum(n.startswith("atari_") for n in names) >= 57
    assert env_spec("doom_basic").frameskip == 4 and env_spec("doom_basic").family == "doom"
    assert env_spec("doom_basic").gamma is None
    for n in ("doom_duel_bots", "doom_deathmatch_bots"):
        assert env_spec(n).frameskip == 2 and env_spec(n).gamma == 0.995
    assert env_spec("atari_breakout").frameskip == 4 and env_spec("atari_breakout").family == "atari"
    assert env_spec("dmlab_30").family == "dmlab" and env_spec("dmlab_30").frameskip == 4
    assert env_spec("test_corridor").family == "test" and env_spec("test_corridor").frameskip == 1
    assert env_spec("atari_spaceinvaders").name == "atari_space_invaders"  # Sample Factory's names resolve too


def test_frameskip_override():
    cfg = env_cfg("doom_basic", env_frameskip=2)
    assert env_spec("doom_basic", cfg).frameskip == 2
    assert env_spec("test_corridor", env_cfg("test_corridor", env_frameskip=2)).frameskip == 1  # only simulators


@pytest.mark.parametrize("bad, expected", [("doom_basc", "doom_basic"), ("doom_batle", "doom_battle"),
                                           ("atari_breakot", "atari_breakout"), ("test_coridor", "test_corridor"),
                                           ("gym:CartPol-v1", "gym:CartPole-v1")])
def test_unknown_env_one_line_with_close_matches(bad, expected):
    with pytest.raises(UnknownEnvError) as e:
        env_spec(bad)
    msg = str(e.value)
    assert isinstance(e.value, ValueError)
    assert "\n" not in msg and expected in msg and bad.split(":")[-1] in msg


def test_unknown_env_without_match():
    with pytest.raises(UnknownEnvError, match="unknown env 'zzzz'"):
        make_env(env_cfg("zzzz"))


def test_gym_cartpole_contract():
    env = make_env(env_cfg("gym:CartPole-v1", seed=3))
    assert env_spec("gym:CartPole-v1").family == "gym"
    assert env.observation_space["obs"].shape == (4,) and env.observation_space["obs"].dtype == np.float32
    assert isinstance(env.action_space, gym.spaces.Discrete) and env.action_space.n == 2
    check_contract(env)
    obs, _ = env.reset(seed=0)
    total, steps = 0.0, 0
    while True:
        obs, r, term, trunc, info = env.step(0)
        total += r
        steps += 1
        if term or trunc:
            break
    assert info["episode"] == {"reward": total, "length": steps}
    env.close()


def test_gym_image_and_action_adaptation():
    class ImgEnv(gym.Env):
        observation_space = gym.spaces.Box(0, 255, (20, 30, 3), np.uint8)
        action_space = gym.spaces.Tuple((gym.spaces.Discrete(3, start=1), gym.spaces.Discrete(2)))

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros((20, 30, 3), np.uint8), {}

        def step(self, action):
            assert action[0] in (1, 2, 3) and action[1] in (0, 1)
            return np.full((20, 30, 3), 7, np.uint8), 1.0, True, False, {}

    gym.register("SfEnvsTestImg-v0", entry_point=ImgEnv)
    try:
        env = make_env(env_cfg("gym:SfEnvsTestImg-v0"))
        assert env.observation_space["obs"].shape == (3, 20, 30)
        assert list(env.action_space.nvec) == [3, 2]
        env.reset()
        obs, r, term, _, info = env.step(np.array([2, 1]))
        assert obs["obs"].shape == (3, 20, 30) and obs["obs"].flags.c_contiguous and term
        assert info["episode"] == {"reward": 1.0, "length": 1}
    finally:
        gym.registry.pop("SfEnvsTestImg-v0", None)


def test_gym_module_prefix(tmp_path, monkeypatch):
    (tmp_path / "sf_envs_tmp_module.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('SfEnvsTmpModuleEnv-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make_env(env_cfg("gym:sf_envs_tmp_module:SfEnvsTmpModuleEnv-v0"))
    check_contract(env, steps=5)
    with pytest.raises(UnknownEnvError, match="cannot import module"):
        env_spec("gym:no_such_module_xyz:Foo-v0")


def test_register_env_user_factory():
    calls = []

    class Raw(gym.Env):  # not yet of the contract: a plain Box obs, no episode report
        observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float64)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return self.np_random.uniform(-1, 1, 3), {}

        def step(self, action):
            self.t += 1
            return np.zeros(3), 0.5, self.t >= 4, False, {}

    def factory(cfg, env_index, render_mode):
        calls.append((cfg.env, env_index, render_mode))
        return Raw()

    spec = register_env("my_custom_env", factory, frameskip=3)
    try:
        assert "my_custom_env" in env_names() and env_spec("my_custom_env") == spec
        assert spec.family == "custom" and spec.frameskip == 3
        env = make_env(env_cfg("my_custom_env", seed=7), env_index=5, render_mode="rgb_array")
        assert calls == [("my_custom_env", 5, "rgb_array")]
        assert env.observation_space["obs"].dtype == np.float32 and env.num_agents == 1
        first, _ = env.reset()
        env2 = make_env(env_cfg("my_custom_env", seed=7), env_index=5)
        assert np.array_equal(first["obs"], env2.reset()[0]["obs"])  # seeded from cfg.seed and env_index
        for _ in range(3):
            assert "episode" not in env.step(0)[4]
        info = env.step(1)[4]
        assert info["episode"] == {"reward": 2.0, "length": 12}  # 4 steps x frameskip 3
        with pytest.raises(ValueError, match="already registered"):
            register_env("my_custom_env", factory)
        with pytest.raises(ValueError, match="already registered"):
            register_env("doom_basic", factory)
        register_env("my_custom_env", factory, overwrite=True)
    finally:
        unregister_env("my_custom_env")
    assert "my_custom_env" not in env_names()


def test_check_env_available_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "vizdoom", None)  # import vizdoom -> ImportError
    with pytest.raises(EnvUnavailableError) as e:
        check_env_available(env_cfg("doom_basic"))
    assert "\n" not in str(e.value) and "pip install vizdoom" in str(e.value)
    with pytest.raises(EnvUnavailableError):
        make_env(env_cfg("doom_basic"))
    monkeypatch.setitem(sys.modules, "deepmind_lab", None)
    with pytest.raises(EnvUnavailableError, match="deepmind/lab"):
        check_env_available(env_cfg("dmlab_30"))


def test_env_params_table():
    names = [p["name"] for p in ENV_PARAMS]
    assert len(names) == len(set(names))
    for p in ENV_PARAMS:
        assert set(p) >= {"name", "type", "default", "help", "choices"} and p["help"]
        assert p["type"] in (int, float, str, bool)
        assert (p["default"] is None or isinstance(p["default"], p["type"])
                or (p["type"] is float and isinstance(p["default"], int)))
    for n in ("doom_scenarios_dir", "doom_bots_difficulty", "env_frameskip", "dmlab_level_cache_dir", "doom_rew_frag",
              "atari_framestack"):
        assert n in names
    cfg = env_cfg("doom_basic", seed=3, doom_rew_frag=2.0)
    assert cfg.env == "doom_basic" and cfg.seed == 3 and get_param(cfg, "doom_rew_frag") == 2.0
    assert get_param(None, "atari_noop_max") == 30  # no cfg: the default
    with pytest.raises(KeyError):
        env_cfg("doom_basic", not_a_param=1)


def test_params_reach_the_command_line():
    from sf.cfg import default_cfg
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = default_cfg(env="test_corridor")
    for p in ENV_PARAMS:
        assert getattr(cfg, p["name"]) == p["default"]
