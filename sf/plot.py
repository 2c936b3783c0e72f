"""Learning curves as a PNG, from the TensorBoard event files that training writes into train_dir/EXPERIMENT/.

    python -m sf.plot train_dir/exp_a [train_dir/exp_b ...] [--out curves.png] [--smooth 0.6] [--panels reward,fps]
    python -m sf.plot SWEEP.py [--train_dir DIR]    (or the sweep's directory train_dir/<sweep>; see docs/sweeps.md)

Panels (the tags are those of sf/runner/stats.py; the step of every scalar is the env frame count):
    reward       reward/reward (average episode reward) vs env frames
    reward_time  reward/reward vs wall time since the experiment's first summary (a resumed run's pause included)
    fps          perf/_fps (env frames per second over the last 10 s) vs env frames
    lag          train/policy_lag_avg (line) within train/policy_lag_min..max (band), in SGD steps, vs env frames
Several experiments share each panel: one colour per experiment, the legend gives the experiment directory's name. A
population's experiment (--num_policies N: series tagged p{i}/...) is drawn as one curve per policy, 'exp/p{i}'.
--smooth is TensorBoard's smoothing (a debiased exponential moving average); the raw values are drawn faintly behind.
A sweep (python -m sf.launch) is drawn as one line per configuration: the mean over its runs (seeds) of their smoothed
curves, with a band from their minimum to their maximum, over the frames every run has reached (`sweep_bands`); the
PNG goes to train_dir/<sweep>/learning_curves.png by default.

Event files are read by sf/utils/events.py (TensorBoard's own reader, file by file in name order = creation order).
Bad input (an experiment directory that does not exist or holds no event files, an --out whose directory does not
exist, a flag out of range) is one line on stderr and exit code 2; an I/O failure one line and exit code 1.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sf.cfg import ConfigError, OneLineArgumentParser, RunError, run_guarded
from sf.launch.state import LAUNCH_DIR, SWEEP_JSON
from sf.launch.sweep import load_sweep
from sf.utils.events import EVENT_GLOB, drop_orphans, event_files, read_scalar_events
from sf.utils.files import write_atomic

# matplotlib is imported where used: answering --help or bad input stays fast.

DEFAULT_OUT_NAME = "learning_curves.png"


@dataclass(frozen=True)
class PanelSpec:
    title: str
    x: str  # "frames" (the event step) or "time" (the event wall time, from the experiment's first summary)
    tags: tuple[str, ...]  # the first one is the line; lag: (avg, min, max), min..max drawn as a band
    ylabel: str


PANELS: dict[str, PanelSpec] = {
    "reward": PanelSpec("Reward vs env frames", "frames", ("reward/reward",), "average episode reward"),
    "reward_time": PanelSpec("Reward vs wall time", "time", ("reward/reward",), "average episode reward"),
    "fps": PanelSpec("Throughput", "frames", ("perf/_fps",), "env frames / s (10 s window)"),
    "lag": PanelSpec("Policy lag (avg; band: min..max)", "frames",
                     ("train/policy_lag_avg", "train/policy_lag_min", "train/policy_lag_max"), "SGD steps"),
}


@dataclass
class Series:
    """One experiment's curve of one tag in one panel: x as plotted (env frames, or wall time in `time_unit`),
    y as written to the event file (orphans dropped, see `drop_orphans`), y_smooth = ema(y, --smooth)."""
    experiment: str
    tag: str
    x: np.ndarray
    y: np.ndarray
    y_smooth: np.ndarray


# --- the series ---

def ema(values, weight: float) -> np.ndarray:
    """TensorBoard's smoothing of `values` with `weight` in [0, 1): last = last * weight + (1 - weight) * v, divided by
    1 - weight**n (debiased: the first point is not pulled toward 0); non-finite values pass through unsmoothed."""
    values = np.asarray(values, dtype=float)
    if weight == 0:
        return values.copy()
    out = np.empty_like(values)
    last, n = 0.0, 0
    for i, v in enumerate(values):
        if not math.isfinite(v):
            out[i] = v
            continue
        last = last * weight + (1 - weight) * v
        n += 1
        out[i] = last / (1 - weight ** n)
    return out


def time_unit(max_seconds: float) -> tuple[str, float]:
    """(name, seconds per unit) for a wall-time axis spanning max_seconds: s up to 2 min, min up to 2 h, then h."""
    if max_seconds <= 120:
        return "s", 1.0
    if max_seconds <= 7200:
        return "min", 60.0
    return "h", 3600.0


def panel_series(runs: dict[str, dict[str, list[tuple[int, float, float]]]], panels: list[str],
                 smooth: float) -> tuple[dict[str, list[Series]], str]:
    """runs: experiment label -> `read_scalar_events` of it. Returns (panel name -> the Series it plots, in the order
    of runs then of the panel's tags; a tag missing from an experiment gives no Series) and the wall-time axis unit.
    This is exactly what `render` draws, so tests check it against what was written."""
    starts = {label: min((w for pts in scalars.values() for _, w, _ in pts), default=0.0)
              for label, scalars in runs.items()}
    span = max((w - starts[label] for label, scalars in runs.items() for pts in scalars.values() for _, w, _ in pts),
               default=0.0)
    unit, unit_s = time_unit(span)
    out: dict[str, list[Series]] = {}
    for name in panels:
        spec = PANELS[name]
        out[name] = []
        for label, scalars in runs.items():
            for tag in spec.tags:
                pts = drop_orphans(scalars.get(tag, []))
                if not pts:
                    continue
                steps, walls, values = (np.array(c, dtype=float) for c in zip(*pts))
                x = steps if spec.x == "frames" else (walls - starts[label]) / unit_s
                out[name].append(Series(label, tag, x, values, ema(values, smooth)))
    return out, unit


# --- drawing ---

def _figure(n: int):
    """A figure of n panels, two per row: (Figure, axes [n...] flat, the unused ones hidden). A Figure with its own Agg
    canvas, not pyplot: headless whatever backend the caller's matplotlib has chosen."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    ncols = 1 if n == 1 else 2
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(6.4 * ncols, 4.4 * nrows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes


def render(series: dict[str, list[Series]], unit: str, labels: list[str], smooth: float, out: Path,
           title: str | None = None) -> None:
    """Draws the panels of `series` (from `panel_series`) into a PNG at `out`, written atomically (write_atomic), so
    `out` is either the previous file or the complete new one. labels fixes each experiment's colour.
    Raises OSError when the file cannot be written."""
    from matplotlib.ticker import EngFormatter

    colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    fig, axes = _figure(len(series))
    for ax, (name, curves) in zip(axes, series.items()):
        spec = PANELS[name]
        ax.set_title(spec.title)
        ax.set_ylabel(spec.ylabel)
        ax.set_xlabel("env frames" if spec.x == "frames" else f"wall time ({unit})")
        if spec.x == "frames":
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 1.2M rather than 1.2e6 in the corner
        ax.grid(True, alpha=0.3)
        if not curves:
            ax.text(0.5, 0.5, f"no {spec.tags[0]} in the event files", ha="center", va="center",
                    transform=ax.transAxes, color="gray")
            continue
        by_tag = {(s.experiment, s.tag): s for s in curves}
        for s in curves:
            if s.tag != spec.tags[0]:
                continue  # lag min/max: drawn as the band below
            color = colors[s.experiment]
            if smooth > 0:  # the raw values faintly behind the smoothed line, as TensorBoard shows them
                ax.plot(s.x, s.y, color=color, alpha=0.25, linewidth=1)
            # markers while points are few: a lone point is otherwise invisible (a short run's first summaries)
            marker = dict(marker="o", markersize=3) if len(s.x) <= 20 else {}
            ax.plot(s.x, s.y_smooth, color=color, linewidth=1.8, label=s.experiment, **marker)
            lo, hi = (by_tag.get((s.experiment, t)) for t in spec.tags[1:]) if len(spec.tags) == 3 else (None, None)
            if lo is not None and hi is not None:  # lag: min..max around the average
                if np.array_equal(lo.x, hi.x):  # written together each summary: one band
                    ax.fill_between(lo.x, lo.y_smooth, hi.y_smooth, color=color, alpha=0.15, linewidth=0)
                else:
                    for b in (lo, hi):
                        ax.plot(b.x, b.y_smooth, color=color, linewidth=0.8, linestyle=":")
        if ax.get_legend_handles_labels()[0]:  # (matplotlib warns on stderr about a legend with no lines)
            ax.legend(fontsize="small", loc="best")
    if title:
        fig.suptitle(title)
    write_atomic(out, lambda f: fig.savefig(f, format="png"))


# --- sweeps (python -m sf.launch) ---

@dataclass
class Band:
    """One configuration of a sweep in one panel: the mean over its runs (seeds) of their smoothed curves, and the
    min..max band around it, on a common x grid (where every run has data: from the latest first point to the
    earliest last one; each run's smoothed curve linearly interpolated onto it). n: the runs drawn."""
    config: str
    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    n: int


BAND_POINTS = 200  # points of the common grid
SWEEP_PANELS = "reward,reward_time"  # a sweep's default: the rewards its configurations are compared by


def sweep_bands(series: dict[str, list[Series]], config_of: dict[str, str]) -> dict[str, list[Band]]:
    """panel -> a Band per configuration, from `panel_series`'s Series of the sweep's runs (labelled by run name;
    config_of: run name -> configuration). Only each panel's first tag (the line) is aggregated."""
    out: dict[str, list[Band]] = {}
    for name, curves in series.items():
        groups: dict[str, list[Series]] = {}
        for s in curves:
            if s.tag == PANELS[name].tags[0] and len(s.x):
                groups.setdefault(config_of[s.experiment], []).append(s)
        out[name] = []
        for config, runs in groups.items():
            start, end = max(float(s.x[0]) for s in runs), min(float(s.x[-1]) for s in runs)
            if end < start:  # no common range (a run that has just begun): draw the runs' own points
                start, end = min(float(s.x[0]) for s in runs), max(float(s.x[-1]) for s in runs)
            xs = np.linspace(start, end, BAND_POINTS) if end > start else np.array([start])
            ys = np.stack([np.interp(xs, s.x, s.y_smooth) for s in runs])
            out[name].append(Band(config, xs, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0), len(runs)))
    return out


def render_sweep(bands: dict[str, list[Band]], unit: str, out: Path, title: str) -> None:
    """Draws the panels of `bands` (one line per configuration: the mean over seeds, its band min..max) into a PNG
    at `out`, written atomically. Raises OSError when the file cannot be written."""
    from matplotlib.ticker import EngFormatter

    configs = list(dict.fromkeys(b.config for bs in bands.values() for b in bs))
    colors = {c: f"C{i % 10}" for i, c in enumerate(configs)}
    fig, axes = _figure(len(bands))
    for ax, (name, bs) in zip(axes, bands.items()):
        spec = PANELS[name]
        ax.set_title(spec.title.split(" (")[0])
        ax.set_ylabel(spec.ylabel)
        ax.set_xlabel("env frames" if spec.x == "frames" else f"wall time ({unit})")
        if spec.x == "frames":
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        ax.grid(True, alpha=0.3)
        if not bs:
            ax.text(0.5, 0.5, f"no {spec.tags[0]} in the event files", ha="center", va="center",
                    transform=ax.transAxes, color="gray")
            continue
        for b in bs:
            marker = dict(marker="o", markersize=3) if len(b.x) == 1 else {}
            ax.plot(b.x, b.mean, color=colors[b.config], linewidth=1.8, label=f"{b.config} (n={b.n})", **marker)
            if b.n > 1:
                ax.fill_between(b.x, b.lo, b.hi, color=colors[b.config], alpha=0.2, linewidth=0)
        ax.legend(fontsize="small", loc="best")
    fig.suptitle(title)
    write_atomic(out, lambda f: fig.savefig(f, format="png"))


def is_sweep(arg: Path) -> bool:
    """A sweep file (.py / .json) or a sweep's directory (<train_dir>/<sweep>, which holds the launcher's .launch/)."""
    try:
        return (arg.is_file() and arg.suffix in (".py", ".json")) or (arg / LAUNCH_DIR).is_dir()
    except OSError:
        return False


def sweep_runs(arg: Path, train_dir: str | None) -> tuple[str, Path, list[tuple[str, str, Path]]]:
    """(sweep name, its directory, [(run name, configuration, experiment dir)]) of a sweep file (sf.launch's
    load_sweep) or a sweep's directory (the runs sf.launch recorded in .launch/sweep.json)."""
    if arg.is_file():
        sw = load_sweep(str(arg), train_dir, check=False)
        return sw.name, sw.train_dir, [(r.name, r.config, r.exp_dir) for r in sw.runs]
    try:
        rec = json.loads((arg / LAUNCH_DIR / SWEEP_JSON).read_text())
        runs = [(r["name"], r["config"], arg / r["name"]) for r in rec["runs"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"{arg}: {LAUNCH_DIR}/{SWEEP_JSON} is missing or unreadable; give the sweep file instead "
                          f"(python -m sf.plot SWEEP.py --train_dir DIR)") from None
    return str(rec.get("name", arg.name)), arg, runs


def run_plot_sweep(args: argparse.Namespace, panels: list[str]) -> Path:
    """A sweep: one curve per configuration (mean over its seeds) with the band min..max across them."""
    name, sweep_dir, runs = sweep_runs(args.exp_dirs[0], args.train_dir)
    drawn = [(n, c, d) for n, c, d in runs if d.is_dir() and event_files(d)]
    if not drawn:
        raise ConfigError(f"{args.exp_dirs[0]}: no run of sweep {name!r} has TensorBoard event files yet (under "
                          f"{sweep_dir}); start it with python -m sf.launch")
    out = args.out if args.out is not None else sweep_dir / DEFAULT_OUT_NAME
    check_out(out)
    try:
        scalars = {}
        for n, _, d in drawn:  # a population's run: its first policy's curves
            scalars[n] = next(iter(split_policies(n, read_scalar_events(d)).values()))
    except OSError as e:
        raise RunError(f"cannot read {e.filename or sweep_dir}: {e.strerror or e}") from None
    series, unit = panel_series(scalars, panels, args.smooth)
    bands = sweep_bands(series, {n: c for n, c, _ in drawn})
    title = args.title or f"{name}: mean over seeds, band min..max ({len(drawn)} of {len(runs)} runs)"
    try:
        render_sweep(bands, unit, out, title)
    except OSError as e:
        raise RunError(f"cannot write {out}: {e.strerror or e}") from None
    return out


# --- command line ---

def experiment_labels(dirs: list[Path]) -> list[str]:
    """Legend names: each directory's name, or as many trailing path components as make the names distinct
    (run_1/exp and run_2/exp)."""
    parts = [Path(os.path.abspath(d)).parts for d in dirs]
    for k in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-k:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(d) for d in dirs]


def split_policies(label: str, scalars: dict) -> dict[str, dict]:
    """A population's experiment (its series tagged p{i}/...) as one run per policy, labelled 'label/p{i}', with the
    prefix dropped; the global series (perf/, memory/) go with policy 0's run. One policy: {label: scalars}."""
    prefixed = [t for t in scalars if t.startswith("p") and "/" in t and t.split("/", 1)[0][1:].isdigit()]
    if not prefixed:
        return {label: scalars}
    policies = sorted({int(t.split("/", 1)[0][1:]) for t in prefixed})
    out = {f"{label}/p{i}": {} for i in policies}
    for tag, points in scalars.items():
        head, _, rest = tag.partition("/")
        if tag in prefixed:
            out[f"{label}/p{int(head[1:])}"][rest] = points
        else:
            out[f"{label}/p{policies[0]}"][tag] = points
    return out


def check_experiment_dir(d: Path) -> None:
    """Raises a one-line ConfigError unless d is a directory holding event files (naming sub-directories that do,
    for `python -m sf.plot train_dir`)."""
    valid = "give an experiment directory that training wrote, such as train_dir/<experiment>"
    try:
        exists, is_dir = d.exists(), d.is_dir()
    except OSError as e:  # a name too long for the filesystem, say: an I/O failure, as in training
        raise RunError(f"cannot read {d}: {e.strerror or e}") from None
    if not exists:
        raise ConfigError(f"{d}: no such directory; {valid}")
    if not is_dir:
        raise ConfigError(f"{d}: not a directory; {valid}")
    if not event_files(d):
        subs = sorted(str(s) for s in d.iterdir() if s.is_dir() and event_files(s))
        hint = f" (these sub-directories have them: {', '.join(subs[:5])}{', ...' if len(subs) > 5 else ''})" \
            if subs else ""
        raise ConfigError(f"{d}: no TensorBoard event files ({EVENT_GLOB}) in this directory{hint}; {valid}")


def check_out(out: Path) -> None:
    """Raises a one-line ConfigError unless `out` can name the PNG: a .png name in an existing directory."""
    if out.suffix.lower() != ".png":
        raise ConfigError(f"--out {out}: the file name must end in .png, such as {out.with_suffix('.png')}")
    try:
        is_dir, parent_is_dir = out.is_dir(), out.parent.is_dir()
    except OSError as e:  # a name too long for the filesystem, say
        raise RunError(f"cannot write {out}: {e.strerror or e}") from None
    if is_dir:
        raise ConfigError(f"--out {out} is a directory; give a file name in it, such as {out / DEFAULT_OUT_NAME}")
    parent = out.parent
    if not parent_is_dir:
        what = "is not a directory" if parent.exists() else "does not exist"
        raise ConfigError(f"--out {out}: directory {parent} {what}; give a .png path in an existing directory")


def parse_panels(text: str) -> list[str]:
    """'reward,fps' -> ['reward', 'fps'] (order kept, repeats dropped); ConfigError for an unknown or empty list."""
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in PANELS]
    if bad or not names:
        raise ConfigError(f"--panels {text!r}: {'unknown panel ' + ', '.join(bad) if bad else 'empty'}; "
                          f"choose a comma-separated list of {', '.join(PANELS)}")
    return names


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog=prog, allow_abbrev=False,
                                   description="Learning curves (PNG) from the TensorBoard event files of experiments.")
    parser.add_argument("exp_dirs", nargs="+", type=Path, metavar="EXPERIMENT_DIR",
                        help="experiment directories, such as train_dir/<experiment>; one line each per panel. Or one "
                             "sweep (python -m sf.launch): its .py/.json file or its directory <train_dir>/<sweep>: "
                             "one line per configuration, the mean over its seeds, with a band from min to max")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"the PNG to write (default: EXPERIMENT_DIR/{DEFAULT_OUT_NAME} for one experiment, "
                             f"./{DEFAULT_OUT_NAME} for several)")
    parser.add_argument("--smooth", type=float, default=0.6,
                        help="TensorBoard's smoothing weight, in [0, 1): 0 draws the values as written (default 0.6)")
    parser.add_argument("--panels", default=None,
                        help=f"comma-separated panels among {', '.join(PANELS)} (default: all; a sweep: "
                             f"{SWEEP_PANELS})")
    parser.add_argument("--title", default=None, help="a title above the panels")
    parser.add_argument("--train_dir", default=None,
                        help="a sweep file's train dir, as given to python -m sf.launch (default: train_dir)")
    return parser


def run_plot(args: argparse.Namespace) -> Path:
    """Checks the arguments (ConfigError), reads the experiments, writes the PNG (RunError on an I/O failure);
    returns the path written."""
    if not (math.isfinite(args.smooth) and 0 <= args.smooth < 1):
        raise ConfigError(f"--smooth {args.smooth}: must be in [0, 1) (0: no smoothing; TensorBoard's default is 0.6)")
    dirs: list[Path] = args.exp_dirs
    sweep = any(is_sweep(d) for d in dirs)
    panels = parse_panels(args.panels if args.panels is not None else SWEEP_PANELS if sweep else ",".join(PANELS))
    if sweep:
        if len(dirs) > 1:
            raise ConfigError(f"{next(d for d in dirs if is_sweep(d))}: a sweep is plotted alone; give one sweep "
                              "or experiment directories")
        return run_plot_sweep(args, panels)
    if args.train_dir is not None:
        raise ConfigError("--train_dir goes with a sweep file (python -m sf.plot SWEEP.py --train_dir DIR)")
    for d in dirs:
        check_experiment_dir(d)
    seen: dict[Path, Path] = {}
    for d in dirs:
        if d.resolve() in seen:
            raise ConfigError(f"{d}: given twice (as {seen[d.resolve()]}); give each experiment directory once")
        seen[d.resolve()] = d
    out = args.out
    if out is None:  # one experiment: beside its event files; several: here, as none of them owns the comparison
        out = dirs[0] / DEFAULT_OUT_NAME if len(dirs) == 1 else Path(DEFAULT_OUT_NAME)
    check_out(out)
    try:
        runs = {}
        for label, d in zip(experiment_labels(dirs), dirs):
            runs.update(split_policies(label, read_scalar_events(d)))
    except OSError as e:
        raise RunError(f"cannot read {e.filename or dirs}: {e.strerror or e}") from None
    labels = list(runs)
    series, unit = panel_series(runs, panels, args.smooth)
    try:
        render(series, unit, labels, args.smooth, out, args.title)
    except OSError as e:
        raise RunError(f"cannot write {out}: {e.strerror or e}") from None
    return out


def main(argv=None, *, prog: str = "python -m sf.plot") -> int:
    """`python -m sf.plot`: write the PNG and print its path. Bad input: one line on stderr, exit code 2;
    an I/O failure: one line, exit code 1."""
    def body() -> int:
        print(f"Wrote {run_plot(build_parser(prog).parse_args(argv))}")
        return 0

    return run_guarded(prog, body)


if __name__ == "__main__":
    sys.exit(main())
