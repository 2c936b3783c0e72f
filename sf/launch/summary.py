"""The --status and --summary tables of a sweep, from its runs' files (sf.launch.state).

--summary: one row per configuration (the runs that differ only in their seed): the final average episode reward
(each run's last reward/reward summary) and the best one (each run's highest), as mean, sample standard deviation
and the 95% confidence interval of the mean (Student's t with n-1 degrees of freedom: mean +- t * std / sqrt(n)),
n being the runs with a reward; their frames (mean) and wall time (mean).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from sf.launch.state import RunState, run_state
from sf.launch.sweep import Sweep
from sf.utils.stats import t_quantile


# --- statistics ---
@dataclass
class Stats:
    n: int
    mean: float
    std: Optional[float]  # sample standard deviation (n-1); None for n < 2
    ci: Optional[tuple[float, float]]  # the 95% t-interval of the mean; None for n < 2


def describe(values: Sequence[float], level: float = 0.95) -> Optional[Stats]:
    """Mean, sample std and the t confidence interval of the mean of `values` (None when empty)."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        return None
    mean = sum(xs) / n
    if n < 2:
        return Stats(n, mean, None, None)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + level / 2.0, n - 1) * std / math.sqrt(n)
    return Stats(n, mean, std, (mean - half, mean + half))


# --- tables ---
def _num(x: Optional[float], digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}" if abs(x) >= 1e4 else f"{x:.{digits}f}"


def _wall(s: Optional[float]) -> str:
    if s is None:
        return "-"
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _frames(f: float) -> str:
    for unit, k in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if f >= k:
            return f"{f / k:.2f}{unit}"
    return f"{int(f)}"


def format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)


def status_rows(sweep: Sweep) -> list[tuple[str, RunState]]:
    return [(r.name, run_state(r)) for r in sweep.runs]


def status_table(sweep: Sweep, states: Optional[list[tuple[str, RunState]]] = None) -> str:
    """Each run's state: pending, queued, running (frames and the last reward), done, failed (its last log line),
    interrupted; then a count per state."""
    states = states if states is not None else status_rows(sweep)
    budgets = {r.name: r.budget for r in sweep.runs}
    rows = []
    for name, st in states:
        budget = budgets.get(name)
        frames = _frames(st.frames) + (f"/{_frames(budget)}" if budget and budget < 10**12 else "")
        note = st.last_line[:100] if st.state == "failed" else ""
        rows.append([name, st.state, frames, _num(st.reward), _num(st.best_reward), _wall(st.wall), note])
    counts: dict[str, int] = {}
    for _, st in states:
        counts[st.state] = counts.get(st.state, 0) + 1
    table = format_table(["run", "state", "frames", "reward", "best", "wall", "last line (failed)"], rows)
    return f"{table}\n{len(states)} runs: " + ", ".join(f"{v} {k}" for k, v in counts.items())


@dataclass
class ConfigSummary:
    config: str
    runs: int  # runs of the configuration (seeds)
    done: int
    final: Optional[Stats]  # over the runs with a reward: each one's last reward/reward
    best: Optional[Stats]  # each one's highest reward/reward
    frames: float  # mean
    wall: Optional[float]  # mean over the runs that have one


def summarize(sweep: Sweep, states: Optional[list[tuple[str, RunState]]] = None) -> list[ConfigSummary]:
    """One ConfigSummary per configuration, in the order of the sweep's runs."""
    states = dict(states if states is not None else status_rows(sweep))
    groups: dict[str, list[RunState]] = {}
    for r in sweep.runs:
        groups.setdefault(r.config, []).append(states[r.name])
    out = []
    for config, sts in groups.items():
        walls = [s.wall for s in sts if s.wall is not None]
        out.append(ConfigSummary(
            config=config, runs=len(sts), done=sum(s.state == "done" for s in sts),
            final=describe([s.reward for s in sts if s.reward is not None]),
            best=describe([s.best_reward for s in sts if s.best_reward is not None]),
            frames=sum(s.frames for s in sts) / len(sts), wall=sum(walls) / len(walls) if walls else None))
    return out


def _stats_cells(s: Optional[Stats]) -> list[str]:
    if s is None:
        return ["-", "-", "-"]
    ci = "-" if s.ci is None else f"[{_num(s.ci[0])}, {_num(s.ci[1])}]"
    return [_num(s.mean), _num(s.std), ci]


def summary_table(sweep: Sweep, states: Optional[list[tuple[str, RunState]]] = None) -> str:
    rows = []
    for c in summarize(sweep, states):
        n = c.final.n if c.final else 0
        rows.append([c.config, f"{n}", f"{c.done}/{c.runs}", *_stats_cells(c.final), *_stats_cells(c.best),
                     _frames(c.frames), _wall(c.wall)])
    header = ["configuration", "n", "done", "final mean", "std", "95% CI", "best mean", "std", "95% CI", "frames",
              "wall"]
    return (format_table(header, rows) + "\nfinal: each run's last average episode reward (reward/reward); best: its "
            "highest; mean, sample std and 95% t-interval over the n runs (seeds) with a reward; frames and wall: "
            "means")
