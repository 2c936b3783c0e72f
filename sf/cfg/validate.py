"""Valid values: conversion and checks of one value (the same for the command line, presets and a saved
config.json), the checks of a whole configuration (`verify`), and the device a run uses.

A value from the command line is reported with its flag ("--gamma must be in [0, 1] (got 50.0)"), one from a file
with the file and key ("train_dir/x/config.json: key 'rollout': expected an integer, got 'abc'")."""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from sf.cfg.params import (LIST_MAX_LEN, Param, all_params, optional_float, optional_int, optional_str, str2bool,
                           to_int)
from sf.cfg.shape import num_envs
from sf.cfg.string_checks import shown, shown_str, validate_experiment_name, validate_train_dir
from sf.processes.control import usable_cores
from sf.utils.errors import ConfigError

if TYPE_CHECKING:
    from sf.cfg.config import Config

MAX_TOTAL_ENVS = 65536  # num_workers * num_envs_per_worker
MAX_SAMPLES_PER_TRAINING_BATCH = 2**24  # batch_size * num_batches_per_epoch


class ValueProblem(Exception):
    """What is wrong with one value: a phrase that follows the flag or the file and key."""


def value_kind(p: Param) -> tuple[str, bool]:
    """(kind, optional): kind is int, float, bool, str or custom; optional: None is a valid value."""
    kind = {int: "int", optional_int: "int", float: "float", optional_float: "float", str2bool: "bool", str: "str",
            optional_str: "str"}.get(p.type, "custom")
    return kind, p.type in (optional_int, optional_float, optional_str)


def _bound_text(x: Any) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return str(x)


def range_text(p: Param) -> Optional[str]:
    """'[0, 1)' for a parameter with bounds, else None."""
    if p.min_value is None and p.max_value is None:
        return None
    lo = "-inf" if p.min_value is None else _bound_text(p.min_value)
    hi = "inf" if p.max_value is None else _bound_text(p.max_value)
    return f"{'(' if p.min_exclusive else '['}{lo}, {hi}{')' if p.max_exclusive else ']'}"


def _out_of_range(p: Param, x: Any) -> bool:
    if p.min_value is not None and (x <= p.min_value if p.min_exclusive else x < p.min_value):
        return True
    return p.max_value is not None and (x >= p.max_value if p.max_exclusive else x > p.max_value)


_EXPECTED = {"int": "an integer", "float": "a number", "bool": "True or False", "str": "a string"}


def _convert_one(p: Param, kind: str, v: Any) -> Any:
    try:
        if kind == "int":
            return to_int(v)
        if kind == "float":
            if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                raise ValueError(v)
            return float(v.strip() if isinstance(v, str) else v)
        if kind == "bool":
            if not isinstance(v, (bool, int, str)):
                raise ValueError(v)
            return str2bool(v)
        if kind == "str":
            if not isinstance(v, str):
                raise ValueError(v)
            return v
        return p.type(v)
    except (ValueError, TypeError, OverflowError, argparse.ArgumentTypeError):
        raise ValueProblem(f"expected {_EXPECTED.get(kind, 'a valid value')}, got {shown(v)}") from None


def convert(p: Param, raw: Any) -> Any:
    """The value of `p` from a command-line string or a JSON value, checked (`check_value`); raises ValueProblem."""
    kind, optional = value_kind(p)
    if optional and (raw is None or (isinstance(raw, str) and raw.strip().lower() == "none")):
        return None
    if p.nargs in ("+", "*"):
        if not isinstance(raw, list):
            raise ValueProblem(f"expected a list of {'integers' if kind == 'int' else 'values'}, got {shown(raw)}")
        value = [_convert_one(p, kind, x) for x in raw]
    else:
        value = _convert_one(p, kind, raw)
    check_value(p, value)
    return value


def _check_types(kind: str, items: list) -> None:
    for x in items:
        if kind == "int" and (isinstance(x, bool) or not isinstance(x, int)):
            raise ValueProblem(f"expected an integer, got {shown(x)}")
        if kind == "float" and (isinstance(x, bool) or not isinstance(x, (int, float))):
            raise ValueProblem(f"expected a number, got {shown(x)}")
        if kind == "bool" and not isinstance(x, bool):
            raise ValueProblem(f"expected True or False, got {shown(x)}")
        if kind == "str" and not isinstance(x, str):
            raise ValueProblem(f"expected a string, got {shown(x)}")


def check_value(p: Param, value: Any) -> None:
    """Raise ValueProblem unless `value` (already of the parameter's type) is valid for `p`."""
    kind, optional = value_kind(p)
    if value is None:
        if optional:
            return
        raise ValueProblem(f"expected {_EXPECTED.get(kind, 'a value')}, got None")
    if p.nargs in ("+", "*"):
        if not isinstance(value, list):
            raise ValueProblem(f"expected a list, got {shown(value)}")
        least = 0 if p.nargs == "*" else 1
        if not least <= len(value) <= LIST_MAX_LEN:
            raise ValueProblem(f"must have {least} to {LIST_MAX_LEN} entries (got {len(value)})")
        items = value
    else:
        items = [value]
    _check_types(kind, items)
    if p.choices is not None and value not in p.choices:
        raise ValueProblem(f"must be one of {', '.join(map(str, p.choices))} (got {shown(value)})")
    if kind in ("int", "float"):
        rng = range_text(p)
        entries = "entries " if p.nargs in ("+", "*") else ""
        none = " or None" if optional else ""
        for x in items:
            if isinstance(x, float) and not math.isfinite(x):
                raise ValueProblem(f"{entries}must be a finite number in {rng}{none} (got {shown_str(value)})")
            if _out_of_range(p, x):
                raise ValueProblem(f"{entries}must be in {rng}{none} (got {shown_str(value)})")
    if p.check is not None:
        problem = p.check(value)
        if problem:
            raise ValueProblem(problem)


def problem_message(where: str, problem: str) -> str:
    """The one-line message of a ValueProblem at `where` (a flag, or a file and key)."""
    # "--gamma must be in [0, 1] (got 50.0)"; "--rollout: expected an integer, got 'abc'"
    return f"{where}{': ' if problem.startswith('expected') else ' '}{problem}"


def from_command_line(p: Param, raw: Any) -> Any:
    """The value of flag --p.name given as `raw`; ConfigError naming the flag."""
    try:
        return convert(p, raw)
    except ValueProblem as e:
        raise ConfigError(problem_message(f"--{p.name}", str(e))) from None


def from_file(path: str, key: str, p: Param, raw: Any) -> Any:
    """The value of `p` under `key` of the JSON file `path` (a preset, a saved config.json); ConfigError naming both."""
    try:
        return convert(p, raw)
    except ValueProblem as e:
        raise ConfigError(problem_message(f"{path}: key {key!r}", str(e))) from None


# --- a whole configuration ----------------------------------------------------------------------------------------
def experiment_dir(cfg: Config) -> Path:
    return Path(cfg.train_dir) / cfg.experiment


def scale_envs_per_worker(envs: int, workers: int, splits: int, cores: Optional[int] = None) -> int:
    """Envs per rollout worker when the user did not choose it. The presets' values (the paper's 16 for Doom) are meant
    for one worker per core; with more workers than cores, the same number of envs per core is spread over them, never
    fewer than one env per split. Without this, `--num_workers 72` on 2 cores would start 1,152 VizDoom engines
    where 144 keep both cores busy."""
    cores = cores or usable_cores()
    if workers <= cores:
        return envs
    per_worker = envs * cores // workers
    return max(splits, per_worker // splits * splits)


def _verify_env_engine(cfg: Config) -> None:
    """--env_engine other than native: it steps this env's family, or one line says which families it steps."""
    try:  # (the env integrations are optional for the core library; without them there is no engine to pick)
        from sf_envs.registry import env_spec
    except ImportError:
        return
    if cfg.env_engine != "native":
        try:
            env_spec(cfg.env, cfg)
        except ValueError as e:
            raise ConfigError(str(e)) from None


def verify(cfg: Config, mode: str = "train") -> None:
    """Check every value (type, range or choices) and the cross-parameter rules; raise ConfigError with a
    one-line message naming the flag. Checks only: creates and writes nothing."""
    for p in all_params():
        try:
            check_value(p, getattr(cfg, p.name))
        except ValueProblem as e:
            if p.name == "env" and cfg.env is None:
                raise ConfigError("--env is required, e.g. --env doom_basic (see --help)") from None
            raise ConfigError(problem_message(f"--{p.name}", str(e))) from None
    validate_train_dir(cfg.train_dir)
    validate_experiment_name(cfg.experiment)
    if cfg.num_envs_per_worker % cfg.worker_num_splits:
        raise ConfigError(f"--num_envs_per_worker ({cfg.num_envs_per_worker}) must be divisible by "
                          f"--worker_num_splits ({cfg.worker_num_splits})")
    if num_envs(cfg) > MAX_TOTAL_ENVS:
        raise ConfigError(f"--num_workers x --num_envs_per_worker must be at most {MAX_TOTAL_ENVS} envs in all "
                          f"(got {cfg.num_workers} x {cfg.num_envs_per_worker} = {num_envs(cfg)})")
    if cfg.batch_size % cfg.rollout:
        raise ConfigError(f"--batch_size ({cfg.batch_size}) must be a multiple of --rollout ({cfg.rollout})")
    _verify_env_engine(cfg)
    samples = cfg.batch_size * cfg.num_batches_per_epoch
    if samples > MAX_SAMPLES_PER_TRAINING_BATCH:
        raise ConfigError(f"--batch_size x --num_batches_per_epoch must be at most {MAX_SAMPLES_PER_TRAINING_BATCH} "
                          f"samples per training batch (got {cfg.batch_size} x {cfg.num_batches_per_epoch} = "
                          f"{samples})")
    if mode == "train" and cfg.mode.intervals and cfg.sampler_only:
        raise ConfigError(f"--sampler_only measures the asynchronous sampler alone; with --sync_mode {cfg.sync_mode} "
                          "every interval waits for the learner: use --sync_mode async")
    if mode == "train" and cfg.mode.intervals:
        per_batch = num_envs(cfg) * cfg.rollout
        if cfg.batch_size < per_batch and per_batch % cfg.batch_size:
            raise ConfigError(f"--sync_mode {cfg.sync_mode}: a training batch is one --rollout of every env "
                              f"({cfg.num_workers} x {cfg.num_envs_per_worker} x {cfg.rollout} = {per_batch} samples); "
                              f"--batch_size ({cfg.batch_size}) must divide it (or be at least {per_batch})")
    if mode == "train" and cfg.mode.deterministic and cfg.precision == "bfloat16":
        raise ConfigError(f"--precision bfloat16: --sync_mode {cfg.sync_mode} computes in float32 (its bit-for-bit "
                          "guarantee across layouts is float32's); use --precision auto or float32")
    if mode == "train" and cfg.num_policies > 1 and cfg.mode.intervals:
        raise ConfigError(f"--sync_mode {cfg.sync_mode} trains one policy; a population (--num_policies "
                          f"{cfg.num_policies}) needs --sync_mode async")
    if mode == "train" and cfg.pbt_perturb_min > cfg.pbt_perturb_max:
        raise ConfigError(f"--pbt_perturb_min ({cfg.pbt_perturb_min}) must be at most --pbt_perturb_max "
                          f"({cfg.pbt_perturb_max})")
    if mode == "train" and cfg.lr_adaptive_min > cfg.lr_adaptive_max:
        raise ConfigError(f"--lr_adaptive_min ({cfg.lr_adaptive_min}) must be at most --lr_adaptive_max "
                          f"({cfg.lr_adaptive_max})")
    if mode == "train" and cfg.sample_minibatches and (cfg.use_rnn or cfg.with_vtrace):
        raise ConfigError("--sample_minibatches True needs a feed-forward policy with GAE targets (--use_rnn False "
                          "--with_vtrace False): a recurrent core, and V-trace's targets, follow whole trajectories")
    if cfg.use_rnn and cfg.rollout % cfg.recurrence:
        raise ConfigError(f"--recurrence ({cfg.recurrence}) must divide --rollout ({cfg.rollout})")
    if cfg.adaptive_stddev and (cfg.initial_stddev != 1.0 or cfg.continuous_tanh_scale):  # would have no effect
        flag, v = (("--initial_stddev", cfg.initial_stddev) if cfg.initial_stddev != 1.0
                   else ("--continuous_tanh_scale", cfg.continuous_tanh_scale))
        raise ConfigError(f"{flag} {v} applies to the learned state-independent std of --adaptive_stddev False; with "
                          "--adaptive_stddev True the std is an output of the network: give --adaptive_stddev False")
    if mode == "train" and cfg.num_traj_buffers and cfg.mode.frees_slots:  # (intervals: two slots per env)
        need = num_envs(cfg) + samples // cfg.rollout
        if cfg.num_traj_buffers < need:
            raise ConfigError(f"--num_traj_buffers ({cfg.num_traj_buffers}) must be 0 or at least num_workers x "
                              f"num_envs_per_worker + batch_size x num_batches_per_epoch / rollout = {need}")
    if cfg.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is available here; use --device auto or cpu")
    if mode == "train":
        _check_writable(Path(cfg.train_dir))
        exp = experiment_dir(cfg)
        if os.path.lexists(exp) and not exp.is_dir():
            raise ConfigError(f"--experiment: {exp} exists and is not a directory; choose another name or move it")


def _check_writable(train_dir: Path) -> None:
    """Whether train_dir exists as a writable directory or could be created; checks only, creates nothing."""
    d = train_dir
    try:
        while not d.exists():  # the nearest existing ancestor decides whether we can create it
            d = d.parent
        ok = d.is_dir() and os.access(d, os.W_OK | os.X_OK)
    except OSError as e:
        raise ConfigError(f"--train_dir {train_dir} cannot be checked ({e.strerror or e})") from None
    if not ok:
        raise ConfigError(f"--train_dir {train_dir} is not writable (checked {d}); choose a directory you can write to")


def resolve_device(cfg: Config) -> str:
    """'cuda' or 'cpu' for --device auto/cpu/cuda."""
    device = cfg.device
    if device == "auto":
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and os.environ.get("WORLD_SIZE", "1") != "1":  # torchrun: this rank's GPU of the machine
        import torch
        local_rank, gpus = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
        if local_rank >= gpus:  # NCCL needs a GPU of its own per rank (it refuses two ranks on one device)
            raise ConfigError(f"--device cuda: local rank {local_rank} needs GPU {local_rank}, this machine has "
                              f"{gpus}: start at most {gpus} ranks per machine (torchrun --nproc-per-node "
                              f"{max(gpus, 1)})")
        device = f"cuda:{local_rank}"
    return device
