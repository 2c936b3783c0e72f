"""Parameters of train.py and enjoy.py: one table, presets per env family, validation, config.json.

Every parameter is declared once in `PARAMS` (name, type, default, help); env integrations add theirs
through `sf_envs.params.ENV_PARAMS`. A configuration is resolved in layers, each over the previous:

    table defaults  <  configs/<family>.json "defaults"  <  its "envs"[<env>]  <  saved config.json
    (resume / enjoy)  <  flags given on the command line

`parse_cfg` returns an `argparse.Namespace`; bad input raises `ConfigError`, whose message is one line
naming the flag and what is allowed. Entry points print it and exit with code 2 (`cli_main`).
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS_DIR = REPO_ROOT / "configs"


class ConfigError(ValueError):
    """A user mistake in the configuration: a one-line message naming the flag and what is allowed."""


@dataclass(frozen=True)
class Param:
    name: str
    type: Callable
    default: Any
    help: str
    choices: Optional[Sequence] = None
    nargs: Optional[str] = None
    scope: str = "all"  # "all", "train" or "enjoy": which entry point shows the flag
    min_value: Optional[float] = None  # inclusive lower bound checked by verify()


def str2bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("true", "1", "yes", "y", "on"):
        return True
    if s in ("false", "0", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {v!r}")


def _opt_int(v: Any) -> Optional[int]:
    return None if v is None or str(v).lower() == "none" else int(v)


def _opt_str(v: Any) -> Optional[str]:
    return None if v is None or str(v).lower() == "none" else str(v)


P = Param
PARAMS: list[Param] = [
    # --- experiment ---
    P("env", str, None, "Environment name, e.g. doom_basic, doom_battle, atari_breakout, dmlab_<level>, gym:<id>, test_corridor"),
    P("experiment", _opt_str, None, "Experiment name; its directory is train_dir/experiment (default: the env name)"),
    P("train_dir", str, "train_dir", "Root directory of experiments"),
    P("restart_behavior", str, "resume", "resume: continue from the latest checkpoint with the saved config; "
      "restart: move the old experiment directory aside; overwrite: delete it", choices=("resume", "restart", "overwrite"), scope="train"),
    P("seed", _opt_int, None, "Random seed (None: not seeded)"),
    P("device", str, "auto", "auto (CUDA when available, else CPU), cpu or cuda", choices=("auto", "cpu", "cuda")),
    P("serial_mode", str2bool, False, "Run every component in one process (for debugging)", scope="train"),
    # --- sampling ---
    P("num_workers", int, os.cpu_count() or 1, "Number of rollout worker processes", scope="train", min_value=1),
    P("num_envs_per_worker", int, 2, "Envs per rollout worker", scope="train", min_value=1),
    P("worker_num_splits", int, 2, "Groups the envs of a worker are split into (2 = double-buffered sampling)", scope="train", min_value=1),
    P("policy_workers_per_policy", int, 1, "Policy worker processes (batched inference)", scope="train", min_value=1),
    P("set_workers_cpu_affinity", str2bool, True, "Pin rollout workers to cores (round-robin)", scope="train"),
    P("num_traj_buffers", int, 0, "Trajectory buffer slots in shared memory (0: enough for all envs plus two training batches)", scope="train", min_value=0),
    P("max_env_restarts", int, 10, "An env that raises in a rollout worker is logged with its traceback and replaced by a "
      "fresh one (its episode ends there); after this many replacements in one worker the run stops with a checkpoint "
      "(0: the first error stops it)", scope="train", min_value=0),
    P("stall_timeout_sec", float, 120.0, "A process that gives no sign of life for this long (alive but stuck, e.g. in an "
      "env engine that hangs) is reported with its Python stack and the run stops with a checkpoint (0: never)",
      scope="train", min_value=0.0),
    P("policy_worker_torch_threads", int, 1, "torch threads of each policy worker", scope="train", min_value=1),
    P("learner_torch_threads", int, 0, "torch threads of the learner (0: number of cores)", scope="train", min_value=0),
    P("sampler_only", str2bool, False, "Benchmark: the learner returns trajectories unused (measures the sampler alone)", scope="train"),
    P("random_policy", str2bool, False, "Benchmark: policy workers sample uniform random actions without the network", scope="train"),
    # --- learning ---
    P("rollout", int, 32, "Trajectory length T (samples per trajectory)", min_value=1),
    P("recurrence", int, 32, "Truncated BPTT length; must divide --rollout", min_value=1),
    P("batch_size", int, 1024, "Minibatch size in samples (one SGD step); a multiple of --rollout", scope="train", min_value=1),
    P("num_batches_per_epoch", int, 1, "Minibatches per training batch", scope="train", min_value=1),
    P("num_epochs", int, 1, "Passes over each training batch", scope="train", min_value=1),
    P("learning_rate", float, 1e-4, "Adam learning rate", scope="train", min_value=0.0),
    P("adam_eps", float, 1e-6, "Adam epsilon", scope="train", min_value=0.0),
    P("adam_beta1", float, 0.9, "Adam beta1", scope="train", min_value=0.0),
    P("adam_beta2", float, 0.999, "Adam beta2", scope="train", min_value=0.0),
    P("gamma", float, 0.99, "Discount factor", scope="train", min_value=0.0),
    P("with_vtrace", str2bool, True, "V-trace targets (False: GAE)", scope="train"),
    P("vtrace_rho", float, 1.0, "V-trace rho-bar (importance weight clip)", scope="train", min_value=0.0),
    P("vtrace_c", float, 1.0, "V-trace c-bar (trace cutting)", scope="train", min_value=0.0),
    P("gae_lambda", float, 0.95, "GAE lambda (with --with_vtrace False)", scope="train", min_value=0.0),
    P("ppo_clip_ratio", float, 0.1, "PPO clip: ratio kept in [1/(1+x), 1+x]", scope="train", min_value=0.0),
    P("ppo_clip_value", float, 1.0, "Value clipping around the behaviour value", scope="train", min_value=0.0),
    P("exploration_loss_coeff", float, 0.003, "Entropy bonus coefficient", scope="train", min_value=0.0),
    P("value_loss_coeff", float, 0.5, "Critic loss coefficient", scope="train", min_value=0.0),
    P("max_grad_norm", float, 4.0, "Gradient norm clip (0: off)", scope="train", min_value=0.0),
    P("normalize_advantage", str2bool, True, "Normalize advantages per minibatch", scope="train"),
    P("max_policy_lag", int, 100, "Samples older than this many SGD steps are masked out of the loss", scope="train", min_value=0),
    # --- model ---
    P("use_rnn", str2bool, True, "Recurrent core (False: feed-forward)"),
    P("rnn_type", str, "gru", "Recurrent core type", choices=("gru", "lstm")),
    P("rnn_size", int, 512, "Recurrent core size", min_value=1),
    P("hidden_size", int, 512, "Size of the fully connected layer after the encoder", min_value=1),
    P("encoder_conv_architecture", str, "auto", "Conv encoder for image observations",
      choices=("auto", "convnet_simple", "convnet_atari")),
    P("encoder_mlp_layers", int, [512, 512], "MLP encoder layer sizes for vector observations", nargs="+"),
    P("nonlinearity", str, "elu", "Activation", choices=("elu", "relu", "tanh")),
    P("normalize_input", str2bool, True, "Running mean/std normalization of vector observations"),
    P("normalize_returns", str2bool, False, "Train the critic on normalized returns"),
    # --- budget, checkpoints, monitoring ---
    P("train_for_env_steps", int, 10_000_000_000, "Stop after this many env frames", scope="train", min_value=1),
    P("train_for_seconds", int, 10_000_000_000, "Stop after this many seconds", scope="train", min_value=1),
    P("save_every_sec", int, 120, "Checkpoint period in seconds", scope="train", min_value=1),
    P("keep_checkpoints", int, 2, "Latest checkpoints kept (plus the best)", scope="train", min_value=1),
    P("save_best_metric", str, "reward", "Metric of the best checkpoint (average over --stats_avg episodes)", choices=("reward", "score"), scope="train"),
    P("save_best_after", int, 100_000, "Keep a best checkpoint only after this many env frames", scope="train", min_value=0),
    P("stats_avg", int, 100, "Episodes averaged for reward statistics", scope="train", min_value=1),
    P("report_interval_sec", float, 5.0, "Console report period", scope="train", min_value=0.1),
    P("experiment_summaries_interval", float, 10.0, "TensorBoard summary period in seconds", scope="train", min_value=0.1),
    # --- enjoy ---
    P("load_checkpoint_kind", str, "latest", "Checkpoint to load", choices=("latest", "best"), scope="enjoy"),
    P("no_render", str2bool, False, "Run headless (no window)", scope="enjoy", nargs="?"),
    P("save_video", str2bool, False, "Write an .mp4 of the episodes", scope="enjoy", nargs="?"),
    P("video_name", _opt_str, None, "Video file name (default: replay_<experiment>.mp4 in the experiment dir)", scope="enjoy"),
    P("video_frames", int, 1_000_000_000, "Maximum frames written to the video", scope="enjoy", min_value=1),
    P("fps", int, 0, "Video/window frame rate (0: the env's natural rate)", scope="enjoy", min_value=0),
    P("max_num_episodes", int, 1_000_000_000, "Stop after this many episodes", scope="enjoy", min_value=1),
    P("max_num_frames", int, 1_000_000_000, "Stop after this many env frames", scope="enjoy", min_value=1),
    P("eval_deterministic", str2bool, False, "Take the most likely action instead of sampling", scope="enjoy", nargs="?"),
]
del P

# Parameters that describe the run's identity: never taken from a saved config.json over the command line.
_NOT_RESUMED = {"restart_behavior", "train_dir", "experiment"}


def all_params() -> list[Param]:
    """The core table plus the env integrations' parameters (sf_envs/params.py)."""
    params = list(PARAMS)
    try:
        from sf_envs.params import ENV_PARAMS
    except ImportError:  # the env package is optional for the core library
        ENV_PARAMS = []
    for p in ENV_PARAMS:
        if isinstance(p, dict):
            typ = p["type"]
            if typ is bool:
                typ = str2bool
            elif p.get("default") is None and typ in (int, str):
                typ = _opt_int if typ is int else _opt_str
            p = Param(p["name"], typ, p.get("default"), p.get("help", ""), p.get("choices"), p.get("nargs"),
                      scope=p.get("scope", "all"), min_value=p.get("min_value"))
        params.append(p)
    return params


def default_cfg(**overrides) -> argparse.Namespace:
    """Every parameter at its table default (no preset), with `overrides` applied. For tests and scripts."""
    cfg = argparse.Namespace(**{p.name: _copy(p.default) for p in all_params()})
    for k, v in overrides.items():
        if not hasattr(cfg, k):
            raise ConfigError(f"unknown parameter {k!r}")
        setattr(cfg, k, v)
    return cfg


def _copy(v):
    return list(v) if isinstance(v, list) else v


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports mistakes as one line (with close matches for unknown flags), exit code 2."""

    def error(self, message):
        if message.startswith("unrecognized arguments"):
            bad = [a.split("=")[0] for a in message.split(":", 1)[1].split() if a.startswith("--")]
            known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
            hints = [m for b in bad for m in difflib.get_close_matches(b, known, n=3)]
            if hints:
                message += f" (did you mean {', '.join(hints)}?)"
        raise ConfigError(message + "; see --help")


def build_parser(mode: str, prog: str) -> argparse.ArgumentParser:
    """The command-line parser: every parameter of the mode, with its default in the help text."""
    parser = _OneLineParser(prog=prog, argument_default=argparse.SUPPRESS, allow_abbrev=False,
                            description="Asynchronous PPO (Sample Factory architecture). Defaults shown are the "
                                        "table defaults; configs/<family>.json presets override them.")
    for p in all_params():
        if p.scope not in ("all", mode):
            continue
        kwargs = dict(type=p.type, help=f"{p.help} (default: {p.default})", metavar=p.name.upper())
        if p.choices:
            kwargs["choices"] = p.choices
            kwargs["metavar"] = "{" + ",".join(map(str, p.choices)) + "}"
        if p.nargs == "?":  # boolean switches: `--no_render` alone means True
            kwargs.update(nargs="?", const=True)
        elif p.nargs:
            kwargs["nargs"] = p.nargs
        parser.add_argument(f"--{p.name}", **kwargs)
    return parser


def load_preset(env_name: str, family: str) -> dict:
    """Values of configs/<family>.json: its "defaults" then its "envs"[env_name] entry."""
    path = CONFIGS_DIR / f"{family}.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"preset {path} is not valid JSON: {e}") from None
    values = dict(data.get("defaults", {}))
    values.update(data.get("envs", {}).get(env_name, {}))
    return values


def experiment_dir(cfg) -> Path:
    return Path(cfg.train_dir) / cfg.experiment


def parse_cfg(argv: Optional[Sequence[str]] = None, mode: str = "train", prog: str = "train.py") -> argparse.Namespace:
    """Resolve the configuration of one run (see the module docstring for the layers). Raises ConfigError."""
    parser = build_parser(mode, prog)
    explicit = vars(parser.parse_args(argv))
    if not explicit.get("env"):
        raise ConfigError("--env is required, e.g. --env doom_basic (see --help)")
    params = {p.name: p for p in all_params()}

    from sf_envs.registry import env_spec  # the registry raises a one-line error with close matches
    try:
        spec = env_spec(explicit["env"])
    except ValueError as e:
        raise ConfigError(f"--env: {e}") from None

    values = {name: _copy(p.default) for name, p in params.items()}
    for k, v in load_preset(spec.name, spec.family).items():
        if k not in params:
            raise ConfigError(f"preset configs/{spec.family}.json sets unknown parameter {k!r}")
        values[k] = v
    values.update(explicit)
    if values["experiment"] is None:
        values["experiment"] = values["env"]

    saved_path = Path(values["train_dir"]) / values["experiment"] / "config.json"
    resuming = mode == "enjoy" or values["restart_behavior"] == "resume"
    if resuming and saved_path.exists():
        try:
            saved = json.loads(saved_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"cannot read saved configuration {saved_path}: {e}") from None
        for k, v in saved.items():
            if k in params and k not in _NOT_RESUMED and k not in explicit and params[k].scope != "enjoy":
                values[k] = v
    cfg = argparse.Namespace(**values)
    verify(cfg, mode)
    return cfg


def verify(cfg, mode: str = "train") -> None:
    """Check values and cross-parameter rules; raise ConfigError with a one-line message."""
    for p in all_params():
        v = getattr(cfg, p.name, None)
        if p.choices and v not in p.choices:
            raise ConfigError(f"--{p.name} must be one of {', '.join(map(str, p.choices))} (got {v!r})")
        if p.min_value is not None and v is not None:
            vals = v if isinstance(v, list) else [v]
            if any(x < p.min_value for x in vals):
                what = "a positive" if p.min_value == 1 else f">= {p.min_value}"
                raise ConfigError(f"--{p.name} must be {what} {'integer' if p.type is int else 'number'} (got {v})")
    if any(x < 1 for x in cfg.encoder_mlp_layers):
        raise ConfigError(f"--encoder_mlp_layers must be positive sizes (got {cfg.encoder_mlp_layers})")
    if cfg.num_envs_per_worker % cfg.worker_num_splits:
        raise ConfigError(f"--num_envs_per_worker ({cfg.num_envs_per_worker}) must be divisible by "
                          f"--worker_num_splits ({cfg.worker_num_splits})")
    if cfg.batch_size % cfg.rollout:
        raise ConfigError(f"--batch_size ({cfg.batch_size}) must be a multiple of --rollout ({cfg.rollout})")
    if cfg.use_rnn and cfg.rollout % cfg.recurrence:
        raise ConfigError(f"--recurrence ({cfg.recurrence}) must divide --rollout ({cfg.rollout})")
    if cfg.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is available here; use --device auto or cpu")
    if mode == "train":
        _check_writable(Path(cfg.train_dir))


def _check_writable(train_dir: Path) -> None:
    d = train_dir
    while not d.exists():  # the nearest existing ancestor decides whether we can create it
        d = d.parent
    if not d.is_dir() or not os.access(d, os.W_OK | os.X_OK):
        raise ConfigError(f"--train_dir {train_dir} is not writable (checked {d}); choose a directory you can write to")


def resolve_device(cfg) -> str:
    """'cuda' or 'cpu' for --device auto/cpu/cuda."""
    if cfg.device == "auto":
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


def save_cfg(cfg, exp_dir: Path) -> Path:
    """Write the resolved configuration as exp_dir/config.json (atomically)."""
    exp_dir.mkdir(parents=True, exist_ok=True)
    path = exp_dir / "config.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(vars(cfg), indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def cli_main(main: Callable[[argparse.Namespace], int], mode: str, prog: str, argv=None) -> int:
    """Parse the command line, run `main(cfg)`; user mistakes become one line on stderr and exit code 2."""
    try:
        cfg = parse_cfg(argv, mode=mode, prog=prog)
        return main(cfg)
    except ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
