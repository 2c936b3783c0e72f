"""The cached layouts: one JSON file per env and host in `cache_dir()`, written by python -m sf.autolayout and by
the measuring child of train.py --num_workers auto, read by --num_workers auto."""
from __future__ import annotations

import json
import math
import os
import re
import socket
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from sf.autolayout.model import LAYOUT_KEYS, Layout, Measurements
from sf.cfg import ConfigError
from sf.cfg.parse import read_json_object
from sf.utils.files import write_json_atomic

if TYPE_CHECKING:
    from sf.cfg.config import Config

CACHE_VERSION = 1


def cache_dir() -> Path:
    """Where layouts are cached: $XDG_CACHE_HOME/sf/autolayout (default ~/.cache/sf/autolayout)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sf" / "autolayout"


def layout_key(cfg: Config) -> str:
    """What a cached layout was measured for: the env, and the engine stepping it when that is not the env's own
    (--env_engine envpool: one pool of --env_agents games is one env, so its best layout is another's)."""
    return cfg.env if cfg.env_engine == "native" else f"{cfg.env}.{cfg.env_engine}{cfg.env_agents}"


def cache_path(key: str) -> Path:
    """The cached layout of `key` (layout_key) on this host."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"
    return cache_dir() / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', key)}-{host}.json"


def save(path: Path, cfg: Config, m: Measurements, chosen: Layout, pred: dict, preset: Layout, preset_pred: dict,
         tune_batch_size: bool, check: Optional[dict]) -> None:
    data = {"version": CACHE_VERSION, "env": cfg.env, "host": socket.gethostname(), "cores": m.cores,
            "device": "cuda" if m.gpu else "cpu", "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
            "batch_size_tuned": tune_batch_size, "choice": asdict(chosen), "predicted": pred,
            "preset": asdict(preset), "preset_predicted": preset_pred, "measurements": asdict(m),
            "check": None if check is None else {k: check[k] for k in ("frames_per_s", "lag", "reports", "rc")}}
    write_json_atomic(path, _finite(json.loads(json.dumps(data, default=float))))


def _finite(x):
    """`x` with every NaN or infinite float as None (JSON has no NaN: a check run too short for a figure)."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def cached_layout(cfg: Config, explicit=frozenset()) -> tuple[str, dict, str] | None:
    """(the cache file, the layout values to apply, a description) from the cached file of cfg's env (and engine:
    layout_key), or None when there is none. Values given on the command line (`explicit`) are left out: they win."""
    env = cfg.env
    path = cache_path(layout_key(cfg))
    if not path.exists():
        return None
    data = read_json_object(path, str(path))
    choice = data.get("choice")
    if not isinstance(choice, dict) or any(k not in choice for k in LAYOUT_KEYS):
        raise ConfigError(f"{path}: no layout in it (key 'choice' with {', '.join(LAYOUT_KEYS)}); delete it or measure "
                          f"again: python -m sf.autolayout --env {env}")
    keys = LAYOUT_KEYS + (("batch_size",) if data.get("batch_size_tuned") else ())
    values = {k: choice[k] for k in keys if k == "num_workers" or k not in explicit}
    pred = data.get("predicted", {}).get("frames_per_s")
    desc = f"measured {data.get('measured_at', '?')}" + (f", predicted {pred:,.0f} env frames/s"
                                                         if isinstance(pred, (int, float)) else "")
    return str(path), values, desc
