"""Helpers shared by the env tests (tests/envs)."""
import gymnasium as gym
import numpy as np

from sf_envs.params import env_cfg


def cfg_for(name, data=None, **kw):
    """An env config for `name`: seed 1 unless given, Doom scenario data from `data` (None: the default directory)."""
    return env_cfg(name, seed=kw.pop("seed", 1), doom_scenarios_dir=data, **kw)


def random_action(env, obs):
    """A random action of `env`'s space, among the valid ones where `obs` is a dict with an "action_mask" (a Discrete
    space)."""
    return env.action_space.sample(mask=obs.get("action_mask") if isinstance(obs, dict) else None)


def check_contract(env, steps=30):
    """Spaces and step() of the env contract (docs/architecture.md)."""
    assert isinstance(env.observation_space, gym.spaces.Dict) and "obs" in env.observation_space.spaces
    assert set(env.observation_space.spaces) <= {"obs", "measurements", "action_mask"}
    o_space = env.observation_space["obs"]
    assert ((o_space.dtype == np.uint8 and len(o_space.shape) == 3)
            or (o_space.dtype == np.float32 and len(o_space.shape) == 1))
    if "measurements" in env.observation_space.spaces:
        assert env.observation_space["measurements"].dtype == np.float32
    assert isinstance(env.action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.Box))
    assert env.num_agents == 1
    obs, info = env.reset(seed=1)
    assert isinstance(info, dict)
    for _ in range(steps):
        for k, space in env.observation_space.spaces.items():
            assert obs[k].shape == space.shape and obs[k].dtype == space.dtype, k
        obs, r, terminated, truncated, info = env.step(random_action(env, obs))
        assert isinstance(r, float) and isinstance(terminated, bool) and isinstance(truncated, bool)
        if terminated or truncated:
            if "episode" in info:
                assert {"reward", "length"} <= set(info["episode"])
            obs, _ = env.reset()


def episode_reports(env, episodes: int, actions, seed: int = 0) -> list[dict]:
    """The info["episode"] reports of the first `episodes` episodes `env` ends under `actions(rng)` (a generator
    seeded with `seed`): a multi-agent env (an EnvPool pool) is given one action per agent and reports each agent's,
    a single-agent env is reset at each episode end. Closes the env."""
    rng = np.random.default_rng(seed)
    env.reset()
    reports: list[dict] = []
    while len(reports) < episodes:
        _, _, terminated, truncated, infos = env.step(actions(rng))
        if getattr(env, "is_multiagent", False):
            reports += [i["episode"] for i in infos if "episode" in i]
            continue
        if "episode" in infos:
            reports.append(infos["episode"])
        if terminated or truncated:
            env.reset()
    env.close()
    return reports[:episodes]


def pool_trace(env, steps: int, actions) -> np.ndarray:
    """[steps+1, agents, *obs_shape] observations of a multi-agent env (an EnvPool pool) under `actions(rng)` (one per
    agent) from a generator seeded with 0. Closes the env."""
    rng = np.random.default_rng(0)
    out = [np.stack([o["obs"] for o in env.reset()[0]])]
    for _ in range(steps):
        out.append(np.stack([o["obs"] for o in env.step(actions(rng))[0]]))
    env.close()
    return np.stack(out)


def observation_trace(env, steps: int, stop_at_episode_end: bool) -> np.ndarray:
    """[steps+1 (or fewer), *obs_shape] frames of `env` under random actions from an action space seeded with 0;
    at an episode end it stops or resets. Closes the env."""
    env.action_space.seed(0)
    obs, _ = env.reset()
    out = [obs["obs"]]
    for _ in range(steps):
        obs, r, term, trunc, _ = env.step(env.action_space.sample())
        out.append(obs["obs"])
        if term or trunc:
            if stop_at_episode_end:
                break
            obs, _ = env.reset()
    env.close()
    return np.stack(out)
