"""The Atari game list, read from ale-py's bundled ROMs without importing ale_py (cheap)."""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

# ROMs without a single-player mode (ALE registers no v5 env for them)
MULTIPLAYER_ONLY = {"combat", "joust", "maze_craze", "warlords"}

# used only when ale-py is not installed, so that atari_<game> still resolves (and then says how to install it)
FALLBACK_GAMES = (
    "adventure air_raid alien amidar assault asterix asteroids atlantis bank_heist battle_zone beam_rider berzerk "
    "bowling boxing breakout carnival centipede chopper_command crazy_climber defender demon_attack double_dunk "
    "elevator_action enduro fishing_derby freeway frostbite gopher gravitar hero ice_hockey jamesbond journey_escape "
    "kangaroo krull kung_fu_master montezuma_revenge ms_pacman name_this_game phoenix pitfall pong pooyan private_eye "
    "qbert riverraid road_runner robotank seaquest skiing solaris space_invaders star_gunner tennis time_pilot "
    "tutankham up_n_down venture video_pinball wizard_of_wor yars_revenge zaxxon").split()


def roms_dir() -> Path | None:
    spec = importlib.util.find_spec("ale_py")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "roms"
    return d if d.is_dir() else None


@lru_cache(maxsize=1)
def atari_games() -> tuple:
    d = roms_dir()
    if d is None:
        return tuple(FALLBACK_GAMES)
    games = sorted(p.stem for p in d.glob("*.bin") if p.stem not in MULTIPLAYER_ONLY)
    return tuple(games) or tuple(FALLBACK_GAMES)
