"""What the EnvPool engines share (--env_engine envpool): the version, its install line, the check that EnvPool and the
task are there, and each pool's seed. A pool of --env_agents envs is one env of that many agents (the multi-agent
contract of docs/architecture.md); atari.py and mujoco.py adapt EnvPool's batched arrays to it."""
from __future__ import annotations

import numpy as np

from sf_envs.errors import EnvUnavailableError
from sf_envs.utils import cfg_seed, derive_seed

ENVPOOL_VERSION = "1.2.5"  # the last release for Python 3.11 (setup.py's extra "envpool")
INSTALL = f"pip install envpool=={ENVPOOL_VERSION} (or pip install -e .[envpool])"


def check_envpool(task: str, env_name: str) -> None:
    """EnvUnavailableError (one line) when EnvPool is missing or has no task `task` (what `env_name` maps to)."""
    try:
        import envpool
    except ImportError:
        raise EnvUnavailableError(f"--env_engine envpool needs EnvPool: {INSTALL}") from None
    if task not in envpool.list_all_envs():
        raise EnvUnavailableError(f"--env_engine envpool: EnvPool {envpool.__version__} has no {task} ({env_name}); "
                                  "use --env_engine native")


def pool_seed(cfg, env_index: int) -> int:
    """The pool's seed (EnvPool seeds its env i with seed + i): the run's seed for this env index, else fresh."""
    seed = derive_seed(cfg_seed(cfg), env_index)
    if seed is None:
        seed = int(np.random.SeedSequence().generate_state(1)[0])
    return int(seed) % 2**31
