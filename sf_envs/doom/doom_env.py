"""VizDoom env of the contract: 160x120 game frames downsampled to [3, 72, 128] uint8, action repeat,
optional measurement vector and multi-head actions, reward shaping, in-game bots.

One class, no wrapper stack (rollout workers step it tens of thousands of times per second). The game
starts lazily at the first reset(), so that making an env only to read its spaces is cheap.
"""
from __future__ import annotations

import os
import tempfile
from collections import deque
from pathlib import Path
from typing import Any, Optional

import cv2
import gymnasium as gym
import numpy as np

from sf_envs.doom.fetch_scenarios import fetch_hint, scenarios_dir
from sf_envs.doom.scenario_check import check_scenario_files
from sf_envs.doom.scenarios import NUM_MEASUREMENTS, NUM_WEAPONS, WEAPON_PREFERENCE, DoomScenario
from sf_envs.episode_stats import episode_report
from sf_envs.errors import EnvUnavailableError
from sf_envs.params import get_param
from sf_envs.utils import cfg_seed, derive_seed, single_threaded

RENDER_W, RENDER_H = 160, 120

_MEAS_LOW = np.array([0, 0, 0, 0, -50, 0, 0] + [0] * NUM_WEAPONS + [0] * NUM_WEAPONS, dtype=np.float32)
_MEAS_HIGH = np.array([20, 5, 50, 50, 50, 1, 10] + [5] * NUM_WEAPONS + [5] * NUM_WEAPONS, dtype=np.float32)


def scenario_path(scenario: DoomScenario, cfg=None) -> Path:
    """The config file of a scenario, checked (scenario_check.py: cfg keys; fetched data against its pinned digests);
    raises EnvUnavailableError (one line) when vizdoom or the data is missing or a file fails its check."""
    try:
        import vizdoom
    except ImportError:
        raise EnvUnavailableError(f"env {scenario.name} needs the vizdoom package: pip install vizdoom") from None
    if scenario.data == "vizdoom":
        return check_scenario(scenario, Path(vizdoom.scenarios_path) / scenario.cfg_file)
    d = scenarios_dir(cfg)
    missing = [f for f in (scenario.cfg_file, *scenario.files) if not (d / f).is_file()]
    if missing:
        raise EnvUnavailableError(f"Doom scenario data for {scenario.name} is missing "
                                  f"({', '.join(missing)} not in {d}); fetch it with: {fetch_hint(d)}")
    return check_scenario(scenario, d / scenario.cfg_file)


def check_scenario(scenario: DoomScenario, path: Path) -> Path:
    """Refuse (ScenarioDataError, one line) a cfg with keys naming executables or paths outside its directory and
    fetched data that does not match its pinned digests; cached per file, so cheap to repeat."""
    check_scenario_files(path, scenario.needs_fetch, scenario.files, fetch_hint(path.parent))
    return path


def bots_config(difficulty: int, num_bots: int) -> str:
    """A ZDoom bots.cfg with `num_bots` bots of one skill (0-100); written once per skill, atomically."""
    d = Path(tempfile.gettempdir()) / f"sf_envs_doom_bots_{os.getuid() if hasattr(os, 'getuid') else 0}"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"bots_skill{difficulty:03d}_n{num_bots}.cfg"
    if not path.exists():
        colors = ["40 cf 00", "b0 b0 b0", "50 50 60", "8f 00 00", "ff ff ff", "cf 40 00", "ff ff 00", "00 80 ff"]
        text = "".join(f"{{\n    name        Bot{i + 1}_skill{difficulty}\n    aiming      {difficulty}\n"
                       f"    perfection  {difficulty}\n    reaction    {difficulty}\n    isp         {difficulty}\n"
                       f"    color       \"{colors[i % len(colors)]}\"\n    skin        base\n}}\n\n"
                       for i in range(num_bots))
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
    return str(path)


SHAPING_PARAMS = {  # the coefficients (sf_envs/params.py names) of each shaping kind
    "gathering": ("doom_rew_gathering_health",),
    "battle": ("doom_rew_health_gain", "doom_rew_health_loss", "doom_rew_armor_gain", "doom_rew_armor_loss",
               "doom_rew_weapon_pickup", "doom_rew_weapon_loss", "doom_rew_ammo_pickup", "doom_rew_ammo_use",
               "doom_rew_frag", "doom_rew_suicide", "doom_rew_death", "doom_rew_hit", "doom_rew_damage",
               "doom_rew_weapon_hold"),
}
SHAPING_PARAMS["deathmatch"] = SHAPING_PARAMS["battle"]


def shaping_coeffs(cfg, kind: str) -> dict:
    """The shaping coefficients of `kind` by param name, from cfg (table defaults where cfg is None or lacks one)."""
    return {n: float(get_param(cfg, n)) for n in SHAPING_PARAMS.get(kind, ())}


class DoomRewardShaper:
    """Sample Factory's shaping of appendix A.3: rewards from changes of game variables between steps.

    Every term is gain_coeff * delta for an increase and loss_coeff * delta for a decrease (delta < 0), with
    the coefficients of sf_envs/params.py; plus a per-step bonus for holding one loaded weapon 5+ steps.
    Nothing on the first step of an episode, on its last step, or on the step a dead player respawns.
    `coeffs` is a cfg namespace or a dict of coefficients by param name (missing ones: the table defaults);
    set_coeffs() changes them (population-based training mutates them per policy).
    """

    def __init__(self, coeffs, kind: str, var_index: dict):
        self.kind = kind
        self.idx = var_index
        self.coeffs = shaping_coeffs(None, kind)
        self.set_coeffs(coeffs if isinstance(coeffs, dict) else shaping_coeffs(coeffs, kind))
        self.sel = var_index.get("SELECTED_WEAPON")
        self.sel_ammo = var_index.get("SELECTED_WEAPON_AMMO")
        self.health = var_index.get("HEALTH")
        self.dead = var_index.get("DEAD")
        self.prev: Optional[np.ndarray] = None
        self.selected = deque(maxlen=5)

    def set_coeffs(self, coeffs: dict) -> None:
        """Update some or all coefficients (by param name) from the next step on; KeyError for a name this kind of
        shaping does not use."""
        unknown = sorted(set(coeffs) - set(self.coeffs))
        if unknown:
            raise KeyError(f"{self.kind} reward shaping has no coefficient(s) {', '.join(unknown)} "
                           f"(it has: {', '.join(self.coeffs) or 'none'})")
        self.coeffs.update({n: float(v) for n, v in coeffs.items()})
        g = self.coeffs.get
        terms = {}
        if self.kind == "gathering":
            self.gathering_reward = g("doom_rew_gathering_health")
        else:
            terms["HEALTH"] = (g("doom_rew_health_gain"), g("doom_rew_health_loss"), None)
            terms["ARMOR"] = (g("doom_rew_armor_gain"), g("doom_rew_armor_loss"), None)
            for w in range(NUM_WEAPONS):
                pref = WEAPON_PREFERENCE[w]
                terms[f"WEAPON{w}"] = (g("doom_rew_weapon_pickup") * pref, g("doom_rew_weapon_loss") * pref, None)
                terms[f"AMMO{w}"] = (g("doom_rew_ammo_pickup") * pref, g("doom_rew_ammo_use") * pref, None)
            terms["FRAGCOUNT"] = (g("doom_rew_frag"), g("doom_rew_suicide"), None)
            terms["DEATHCOUNT"] = (-g("doom_rew_death"), 0.0, None)
            terms["HITCOUNT"] = (g("doom_rew_hit"), 0.0, 5.0)
            terms["DAMAGECOUNT"] = (g("doom_rew_damage"), 0.0, 200.0)
            self.hold = g("doom_rew_weapon_hold")
        # (index into the game-variable vector, gain, loss, cap) for the variables this scenario has
        self.terms = [(self.idx[n], gain, loss, cap) for n, (gain, loss, cap) in terms.items() if n in self.idx]

    def reset(self, v: Optional[np.ndarray]) -> None:
        self.prev = None if v is None else self._clean(v)
        self.selected.clear()

    def _clean(self, v: np.ndarray) -> np.ndarray:
        v = np.array(v, dtype=np.float64)
        if self.health is not None:
            v[self.health] = max(0.0, v[self.health])  # dead is dead, however negative
        return v

    def step(self, v: Optional[np.ndarray], done: bool) -> float:
        if v is None or done:
            return 0.0
        v = self._clean(v)
        prev, self.prev = self.prev, v
        if prev is None:
            return 0.0
        if self.kind == "gathering":
            return self.gathering_reward if v[self.health] > prev[self.health] else 0.0
        if self.dead is not None and prev[self.dead] > 0 and v[self.dead] == 0:
            self.selected.clear()
            return 0.0  # just respawned: health and weapons were reset, not earned
        r = 0.0
        for i, gain, loss, cap in self.terms:
            d = v[i] - prev[i]
            if d > 0:
                r += gain * (min(d, cap) if cap is not None else d)
            elif d < 0:
                r += loss * d
        if self.sel is not None:
            sel = int(max(0.0, v[self.sel]))
            self.selected.append(sel)
            ammo = v[self.sel_ammo] if self.sel_ammo is not None else 0.0
            if ammo > 0 and len(self.selected) == self.selected.maxlen and all(s == sel for s in self.selected):
                r += self.hold * WEAPON_PREFERENCE.get(sel, 1)
        return r


class DoomEnv(gym.Env):
    metadata = {"render_modes": ["human", "rgb_array"], "render_fps": 35}

    def __init__(self, scenario: DoomScenario, cfg=None, env_index: int = 0, render_mode: Optional[str] = None):
        single_threaded()
        self.scenario = scenario
        self.cfg = cfg
        self.env_index = env_index
        self.render_mode = render_mode
        self.num_agents = 1
        self.is_multiagent = False
        self.config_path = scenario_path(scenario, cfg)  # fails in one line when vizdoom or data is missing
        fs = get_param(cfg, "env_frameskip")
        self.frameskip = int(fs) if fs else scenario.frameskip
        self.res_w, self.res_h = int(get_param(cfg, "doom_res_w")), int(get_param(cfg, "doom_res_h"))
        obs = {"obs": gym.spaces.Box(0, 255, (3, self.res_h, self.res_w), np.uint8)}
        if scenario.measurements:
            obs["measurements"] = gym.spaces.Box(_MEAS_LOW, _MEAS_HIGH, dtype=np.float32)
        self.observation_space = gym.spaces.Dict(obs)
        sizes = scenario.head_sizes
        self.action_space = gym.spaces.Discrete(sizes[0]) if scenario.single_head else gym.spaces.MultiDiscrete(sizes)
        self.action_heads = [name for name, _ in scenario.heads]

        self.buttons = scenario.buttons
        self._tables = []  # per head: [n_options, n_buttons] button values
        for _, opts in scenario.heads:
            t = np.zeros((len(opts), len(self.buttons)), dtype=np.float64)
            for k, opt in enumerate(opts):
                for b, val in opt:
                    t[k, self.buttons.index(b)] = val
            self._tables.append(t)
        self._single_actions = [row.tolist() for row in self._tables[0]] if scenario.single_head else None

        self.var_names = scenario.game_vars
        self.var_index = {n: i for i, n in enumerate(self.var_names)}
        self.shaper = DoomRewardShaper(cfg, scenario.shaping, self.var_index) if scenario.shaping != "none" else None
        self.num_bots = 0
        self.bots_difficulty = None
        if scenario.num_bots:
            nb = get_param(cfg, "doom_num_bots")
            self.num_bots = scenario.num_bots if nb is None else int(nb)
            diff = get_param(cfg, "doom_bots_difficulty")
            if diff is not None and not 0 <= int(diff) <= 100:
                raise ValueError(f"--doom_bots_difficulty must be in 0..100 (got {diff})")
            self.bots_difficulty = None if diff is None else int(diff)

        self.game: Any = None  # vizdoom.DoomGame once started (vizdoom ships no type information)
        self._rng_seed = derive_seed(cfg_seed(cfg), env_index)
        self._restart_steps = int(get_param(cfg, "doom_restart_engine_steps"))
        self._engine_steps = 0  # agent steps of the running engine
        self._engine_restarts = 0
        self._restart_seeds = None  # np.random.Generator of a seeded env: the seeds of its restarted engines
        self._pending_seed: Optional[int] = None
        self._episodes = 0
        self._screen = np.zeros((RENDER_H, RENDER_W, 3), np.uint8)
        self._obs = None
        self._vars = None
        self._meas = np.zeros(NUM_MEASUREMENTS, np.float32) if scenario.measurements else None
        self._reset_stats()

    # --- game lifecycle ---
    def _new_game(self):
        """A configured DoomGame, not started yet."""
        import vizdoom as vzd
        check_scenario(self.scenario, self.config_path)  # again before each engine start (cached: a few stats)
        # each engine makes ./_vizdoom/ at start and dies if another made it in between; the Python process that
        # started it then dies of SIGSEGV (6 engines started at once in a fresh directory: 3 trials in 15 crashed)
        os.makedirs("_vizdoom", exist_ok=True)
        game = vzd.DoomGame()
        game.load_config(str(self.config_path))
        # the map path relative to the config file's directory, independent of the cwd
        cfg_dir = self.config_path.parent
        wad = game.get_doom_scenario_path()
        if wad and not os.path.isabs(wad):
            game.set_doom_scenario_path(str(cfg_dir / os.path.basename(wad)))
        game.set_screen_resolution(vzd.ScreenResolution.RES_160X120)
        game.set_screen_format(vzd.ScreenFormat.RGB24)
        game.set_window_visible(self.render_mode == "human")
        game.set_sound_enabled(False)
        game.set_mode(vzd.Mode.PLAYER)
        game.set_available_buttons([getattr(vzd.Button, b) for b in self.buttons])
        game.set_available_game_variables([getattr(vzd.GameVariable, v) for v in self.var_names])
        for key, value in self.scenario.settings.items():
            getattr(game, f"set_{key}")(value)
        self._add_match_args(game)
        return game

    def _add_match_args(self, game) -> None:
        """With bots: a deathmatch hosted for this one player (doom_multiplayer.py overrides it for a match)."""
        if self.num_bots or self.scenario.num_bots:
            minutes = float(get_param(self.cfg, "doom_bots_timelimit"))
            game.add_game_args(" ".join(["-host 1", *self._match_args(minutes), "+name AI +colorset 0"]))
            game.set_episode_timeout(int(minutes * 60 * game.get_ticrate()))

    def _match_args(self, minutes: float) -> list:
        """The engine arguments of a deathmatch host: rules, match length, bots' skill."""
        args = ["-deathmatch", f"+timelimit {minutes}", "+sv_forcerespawn 1", "+sv_noautoaim 1", "+sv_respawnprotect 1",
                "+sv_spawnfarthest 1", "+sv_nocrouch 1", "+sv_nojump 1", "+sv_nofreelook 1", "+sv_noexit 1",
                "+viz_respawn_delay 2"]
        if self.num_bots and self.bots_difficulty is not None:
            args.append(f"+viz_bots_path {bots_config(self.bots_difficulty, max(self.num_bots, 1))}")
        return args

    def _start_game(self) -> None:
        game = self._new_game()
        seed = self._take_seed()
        if seed is not None:
            game.set_seed(seed)
        try:
            game.init()
        except Exception as e:  # vizdoom raises its own exception types
            raise RuntimeError(f"VizDoom failed to start {self.scenario.name} ({self.config_path}): {e}") from e
        self.game = game
        self._engine_steps = 0

    def _restart_engine(self) -> None:
        """A fresh engine process for the next episode (between episodes, so no episode is cut short); a seeded env
        seeds it from its own generator, so seeded runs stay reproducible across restarts."""
        self.close()
        self._engine_restarts += 1
        if self._pending_seed is None and self._restart_seeds is not None:
            self._pending_seed = int(self._restart_seeds.integers(2**31))

    def _take_seed(self) -> Optional[int]:
        seed = self._pending_seed if self._pending_seed is not None else self._rng_seed
        if seed is None and self.game is None:  # unseeded run: fresh entropy, never the same seed for every env
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        self._pending_seed = self._rng_seed = None
        return None if seed is None else int(seed) % (2**32)

    def _add_bots(self) -> None:
        if self.scenario.num_bots:
            self.game.send_game_command("removebots")
            for _ in range(self.num_bots):
                self.game.send_game_command("addbot")

    # --- observations ---
    def _read_state(self) -> None:
        state = self.game.get_state()
        if state is None:
            return
        self._screen = state.screen_buffer
        if (self.res_w, self.res_h) != (RENDER_W, RENDER_H):
            small = cv2.resize(self._screen, (self.res_w, self.res_h), interpolation=cv2.INTER_NEAREST)
        else:
            small = self._screen
        img = np.ascontiguousarray(small.transpose(2, 0, 1))
        self._vars = state.game_variables
        if self._meas is not None:
            self._fill_measurements(self._vars)
            self._obs = {"obs": img, "measurements": self._meas.copy()}
        else:
            self._obs = {"obs": img}

    def _fill_measurements(self, v: np.ndarray) -> None:
        ix, m = self.var_index, self._meas
        sel_ammo = max(0.0, v[ix["SELECTED_WEAPON_AMMO"]]) / 15.0
        score = v[ix[self.scenario.score_var]] - self._score_start if self.scenario.score_var else 0.0
        m[0] = max(0.0, round(v[ix["SELECTED_WEAPON"]]))
        m[1] = min(sel_ammo, 5.0)
        m[2] = max(0.0, v[ix["HEALTH"]]) / 30.0
        m[3] = v[ix["ARMOR"]] / 30.0
        m[4] = score / 10.0
        m[5] = v[ix["ATTACK_READY"]]
        m[6] = v[ix["PLAYER_COUNT"]] / 5.0
        for w in range(NUM_WEAPONS):
            m[7 + w] = max(0.0, v[ix[f"WEAPON{w}"]])
            m[7 + NUM_WEAPONS + w] = min(max(0.0, v[ix[f"AMMO{w}"]]) / 15.0, 5.0)
        np.clip(m, _MEAS_LOW, _MEAS_HIGH, out=m)

    # --- gym API ---
    def _reset_stats(self) -> None:
        # info["episode"] is counted here, not by RecordEpisodeStatistics: its score is the engine's kill/frag
        # counter or the unscaled game reward, seen only inside the env (sf_envs/episode_stats.py)
        self._ep_reward = 0.0  # training reward (shaped, scaled): Sample Factory's reported reward
        self._ep_game_reward = 0.0  # unshaped, unscaled game reward
        self._ep_steps = 0
        self._score_start = 0.0

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        if seed is not None:
            self._pending_seed = seed
            self._restart_seeds = np.random.default_rng(seed)
        elif self._restart_seeds is None and self._rng_seed is not None:
            self._restart_seeds = np.random.default_rng(self._rng_seed)
        if self.game is not None and self._restart_steps and self._engine_steps >= self._restart_steps:
            self._restart_engine()
        if self.game is None:
            self._start_game()  # init() starts the first episode
        else:
            s = self._take_seed()
            if s is not None:
                self.game.set_seed(s)
            self.game.new_episode()
        self._add_bots()
        self._begin_episode()
        return self._obs, {}

    def _begin_episode(self) -> None:
        """Counters, score baseline, first observation and shaping state of an episode that has just started."""
        self._episodes += 1
        self._reset_stats()
        if self.scenario.score_var:  # counters such as FRAGCOUNT may carry over episodes: count from here
            import vizdoom as vzd
            self._score_start = float(self.game.get_game_variable(getattr(vzd.GameVariable, self.scenario.score_var)))
        self._read_state()
        if self.shaper is not None:
            self.shaper.reset(self._vars)

    # --- reward shaping (population-based training changes it per policy) ---
    def reward_shaping_defaults(self) -> dict:
        """This env's shaping coefficients as configured, by param name (doom_rew_*); {} without shaping."""
        return shaping_coeffs(self.cfg, self.scenario.shaping) if self.shaper is not None else {}

    def set_reward_shaping(self, coeffs: dict, agent: int = 0) -> None:
        """Change some or all shaping coefficients (by param name) from the next step on; `agent` is ignored (one
        agent). KeyError for a coefficient this env's shaping does not have."""
        if self.shaper is None:
            if coeffs:
                raise KeyError(f"{self.scenario.name} has no reward shaping (got {', '.join(sorted(coeffs))})")
            return
        self.shaper.set_coeffs(coeffs)

    def _convert_action(self, action):
        if self._single_actions is not None:
            return self._single_actions[int(np.asarray(action).reshape(-1)[0]) if np.ndim(action) else int(action)]
        a = np.asarray(action).reshape(-1)
        vec = self._tables[0][int(a[0])].copy()
        for t, k in zip(self._tables[1:], a[1:]):
            vec += t[int(k)]
        return vec.tolist()

    def step(self, action):
        game = self.game
        game_reward = game.make_action(self._convert_action(action), self.frameskip)
        self._engine_steps += 1
        finished = game.is_episode_finished()
        if not finished:
            self._read_state()
        shaping = self.shaper.step(self._vars, finished) if self.shaper is not None else 0.0
        reward = game_reward * self.scenario.reward_scale + shaping
        self._ep_reward += reward
        self._ep_game_reward += game_reward
        self._ep_steps += 1
        terminated = truncated = False
        info = {}
        if finished:
            timeout = game.is_episode_timeout_reached()
            truncated = bool(timeout) and not self.scenario.num_bots  # a match ends at its time limit
            terminated = not truncated
            info["episode"] = self._episode_report()
        return self._obs, float(reward), terminated, truncated, info

    def _episode_report(self) -> dict:
        return episode_report(self._ep_reward, self._ep_steps * self.frameskip, self._episode_score())

    def _episode_score(self) -> float:
        if self.scenario.score_var is None or self.scenario.score_var == "USER2":
            return self._ep_game_reward  # battle: +1 per kill; single-player scenarios: the game's reward
        try:
            import vizdoom as vzd
            end = self.game.get_game_variable(getattr(vzd.GameVariable, self.scenario.score_var))
        except Exception:
            end = self._vars[self.var_index[self.scenario.score_var]] if self._vars is not None else self._score_start
        return float(end) - self._score_start

    def render(self):
        if self.render_mode == "rgb_array":
            return np.array(self._screen, copy=True)
        return None  # "human": the VizDoom window shows the game

    def close(self):
        if self.game is not None:
            try:
                self.game.close()
            except Exception:
                pass
            self.game = None
