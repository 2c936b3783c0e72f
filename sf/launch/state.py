"""The state of one run of a sweep, from the files in its experiment directory only (any backend, any machine that sees
them): train.py's checkpoints (checkpoint_p{i}/checkpoint_<version>_<frames>.pth), TensorBoard events and logs, and
<exp_dir>/launch.json, which the backend that started the run keeps:

    {"backend": "local" | "slurm", "state": "queued" | "running" | "done" | "failed" | "interrupted",
     "rc": exit code or null, "job_id": Slurm's or null, "pid", "pid_start", "host": the local process,
     "started": unix time, "ended": unix time or null, "wall_before": seconds of earlier launches}

A run is done when its latest checkpoint reached its --train_for_env_steps (every policy's), or when the backend
recorded that train.py exited 0 without being interrupted (e.g. --train_for_seconds ran out). A "running" record whose
local process is gone (the launcher was killed) reads as interrupted. Without launch.json, a run with checkpoints is
interrupted (started before, e.g. by hand) and one without is pending.

The sweep as a whole: <train_dir>/<sweep>/.launch/ (LAUNCH_DIR), where the backends keep their records and
record_runs the runs' configurations (sweep.json, which python -m sf.plot reads).
"""
from __future__ import annotations

import json
import math
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from sf.utils.events import drop_orphans, event_files, read_scalar_events
from sf.utils.files import write_json_atomic

STATES = ("pending", "queued", "running", "done", "failed", "interrupted")
LAUNCH_DIR = ".launch"  # <train_dir>/<sweep>/.launch/: what the backends keep of the sweep as a whole
SWEEP_JSON = "sweep.json"  # in it: the runs and their configurations (record_runs), for python -m sf.plot
LAUNCH_JSON = "launch.json"
LAUNCH_LOG = "launch.log"
REWARD_TAG = "reward/reward"


@dataclass
class RunState:
    state: str  # one of STATES
    frames: int  # env frames: the latest checkpoint's, or the latest summary's when later (a run in progress)
    reward: Optional[float]  # the last average episode reward written (reward/reward; policy 0's in a population)
    best_reward: Optional[float]  # the highest of them
    wall: Optional[float]  # seconds of training, all launches together (None: never started by a backend)
    last_line: str  # the last line of launch.log (or sf_log.txt); of a failed run, its last error line


def read_launch(exp_dir: Path) -> dict:
    """<exp_dir>/launch.json ({} when missing or unreadable: a torn write is not the run's state)."""
    try:
        data = json.loads((Path(exp_dir) / LAUNCH_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_launch(exp_dir: Path, **updates: Any) -> dict:
    """Merge `updates` into <exp_dir>/launch.json (written atomically; the directory is created). Returns the record."""
    record = read_launch(exp_dir)
    record.update(updates)
    Path(exp_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(exp_dir) / LAUNCH_JSON, record)
    return record


def record_runs(sweep) -> None:
    """<train_dir>/<sweep>/.launch/sweep.json: the runs and their configurations, for `python -m sf.plot` given the
    sweep's directory."""
    (sweep.train_dir / LAUNCH_DIR).mkdir(parents=True, exist_ok=True)
    write_json_atomic(sweep.train_dir / LAUNCH_DIR / SWEEP_JSON, {
        "name": sweep.name, "path": str(sweep.path.resolve()) if sweep.path.exists() else str(sweep.path),
        "runs": [{"name": r.name, "config": r.config, "seed": r.seed,
                  "params": {k: v if isinstance(v, (str, int, bool, type(None))) or
                             (isinstance(v, float) and math.isfinite(v)) else str(v) for k, v in r.params.items()}}
                 for r in sweep.runs]})


def checkpoint_frames(exp_dir: Path, num_policies: int = 1) -> int:
    """The env frames of the latest regular checkpoint, the least over the policies (0: none). Read from the file
    names (checkpoint_<version>_<frames>.pth), as the checkpoint store names them."""
    from sf.learning.checkpoint import REGULAR_NAME_RE  # (torch: 2 s that --help and bad input do without)

    frames = []
    for p in range(num_policies):
        d = Path(exp_dir) / f"checkpoint_p{p}"
        try:
            names = [m for m in (REGULAR_NAME_RE.match(f.name) for f in d.iterdir()) if m]
        except OSError:
            names = []
        frames.append(max((int(m.group(2)) for m in names), default=0))
    return min(frames) if frames else 0


def reward_series(exp_dir: Path) -> list[tuple[int, float, float]]:
    """[(frames, wall time, average episode reward)] of the run's reward/reward summaries (policy 0's in a
    population), orphans of a resume dropped as TensorBoard does; [] without event files."""
    if not event_files(exp_dir):
        return []
    scalars = read_scalar_events(exp_dir)
    pts = scalars.get(REWARD_TAG) or scalars.get(f"p0/{REWARD_TAG}") or []
    return [p for p in drop_orphans(pts) if math.isfinite(p[2])]


def last_line(exp_dir: Path, failure: bool = False) -> str:
    """The last non-empty line of launch.log, else of sf_log.txt ('' when neither has one). failure: the last error
    line (train.py's one-line error, or the runner's [ERROR] line naming what stopped the run) when there is one, the
    closing "Done:" line saying less."""
    for name in (LAUNCH_LOG, "sf_log.txt"):
        try:
            with open(Path(exp_dir) / name, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 16384))
                lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        except OSError:
            continue
        if lines:
            errors = [i for i, ln in enumerate(lines)
                      if "[ERROR]" in ln or ": error: " in ln or ln.startswith("Traceback")]
            if not (failure and errors):
                return lines[-1]
            last = errors[-1]
            return _exception_line(lines, last) if lines[last].startswith("Traceback") else lines[last]
    return ""


EXCEPTION_RE = re.compile(r"[A-Za-z_][\w.]*(: |$)")  # "ValueError: ...", "sf.x.ConfigError: ...", "KeyboardInterrupt"


def _exception_line(lines: list, start: int) -> str:
    """The line naming the exception of the Python traceback that begins at lines[start] (its lines stripped): the
    first `Type: message` (or bare `Type`) line after its last `File "..."` line; the Traceback line itself when there
    is none (a traceback cut short)."""
    last_file = start
    for j in range(start + 1, len(lines)):
        if lines[j].startswith("Traceback"):
            break
        if lines[j].startswith('File "'):
            last_file = j
    for ln in lines[last_file + 1:]:  # (the source line under it is code: `raise X(...)`, `f(x)`, not `Name: ...`)
        if ln.startswith("Traceback"):
            break
        if EXCEPTION_RE.match(ln):
            return ln
    return lines[start]


def process_start(pid: int) -> Optional[int]:
    """The start time of process `pid` in clock ticks since boot (/proc/<pid>/stat field 22); None if it is gone. With
    the pid it identifies a process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def pid_alive(record: dict) -> bool:
    """Whether the local process a launch.json records still runs (on another host, or none recorded: assumed so)."""
    host, pid = record.get("host"), record.get("pid")
    if (host is not None and host != socket.gethostname()) or not isinstance(pid, int):
        return True
    start = process_start(pid)
    return start is not None and record.get("pid_start") in (None, start)


def _budget(run) -> Optional[int]:
    if getattr(run, "budget", None) is not None:
        return run.budget
    try:
        return int(json.loads((Path(run.exp_dir) / "config.json").read_text())["train_for_env_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_state(run, read_events: bool = True) -> RunState:
    """The state of `run` (sf.launch.sweep.Run) from its files. read_events: read the reward from the event files
    (TensorBoard's reader; False for a quick look: reward None)."""
    exp_dir = Path(run.exp_dir)
    record = read_launch(exp_dir)
    frames = checkpoint_frames(exp_dir, getattr(run, "num_policies", 1))
    budget = _budget(run)
    series = reward_series(exp_dir) if read_events and exp_dir.is_dir() else []
    recorded = record.get("state")
    if recorded == "running" and record.get("backend", "local") == "local" and not pid_alive(record):
        recorded = "interrupted"  # the launcher was killed before it could record the end
    if recorded in ("running", "queued"):
        state = recorded
    elif budget is not None and frames >= budget:
        state = "done"
    elif recorded in ("done", "failed", "interrupted"):
        state = recorded
    else:
        state = "interrupted" if frames > 0 else "pending"
    wall = None
    if record.get("started") is not None:
        end = record.get("ended") if recorded != "running" else None
        wall = float(record.get("wall_before") or 0.0) + max(0.0, float(end or time.time()) - float(record["started"]))
    elif series:
        wall = series[-1][1] - series[0][1]
    shown_frames = max(frames, series[-1][0] if series and state == "running" else 0)
    return RunState(state=state, frames=shown_frames, reward=series[-1][2] if series else None,
                    best_reward=max(p[2] for p in series) if series else None, wall=wall,
                    last_line=last_line(exp_dir, failure=state == "failed") if exp_dir.is_dir() else "")
