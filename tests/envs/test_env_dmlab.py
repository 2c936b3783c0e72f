"""The DeepMind Lab wrapper against a stand-in `deepmind_lab` module (injected through sys.modules) that
implements the documented API surface the wrapper uses: Lab(level, observations, config, renderer,
level_cache), reset(seed=), step(action, num_steps=), is_running(), observations(), close().
No real DeepMind Lab runs here."""
import os
import sys
import types

import numpy as np
import pytest

from sf_envs.dmlab.dmlab_env import EXTENDED_ACTION_SET, IMPALA_ACTION_SET, LevelCache, optimistic_asymmetric_clip
from sf_envs.errors import EnvUnavailableError
from sf_envs.params import env_cfg
from sf_envs.registry import env_names, env_spec, make_env

from env_test_helpers import check_contract


class FakeLab:
    """Episodes of EPISODE_FRAMES frames; reward +2 per step with FIRE, -10 per step moving backward; levels
    are "compiled" on reset (a file per (level, seed)) through the level cache protocol."""

    EPISODE_FRAMES = 40
    instances = []

    def __init__(self, level, observations, config=None, renderer="software", level_cache=None):
        assert observations == ["RGB_INTERLEAVED"]
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in config.items())  # strings only, per the API
        assert renderer in ("software", "hardware")
        self.level, self.config, self.level_cache = level, config, level_cache
        self.w, self.h = int(config["width"]), int(config["height"])
        self.running, self.frames, self.steps_log, self.compiled = False, 0, [], 0
        self.closed = False
        FakeLab.instances.append(self)

    def reset(self, episode=-1, seed=None):
        assert isinstance(seed, int)
        key = f"{self.level.replace('/', '_')}_{seed}.pk3"
        if self.level_cache is not None:
            import tempfile
            pk3 = os.path.join(tempfile.mkdtemp(), "map.pk3")
            if not self.level_cache.fetch(key, pk3):
                self.compiled += 1
                with open(pk3, "wb") as f:
                    f.write(b"compiled " + key.encode())
                self.level_cache.write(key, pk3)
            else:
                assert open(pk3, "rb").read() == b"compiled " + key.encode()
        self.seed, self.running, self.frames = seed, True, 0

    def step(self, action, num_steps=1):
        assert isinstance(action, np.ndarray) and action.dtype == np.intc and action.shape == (7,)
        assert self.running
        self.steps_log.append((action.copy(), num_steps))
        self.frames += num_steps
        if self.frames >= self.EPISODE_FRAMES:
            self.running = False
        return float(2 * action[4] - 10 * (action[3] < 0)) * 1.0

    def is_running(self):
        return self.running

    def observations(self):
        assert self.running
        img = np.full((self.h, self.w, 3), self.frames % 256, np.uint8)
        img[0, 0] = (1, 2, 3)
        return {"RGB_INTERLEAVED": img}

    def close(self):
        self.closed = True


@pytest.fixture
def fake_dmlab(monkeypatch):
    mod = types.ModuleType("deepmind_lab")
    mod.Lab = FakeLab
    FakeLab.instances = []
    monkeypatch.setitem(sys.modules, "deepmind_lab", mod)
    return mod


def cfg(name, tmp_path, **kw):
    return env_cfg(name, seed=kw.pop("seed", 0), dmlab_level_cache_dir=str(tmp_path / "cache"), **kw)


def test_registered_levels():
    names = env_names()
    assert "dmlab_rooms_collect_good_objects_train" in names and "dmlab_30" in names and "dmlab_benchmark" in names
    assert sum(n.startswith("dmlab_") for n in names) == 30 + 2 + 2
    assert env_spec("dmlab_explore_goal_locations_large").frameskip == 4


def test_contract_actions_frameskip(fake_dmlab, tmp_path):
    env = make_env(cfg("dmlab_rooms_collect_good_objects_train", tmp_path), render_mode="rgb_array")
    lab = FakeLab.instances[-1]
    assert lab.level == "contributed/dmlab30/rooms_collect_good_objects_train"
    assert (lab.w, lab.h) == (96, 72)
    assert env.observation_space["obs"].shape == (3, 72, 96)
    assert env.action_space.n == len(EXTENDED_ACTION_SET) == 15
    check_contract(env, steps=25)
    obs, _ = env.reset()
    assert tuple(obs["obs"][:, 0, 0]) == (1, 2, 3)  # HWC frame -> CHW
    assert env.render().shape == (72, 96, 3)
    env.step(14)  # fire
    action, num_steps = lab.steps_log[-1]
    assert list(action) == [0, 0, 0, 0, 1, 0, 0] and num_steps == 4
    env.step(12)  # forward + large look left
    assert list(lab.steps_log[-1][0]) == [-60, 0, 0, 1, 0, 0, 0]
    env.close()
    assert lab.closed


def test_reward_clipping_and_reported_score(fake_dmlab, tmp_path):
    env = make_env(cfg("dmlab_rooms_watermaze", tmp_path))
    env.reset()
    rewards = []
    for t in range(10):  # 10 steps x 4 frames = the fake's 40-frame episode
        obs, r, term, trunc, info = env.step(14 if t % 2 == 0 else 1)  # fire (+2), backward (-10)
        rewards.append(r)
    assert term and not trunc
    assert rewards[0] == pytest.approx(optimistic_asymmetric_clip(2.0)) == pytest.approx(5 * np.tanh(0.4))
    assert rewards[1] == pytest.approx(-0.3 * 5 * np.tanh(2.0))
    assert info["episode"] == {"reward": 5 * 2.0 - 5 * 10.0, "length": 40, "score": -40.0}  # raw, not clipped
    raw = make_env(cfg("dmlab_rooms_watermaze", tmp_path, dmlab_reward_clipping=False, dmlab_extended_action_set=False))
    assert raw.action_space.n == len(IMPALA_ACTION_SET) == 9
    raw.reset()
    assert raw.step(8)[1] == 2.0


def test_level_cache_is_reused_across_envs(fake_dmlab, tmp_path):
    a = make_env(cfg("dmlab_explore_goal_locations_small", tmp_path, seed=3))
    a.reset()
    assert FakeLab.instances[-1].compiled == 1
    b = make_env(cfg("dmlab_explore_goal_locations_small", tmp_path, seed=3))
    b.reset()  # same seed -> same level key -> fetched from the cache, not compiled
    assert FakeLab.instances[-1].compiled == 0 and b.level_cache.hits == 1
    assert len(list((tmp_path / "cache").glob("*.pk3"))) == 1
    off = make_env(cfg("dmlab_explore_goal_locations_small", tmp_path, dmlab_use_level_cache=False))
    assert FakeLab.instances[-1].level_cache is None
    off.reset()


def test_level_cache_protocol(tmp_path):
    cache = LevelCache(tmp_path / "c")
    src = tmp_path / "level.pk3"
    src.write_bytes(b"map")
    assert not cache.fetch("k1", str(tmp_path / "out.pk3"))
    cache.write("k1", str(src))
    assert cache.fetch("k1", str(tmp_path / "out.pk3")) and (tmp_path / "out.pk3").read_bytes() == b"map"
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["k1"]  # no temp files left behind


def test_dmlab30_assigns_levels_by_env_index(fake_dmlab, tmp_path):
    from sf_envs.dmlab.levels import DMLAB30_LEVELS
    levels = []
    for i in (0, 1, 29, 30):
        make_env(cfg("dmlab_30", tmp_path), env_index=i)
        levels.append(FakeLab.instances[-1].level.split("/")[-1])
    assert levels == [DMLAB30_LEVELS[0], DMLAB30_LEVELS[1], DMLAB30_LEVELS[29], DMLAB30_LEVELS[0]]


def test_seeds_follow_cfg_seed(fake_dmlab, tmp_path):
    def first_seed(seed, idx):
        env = make_env(cfg("dmlab_rooms_watermaze", tmp_path, seed=seed), env_index=idx)
        env.reset()
        return FakeLab.instances[-1].seed
    assert first_seed(1, 0) == first_seed(1, 0) != first_seed(1, 1)


def test_missing_deepmind_lab_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepmind_lab", None)
    with pytest.raises(EnvUnavailableError) as e:
        make_env(env_cfg("dmlab_rooms_watermaze"))
    assert "\n" not in str(e.value) and "github.com/deepmind/lab" in str(e.value)


def test_episode_report_naive_count(fake_dmlab, tmp_path):
    """One report per episode, counted from that episode's reset: reward = score = the sum of the raw rewards,
    length = steps x frameskip (an episode cut by reset() reports nothing and does not leak into the next)."""
    env = make_env(cfg("dmlab_rooms_watermaze", tmp_path, dmlab_reward_clipping=False, env_frameskip=5))
    rng = np.random.default_rng(0)
    env.reset()
    for _ in range(3):
        env.step(14)  # fire: +2, cut by the reset below
    for _ in range(3):
        env.reset()
        rewards, term = [], False
        while not term:
            _, r, term, trunc, info = env.step(int(rng.integers(env.action_space.n)))
            rewards.append(r)
            assert ("episode" in info) == term and not trunc
        assert info["episode"] == {"reward": sum(rewards), "length": 5 * len(rewards), "score": sum(rewards)}
        assert len(rewards) == FakeLab.EPISODE_FRAMES // 5
