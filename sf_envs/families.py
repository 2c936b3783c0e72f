"""The built-in env families: the one list, read by the registry (sf_envs/registry.py: name prefixes, which families
take --env_frameskip), the presets' check (sf.cfg.parse: each family ships configs/<family>.json) and enjoy (a video's
frame rate). Imports nothing, so that sf.cfg may read it.

    from sf_envs.families import FAMILIES, FAMILY_NAMES

A family that users add with register_env() is not listed here: it has no preset and no special handling.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Family:
    name: str                         # EnvSpec.family, and the preset's file: configs/<name>.json
    prefix: str                       # how its env names start: doom_basic, gym:CartPole-v1
    listed: bool = True               # its names are a fixed set (env_names()); gym: and pettingzoo_ are open-ended
    frameskip: bool = False           # --env_frameskip overrides the spec's frameskip (the simulators)
    native_fps: Optional[int] = None  # the simulator's frame rate (enjoy's video); None: the env's render_fps
    envpool: Optional[str] = None     # --env_engine envpool steps it: what its pool holds ("games"); None: it does not


FAMILIES: tuple[Family, ...] = (
    Family("doom", "doom_", frameskip=True, native_fps=35),
    Family("atari", "atari_", frameskip=True, native_fps=60, envpool="games"),
    Family("dmlab", "dmlab_", frameskip=True, native_fps=60),
    Family("test", "test_"),
    Family("mujoco", "mujoco_", envpool="envs"),
    Family("gym", "gym:", listed=False),
    Family("pettingzoo", "pettingzoo_", listed=False),
)
FAMILY_NAMES: tuple[str, ...] = tuple(f.name for f in FAMILIES)

