#!/usr/bin/env python
"""Learning suite: every task with its preset and a fixed budget for N seeds, each final policy evaluated, one row per
task against a published anchor.

    python benchmarks/learning_suite.py                         # every task but the slow ones, 3 seeds each
    python benchmarks/learning_suite.py --tasks all --with_sf   # every task; Sample Factory 2.1.1 twice on each
    python benchmarks/learning_suite.py --tasks mujoco_hopper doom_basic --seeds 5 --train_dir /data/suite
    python benchmarks/learning_suite.py --quick                 # CI: doom_basic, one seed, a tiny budget (~1 min)

Training is one sweep of sf.launch (<train_dir>/learning_suite/, its sweep file written beside it as
learning_suite.py): the same command again skips the finished runs and resumes the others from their checkpoints,
and `python -m sf.launch <train_dir>/learning_suite.py --train_dir <train_dir> --summary` prints its table. Each
finished run's latest checkpoint is then evaluated by `python -m sf.eval` (a fixed number of episodes per task, seed 0,
sampled actions as in training and Sample Factory's enjoy; the CSV stays in the run's directory, named after the
checkpoint's frames, and is not redone). Curves: one PNG per task (sf.plot: mean over seeds, band min..max; Sample
Factory's runs as configurations of their own) in the sweep's directory.

Two tables: the tuning tasks (each family's settings were chosen on them: CHOSEN_ON) and the held-out tasks (no choice
looked at them; the slow ones run only when named). Report on fresh seeds: --seeds N runs seeds 0..N-1, and the
choices were made on seeds 100-102 (docs/benchmarks.md says which runs made each one).

Row: budget (env frames, frameskip included), seeds done, the final training average (each run's last average episode
reward, TensorBoard's reward/reward) and the evaluation's mean return, each as mean ± the 95% Student-t half-width
over seeds (one seed: the evaluation's over its episodes), the course's rule where it applies (evaluation mean - std
>= 5, per seed), the anchor and its source, wall time per run (start-up included, all launches of it) and frames/s
(frames / that wall time) on this machine with sf.launch's layout, and with --with_sf Sample Factory 2.1.1's final
training average and frames/s for the same task, budget, seeds and rollout workers on the same cores (.venv-sf; run
after ours, one at a time), once per mode: 'same' gives it our run's settings (benchmarks/sf_same_settings.py: its
flags under our values, so that both sides train the same algorithm), 'defaults' its example trainer's own (what its
users get); results kept in <sweep>/sf_2.1.1_same/ and <sweep>/sf_2.1.1/, not redone. Then a side-by-side table per
task and mode: each side's reward at the frames both reached (what the algorithm learns per sample) and at the
seconds since each one's first summary that both reached (what the user waits for), means over seeds.

Bad input (an unknown task, --seeds below 1, a task whose env cannot run here, --with_sf without Sample Factory's
Python) is one line on stderr and exit code 2, before anything starts. Exit code 1: a run, an evaluation or a Sample
Factory run failed (the table shows the rest); 130: stopped by Ctrl-C (run the same command again to resume).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import policy_lag  # noqa: E402
from common import header, table  # noqa: E402
from sf.cfg import ConfigError, OneLineArgumentParser, run_guarded  # noqa: E402

PROG = "benchmarks/learning_suite.py"
EVAL_SEED = 0
COURSE_MIN = 5.0  # the Hugging Face Deep RL course's pass mark for health_gathering_supreme: eval mean - std >= 5
CLEANRL_MUJOCO = "CleanRL ppo_continuous_action.py, gymnasium v4, 1M steps, mean ± std of 3 seeds"
SF_CARD = "Sample Factory's published model (HF hub model card)"


@dataclass(frozen=True)
class Task:
    name: str  # the env, and the sweep's Experiment name
    budget: int  # --train_for_env_steps: env frames, frameskip included
    episodes: int  # evaluation episodes per seed
    anchor: str
    source: str
    sf_module: str  # Sample Factory 2.1.1's example trainer
    sf_needs: str  # the module its env needs in Sample Factory's venv
    course_rule: bool = False
    slow: bool = False  # left out unless named (or --tasks all)
    max_seeds: Optional[int] = None
    extra: tuple = ()  # more train.py flags
    held_out: bool = False  # no choice of settings looked at it (the table's own section)


MUJOCO = dict(sf_module="sf_examples.mujoco.train_mujoco", sf_needs="mujoco")
DOOM = dict(sf_module="sf_examples.vizdoom.train_vizdoom", sf_needs="vizdoom")
ATARI = dict(sf_module="sf_examples.atari.train_atari", sf_needs="ale_py")
# Held-out Doom scenarios: 1M frames (about 4 minutes of ours on 2 cores), 20 evaluation episodes; no published
# figure at this budget: the anchor is Sample Factory 2.1.1's own runs (--with_sf)
HELD_OUT_DOOM = dict(held_out=True, anchor="-", source="Sample Factory 2.1.1 here (--with_sf)", **DOOM)
# Held-out Atari games and MuJoCo tasks: their presets' budgets, one Atari seed as for Pong (about 45 minutes each)
HELD_OUT_SLOW = dict(held_out=True, slow=True, anchor="-", source="Sample Factory 2.1.1 here (--with_sf)")
TASKS = {t.name: t for t in [
    Task("mujoco_halfcheetah", 1_000_000, 100, "1442.6 ± 46.0", CLEANRL_MUJOCO, **MUJOCO),
    Task("mujoco_hopper", 1_000_000, 100, "2382.9 ± 271.7", CLEANRL_MUJOCO, **MUJOCO),
    Task("mujoco_walker", 1_000_000, 100, "2288.0 ± 571.8", CLEANRL_MUJOCO, **MUJOCO),
    Task("doom_health_gathering_supreme", 4_000_000, 100, "≈ 66; course: eval mean - std >= 5",
         f"{SF_CARD}; HF Deep RL course unit 8 part 2 (Sample Factory, 4M frames)", course_rule=True, **DOOM),
    # 10M frames: a reactive task (turn and shoot, no navigation, a reward per kill), easier than health gathering
    # supreme, which the course expects to learn in 4M; 2.5x that leaves room to approach the anchor's plateau while
    # a seed takes about 35 minutes on 2 cores (its preset, Sample Factory 2's settings: about 4.6k frames/s)
    Task("doom_defend_the_center", 10_000_000, 100, "≈ 24-25", SF_CARD, **DOOM),
    # 600k frames: benchmarks/learning_doom_basic.py's budget, which reaches its 0.75 target at ~200k
    Task("doom_basic", 600_000, 100, "≈ 0.75", SF_CARD, **DOOM),
    # CleanRL counts agent steps: its 10M are 40M frames at frameskip 4, four times this budget
    Task("atari_pong", 10_000_000, 10, "≈ 20.4", "CleanRL ppo_atari_envpool, 10M agent steps (= 40M frames)",
         slow=True, max_seeds=1, **ATARI),
    # --- held out: no setting was chosen looking at these
    Task("doom_defend_the_line", 1_000_000, 20, **HELD_OUT_DOOM),
    Task("doom_health_gathering", 1_000_000, 20, **HELD_OUT_DOOM),
    Task("doom_my_way_home", 1_000_000, 20, **HELD_OUT_DOOM),
    Task("doom_deadly_corridor", 1_000_000, 20, **HELD_OUT_DOOM),
    Task("atari_breakout", 10_000_000, 10, max_seeds=1, **HELD_OUT_SLOW, **ATARI),
    Task("atari_beamrider", 10_000_000, 10, max_seeds=1, **HELD_OUT_SLOW, **ATARI),
    Task("mujoco_ant", 1_000_000, 100, **HELD_OUT_SLOW, **MUJOCO),
    Task("mujoco_pendulum", 1_000_000, 100, **HELD_OUT_SLOW, **MUJOCO),
    # a harder one than the pendulum (which both sides solve): Swimmer's gamma-0.99 returns stay low for PPO at 1M
    Task("mujoco_swimmer", 1_000_000, 100, "-13.47 ± 3.89", "CleanRL ppo_continuous_action.py, Swimmer-v4, 1M "
         "steps: its seed-1 model card (one seed)", held_out=True, slow=True, **MUJOCO),
]}
# Where each family's settings were chosen (the table's note; docs/benchmarks.md, Learning, has the runs)
CHOSEN_ON = {
    "doom": "Sample Factory 2's Doom defaults, taken for doom_health_gathering_supreme and doom_defend_the_center on "
            "seeds 0-2 (before this protocol: the paper's settings stayed at the random policy's reward there), "
            "--num_batches_to_accumulate on doom_defend_the_center seed 100; doom_basic's own entry on doom_basic "
            "(seed 100 confirmed it)",
    "atari": "atari_pong, seed 0 (before this protocol)",
    "mujoco": "mujoco_halfcheetah, mujoco_hopper, mujoco_walker (CleanRL's settings; minibatch 128 on seed 1, a "
              "reporting seed, before this protocol)",
}
# --quick (CI): doom_basic's preset on a budget that trains for ~20 s on 2 cores (a smoke test of the whole path: its
# reward stays near the random policy's), summaries every 2 s so that the short run writes some
QUICK = Task("doom_basic", 24_000, 5, TASKS["doom_basic"].anchor, TASKS["doom_basic"].source, **DOOM,
             extra=("--experiment_summaries_interval", "2"))


SF_MODES = ("same", "defaults")


# --- the command line -------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = OneLineArgumentParser(prog=PROG, allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=None, metavar="TASK",
                    help=f"tasks among {', '.join(TASKS)}, or all (default: all but the slow "
                         f"{', '.join(t.name for t in TASKS.values() if t.slow)})")
    ap.add_argument("--seeds", default="3", help="seeds per task, 0..N-1 (atari_pong: one at most; default 3)")
    ap.add_argument("--quick", action="store_true", help="doom_basic, one seed, a tiny budget, 5 evaluation "
                                                        "episodes: the whole path in about a minute (CI)")
    ap.add_argument("--with_sf", nargs="*", default=None, choices=SF_MODES, metavar="MODE",
                    help="also run Sample Factory 2.1.1 on the same tasks, budgets and seeds (after ours): 'same': "
                         "with our run's settings (benchmarks/sf_same_settings.py), 'defaults': with its own example "
                         "trainer's; no MODE: both")
    ap.add_argument("--sf_python", default=str(ROOT / ".venv-sf" / "bin" / "python"),
                    help="a Python with sample-factory 2.1.1 installed (default: .venv-sf)")
    ap.add_argument("--train_dir", default="train_dir", help="root of the suite's sweep directory (default: train_dir)")
    return ap


def chosen(args) -> tuple[list[Task], int]:
    """(the tasks, seeds per task) of the command line; ConfigError for bad input."""
    try:
        seeds = int(args.seeds)
    except ValueError:
        seeds = 0
    if not 1 <= seeds <= 100:
        raise ConfigError(f"--seeds {args.seeds!r}: must be an integer from 1 to 100")
    if args.quick:
        if args.tasks is not None:
            raise ConfigError("--quick runs doom_basic alone; leave --tasks out")
        return [QUICK], 1
    names = args.tasks or [n for n, t in TASKS.items() if not t.slow]
    if "all" in names:
        names = list(TASKS)
    bad = [n for n in names if n not in TASKS]
    if bad:
        raise ConfigError(f"--tasks: unknown task {bad[0]!r}; choose among {', '.join(TASKS)} or all")
    return [TASKS[n] for n in dict.fromkeys(names)], seeds


def check_envs(tasks: list[Task]) -> None:
    from sf.cfg import default_cfg
    from sf_envs.registry import EnvUnavailableError, check_env_available
    for t in tasks:
        try:
            check_env_available(default_cfg(env=t.name))
        except EnvUnavailableError as e:
            raise ConfigError(f"task {t.name}: {e}") from None


# --- training: one sweep of sf.launch ----------------------------------------------------------------------------
def write_sweep(path: Path, name: str, tasks: list[Task], seeds: int) -> None:
    """The suite as a sweep file of sf.launch: one Experiment per task, one run per seed."""
    lines = ["# Written by benchmarks/learning_suite.py: its tasks, budgets and seeds as a sweep of sf.launch.",
             "from sf.launch import Experiment, ParamGrid, RunDescription", "",
             f"RUN_DESCRIPTION = RunDescription({name!r}, experiments=["]
    for t in tasks:
        cmd = shlex.join(["python", "train.py", "--env", t.name, "--train_for_env_steps", str(t.budget), *t.extra])
        lines.append(f"    Experiment({t.name!r}, {cmd!r}, ParamGrid([('seed', {list(range(task_seeds(t, seeds)))})])"
                     ".generate_params(randomize=False)),")
    lines.append("])")
    path.parent.mkdir(parents=True, exist_ok=True)
    from sf.utils.files import write_text_atomic
    write_text_atomic(path, "\n".join(lines) + "\n")


def task_seeds(t: Task, seeds: int) -> int:
    return min(seeds, t.max_seeds or seeds)


# --- evaluation: python -m sf.eval --------------------------------------------------------------------------------
def evaluate(run, episodes: int) -> tuple[Optional[list[float]], str]:
    """(the returns of `episodes` episodes of the run's latest checkpoint, '') or (None, why not). The CSV is named
    after the checkpoint's frames: found again, it is read rather than redone; a run trained on later is evaluated
    anew."""
    from sf.launch.state import checkpoint_frames
    frames = checkpoint_frames(run.exp_dir)
    path = run.exp_dir / f"eval_latest_{frames}f_seed{EVAL_SEED}_{episodes}ep.csv"
    if not path.exists():
        log = run.exp_dir / "suite_eval.log"
        cmd = [sys.executable, "-m", "sf.eval", str(run.exp_dir), "--episodes", str(episodes), "--seed",
               str(EVAL_SEED), "--csv", str(path)]
        print(f"evaluate {run.name}: {shlex.join(cmd)} > {log}", flush=True)
        with open(log, "w") as f:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
        if rc == 130:
            raise KeyboardInterrupt
        if rc != 0:
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            return None, f"eval exit {rc}: {lines[-1][:120] if lines else 'no output'} ({log})"
    with open(path, newline="") as f:
        return [float(r["return"]) for r in csv.DictReader(f)], ""


# --- Sample Factory 2.1.1 -----------------------------------------------------------------------------------------
def sf_run(run, task: Task, sf_python: str, sf_dir: Path, mode: str) -> dict:
    """Sample Factory's example trainer on the run's task, budget and seed, with as many rollout workers and the same
    cores as ours had (sf.launch's launch.json); mode 'same': with our run's settings where they differ from its
    defaults (sf_same_settings.translate), 'defaults': with its own. Its result ({'reward', 'frames', 'wall', 'error',
    'flags', 'untranslated'}) is kept in sf_dir/<run>.json once it finished without error. Its own
    --restart_behavior (resume) continues an interrupted one."""
    import sf_same_settings
    import sf_workloads
    from sf.launch.state import read_launch

    done = sf_dir / f"{run.name}.json"
    if done.exists():
        return json.loads(done.read_text())
    (sf_dir / "shim").mkdir(parents=True, exist_ok=True)
    (sf_dir / "shim" / "sitecustomize.py").write_text(sf_workloads.SITECUSTOMIZE)  # (its Atari ids: see there)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(sf_dir / "shim"),
                                                                     os.environ.get("PYTHONPATH")])))
    ours = read_launch(run.exp_dir)
    cores = ours.get("cores") or sorted(os.sched_getaffinity(0))
    flags, untranslated = [], []
    if mode == "same":
        config = json.loads((run.exp_dir / "config.json").read_text())
        flags, untranslated = sf_same_settings.translate(
            config, sf_same_settings.sf_defaults(sf_python, task.sf_module, task.name))
    import torch
    cmd = [sf_python, "-m", task.sf_module, "--env", task.name, "--train_for_env_steps", str(task.budget),
           "--seed", str(run.seed), "--experiment", run.name, "--train_dir", str(sf_dir / "td"),
           "--num_workers", str(ours.get("num_workers") or len(cores)),
           *([] if torch.cuda.is_available() else ["--device", "cpu"]), *flags]
    log = sf_dir / f"{run.name}.log"
    print(f"Sample Factory ({mode}) {run.name} on cores {','.join(map(str, cores))}: {shlex.join(cmd)} > {log}",
          flush=True)
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)  # (inherited by its processes)
    try:
        out = sf_workloads.run(cmd, sf_dir, log, stall_sec=300.0, env=env)
    finally:
        os.sched_setaffinity(0, mine)
    res = sf_workloads.parse("sf", out, sf_summary(sf_dir, run))
    result = {k: res[k] for k in ("reward", "frames", "wall", "error")}
    result.update(flags=flags, untranslated=untranslated)
    if not result["error"]:
        done.write_text(json.dumps(result))
    return result


def sf_mode_dir(sweep_dir: Path, mode: str) -> Path:
    """Where --with_sf MODE keeps Sample Factory's runs (defaults: sf_2.1.1/, where --with_sf kept them before it had
    modes)."""
    return sweep_dir / ("sf_2.1.1" if mode == "defaults" else f"sf_2.1.1_{mode}")


def sf_summary(sf_dir: Path, run) -> Path:
    """Where Sample Factory's TensorBoard files of the run are."""
    return sf_dir / "td" / run.name / ".summary" / "0"


def sf_column(task: Task, done: list, sf_python: str, sf_dir: Path, mode: str) -> tuple[str, list[str]]:
    """(the row's Sample Factory cell: final training average over seeds and frames/s, [a note per failed run])."""
    from sf.launch.summary import describe
    results = [sf_run(r, task, sf_python, sf_dir, mode) for r in done]
    errors = [f"{r.name}, Sample Factory ({mode}): {res['error']}" for r, res in zip(done, results) if res["error"]]
    ok = [res for res in results if not res["error"] and math.isfinite(res["reward"])]
    if not ok:
        return "failed (notes below)", errors
    return (f"{with_ci(describe([x['reward'] for x in ok]), seed_count(len(ok)))}, "
            f"{sum(x['frames'] / x['wall'] for x in ok) / len(ok):.0f} frames/s"), errors


# --- side by side: reward at equal frames and at equal wall-clock -------------------------------------------------
def reward_curve(summary_dir: Path) -> list[tuple[int, float, float]]:
    """[(env frames, seconds since the run's first summary, average episode reward)] of reward/reward."""
    from sf.utils.events import read_scalar_events
    scalars = read_scalar_events(summary_dir) if summary_dir.is_dir() else {}
    start = min((w for pts in scalars.values() for _, w, _ in pts), default=0.0)
    return sorted((step, w - start, v) for step, w, v in scalars.get("reward/reward", []))


def reward_at(curve: list, frames: Optional[float] = None, seconds: Optional[float] = None) -> float:
    """The last reward at or before `frames` (or `seconds` since the first summary); nan when there is none."""
    points = [v for f, t, v in curve if (frames is None or f <= frames) and (seconds is None or t <= seconds)]
    return points[-1] if points else float("nan")


def side_by_side(task: Task, done: list, sf_dir: Path, mode: str) -> Optional[list[str]]:
    """A row: over the seeds both sides finished, each side's reward at the frames both reached and at the wall-clock
    time both reached (since each one's first summary), with the frames and seconds those are."""
    from sf.launch.summary import describe
    pairs = [(reward_curve(r.exp_dir), reward_curve(sf_summary(sf_dir, r))) for r in done]
    pairs = [(o, t) for o, t in pairs if o and t]
    if not pairs:
        return None
    frames = [min(o[-1][0], t[-1][0]) for o, t in pairs]
    seconds = [min(o[-1][1], t[-1][1]) for o, t in pairs]
    cell = lambda xs: with_ci(describe(xs), seed_count(len(xs)))  # noqa: E731
    drift = [(drift_figures(r.exp_dir, policy_lag.OURS), drift_figures(sf_summary(sf_dir, r), policy_lag.THEIRS))
             for r in done]
    mean = lambda side, k: sum(d[side][k] for d in drift) / len(drift)  # noqa: E731
    return [task.name, f"SF 2.1.1, {mode}",
            f"{sum(frames) / len(frames):,.0f}",
            cell([reward_at(o, frames=f) for (o, _), f in zip(pairs, frames)]),
            cell([reward_at(t, frames=f) for (_, t), f in zip(pairs, frames)]),
            f"{sum(seconds) / len(seconds):.0f}",
            cell([reward_at(o, seconds=s) for (o, _), s in zip(pairs, seconds)]),
            cell([reward_at(t, seconds=s) for (_, t), s in zip(pairs, seconds)]),
            *(f"{mean(0, k):.{d}f} vs {mean(1, k):.{d}f}" for k, d in (("lag", 2), ("kl", 5), ("clip", 3)))]


def drift_figures(summary_dir: Path, tags: dict) -> dict:
    """Policy lag, KL from the behaviour policy and clip fraction of a run: medians over its second half
    (benchmarks/policy_lag.py's figures; `tags`: its OURS or THEIRS)."""
    from sf.utils.events import read_scalar_events
    return policy_lag.figures(read_scalar_events(summary_dir) if summary_dir.is_dir() else {}, tags)


def sf_missing(sf_python: str, module: str) -> Optional[str]:
    """Why Sample Factory's Python cannot run a family's envs (its env package missing), else None."""
    rc = subprocess.run([sf_python, "-c", f"import {module}"], capture_output=True).returncode
    return None if rc == 0 else f"not run: {module} is not installed in {sf_python}"


# --- the table ----------------------------------------------------------------------------------------------------
def num(x: Optional[float]) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.4g}"


def seed_count(n: int) -> str:
    return f"{n} seed{'s' * (n != 1)}"


def with_ci(stats, what: str) -> str:
    """'mean ± 95% half-width [what]' of sf.launch.summary's Stats (no interval for one value)."""
    if stats is None:
        return "-"
    if stats.ci is None:
        return f"{num(stats.mean)} [{what}]"
    return f"{num(stats.mean)} ± {num((stats.ci[1] - stats.ci[0]) / 2)} [{what}]"


def eval_cell(returns_by_seed: list[list[float]], episodes: int) -> str:
    """Over seeds (the mean of each one's evaluation) with 2 or more; with one, over its episodes."""
    from sf.eval import summarize
    from sf.launch.summary import Stats, describe
    if not returns_by_seed:
        return "-"
    if len(returns_by_seed) > 1:
        means = [summarize(r)[0] for r in returns_by_seed]
        return with_ci(describe(means), f"{seed_count(len(means))} x {episodes} ep")
    mean, std, lo, hi = summarize(returns_by_seed[0])
    ci = None if math.isnan(lo) else (lo, hi)
    return with_ci(Stats(len(returns_by_seed[0]), mean, std, ci), f"1 seed, {len(returns_by_seed[0])} ep")


def course_cell(returns_by_seed: dict[int, list[float]]) -> str:
    from sf.eval import summarize
    cells = []
    for seed, r in returns_by_seed.items():
        mean, std, _, _ = summarize(r)
        cells.append(f"s{seed} {num(mean - std)} {'PASS' if mean - std >= COURSE_MIN else 'FAIL'}")
    return ", ".join(cells) or "-"


def plot_task(sweep, task: Task, sf_dirs: dict[str, Path]) -> Optional[Path]:
    """<sweep dir>/curves_<task>.png: sf.plot's sweep figure (mean over seeds, band min..max) of one task (the tasks'
    rewards differ in scale by 1000x: one figure each), with Sample Factory's runs of each mode (sf_dirs: mode ->
    its directory) as configurations of their own."""
    from sf.plot import SWEEP_PANELS, event_files, panel_series, read_scalar_events, render_sweep, sweep_bands
    runs = [r for r in sweep.runs if r.config == task.name and r.exp_dir.is_dir() and event_files(r.exp_dir)]
    if not runs:
        return None
    dirs = {r.name: (r.exp_dir, "ours") for r in runs}
    for mode, sf_dir in sf_dirs.items():
        dirs.update({f"{r.name} SF {mode}": (sf_summary(sf_dir, r), f"SF 2.1.1 {mode}") for r in runs
                     if sf_summary(sf_dir, r).is_dir() and event_files(sf_summary(sf_dir, r))})
    series, unit = panel_series({name: read_scalar_events(d) for name, (d, _) in dirs.items()},
                                SWEEP_PANELS.split(","), 0.6)
    out = sweep.train_dir / f"curves_{task.name}.png"
    render_sweep(sweep_bands(series, {name: config for name, (_, config) in dirs.items()}), unit, out,
                 f"{task.name}, {task.budget:,} frames: mean over {len(runs)} seed(s), band min..max")
    return out


def suite(args) -> int:
    tasks, n_seeds = chosen(args)
    check_envs(tasks)
    modes = [] if args.with_sf is None else list(dict.fromkeys(args.with_sf or SF_MODES))
    if modes and not Path(args.sf_python).exists():
        raise ConfigError(f"--sf_python: {args.sf_python} does not exist; give a Python with sample-factory 2.1.1 "
                          "installed (or leave --with_sf out)")
    from sf.cfg import validate_train_dir
    validate_train_dir(args.train_dir)
    name = "learning_suite_quick" if args.quick else "learning_suite"  # (a quick run never resumes into a full one)
    sweep_file = Path(args.train_dir) / f"{name}.py"
    header(f"Learning suite{' (--quick)' if args.quick else ''}: {len(tasks)} task(s), {seed_count(n_seeds)}")
    write_sweep(sweep_file, name, tasks, n_seeds)
    print(f"sweep: {sweep_file}; again: the same command (finished runs are skipped); its table: python -m sf.launch "
          f"{sweep_file} --train_dir {args.train_dir} --summary\n", flush=True)

    from sf.launch.__main__ import main as launch
    from sf.launch.local import available_cores, default_max_parallel
    from sf.launch.summary import describe, status_rows
    from sf.launch.sweep import load_sweep
    t0 = time.time()
    rc = launch([str(sweep_file), "--train_dir", args.train_dir])
    if rc == 130:
        raise KeyboardInterrupt
    if rc == 2:  # (refused, e.g. another launcher runs this sweep: sf.launch said why in one line)
        return 2
    sweep = load_sweep(str(sweep_file), args.train_dir)
    states = dict(status_rows(sweep))
    failed = rc != 0
    rows, pairs, notes = {False: [], True: []}, [], []
    sf_reasons = {t.sf_needs: sf_missing(args.sf_python, t.sf_needs) for t in tasks} if modes else {}
    sf_dirs = {m: sf_mode_dir(sweep.train_dir, m) for m in modes}
    for task in tasks:
        runs = [r for r in sweep.runs if r.config == task.name]
        done = [r for r in runs if states[r.name].state == "done"]
        returns: dict[int, list[float]] = {}
        for r in done:
            got, why = evaluate(r, task.episodes)
            if got is None:
                failed = True
                notes.append(f"{r.name}: {why}")
            else:
                returns[r.seed] = got
        for r in runs:
            if r not in done:
                notes.append(f"{r.name}: {states[r.name].state}: {states[r.name].last_line[:120]}")
        final = describe([states[r.name].reward for r in runs if states[r.name].reward is not None])
        walls = [states[r.name].wall for r in runs if states[r.name].wall]
        wall = sum(walls) / len(walls) if walls else None
        fps = [states[r.name].frames / states[r.name].wall for r in runs if states[r.name].wall]
        sf_cells = {}
        for mode in modes:
            sf_cells[mode] = sf_reasons[task.sf_needs] or "not run: none of ours finished"
            if not sf_reasons[task.sf_needs] and done:
                sf_cells[mode], errors = sf_column(task, done, args.sf_python, sf_dirs[mode], mode)
                failed |= bool(errors)
                notes += errors
                pairs.append(side_by_side(task, done, sf_dirs[mode], mode))
        plot = plot_task(sweep, task, sf_dirs)
        if plot:
            notes.append(f"{task.name} curves: {plot}")
        rows[task.held_out].append(
            [task.name + (" (slow)" if task.slow else ""), f"{task.budget:,}", f"{len(done)}/{len(runs)}",
             with_ci(final, seed_count(final.n)) if final else "-", eval_cell(list(returns.values()), task.episodes),
             course_cell(returns) if task.course_rule else "-", task.anchor, task.source,
             f"{wall:.0f}" if wall else "-", f"{sum(fps) / len(fps):.0f}" if fps else "-",
             *(sf_cells[m] for m in modes)])
    cores = len(available_cores())
    print(f"\n{len(sweep.runs)} run(s), {default_max_parallel(cores)} at once on {cores} cores (sf.launch's layout); "
          f"{time.time() - t0:.0f} s for this invocation")
    print("train final: each run's last average episode reward (last 100 episodes); eval: "
          f"python -m sf.eval, seed {EVAL_SEED}, sampled actions; ±: 95% Student-t half-width (over seeds, or the one "
          "seed's episodes); course: eval mean - std per seed, PASS at >= 5; wall and frames/s: per run, start-up "
          "included\n")
    columns = ["task", "budget (frames)", "seeds done", "train final, mean ± 95% CI", "eval, mean ± 95% CI",
               "course rule (eval mean - std)", "anchor", "anchor source", "wall s/run", "frames/s",
               *(f"SF 2.1.1 {m}: train final, frames/s" for m in modes)]
    for held_out, title in ((False, "Tuning tasks: the families' settings were chosen on these"),
                            (True, "Held-out tasks: no choice of settings looked at these")):
        if rows[held_out]:
            print(f"{title}\n{table(rows[held_out], columns)}\n")
    families = dict.fromkeys(t.name.split("_")[0] for t in tasks)
    print("Settings chosen on: " + "; ".join(f"{f}: {CHOSEN_ON[f]}" for f in families if f in CHOSEN_ON) + "\n")
    if any(pairs):
        print("Side by side (each side's average episode reward, TensorBoard's reward/reward: at the frames both "
              "reached, and at the seconds since each one's first summary that both reached; policy lag, KL from the "
              "behaviour policy and clip fraction: medians over each run's second half, means over seeds):\n" + table(
                  [p for p in pairs if p], ["task", "against", "equal frames", "ours", "SF", "equal seconds", "ours",
                                            "SF", "policy lag, ours vs SF", "KL", "clip fraction"]))
    for mode, sf_dir in sf_dirs.items():
        given = sorted(sf_dir.glob("*.json"))
        if mode == "same" and given:
            last = json.loads(given[-1].read_text())
            notes.append(f"SF 2.1.1 same settings, e.g. {given[-1].stem}: {' '.join(last['flags'])}; ours only (no "
                         f"flag of Sample Factory's): {', '.join(last['untranslated'])}")
    if notes:
        print("\n" + "\n".join(notes))
    return 1 if failed else 0


def main(argv=None) -> int:
    try:
        return run_guarded(PROG, lambda: suite(build_parser().parse_args(argv)))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; run the same command again to resume (finished runs are skipped)",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
