"""A sweep file -> the list of train.py runs it describes (`load_sweep`), every run's arguments checked with train.py's
own parser before anything starts.

Two file kinds:

* a Python file defining `RUN_DESCRIPTION = RunDescription(...)` (Sample Factory's convention; sf.launch's classes,
  or Sample Factory's own where it is installed), or a dotted module name as Sample Factory's `--run` takes;
* a JSON object:

      {"name": "lr_seeds",                                   (default: the file name without .json)
       "command": "python train.py --env test_image --train_for_env_steps 4000",   (a string or a list of arguments)
       "grid": {"learning_rate": [0.0001, 0.0003]},          (parameter -> values; every combination; optional)
       "seeds": [0, 1],                                      (optional: one run per seed of every combination)
       "experiment": "{index:02d}_lr{learning_rate}_s{seed}", (optional name pattern; default: Sample Factory's names)
       "env_vars": {"OMP_NUM_THREADS": "1"}}                 (optional)

  which is the RunDescription of one Experiment named "name" with ParamGrid([("seed", seeds), *grid.items()]). The
  pattern's fields are index (the run's position), name, seed and the grid's parameters.

Commands. The command is train.py's: `python train.py ...`, `python -m sf.train ...`, `sf-train ...`, and Sample
Factory's example trainers `python -m sf_examples.{vizdoom.train_vizdoom, atari.train_atari, mujoco.train_mujoco}`
(train.py takes Sample Factory's flags and env names). The launcher adds `--experiment <run name>` and
`--train_dir <train dir>/<sweep name>`; neither may be in the command or the grid.

Layout: <train dir>/<sweep name>/<run name>/ is each run's experiment directory (Sample Factory puts one more level,
<Experiment name>_<suffix>, between them; here run names are unique within the sweep, so it is not needed).
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from sf.cfg import ConfigError, parse_cfg, validate_experiment_name, validate_train_dir
from sf.launch.run_description import Experiment, ParamGrid, RunDescription
from sf.utils.files import one_line


class SweepError(ConfigError):
    """A mistake in the sweep file or the launcher's flags: one line for the user, exit code 2; nothing is started."""


@dataclass
class Run:
    """One experiment of the sweep = one train.py run."""
    name: str  # experiment name, unique in the sweep, one directory name (Sample Factory's: NN_expname_key_val...)
    config: str  # the label of its configuration without the seed: the summary groups seeds by it
    seed: Optional[int]
    params: dict  # flag name (no dashes) -> value, from the grid
    argv: list[str]  # train.py's arguments, --experiment and --train_dir included; no core pinning (a backend's)
    train_dir: Path  # the sweep's train dir (<--train_dir>/<sweep name>)
    exp_dir: Path  # train_dir / name
    env_vars: dict = field(default_factory=dict)  # extra environment of the process (Experiment's env_vars)
    budget: Optional[int] = None  # the resolved --train_for_env_steps (flags > saved config.json > preset > default)
    num_policies: int = 1
    explicit: frozenset = frozenset()  # the parameters the run's arguments give (e.g. num_workers)


@dataclass
class Sweep:
    name: str
    path: Path
    train_dir: Path
    runs: list[Run]


DEFAULT_TRAIN_DIR = "train_dir"  # train.py's --train_dir default
# Programs whose command line is train.py's (Sample Factory's example trainers take the same flags here).
TRAIN_MODULES = ("sf.train", "sf_examples.vizdoom.train_vizdoom", "sf_examples.atari.train_atari",
                 "sf_examples.mujoco.train_mujoco")
JSON_KEYS = ("name", "command", "grid", "seeds", "experiment", "env_vars")
SET_BY_LAUNCHER = ("experiment", "train_dir")


def train_command() -> list[str]:
    """How a backend starts train.py: this interpreter, the package's entry point (as `python train.py`)."""
    return [sys.executable, "-m", "sf.train"]


def train_args(cmd: Any, where: str) -> list[str]:
    """The train.py arguments of an Experiment's command (a string as Sample Factory writes it, or a list)."""
    try:
        tokens = shlex.split(cmd) if isinstance(cmd, str) else [str(t) for t in cmd]
    except (ValueError, TypeError) as e:
        raise SweepError(f"{where}: command {one_line(cmd, 80)!r} cannot be split into arguments: {e}") from None
    while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
        tokens.pop(0)  # VAR=value before the program: the environment is the backend's (env_vars)
    valid = ("python train.py, python -m sf.train, sf-train or python -m " +
             ", ".join(m for m in TRAIN_MODULES[1:]))
    if not tokens:
        raise SweepError(f"{where}: the command is empty; start it with {valid}")
    prog = os.path.basename(tokens[0])
    if prog in ("train.py", "sf-train"):
        return tokens[1:]
    if re.fullmatch(r"python[0-9.]*", prog) and len(tokens) > 1:
        if tokens[1] == "-m" and len(tokens) > 2 and tokens[2] in TRAIN_MODULES:
            return tokens[3:]
        if os.path.basename(tokens[1]) == "train.py":
            return tokens[2:]
    raise SweepError(f"{where}: command {one_line(' '.join(tokens[:3]), 80)!r}... is not train.py's; start it with "
                     f"{valid}")


def param_args(params: dict, prefix: str) -> list[str]:
    """The grid's parameters as arguments: Sample Factory's `--name=value`; a list value as `--name v1 v2`."""
    out: list[str] = []
    for k, v in params.items():
        if isinstance(v, (list, tuple)):
            out += [f"{prefix}{k}", *map(str, v)]
        else:
            out.append(f"{prefix}{k}={v}")
    return out


def _given(argv: list[str], flag: str) -> bool:
    return any(a == f"--{flag}" or a.startswith(f"--{flag}=") for a in argv)


def runs_of(rd: Any, sweep_path: Path, train_dir: Path, pattern: Optional[str] = None) -> list[Run]:
    """The runs of a RunDescription (ours or Sample Factory's: read by attribute) under train_dir (the sweep's)."""
    shown = str(sweep_path)
    if getattr(rd, "param_prefix", "--") != "--" or getattr(rd, "experiment_arg_name", "--experiment") != \
            "--experiment" or getattr(rd, "experiment_dir_arg_name", "--train_dir") != "--train_dir":
        raise SweepError(f"{shown}: RunDescription's param_prefix, experiment_arg_name and experiment_dir_arg_name "
                         "must keep their defaults (--, --experiment, --train_dir): train.py's flags")
    experiments = list(getattr(rd, "experiments", []) or [])
    if not experiments:
        raise SweepError(f"{shown}: RUN_DESCRIPTION has no experiments; give RunDescription(name, experiments=[...])")
    runs: list[Run] = []
    customize = getattr(rd, "customize_experiment_name", True)
    for exp in experiments:
        if not isinstance(exp, Experiment):  # Sample Factory's own class: same attributes
            exp = Experiment(exp.base_name, exp.cmd, exp.params, getattr(exp, "env_vars", None))
        where = f"{shown}: experiment {exp.base_name!r}"
        base = train_args(exp.cmd, where)
        for idx, (name, params, tokens) in enumerate(exp.experiment_names(customize)):
            for k in list(params):
                if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", k):
                    raise SweepError(f"{where}: parameter name {k!r} is not a flag name (such as learning_rate)")
            for k in SET_BY_LAUNCHER:
                if k in params or _given(base, k):
                    raise SweepError(f"{where}: --{k} is set by the launcher (the sweep's train dir and run names); "
                                     "remove it from the command and the grid")
            if pattern is not None:
                try:
                    name = pattern.format(**{"index": idx, "name": exp.base_name, "seed": None, **params})
                except (KeyError, IndexError, ValueError, AttributeError) as e:
                    raise SweepError(f"{shown}: \"experiment\" pattern {pattern!r}: {one_line(e)} is not a field; "
                                     f"fields: index, name, seed, {', '.join(params) or '(the grid)'}") from None
            try:
                validate_experiment_name(name, flag="experiment name")
            except ConfigError as e:
                raise SweepError(f"{where}: {e}") from None
            config = "_".join([exp.base_name] + [t for k, t in zip(params, tokens) if k != "seed"])
            seed = params.get("seed")
            exp_dir = train_dir / name
            argv = base + param_args(params, "--") + ["--experiment", name, "--train_dir", str(train_dir)]
            runs.append(Run(name=name, config=config, seed=seed, params=dict(params), argv=argv,
                            train_dir=train_dir, exp_dir=exp_dir, env_vars=dict(exp.env_vars or {})))
    seen: dict[str, Run] = {}
    for r in runs:
        if r.name in seen:
            raise SweepError(f"{shown}: two runs are named {r.name!r}; give each Experiment its own name (or make the "
                             "\"experiment\" pattern use every grid parameter)")
        seen[r.name] = r
    return runs


def check_runs(runs: list[Run], shown: str) -> None:
    """Every run's arguments through train.py's parser and checks (sf.cfg.parse_cfg: reads the preset and a saved
    config.json, writes nothing); fills each run's budget, num_policies and explicit. SweepError names run and flag."""
    for r in runs:
        try:
            cfg = parse_cfg(r.argv, mode="train", prog="train.py")
        except ConfigError as e:
            raise SweepError(f"{shown}: run {r.name}: {e}") from None
        r.budget = int(cfg.train_for_env_steps)
        r.num_policies = int(cfg.num_policies)
        r.explicit = frozenset(cfg._explicit)
        if r.seed is None:
            r.seed = int(cfg.seed) if _given(r.argv, "seed") else None


def _load_python(path: Optional[Path], module: Optional[str], shown: str) -> Any:
    try:
        if module is not None:
            mod = importlib.import_module(module)
        else:
            spec = importlib.util.spec_from_file_location(f"_sf_sweep_{abs(hash(str(path)))}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
    except SyntaxError as e:
        raise SweepError(f"{shown}: line {e.lineno}: {e.msg}") from None
    except ModuleNotFoundError as e:
        hint = " (a Sample Factory sweep: import from sf.launch instead of sample_factory.launcher.run_description)" \
            if (e.name or "").startswith("sample_factory") else ""
        raise SweepError(f"{shown}: cannot import {e.name}{hint}") from None
    except Exception as e:  # the sweep file's own code failed: its message, not a traceback
        raise SweepError(f"{shown}: {type(e).__name__}: {one_line(e)}") from None
    rd = getattr(mod, "RUN_DESCRIPTION", None)
    if rd is None or not hasattr(rd, "experiments") or not hasattr(rd, "run_name"):
        raise SweepError(f"{shown}: defines no RUN_DESCRIPTION = RunDescription(...)")
    return rd


def _load_json(path: Path, shown: str) -> tuple[RunDescription, Optional[str]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise SweepError(f"{shown} is not valid JSON: {one_line(str(e).splitlines()[0] if str(e) else e)}") from None
    if not isinstance(data, dict):
        raise SweepError(f"{shown}: expected a JSON object with keys {', '.join(JSON_KEYS)}")
    bad = [k for k in data if k not in JSON_KEYS]
    if bad:
        raise SweepError(f"{shown}: unknown key {bad[0]!r}; valid keys: {', '.join(JSON_KEYS)}")
    if "command" not in data:
        raise SweepError(f"{shown}: key 'command' is required, e.g. \"python train.py --env test_image\"")
    name = data.get("name", path.stem)
    grid, seeds = data.get("grid", {}), data.get("seeds")
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise SweepError(f"{shown}: key 'grid': expected an object of parameter -> non-empty list of values")
    if seeds is not None and not (isinstance(seeds, list) and seeds):
        raise SweepError(f"{shown}: key 'seeds': expected a non-empty list of integers")
    if "seed" in grid and seeds is not None:
        raise SweepError(f"{shown}: give the seeds once: in 'seeds' or in 'grid', not both")
    pattern = data.get("experiment")
    if pattern is not None and not isinstance(pattern, str):
        raise SweepError(f"{shown}: key 'experiment': expected a name pattern such as \"{{index:02d}}_s{{seed}}\"")
    env_vars = data.get("env_vars") or {}
    if not isinstance(env_vars, dict):
        raise SweepError(f"{shown}: key 'env_vars': expected an object of name -> value")
    tuples = ([("seed", seeds)] if seeds is not None else []) + list(grid.items())
    exp = Experiment(str(name), data["command"], ParamGrid(tuples).generate_params(randomize=False),
                     {str(k): str(v) for k, v in env_vars.items()})
    return RunDescription(str(name), experiments=[exp]), pattern


def load_sweep(path: str, train_dir: Optional[str] = None, check: bool = True) -> Sweep:
    """The sweep described by `path` (a .py or .json file, or a dotted module name), its runs under
    <train_dir>/<sweep name>. check: every run's arguments through train.py's parser (SweepError on a bad one)."""
    p = Path(path)
    module = None
    if not p.exists():
        if re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+", str(path)) and not str(path).endswith((".py", ".json")):
            module = str(path)
        else:
            raise SweepError(f"{path}: no such sweep file; give a .py file defining RUN_DESCRIPTION or a .json file")
    elif not p.is_file():
        raise SweepError(f"{path}: not a file; give a .py file defining RUN_DESCRIPTION or a .json file")
    elif p.suffix not in (".py", ".json"):
        raise SweepError(f"{path}: a sweep file is a .py file defining RUN_DESCRIPTION or a .json file")
    pattern = None
    if module is None and p.suffix == ".json":
        rd, pattern = _load_json(p, str(path))
    else:
        rd = _load_python(None if module else p, module, str(path))
    name = f"{rd.run_name}{getattr(rd, 'experiment_suffix', '') or ''}"
    try:
        validate_experiment_name(name, flag="sweep name")
        root = train_dir if train_dir is not None else DEFAULT_TRAIN_DIR
        validate_train_dir(root)
    except ConfigError as e:
        raise SweepError(f"{path}: {e}") from None
    sweep_dir = Path(root) / name
    runs = runs_of(rd, Path(path), sweep_dir, pattern)
    if check:
        check_runs(runs, str(path))
    return Sweep(name=name, path=p, train_dir=sweep_dir, runs=runs)
