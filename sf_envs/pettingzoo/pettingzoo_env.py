"""PettingZoo envs as multi-agent envs of the contract (docs/architecture.md, "Multi-agent envs").

Names. `pettingzoo_<env>` (e.g. pettingzoo_pistonball_v6) is the env of PettingZoo's registry whose id ends in <env>
(butterfly/pistonball-v6; PettingZoo 1.27 made the registry the way to create envs), else the env module <env> of the
first of these packages that holds it: mpe2 (the MPE envs, a package of their own since PettingZoo 1.25),
pettingzoo.mpe, pettingzoo.butterfly, pettingzoo.sisl, pettingzoo.classic, pettingzoo.atari (older PettingZoo).
--pettingzoo_kwargs (a JSON object) goes to the env's constructor (the Parallel API one, else the AEC one).

Agents. The env's possible_agents, in their order, are agents 0..A-1 of the contract: A is fixed per env, and every
agent must have the same observation and action space (one model per policy). The rollout worker maps them to
policies like any multi-agent env's agents (--policy_mapping).

An agent that is done before the others (PettingZoo removes it from env.agents): at its last step it is terminated or
truncated with its own info["episode"], as any agent of the contract. Then, until the env's episode ends, its slot gets
zero observations, reward 0 and info["is_active"] = False (Sample Factory 2's convention): the rollout worker records
those steps as acted by no policy (policy id -1) and the learner leaves them out of the loss. When every agent is done
the env resets itself; an agent that sat out (or one that joins mid-episode) gets terminated = True on that step,
without an episode report, so that its next episode starts from a fresh recurrent state.

Turn-based games (AEC-only envs that are not parallelizable, e.g. classic connect_four_v3) run through PettingZoo's
turn_based_aec_to_parallel: every agent observes every step and only the agent whose turn it is acts; the others are
inactive for that step (their action is ignored and not trained on). A reward given to an agent while it waits (the
loser's -1 on the winner's move) reaches its last own step through the value targets, which run over masked steps.
AEC-only envs marked parallelizable go through aec_to_parallel.

Action masks. An observation {"observation": ..., "action_mask": ...} (PettingZoo's convention), or an "action_mask"
in the agents' infos (looked for in those of the first reset), becomes the observation keys "obs" (converted as gym
envs' observations: uint8 images CHW, others a float32 vector) and "action_mask" (float32 [n], 1 = legal). An agent
with no legal action (all zeros, e.g. the waiting player of a turn-based game) is inactive for that step and gets an
all-ones mask, so its (ignored) action can still be drawn.

An env with one agent (simple_v3) follows the single-agent contract (no lists; the caller resets it).
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import pkgutil
import re
from typing import Optional

import gymnasium as gym
import numpy as np

from sf_envs.episode_stats import episode_report
from sf_envs.errors import EnvUnavailableError, UnknownEnvError
from sf_envs.gym_env import _action_converter, _obs_converter
from sf_envs.params import get_param
from sf_envs.spec import EnvSpec
from sf_envs.utils import cfg_seed, derive_seed, single_threaded

PREFIX = "pettingzoo_"
# (family, package) in lookup order after the registry; pettingzoo.mpe raises ImportError since PettingZoo 1.25
FAMILIES = (("mpe", "mpe2"), ("mpe", "pettingzoo.mpe"), ("butterfly", "pettingzoo.butterfly"),
            ("sisl", "pettingzoo.sisl"), ("classic", "pettingzoo.classic"), ("atari", "pettingzoo.atari"))
_ENV_MODULE = re.compile(r"^[a-z][a-z0-9_]*_v[0-9]+$")  # PettingZoo names every env <name>_v<version>
INSTALL_HINT = "pip install -e '.[pettingzoo]' (pettingzoo, mpe2 for the MPE envs, pymunk for butterfly)"
NAME_RULE = ("names are pettingzoo_<env> with <env> an env of PettingZoo (butterfly, sisl, classic, atari) or of mpe2, "
             "e.g. pettingzoo_pistonball_v6, pettingzoo_simple_spread_v3, pettingzoo_connect_four_v3")


def _installed() -> bool:
    return any(importlib.util.find_spec(top) is not None for top in ("pettingzoo", "mpe2"))


def _registry() -> dict:
    """PettingZoo's registry of envs ({} before PettingZoo 1.27): AEC id (family/name-vN) -> spec."""
    try:
        import pettingzoo
        return dict(getattr(pettingzoo, "aec_registry", {}))
    except ImportError:
        return {}


def _registry_name(env_id: str) -> tuple[str, str]:
    """("butterfly", "pistonball_v6") of registry id butterfly/pistonball-v6."""
    family, _, short = env_id.rpartition("/")
    return family, re.sub(r"-v([0-9]+)$", r"_v\1", short)


def find_env(env: str) -> Optional[tuple[str, str]]:
    """(family, where) of PettingZoo env `env` (e.g. "pistonball_v6"): where is its registry id (with a "/",
    PettingZoo >= 1.27) or its module's name ("mpe2.simple_spread_v3"); None when there is no such env. Imports no env
    module."""
    if not _ENV_MODULE.match(env):
        return None
    for env_id in _registry():
        family, name = _registry_name(env_id)
        if name == env:
            return family, env_id
    for family, package in FAMILIES:
        try:
            if importlib.util.find_spec(f"{package}.{env}") is not None:
                return family, f"{package}.{env}"
        except (ImportError, ValueError):  # the family's package is missing or refuses to be imported
            continue
    return None


def known_envs() -> list[str]:
    """Every env of the registry and of the installed family packages (for close matches in messages)."""
    names = {_registry_name(env_id)[1] for env_id in _registry()}
    for _, package in FAMILIES:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            names.update(m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)
                         if _ENV_MODULE.match(m.name))
    return sorted(names)


def _resolve(name: str) -> tuple[str, str]:
    """find_env of pettingzoo_<env>; UnknownEnvError (how names are formed, close matches) or EnvUnavailableError
    (PettingZoo is not installed)."""
    env = name[len(PREFIX):]
    if not _installed():
        raise EnvUnavailableError(f"env {name} needs PettingZoo: {INSTALL_HINT}")
    found = find_env(env)
    if found is None:
        close = difflib.get_close_matches(env, known_envs(), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(PREFIX + c for c in close)}?" if close else ""
        raise UnknownEnvError(f"unknown PettingZoo env {name!r}: {NAME_RULE}{hint}")
    return found


def env_kwargs(cfg) -> dict:
    """--pettingzoo_kwargs as a dict ({} when not given)."""
    text = get_param(cfg, "pettingzoo_kwargs")
    return json.loads(text) if text else {}


def _make(where: str, kwargs: dict):
    """The env of the registry id or module `where`: (a ParallelEnv, None) or, for AEC-only envs, (None, an AECEnv)."""
    if "/" in where:
        import pettingzoo
        if where in pettingzoo.parallel_registry:
            return pettingzoo.make("parallel", where, **kwargs), None
        return None, pettingzoo.make("aec", where, **kwargs)
    module = importlib.import_module(where)
    if hasattr(module, "parallel_env"):
        return module.parallel_env(**kwargs), None
    if not hasattr(module, "env"):
        raise EnvUnavailableError(f"{where} has neither parallel_env nor env")
    return None, module.env(**kwargs)


def _construct(family: str, where: str, name: str, kwargs: dict, render_mode: Optional[str] = None):
    """The env as a PettingZoo ParallelEnv, and whether it is a turn-based AEC game (only the selected agent acts).
    Import and constructor failures become EnvUnavailableError (one line)."""
    if render_mode is not None:
        kwargs = dict(kwargs, render_mode=render_mode)
    try:
        par, aec = _make(where, kwargs)
        if par is not None:
            return par, False
        from pettingzoo.utils.conversions import aec_to_parallel, turn_based_aec_to_parallel
        if aec.metadata.get("is_parallelizable", False):
            return aec_to_parallel(aec), False
        return turn_based_aec_to_parallel(aec), True
    except EnvUnavailableError as e:
        raise EnvUnavailableError(f"env {name}: {e}") from None
    except Exception as e:  # a missing dependency, a TypeError for an unknown keyword argument, a value refused, ...
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, ImportError) or type(e).__name__ == "FailedToImport":  # (the registry's: the ImportError)
            cause = e if isinstance(e, ImportError) or e.__cause__ is None else e.__cause__
            extra = f"pip install 'pettingzoo[{family}]'" if family != "mpe" else INSTALL_HINT
            raise EnvUnavailableError(f"env {name} ({where}) cannot be imported ({str(cause).splitlines()[0]}): "
                                      f"{extra}") from None
        raise EnvUnavailableError(f"env {name}: {where} cannot be made with --pettingzoo_kwargs "
                                  f"{json.dumps(kwargs)}: {msg}") from None


_SPECS: dict[tuple[str, str], EnvSpec] = {}


def pettingzoo_spec(name: str, cfg=None) -> EnvSpec:
    """The EnvSpec of pettingzoo_<env> (family "pettingzoo", frameskip 1): num_agents is the env's possible_agents
    with cfg's --pettingzoo_kwargs (an env is made once per name and kwargs to count them). An env that cannot be made
    gets num_agents 1 here; make_env then raises its one-line error."""
    family, where = _resolve(name)
    text = get_param(cfg, "pettingzoo_kwargs") or ""
    key = (name, text)
    if key not in _SPECS:
        try:
            par, _ = _construct(family, where, name, json.loads(text) if text else {})
            num_agents = len(par.possible_agents)
            par.close()
        except (EnvUnavailableError, ValueError):
            num_agents = 1

        def factory(cfg, env_index=0, render_mode=None):
            return PettingZooEnv(name, cfg, env_index, render_mode)

        _SPECS[key] = EnvSpec(name, "pettingzoo", 1, None, f"PettingZoo {family} env {where}",
                              num_agents=num_agents, factory=factory)
    return _SPECS[key]


class PettingZooEnv(gym.Env):
    """A PettingZoo env as a multi-agent env of the contract: lists of A observations, rewards, dones and infos in
    and out, one agent's spaces, auto-reset when every agent is done (see the module docstring)."""

    metadata = {"render_modes": ["human", "rgb_array"], "render_fps": 30}

    def __init__(self, name: str, cfg=None, env_index: int = 0, render_mode: Optional[str] = None):
        single_threaded()
        family, where = _resolve(name)
        self.name, self.render_mode = name, render_mode
        self.par, self.turn_based = _construct(family, where, name, env_kwargs(cfg), render_mode)
        fps = (getattr(self.par, "metadata", None) or {}).get("render_fps")  # the game's own (pistonball 20, MPE 10)
        self.metadata = dict(self.metadata, render_fps=fps or self.metadata["render_fps"])
        self.agent_ids = list(self.par.possible_agents)
        self.num_agents = len(self.agent_ids)
        # one agent (simple_v3): the single-agent contract (no lists; the caller resets after the episode's end)
        self.single = self.num_agents == 1
        self.is_multiagent = not self.single
        self._first_seed = derive_seed(cfg_seed(cfg), env_index)
        self._pending = None  # the first reset's output, when __init__ had to reset to look for info action masks
        self._mask_in_obs, self._mask_in_info = False, False
        self._convert = self._spaces(name)
        self.alive: set = set()  # agents in the env's episode now
        self.finished: set = set()  # agents whose episode ended before the env's (never alive again in it)
        self.returns, self.lengths = [0.0] * self.num_agents, [0] * self.num_agents

    # --- spaces ---
    def _spaces(self, name: str):
        """Set observation_space and action_space (agent 0's, which every agent must share) and return the observation
        converter of one agent: convert(obs, info) -> dict."""
        par = self.par
        spaces = [par.observation_space(a) for a in self.agent_ids]
        inner = spaces[0]
        self._mask_in_obs = isinstance(inner, gym.spaces.Dict) and {"observation", "action_mask"} <= set(inner.spaces)
        if self._mask_in_obs:
            mask_shape, inner = inner.spaces["action_mask"].shape, inner.spaces["observation"]
        obs_space, convert_obs = _obs_converter(inner)
        action_space, self._act = _action_converter(par.action_space(self.agent_ids[0]))
        for a, s in zip(self.agent_ids[1:], spaces[1:]):
            if s != spaces[0] or par.action_space(a) != par.action_space(self.agent_ids[0]):
                raise EnvUnavailableError(
                    f"env {name}: agents {self.agent_ids[0]} and {a} have different observation or action spaces "
                    f"({spaces[0]}, {par.action_space(self.agent_ids[0])} vs {s}, {par.action_space(a)}); every agent "
                    f"of an env must share one (one model per policy)")
        if not self._mask_in_obs and isinstance(action_space, gym.spaces.Discrete):
            self._pending = par.reset(seed=self._first_seed)  # an action mask in the infos? (kept for reset())
            self._first_seed = None
            infos = self._pending[1] or {}
            masks = [infos.get(a, {}).get("action_mask") for a in self.agent_ids if isinstance(infos.get(a), dict)]
            masks = [m for m in masks if m is not None]
            self._mask_in_info = bool(masks)
            if masks:
                mask_shape = np.shape(masks[0])
        spaces_out = dict(obs_space.spaces)
        if self._mask_in_obs or self._mask_in_info:
            spaces_out["action_mask"] = gym.spaces.Box(0.0, 1.0, (int(np.prod(mask_shape)),), np.float32)
        self.observation_space = gym.spaces.Dict(spaces_out)
        self.action_space = action_space
        self._zero_obs = {k: np.zeros(s.shape, s.dtype) for k, s in spaces_out.items()}
        if "action_mask" in spaces_out:
            self._zero_obs["action_mask"][:] = 1.0

        def convert(obs, info) -> dict:
            if self._mask_in_obs:
                out = convert_obs(obs["observation"])
                mask = obs["action_mask"]
            else:
                out = convert_obs(obs)
                mask = info.get("action_mask") if self._mask_in_info and isinstance(info, dict) else None
            out = dict(out)
            if "action_mask" in spaces_out:
                out["action_mask"] = np.ones(spaces_out["action_mask"].shape, np.float32) if mask is None else \
                    np.asarray(mask, np.float32).reshape(-1)
            return out

        return convert

    # --- the contract ---
    def _observe(self, i: int, obs_d: dict, info_d: dict) -> tuple[dict, bool]:
        """Agent i's observation after a step or reset and whether it acts in the next step."""
        agent = self.agent_ids[i]
        if agent not in self.alive or agent not in obs_d:
            return {k: v.copy() for k, v in self._zero_obs.items()}, False
        obs = self._convert(obs_d[agent], info_d.get(agent) or {})
        active = not self.turn_based or agent == self.par.aec_env.agent_selection
        mask = obs.get("action_mask")
        if mask is not None and (not active or not mask.any()):  # no legal action: a waiting player
            obs["action_mask"] = np.ones_like(mask)
            active = False
        return obs, active

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        if seed is None and self._first_seed is not None:
            seed = self._first_seed
        self._first_seed = None
        if self._pending is not None and seed is None and options is None:
            obs_d, info_d = self._pending
        else:
            obs_d, info_d = self.par.reset(seed=seed, options=options)
        self._pending = None
        self.alive, self.finished = set(self.par.agents), set()
        self.returns, self.lengths = [0.0] * self.num_agents, [0] * self.num_agents
        obs, infos = [], []
        for i in range(self.num_agents):
            o, active = self._observe(i, obs_d, info_d or {})
            obs.append(o)
            infos.append({"is_active": active})
        return (obs[0], infos[0]) if self.single else (obs, infos)

    def step(self, actions):
        """actions: a list of A (the contract's); the actions of agents not in the env's episode are dropped."""
        par, A = self.par, self.num_agents
        alive_before = self.alive
        if self.single:
            actions = [actions]
        acts = {a: self._act(actions[i]) for i, a in enumerate(self.agent_ids) if a in par.agents}  # (PettingZoo's)
        obs_d, rew_d, term_d, trunc_d, info_d = par.step(acts)
        info_d = info_d or {}
        self.alive = set(par.agents) - self.finished
        rewards, terminated, truncated = [0.0] * A, [False] * A, [False] * A
        infos: list[dict] = [{} for _ in range(A)]
        for i, agent in enumerate(self.agent_ids):
            if agent not in alive_before:
                continue
            rewards[i] = float(rew_d.get(agent, 0.0))
            self.returns[i] += rewards[i]
            self.lengths[i] += 1
            te, tr = bool(term_d.get(agent, False)), bool(trunc_d.get(agent, False))
            if te or tr or agent not in self.alive:  # its episode is over (PettingZoo removed it from env.agents)
                terminated[i], truncated[i] = te or not tr, tr and not te
                infos[i]["episode"] = episode_report(self.returns[i], self.lengths[i])
                if truncated[i] and agent in obs_d:  # the learner bootstraps from it
                    infos[i]["final_obs"] = self._convert(obs_d[agent], info_d.get(agent) or {})
                self.returns[i], self.lengths[i] = 0.0, 0
                self.alive.discard(agent)
                self.finished.add(agent)
        if self.single:
            agent = self.agent_ids[0]
            done = agent not in self.alive and agent in obs_d
            obs = self._convert(obs_d[agent], info_d.get(agent) or {}) if done else self._observe(0, obs_d, info_d)[0]
            infos[0].pop("final_obs", None)  # (the single-agent contract: obs is the episode's last when it ends)
            infos[0]["is_active"] = True
            return obs, rewards[0], terminated[0], truncated[0], infos[0]
        if not self.alive:  # every agent is done: the next episode starts now (its first observations are returned)
            obs_d, info_d = par.reset()
            info_d = info_d or {}
            self.alive, self.finished = set(par.agents), set()
        obs = []
        for i, agent in enumerate(self.agent_ids):
            o, active = self._observe(i, obs_d, info_d)
            obs.append(o)
            infos[i]["is_active"] = active
            if agent in self.alive and agent not in alive_before:  # (re)joins: a fresh start, no episode to report
                terminated[i] = True
        return obs, rewards, terminated, truncated, infos

    def render(self):
        return self.par.render()

    def close(self):
        self.par.close()
