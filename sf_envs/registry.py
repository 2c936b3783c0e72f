"""The env registry: names -> EnvSpec, and make_env(cfg) -> a gymnasium.Env of the env contract.

    from sf_envs.registry import make_env, env_spec, env_names, register_env
    spec = env_spec("doom_basic")      # EnvSpec(name, family, frameskip, gamma, ...)
    env = make_env(cfg, env_index=0)   # uses cfg.env, cfg.seed and the env parameters of sf_envs/params.py

Families: doom_* (VizDoom), atari_<game> (ale-py), dmlab_<level> (DeepMind Lab), mujoco_* (gymnasium's MuJoCo
envs), test_* (built-in, no package), gym:<id> or gym:<module>:<id> (any gymnasium env, adapted to the contract),
pettingzoo_<env> (PettingZoo's multi-agent envs, sf_envs/pettingzoo) and whatever users add with register_env().
The built-in families are listed once, in sf_envs/families.py.
Specs are built per family when first asked for. A family's integration module (doom_env.py, atari_env.py, ...: the
face of its package, vizdoom, ale_py, ...) is imported where an env of the family is made or checked: listing envs
loads none of them (nor cv2, psutil), and `python -m sf_envs.doom.fetch_scenarios` runs before doom_env imports it.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

import gymnasium as gym

from sf_envs.atari.games import atari_games
from sf_envs.dmlab.levels import DMLAB_ENVS
from sf_envs.doom.engine_shm import engine_shm_files, remove_stale_engine_files
from sf_envs.doom.scenarios import ALL_SCENARIOS
from sf_envs.episode_stats import EpisodeStatistics
from sf_envs.errors import EnvUnavailableError, UnknownEnvError
from sf_envs.families import FAMILIES
from sf_envs.gym_env import adapt_env, make_gym_env
from sf_envs.mujoco.envs import MUJOCO_ENVS
from sf_envs.params import get_param
from sf_envs.pettingzoo import pettingzoo_spec
from sf_envs.spec import EnvSpec
from sf_envs.test_envs import TEST_ENVS

__all__ = ["UnknownEnvError", "EnvUnavailableError", "env_spec", "env_names", "make_env", "register_env",
           "unregister_env", "check_env_available", "process_leftover_files", "register_leftover_files"]

FAMILIES_WITH_FRAMESKIP = tuple(f.name for f in FAMILIES if f.frameskip)
ENVPOOL_FAMILIES = {f.name: f.envpool for f in FAMILIES if f.envpool}  # --env_engine envpool: what a pool holds


_USER: dict[str, EnvSpec] = {}
_FAMILY_CACHE: dict[str, dict[str, EnvSpec]] = {}


# --- built-in families (sf_envs/families.py) -------------------------------------------------------
_SPECS: dict[str, Callable[[], dict[str, EnvSpec]]] = {}  # listed family's name -> the builder of its specs


def _specs_of(family: str):
    def register(build):
        _SPECS[family] = build
        return build
    return register


@_specs_of("doom")
def _doom_specs() -> dict[str, EnvSpec]:
    def factory_for(sc):
        def factory(cfg, env_index=0, render_mode=None):
            if sc.num_agents > 1:  # a multiplayer match: one engine per learning agent
                from sf_envs.doom.doom_multiplayer import DoomMultiplayerEnv
                return DoomMultiplayerEnv(sc, cfg, env_index, render_mode)
            from sf_envs.doom.doom_env import DoomEnv
            return DoomEnv(sc, cfg, env_index, render_mode)
        return factory

    def check_for(sc):
        def check(cfg):
            from sf_envs.doom.doom_env import scenario_path
            scenario_path(sc, cfg)
        return check

    return {sc.name: EnvSpec(sc.name, "doom", sc.frameskip, sc.gamma, sc.description, num_agents=sc.num_agents,
                             factory=factory_for(sc), check=check_for(sc)) for sc in ALL_SCENARIOS}


@_specs_of("atari")
def _atari_specs() -> dict[str, EnvSpec]:
    def factory_for(game):
        def factory(cfg, env_index=0, render_mode=None):
            from sf_envs.atari.atari_env import AtariEnv
            return AtariEnv(game, cfg, env_index, render_mode)
        return factory

    def check(cfg):
        if importlib.util.find_spec("ale_py") is None:
            raise EnvUnavailableError(f"env {cfg.env if cfg is not None else 'atari_*'} needs ale-py (ROMs included): "
                                      "pip install ale-py")

    return {f"atari_{g}": EnvSpec(f"atari_{g}", "atari", 4, None, f"Atari 2600 {g} (ALE)", factory=factory_for(g),
                                  check=check)
            for g in atari_games()}


@_specs_of("dmlab")
def _dmlab_specs() -> dict[str, EnvSpec]:
    def factory_for(name):
        def factory(cfg, env_index=0, render_mode=None):
            from sf_envs.dmlab.dmlab_env import make_dmlab_env
            return make_dmlab_env(name, cfg, env_index, render_mode)
        return factory

    def check(cfg):
        from sf_envs.dmlab.dmlab_env import check_dmlab
        check_dmlab()

    return {name: EnvSpec(name, "dmlab", 4, None, desc, factory=factory_for(name), check=check)
            for name, desc in DMLAB_ENVS.items()}


@_specs_of("test")
def _test_specs() -> dict[str, EnvSpec]:
    def factory_for(cls):
        def factory(cfg, env_index=0, render_mode=None):
            if getattr(cls, "NUM_AGENTS", 1) > 1:  # multi-agent: reports each agent's episodes itself
                return cls(cfg, env_index, render_mode)
            return EpisodeStatistics(cls(cfg, env_index, render_mode))  # info["episode"] (frameskip 1)
        return factory

    return {name: EnvSpec(name, "test", 1, None, cls.__doc__.strip().splitlines()[0],
                          num_agents=getattr(cls, "NUM_AGENTS", 1), factory=factory_for(cls))
            for name, cls in TEST_ENVS.items()}


@_specs_of("mujoco")
def _mujoco_specs() -> dict[str, EnvSpec]:
    def factory_for(name):
        def factory(cfg, env_index=0, render_mode=None):
            from sf_envs.mujoco.mujoco_env import make_mujoco_env
            return make_mujoco_env(name, cfg, env_index, render_mode)
        return factory

    def check_for(name):
        def check(cfg):
            from sf_envs.mujoco.mujoco_env import check_mujoco
            check_mujoco(name)
        return check

    return {name: EnvSpec(name, "mujoco", 1, None, f"MuJoCo {env_id} (gymnasium)", factory=factory_for(name),
                          check=check_for(name)) for name, env_id in MUJOCO_ENVS.items()}


_FAMILIES = {f.prefix: _SPECS[f.name] for f in FAMILIES if f.listed}  # name prefix -> its specs' builder


def _family(prefix: str) -> dict[str, EnvSpec]:
    if prefix not in _FAMILY_CACHE:
        _FAMILY_CACHE[prefix] = _FAMILIES[prefix]()
    return _FAMILY_CACHE[prefix]


def env_names() -> list[str]:
    """Every registered name (users' first), without the open-ended gym:<id> family."""
    names = list(_USER)
    for prefix in _FAMILIES:
        names += [n for n in _family(prefix) if n not in _USER]
    return names


# --- gym:<id> ---------------------------------------------------------------------------------------
def _gym_spec(name: str) -> EnvSpec:
    env_id = name[len("gym:"):]
    if not env_id:
        raise UnknownEnvError("gym: needs a gymnasium env id, e.g. gym:CartPole-v1 or gym:<module>:<EnvId>")
    module, _, short_id = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise UnknownEnvError(f"gym env {env_id!r}: cannot import module {module!r} ({e})") from None
    elif short_id.startswith("ALE/") and importlib.util.find_spec("ale_py") is not None:
        import ale_py
        gym.register_envs(ale_py)
    if short_id not in gym.registry:
        close = difflib.get_close_matches(short_id, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join('gym:' + c for c in close)}?" if close else ""
        raise UnknownEnvError(f"unknown gymnasium env id {short_id!r}{hint}")

    def factory(cfg, env_index=0, render_mode=None):
        return make_gym_env(short_id, cfg, env_index, render_mode)

    return EnvSpec(name, "gym", 1, None, f"gymnasium env {short_id}", factory=factory)


# --- public API -------------------------------------------------------------------------------------
# Sample Factory's Atari names that differ in more than '_'
_ALIASES = {"atari_montezuma": "atari_montezuma_revenge", "atari_asteroid": "atari_asteroids",
            "atari_kongfumaster": "atari_kung_fu_master", "atari_privateye": "atari_private_eye"}


def _lookup(name: str) -> Optional[EnvSpec]:
    if name in _USER:
        return _USER[name]
    if name.startswith("gym:"):
        return _gym_spec(name)
    for prefix in _FAMILIES:
        if name.startswith(prefix):
            fam = _family(prefix)
            if name in fam:
                return fam[name]
            if prefix == "atari_":  # Sample Factory's names: atari_spaceinvaders -> atari_space_invaders
                target = _ALIASES.get(name) or next(
                    (n for n in fam if n.replace("_", "") == name.replace("_", "")), None)
                if target in fam:
                    return fam[target]
    return None


def env_spec(name: str, cfg=None) -> EnvSpec:
    """The spec of a registered env; raises UnknownEnvError (one line, with close matches).

    With a cfg whose env_frameskip is set (Doom, Atari, DMLab), the returned frameskip is that override.
    """
    if not isinstance(name, str) or not name:
        raise UnknownEnvError(f"env name must be a non-empty string (got {name!r})")
    if name.startswith("pettingzoo_") and name not in _USER:  # open-ended; its agents depend on --pettingzoo_kwargs
        return pettingzoo_spec(name, cfg)
    spec = _lookup(name)
    if spec is None:
        close = difflib.get_close_matches(name, env_names(), n=4, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        if name.startswith("mujoco_"):  # a small fixed family: every valid name
            hint = f"; valid MuJoCo envs: {', '.join(_family('mujoco_'))}"
        raise UnknownEnvError(f"unknown env {name!r}{hint} (see sf_envs.registry.env_names(); gym:<id> wraps any "
                              f"gymnasium env)")
    fs = get_param(cfg, "env_frameskip") if cfg is not None else None
    if fs and spec.family in FAMILIES_WITH_FRAMESKIP and int(fs) != spec.frameskip:
        spec = replace(spec, frameskip=int(fs))
    if cfg is not None and get_param(cfg, "env_engine") == "envpool":
        spec = _envpool_spec(spec, cfg)
    return spec


def _envpool_spec(spec: EnvSpec, cfg) -> EnvSpec:
    """--env_engine envpool: the same env stepped by EnvPool (sf_envs/envpool), one pool of --env_agents envs being
    one env of that many agents (atari_* and mujoco_*)."""
    if spec.family not in ENVPOOL_FAMILIES or spec.name in _USER:
        raise EnvUnavailableError(f"--env_engine envpool: EnvPool steps the atari_* and mujoco_* envs here, not "
                                  f"{spec.name!r}; use --env_engine native")
    name = spec.name

    def factory(cfg, env_index=0, render_mode=None):
        if spec.family == "atari":
            from sf_envs.envpool.atari import EnvPoolAtari
            return EnvPoolAtari(name[len("atari_"):], cfg, env_index, render_mode)
        from sf_envs.envpool.mujoco import EnvPoolMujoco
        return EnvPoolMujoco(name, cfg, env_index, render_mode)

    def check(cfg):
        if spec.family == "atari":
            from sf_envs.envpool.atari import check_envpool_atari
            check_envpool_atari(name[len("atari_"):])
        else:
            from sf_envs.envpool.mujoco import check_envpool_mujoco
            check_envpool_mujoco(name)

    agents = int(get_param(cfg, "env_agents"))
    return replace(spec, num_agents=agents, factory=factory, check=check,
                   description=f"{spec.description} on EnvPool, {agents} {ENVPOOL_FAMILIES[spec.family]} per pool")


def register_env(name: str, factory: Callable, family: str = "custom", frameskip: int = 1,
                 gamma: Optional[float] = None, description: str = "", check: Optional[Callable] = None,
                 overwrite: bool = False) -> EnvSpec:
    """Add an env without editing the library. factory(cfg, env_index, render_mode) -> gymnasium.Env.

    The env is adapted to the contract by make_env when needed: a non-Dict observation becomes {"obs": ...}
    (HWC uint8 images become CHW), Tuple/MultiBinary actions become MultiDiscrete, and info["episode"] is
    added at the end of each episode if the env does not report one itself.
    """
    if not isinstance(name, str) or not name or name.startswith("gym:"):
        raise ValueError(f"invalid env name {name!r}")
    if not callable(factory):
        raise TypeError("factory must be callable: factory(cfg, env_index, render_mode) -> gymnasium.Env")
    if not overwrite and _lookup(name) is not None:
        raise ValueError(f"env {name!r} is already registered (pass overwrite=True to replace it)")
    spec = EnvSpec(name, family, int(frameskip), gamma, description, factory=factory, check=check)
    _USER[name] = spec
    return spec


def unregister_env(name: str) -> None:
    _USER.pop(name, None)


def check_env_available(cfg, name: Optional[str] = None) -> EnvSpec:
    """Raise EnvUnavailableError (one line: what is missing and how to get it) when cfg.env cannot run here."""
    spec = env_spec(name or cfg.env, cfg)
    if spec.check is not None:
        spec.check(cfg)
    return spec


def make_env(cfg, env_index: int = 0, render_mode: Optional[str] = None) -> gym.Env:
    """An env of the contract for cfg.env. Raises UnknownEnvError / EnvUnavailableError (one line each)."""
    if render_mode not in (None, "human", "rgb_array"):
        raise ValueError(f"render_mode must be None, 'human' or 'rgb_array' (got {render_mode!r})")
    spec = check_env_available(cfg)
    env = spec.factory(cfg, env_index, render_mode)
    if spec.name in _USER:  # users' envs: adapted to the contract (a no-op for envs that already follow it)
        env = adapt_env(env, cfg, env_index, spec.frameskip)
    return env


# --- what a killed env process leaves behind ----------------------------------------------------------------------
def _doom_leftovers(cmdline: list[str]) -> list[Path]:
    return engine_shm_files(cmdline)


_LEFTOVER_HOOKS: list[Callable[[list[str]], list[Path]]] = [_doom_leftovers]


def register_leftover_files(hook: Callable[[list[str]], list[Path]]) -> None:
    """For envs that start processes of their own: `hook(cmdline) -> files` names the files such a process leaves
    behind when it is killed instead of closed (its shared memory); whoever kills it removes them."""
    if hook not in _LEFTOVER_HOOKS:
        _LEFTOVER_HOOKS.append(hook)


def remove_stale_leftovers(min_age: float = 300.0) -> tuple[int, int]:
    """Remove what env processes of earlier runs left behind when every process of their run was killed at once and
    nobody was left to remove it (VizDoom engines' shared memory: sf_envs.doom.engine_shm.stale_engine_files): files
    of this user, older than `min_age` seconds, that no live process uses. Returns (files removed, bytes freed)."""
    return remove_stale_engine_files(min_age)


def process_leftover_files(cmdline: list[str]) -> list[Path]:
    """The files a killed env process of this command line leaves behind ([] for any other process): for the training
    system's process control (sf.processes.control.add_leftover_hook), which knows no env."""
    return [f for hook in _LEFTOVER_HOOKS for f in hook(cmdline)]
