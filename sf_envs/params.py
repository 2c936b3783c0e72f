"""Env-level parameters: one table, read by `sf/cfg/` (command-line flags) and by the env code.

Every entry is `dict(name, type, default, help, choices=None, **extra)` and says which values are valid
(sf/cfg/ checks them for the command line, presets and saved config.json alike): a number declares
`min_value` and `max_value` (inclusive unless `min_exclusive` / `max_exclusive` is True; floats must also be
finite), a string `choices` or `check` ("path": non-empty, no control characters); a default of None makes
None a valid value too. The env code reads them as attributes of the cfg (sf.cfg's Config) through
`get_param(cfg, name)`, which gives the table default when there is no cfg. `env_cfg(env, **overrides)` builds a
complete namespace from these defaults, for tests and scripts that do not use `sf/cfg/`.

Reward-shaping coefficients are the values of Sample Factory's VizDoom reward-shaping scheme
(paper, appendix A.3); "per unit" means per unit of change of the game variable between two steps.
"""
from __future__ import annotations

import types
from typing import Any


def _p(name, type, default, help, choices=None, **extra) -> dict:
    return dict(name=name, type=type, default=default, help=help, choices=choices, **extra)


REWARD_COEFF_MAX = 1000.0


def _json_object_problem(v: str):
    """What is wrong with a JSON-object parameter (a phrase that follows the flag), or None."""
    import json
    try:
        value = json.loads(v)
    except ValueError as e:
        return f"must be a JSON object such as '{{\"max_cycles\": 50}}' ({e}; got {v[:60]!r})"
    return None if isinstance(value, dict) else f"must be a JSON object, got {type(value).__name__} ({v[:60]!r})"


def _rew(name, default, help) -> dict:
    """A reward-shaping coefficient: any value in [-REWARD_COEFF_MAX, REWARD_COEFF_MAX] (negative flips its sign)."""
    return _p(name, float, default, help, min_value=-REWARD_COEFF_MAX, max_value=REWARD_COEFF_MAX)


ENV_PARAMS: list[dict] = [
    # --- all families ---
    _p("env_frameskip", int, None, "Env frames per sample (action repeat); None: the family default "
       "(Doom 4, duel/deathmatch 2, Atari 4, DMLab 4, others 1)", min_value=1, max_value=64),
    _p("env_engine", str, "native", "What steps the env: 'native' (this family's own integration) or 'envpool' "
       "(EnvPool's C++ thread pool: atari_* and mujoco_*; one pool of --env_agents envs is one env of that many "
       "agents, so --num_envs_per_worker counts pools; needs pip install envpool==1.2.5)",
       choices=("native", "envpool")),
    _p("env_agents", int, 4, "--env_engine envpool: envs (games) per pool (Sample Factory's flag); a rollout "
       "worker runs --num_envs_per_worker pools (2 to 1,024: a pool is an env of several agents; 1.6 MiB per Atari "
       "game, and start-up grows with the pool)", min_value=2, max_value=1024),
    # --- VizDoom ---
    _p("doom_scenarios_dir", str, None, "Directory with the fetched Sample Factory Doom scenarios (battle, duel, ...); "
       "None: $SF_DOOM_SCENARIOS or <repo>/data/doom_scenarios in a clone, ~/.local/share/sf/doom_scenarios "
       "installed (fill it: python -m sf_envs.doom.fetch_scenarios)",
       check="path"),
    _p("doom_res_w", int, 128, "Doom observation width (the game renders at 160x120 and is downsampled; the conv "
       "encoders need at least 36)", min_value=36, max_value=1280),
    _p("doom_res_h", int, 72, "Doom observation height (at least 36 for the conv encoders)", min_value=36,
       max_value=960),
    _p("doom_bots_difficulty", int, None, "Skill (0-100: aiming, perfection, reaction, isp) of the in-game bots of "
       "doom_*_bots; None: VizDoom's default bot roster (mixed skills)", min_value=0, max_value=100),
    _p("doom_num_bots", int, None, "Number of in-game bots in doom_*_bots (None: 1 for duel, 7 for deathmatch); "
       "VizDoom has at most 16 players, the agent included", min_value=0, max_value=15),
    _p("doom_restart_engine_steps", int, 500_000, "Restart an env's VizDoom engine at the first episode end after this "
       "many steps: the engine process grows by 5-20 bytes a step whatever the wrapper does (ViZDoom issue #484), "
       "so this bounds each engine's growth at a few MiB; 0: never", min_value=0, max_value=10**12),
    _p("doom_bots_timelimit", float, 4.0, "Match length in minutes of game time for doom_*_bots", min_value=0.1,
       max_value=10000.0),
    _p("doom_multiplayer_timelimit", float, 4.0, "Match length in minutes of game time for the multi-agent Doom envs "
       "(doom_duel, doom_deathmatch_full)", min_value=0.01, max_value=10000.0),
    _p("doom_multiplayer_timeout_sec", float, 30.0, "Multi-agent Doom: a step (or a match start) of the match's "
       "engines that takes longer than this, or an engine that is gone, ends the match (engines killed, every agent "
       "truncated) and starts a new one", min_value=1.0, max_value=3600.0),
    _p("doom_multiplayer_port_min", int, 25000, "Multi-agent Doom: lowest UDP port a match's host may use (ports are "
       "locked per user under the temp directory, so concurrent envs and runs never share one)", min_value=1024,
       max_value=65535),
    _p("doom_multiplayer_port_max", int, 29999, "Multi-agent Doom: highest UDP port a match's host may use (keep the "
       "range out of the kernel's ephemeral ports, /proc/sys/net/ipv4/ip_local_port_range)", min_value=1024,
       max_value=65535),
    _rew("doom_rew_frag", 1.0, "Reward per frag (duel/deathmatch)"),
    _rew("doom_rew_suicide", 1.5, "Penalty per lost frag (suicide) (duel/deathmatch)"),
    _rew("doom_rew_death", 0.75, "Penalty per death (duel/deathmatch)"),
    _rew("doom_rew_hit", 0.01, "Reward per hit on an opponent (at most 5 counted per step)"),
    _rew("doom_rew_damage", 0.003, "Reward per point of damage dealt (at most 200 counted per step)"),
    _rew("doom_rew_health_gain", 0.005, "Reward per point of health gained (health packs) (battle, duel, deathmatch)"),
    _rew("doom_rew_health_loss", 0.003, "Penalty per point of health lost (battle, duel, deathmatch)"),
    _rew("doom_rew_armor_gain", 0.005, "Reward per point of armor gained"),
    _rew("doom_rew_armor_loss", 0.001, "Penalty per point of armor lost"),
    _rew("doom_rew_weapon_pickup", 0.02, "Reward for a new weapon, times the weapon's preference (1-10)"),
    _rew("doom_rew_weapon_loss", 0.01, "Penalty for losing a weapon, times its preference"),
    _rew("doom_rew_ammo_pickup", 0.0002, "Reward per unit of ammo picked up, times the weapon's preference"),
    _rew("doom_rew_ammo_use", 0.0001, "Penalty per unit of ammo spent, times the weapon's preference"),
    _rew("doom_rew_weapon_hold", 0.0002, "Reward per step for keeping the same loaded weapon selected for 5+ steps, "
       "times its preference: switching weapons forfeits it (the paper's weapon-switch penalty)"),
    _rew("doom_rew_gathering_health", 1.0, "Reward per health pickup in health_gathering and two_colors"),
    # --- Atari ---
    _p("atari_noop_max", int, 30, "Up to this many random no-ops at the start of a game", min_value=0, max_value=10000),
    _p("atari_framestack", int, 4, "Frames stacked into one observation", min_value=1, max_value=64),
    _p("atari_episodic_life", bool, True, "Training episodes end at a life loss (the game goes on; reported "
       "episodes are full games)"),
    _p("atari_fire_reset", bool, True, "Press FIRE after a reset in games that need it"),
    _p("atari_clip_rewards", bool, True, "Training rewards clipped to their sign (reported returns are never clipped)"),
    _p("atari_repeat_action_probability", float, 0.0, "Sticky actions (0.0 as in NoFrameskip-v4 used by Sample "
       "Factory; ALE/...-v5 uses 0.25)", min_value=0.0, max_value=1.0),
    _p("atari_max_episode_frames", int, 108_000, "Game truncated after this many frames (30 min)", min_value=1,
       max_value=2**31 - 1),
    _p("atari_full_action_space", bool, False, "All 18 joystick actions instead of the game's minimal set"),
    # --- DeepMind Lab ---
    _p("dmlab_level_cache_dir", str, None, "DMLab level cache directory (generated maps are reused across runs); "
       "None: $SF_DMLAB_LEVEL_CACHE or <repo>/data/dmlab_level_cache in a clone, ~/.local/share/sf/dmlab_level_cache "
       "installed", check="path"),
    _p("dmlab_use_level_cache", bool, True, "Use the DMLab level cache"),
    _p("dmlab_renderer", str, "software", "DMLab renderer", choices=("software", "hardware")),
    _p("dmlab_dataset_path", str, None, "Path of the Brady/Konkle/Oliva 2008 image dataset (psychlab levels)",
       check="path"),
    _p("dmlab_extended_action_set", bool, True, "15-action set of Hessel et al. 2019 (as in the paper, A.2); "
       "False: IMPALA's 9 actions"),
    _p("dmlab_reward_clipping", bool, True, "IMPALA's optimistic asymmetric reward clipping for training "
       "(reported scores are raw)"),
    # --- PettingZoo ---
    _p("pettingzoo_kwargs", str, None, "Keyword arguments of the PettingZoo env's constructor (pettingzoo_* envs), a "
       "JSON object, e.g. '{\"N\": 2, \"max_cycles\": 50}'; None: its defaults", check=_json_object_problem),
]

_DEFAULTS = {p["name"]: p["default"] for p in ENV_PARAMS}


def get_param(cfg: Any, name: str) -> Any:
    """cfg.<name> (a Config, or env_cfg's namespace: both hold every env parameter), or the table default when cfg is
    None."""
    if name not in _DEFAULTS:
        raise KeyError(f"unknown env parameter {name!r}")
    return _DEFAULTS[name] if cfg is None else getattr(cfg, name)


def env_cfg(env: str, seed: int | None = None, **overrides) -> types.SimpleNamespace:
    """A cfg namespace with every env parameter at its default, plus env, seed and overrides."""
    unknown = set(overrides) - set(_DEFAULTS)
    if unknown:
        raise KeyError(f"unknown env parameter(s): {', '.join(sorted(unknown))}")
    values = dict(_DEFAULTS, env=env, seed=seed)
    values.update(overrides)
    return types.SimpleNamespace(**values)
