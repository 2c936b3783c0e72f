"""The VizDoom scenarios of the Sample Factory paper: maps, action heads, game variables, reward settings.

Pure data (no vizdoom import): buttons and game variables are VizDoom enum *names*, resolved when a game
starts. The standard scenarios (basic ... health_gathering) use the maps that ship in the vizdoom
wheel (`vizdoom.scenarios_path`) with Sample Factory's gameplay settings applied programmatically;
health_gathering_supreme (whose wheel map differs from Sample Factory's), battle, battle2, two_colors, duel,
deathmatch and the benchmark use the Sample Factory data fetched by
`python -m sf_envs.doom.fetch_scenarios` (MIT licence), checked against the digests pinned in scenario_digests.py.
Scenarios with num_agents > 1 are multi-agent envs: one VizDoom engine per learning agent, joined over VizDoom's
network mode on localhost (sf_envs/doom/doom_multiplayer.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# --- action heads ---------------------------------------------------------------------------------
# A head is (name, options); an option is a tuple of (button, value) pairs; () is the head's no-op.


def _buttons(*names):
    return tuple(((n, 1.0),) for n in names)


def _delta_bins(n: int, max_deg: float):
    step = 2 * max_deg / (n - 1)
    return tuple(((("TURN_LEFT_RIGHT_DELTA", round(-max_deg + i * step, 4)),)
                  if abs(-max_deg + i * step) > 1e-9 else ())
                 for i in range(n))


NOOP = ((),)
TURN = ("turn", NOOP + _buttons("TURN_LEFT", "TURN_RIGHT"))
MOVE = ("move", NOOP + _buttons("MOVE_FORWARD", "MOVE_BACKWARD"))
STRAFE = ("strafe", NOOP + _buttons("MOVE_LEFT", "MOVE_RIGHT"))
ATTACK = ("attack", NOOP + _buttons("ATTACK"))
SPRINT = ("sprint", NOOP + _buttons("SPEED"))
USE = ("use", NOOP + _buttons("USE"))
WEAPON = ("weapon", NOOP + _buttons(*[f"SELECT_WEAPON{i}" for i in range(1, 8)]))
AIM_BATTLE = ("aim", _delta_bins(11, 10.0))  # 2 degree steps in [-10, 10] (Sample Factory's battle heads)
AIM_FULL = ("aim", _delta_bins(21, 12.5))  # 1.25 degree steps in [-12.5, 12.5] (Table A.4)

# --- game variables -------------------------------------------------------------------------------
NUM_WEAPONS = 8
WEAPON_VARS = tuple(f"WEAPON{i}" for i in range(NUM_WEAPONS))
AMMO_VARS = tuple(f"AMMO{i}" for i in range(NUM_WEAPONS))
MEASUREMENT_VARS = ("SELECTED_WEAPON", "SELECTED_WEAPON_AMMO", "HEALTH", "ARMOR", "ATTACK_READY", "PLAYER_COUNT",
                    *WEAPON_VARS, *AMMO_VARS)
# measurement vector (23 floats, scaled to small numbers as in Sample Factory / DFP):
MEASUREMENT_NAMES = ("selected_weapon", "selected_weapon_ammo/15", "health/30", "armor/30", "score/10", "attack_ready",
                     "player_count/5", *[f"weapon{i}_owned" for i in range(NUM_WEAPONS)],
                     *[f"ammo{i}/15" for i in range(NUM_WEAPONS)])
NUM_MEASUREMENTS = len(MEASUREMENT_NAMES)

# weapon preferences of the shaping scheme (pistol 1, shotguns/chaingun/rockets 5, plasma/BFG 10)
WEAPON_PREFERENCE = {0: 1, 1: 1, 2: 1, 3: 5, 4: 5, 5: 5, 6: 10, 7: 10}

_RENDER_FULL = dict(render_hud=True, render_crosshair=True, render_weapon=True, render_decals=False,
                    render_particles=False)


@dataclass(frozen=True)
class DoomScenario:
    name: str
    cfg_file: str
    data: str  # "vizdoom": map ships with the vizdoom wheel; "sf": fetched Sample Factory data
    heads: tuple
    description: str
    single_head: bool = False  # one Discrete head (else MultiDiscrete over the heads)
    reward_scale: float = 1.0  # Sample Factory's per-scenario scale of the game reward
    frameskip: int = 4
    gamma: Optional[float] = None
    measurements: bool = False
    shaping: str = "none"  # none | gathering | battle | deathmatch
    score_var: Optional[str] = None  # game variable counting the score (None: the sum of game rewards)
    extra_vars: tuple = ()
    settings: dict = field(default_factory=dict)  # DoomGame setters applied after load_config
    num_bots: int = 0
    files: tuple = ()  # data files the scenario needs (besides cfg_file)
    num_agents: int = 1  # learning agents per env (> 1: a multiplayer match of that many engines)

    @property
    def needs_fetch(self) -> bool:
        return self.data == "sf"

    @property
    def head_sizes(self) -> tuple:
        return tuple(len(opts) for _, opts in self.heads)

    @property
    def buttons(self) -> tuple:
        seen = []
        for _, opts in self.heads:
            for opt in opts:
                for b, _v in opt:
                    if b not in seen:
                        seen.append(b)
        return tuple(seen)

    @property
    def game_vars(self) -> tuple:
        names = list(MEASUREMENT_VARS) if self.measurements else []
        if self.shaping == "gathering":
            names.append("HEALTH")
        for v in (self.score_var, *self.extra_vars):
            if v:
                names.append(v)
        if self.shaping in ("battle", "deathmatch"):
            names.append("DEAD")
        return tuple(dict.fromkeys(names))  # unique, in order


SCENARIOS = [
    DoomScenario("doom_basic", "basic.cfg", "vizdoom",
                 (("action", NOOP + _buttons("MOVE_LEFT", "MOVE_RIGHT", "ATTACK")),),
                 "Basic: shoot the monster in front (reward x0.01)", single_head=True, reward_scale=0.01,
                 settings=dict(living_reward=-1.0, episode_start_time=14, episode_timeout=300, doom_skill=5,
                               render_hud=True, render_crosshair=False, render_weapon=True, render_decals=False,
                               render_particles=False)),
    DoomScenario("doom_defend_the_center", "defend_the_center.cfg", "vizdoom", (TURN, ATTACK),
                 "Defend the center: turn and shoot the approaching monsters", frameskip=4,
                 settings=dict(death_penalty=1.0, episode_start_time=10, episode_timeout=2100, doom_skill=3,
                               render_hud=True, render_crosshair=False, render_weapon=True, render_decals=False,
                               render_particles=False)),
    DoomScenario("doom_defend_the_line", "defend_the_line.cfg", "vizdoom", (TURN, ATTACK),
                 "Defend the line: shoot the monsters across the room",
                 settings=dict(death_penalty=1.0, episode_start_time=10, doom_skill=3, render_hud=True,
                               render_crosshair=False, render_weapon=True, render_decals=False,
                               render_particles=False)),
    DoomScenario("doom_health_gathering", "health_gathering.cfg", "vizdoom",
                 (("action", NOOP + _buttons("TURN_LEFT", "TURN_RIGHT", "MOVE_FORWARD", "MOVE_BACKWARD")),),
                 "Health gathering: pick up medkits on an acid floor (+1 per medkit shaping)", single_head=True,
                 shaping="gathering",
                 settings=dict(living_reward=0.01, death_penalty=0.0, episode_timeout=2100, render_hud=False,
                               render_crosshair=False, render_weapon=False, render_decals=False,
                               render_particles=False)),
    # Sample Factory's map (fetched), not the vizdoom wheel's: the wheel's health_gathering_supreme.wad differs (29,498
    # bytes against 23,206), and Sample Factory's published model and the Hugging Face course were trained on its own
    DoomScenario("doom_health_gathering_supreme", "health_gathering_supreme.cfg", "sf",
                 (("action", NOOP + _buttons("TURN_LEFT", "TURN_RIGHT", "MOVE_FORWARD", "MOVE_BACKWARD")),),
                 "Health gathering supreme: a maze with medkits and poison vials", single_head=True,
                 shaping="gathering",
                 settings=dict(living_reward=0.01, death_penalty=0.0, episode_timeout=2100, render_hud=False,
                               render_crosshair=False, render_weapon=False, render_decals=False,
                               render_particles=False)),
    DoomScenario("doom_my_way_home", "my_way_home.cfg", "vizdoom", (TURN, MOVE),
                 "My way home: find the vest in a maze (sparse reward)",
                 settings=dict(living_reward=-0.0001, episode_start_time=10, episode_timeout=2100, doom_skill=5,
                               render_hud=False, render_crosshair=False, render_weapon=True, render_decals=False,
                               render_particles=False)),
    DoomScenario("doom_deadly_corridor", "deadly_corridor.cfg", "vizdoom", (TURN, MOVE, STRAFE, ATTACK),
                 "Deadly corridor: reach the vest past shooting monsters (reward x0.01)", reward_scale=0.01,
                 settings=dict(death_penalty=100.0, episode_start_time=0, episode_timeout=2100, doom_skill=5,
                               render_hud=True, render_crosshair=False, render_weapon=True, render_decals=False,
                               render_particles=False)),
    DoomScenario("doom_two_colors_easy", "two_colors_easy.cfg", "sf", (TURN, MOVE),
                 "Two colors (easy): pick up the healing items of one color, avoid the other", shaping="gathering",
                 settings=dict(living_reward=0.01, episode_timeout=2100, render_hud=False, render_crosshair=False,
                               render_weapon=False, render_decals=False, render_particles=False),
                 files=("two_colors_easy.wad",)),
    DoomScenario("doom_two_colors_hard", "two_colors_hard.cfg", "sf", (TURN, MOVE),
                 "Two colors (hard)", shaping="gathering",
                 settings=dict(living_reward=0.01, episode_timeout=2100, render_hud=False, render_crosshair=False,
                               render_weapon=False, render_decals=False, render_particles=False),
                 files=("two_colors_hard.wad",)),
    DoomScenario("doom_battle", "battle_continuous_turning.cfg", "sf", (MOVE, STRAFE, ATTACK, SPRINT, AIM_BATTLE),
                 "Battle: kill monsters, gather health and ammo (full variant: measurements, 5 heads)",
                 measurements=True, shaping="battle", score_var="USER2",
                 settings=dict(living_reward=0.0, death_penalty=0.0, episode_timeout=2100, doom_skill=2,
                               **_RENDER_FULL),
                 files=("battle.wad",)),
    DoomScenario("doom_battle2", "battle2_continuous_turning.cfg", "sf", (MOVE, STRAFE, ATTACK, SPRINT, AIM_BATTLE),
                 "Battle2: a harder maze map with monsters, health and ammo (full variant)",
                 measurements=True, shaping="battle", score_var="USER2",
                 settings=dict(living_reward=0.0, death_penalty=0.0, episode_timeout=2100, doom_skill=2,
                               **_RENDER_FULL),
                 files=("battle2.wad",)),
    DoomScenario("doom_duel_bots", "ssl2.cfg", "sf", (MOVE, STRAFE, ATTACK, SPRINT, USE, WEAPON, AIM_FULL),
                 "Duel against one in-game bot (ssl2 map; full variant, Table A.4 heads)",
                 frameskip=2, gamma=0.995, measurements=True, shaping="deathmatch", score_var="FRAGCOUNT",
                 extra_vars=("DEATHCOUNT", "HITCOUNT", "DAMAGECOUNT"), num_bots=1, settings=dict(**_RENDER_FULL),
                 files=("ssl2.wad",)),
    DoomScenario("doom_deathmatch_bots", "dwango5_dm_continuous_weap.cfg", "sf",
                 (MOVE, STRAFE, ATTACK, SPRINT, USE, WEAPON, AIM_FULL),
                 "Deathmatch against 7 in-game bots (dwango5 map; full variant, Table A.4 heads)",
                 frameskip=2, gamma=0.995, measurements=True, shaping="deathmatch", score_var="FRAGCOUNT",
                 extra_vars=("DEATHCOUNT", "HITCOUNT", "DAMAGECOUNT"), num_bots=7, settings=dict(**_RENDER_FULL),
                 files=("dwango5.wad",)),
    DoomScenario("doom_benchmark", "battle.cfg", "sf",
                 (("action", NOOP + _buttons("MOVE_FORWARD", "MOVE_BACKWARD", "MOVE_RIGHT", "MOVE_LEFT", "TURN_RIGHT",
                                             "TURN_LEFT", "ATTACK", "SPEED")),),
                 "Throughput benchmark of the paper: Battle, pixels only, one Discrete(9) head, no shaping",
                 single_head=True,
                 settings=dict(living_reward=0.0, death_penalty=0.0, episode_timeout=2100, doom_skill=2,
                               **_RENDER_FULL),
                 files=("battle.wad",)),
]

# Multi-agent (self-play) scenarios, kept apart from the single-agent ones above (one DoomEnv each): Sample Factory
# 1.x's doom_duel and doom_deathmatch_full (4 agents + 4 bots on freedm, as there).
MULTIPLAYER_SCENARIOS = [
    DoomScenario("doom_duel", "ssl2.cfg", "sf", (MOVE, STRAFE, ATTACK, SPRINT, USE, WEAPON, AIM_FULL),
                 "Duel of 2 learning agents, self-play (ssl2 map, multiplayer; full variant, Table A.4 heads)",
                 frameskip=2, gamma=0.995, measurements=True, shaping="deathmatch", score_var="FRAGCOUNT",
                 extra_vars=("DEATHCOUNT", "HITCOUNT", "DAMAGECOUNT"), settings=dict(**_RENDER_FULL),
                 files=("ssl2.wad",), num_agents=2),
    DoomScenario("doom_deathmatch_full", "freedm.cfg", "sf", (MOVE, STRAFE, ATTACK, SPRINT, USE, WEAPON, AIM_FULL),
                 "Deathmatch of 4 learning agents and 4 in-game bots (freedm map, multiplayer; Table A.4 heads)",
                 frameskip=2, gamma=0.995, measurements=True, shaping="deathmatch", score_var="FRAGCOUNT",
                 extra_vars=("DEATHCOUNT", "HITCOUNT", "DAMAGECOUNT"), num_bots=4, settings=dict(**_RENDER_FULL),
                 files=("freedm.wad",), num_agents=4),
]

SCENARIOS_BY_NAME = {s.name: s for s in SCENARIOS}  # single-agent
ALL_SCENARIOS = SCENARIOS + MULTIPLAYER_SCENARIOS
