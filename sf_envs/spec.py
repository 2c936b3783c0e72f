"""EnvSpec: what the registry knows of an env before making one (sf_envs.registry.env_spec returns it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass(frozen=True)
class EnvSpec:
    name: str
    family: str  # doom | atari | dmlab | gym | test | a user's family
    frameskip: int = 1  # env frames per sample
    gamma: Optional[float] = None  # discount hint when the family's usual one does not fit (duel/deathmatch: 0.995)
    description: str = ""
    num_agents: int = 1  # agents per env instance (every built-in env has one)
    factory: Optional[Callable] = field(default=None, repr=False, compare=False)  # factory(cfg, env_index, render_mode)
    check: Optional[Callable] = field(default=None, repr=False, compare=False)  # check(cfg): raises EnvUnavailableError
