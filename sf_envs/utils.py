"""Small helpers shared by the env integrations."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np

# sf.seeding's ENV stream kind: the env integrations import nothing of the training system, so the one derivation is
# spelled out here for the env's own first seed (tests/test_seeding.py checks both give the same seeds)
ENV_STREAM = 5
_single_threaded = False


def single_threaded() -> None:
    """Keep the libraries an env uses on one thread (rollout workers run many envs, one per core)."""
    global _single_threaded
    if _single_threaded:
        return
    try:
        import cv2
        cv2.setNumThreads(1)
        cv2.ocl.setUseOpenCL(False)
    except ImportError:
        pass
    _single_threaded = True


def derive_seed(base_seed: Optional[int], env_index: int) -> Optional[int]:
    """The seed of the first episode of env `env_index` (its global index) of a run seeded with `base_seed` (None: not
    seeded): stream ENV (env_index, 0, 0) of sf.seeding (stream_seed), the seed a rollout worker gives that env's first
    reset."""
    if base_seed is None:
        return None
    state = np.random.SeedSequence(int(base_seed),
                                   spawn_key=(ENV_STREAM, int(env_index), 0, 0)).generate_state(1, np.uint64)
    return int(state[0]) >> 1


def cfg_seed(cfg) -> Optional[int]:
    return cfg.seed if cfg is not None else None


def data_dir(name: str) -> Path:
    """Where env data that is fetched or cached at run time lives (name: e.g. "doom_scenarios"): <clone>/data/<name> in
    a clone (the repository's setup.py beside the package), else an installed copy's per-user data directory,
    $XDG_DATA_HOME/sf/<name> (~/.local/share/sf/<name>): never inside site-packages."""
    root = Path(__file__).resolve().parent.parent
    if (root / "setup.py").is_file() and (root / "sf_envs").is_dir():
        return root / "data" / name
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "sf" / name
