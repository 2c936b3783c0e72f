"""Parameters of train.py and enjoy.py: one table, presets per env family, validation, config.json.

Every parameter is declared once in `PARAMS` (name, type, default, help, and what values are valid); env
integrations add theirs through `sf_envs.params.ENV_PARAMS`. A configuration is resolved in layers, each
over the previous:

    table defaults  <  configs/<family>.json "defaults"  <  its "envs"[<env>]  <  saved config.json
    (resume / enjoy)  <  flags given on the command line

Valid values. Every numeric parameter declares both bounds (`min_value`, `max_value`; inclusive unless
`min_exclusive` / `max_exclusive`), every string parameter its `choices` or a `check`, and a list parameter
bounds each entry. Floats must be finite (NaN and inf are never accepted). An integer may be written as
`32`, `32.0` or `1e9` (an integral value), a boolean as True/False/1/0/yes/no (JSON true/false too), an
optional parameter as None (JSON null). The bounds are about absurd values; whether a configuration fits
the machine's memory is checked by the runner.

Every layer goes through the same conversion and checks: a value from the command line is reported with
its flag ("--gamma must be in [0, 1] (got 50.0)"), a value from a preset or a saved config.json with the
file and key ("train_dir/x/config.json: key 'rollout': expected an integer, got 'abc'"); a file that is not
a JSON object is one line naming the file. Every value of a preset is checked and a preset may only set
parameters. Of a saved config.json only the keys that are used are checked: keys that are not parameters
(other versions wrote them) are ignored, and so are the run's identity (experiment, train_dir,
restart_behavior), enjoy-only parameters and those given as flags (so a flag repairs a bad saved value);
with --restart_behavior restart/overwrite it is not read at all.

The experiment name must be one plain directory name (`validate_experiment_name`: 1-128 letters, digits,
spaces and _-.=,+@:, starting with a letter, digit or _, not ending with a space), the train dir a path
that is not empty and not the filesystem root (`validate_train_dir`); both in train and enjoy mode. The
default experiment name is the env name with other characters replaced by `_` (`default_experiment_name`).

Sample Factory's command lines run as written (`SF_FLAGS`, listed under their own heading in --help): a flag of
Sample Factory's that is not a parameter here under that name is an alias (e.g. --ppo_epochs: stored as num_epochs;
given with its target, the two must agree), selects something not implemented (e.g. --pbt_optimize_gamma: only False
is accepted, anything else is one line naming the flag), or has no meaning here (e.g. --benchmark: accepted,
not stored, one line in the run log via cfg._notes). Booleans take Sample Factory's spellings too (t/f),
and a bare boolean flag of theirs means True.

`parse_cfg` returns an `argparse.Namespace` and writes nothing (it reads the preset and the saved config.json).
Bad input raises `ConfigError`, whose message is one line; entry points print it and exit with code 2
(`cli_main`). A failure that is not the
user's input (an OS error writing config.json) raises `RunError`: one line, exit code 1. config.json is
written by `save_cfg`, which the runner calls only after every check has passed: atomically (temporary
file, fsync, rename, fsync of the directory).
"""
from __future__ import annotations

import argparse
import difflib
import errno
import hashlib
import json
import math
import os
import secrets
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
# The presets (configs/<family>.json): in an installed copy (wheel, `pip install .`) the package data `sf_configs`
# beside `sf` (setup.py maps the clone's configs/ to it); in a clone, also under `pip install -e .`, configs/ itself.
CONFIGS_DIR = next((d for d in (REPO_ROOT / "sf_configs", REPO_ROOT / "configs") if d.is_dir()), REPO_ROOT / "configs")

EXPERIMENT_NAME_MAX_LEN = 128  # well under NAME_MAX (255): the runner appends suffixes such as _old_<stamp>_<n>
EXPERIMENT_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_-.=,+@: ")
PATH_MAX_BYTES = 4000  # under PATH_MAX (4096), for paths given as parameters
LIST_MAX_LEN = 64  # entries of a list parameter (nargs="+")
MAX_TOTAL_ENVS = 65536  # num_workers * num_envs_per_worker
MAX_SAMPLES_PER_TRAINING_BATCH = 2**24  # batch_size * num_batches_per_epoch


class ConfigError(ValueError):
    """A user mistake in the configuration: a one-line message naming the flag (or file and key) and what is
    allowed. Entry points exit with code 2."""


class RunError(Exception):
    """A failure that is not a mistake in the input (e.g. an OS error writing config.json): a one-line message
    naming what failed. Entry points print it and exit with code 1."""


@dataclass(frozen=True)
class Param:
    name: str
    type: Callable  # int, float, str2bool, str, _opt_int, _opt_str (optional: None allowed), or a custom converter
    default: Any
    help: str
    choices: Optional[Sequence] = None
    nargs: Optional[str] = None
    scope: str = "all"  # "all", "train" or "enjoy": which entry point shows the flag
    min_value: Optional[float] = None  # lower bound (inclusive unless min_exclusive); every entry of a list
    max_value: Optional[float] = None  # upper bound (inclusive unless max_exclusive)
    min_exclusive: bool = False
    max_exclusive: bool = False
    check: Optional[Callable[[Any], Optional[str]]] = None  # for strings: what is wrong with a value, or None


def str2bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("true", "t", "1", "yes", "y", "on"):  # Sample Factory's str2bool spellings (t/f, y/n) included
        return True
    if s in ("false", "f", "0", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {v!r}")


def _opt_int(v: Any) -> Optional[int]:
    return None if v is None or str(v).lower() == "none" else _to_int(v)


def _opt_str(v: Any) -> Optional[str]:
    return None if v is None or str(v).lower() == "none" else str(v)


# --- checks of string values: each returns what is wrong (a phrase after the flag), or None -----------------
def _control_char(s: str) -> Optional[str]:
    return next((c for c in s if ord(c) < 32 or ord(c) == 127), None)


def _path_problem(v: str) -> Optional[str]:
    if not v.strip():
        return "must not be empty"
    bad = _control_char(v)
    if bad is not None:
        return f"must not contain control characters such as {bad!r} (got {_show(v)})"
    if len(os.fsencode(v)) > PATH_MAX_BYTES:
        return f"must be at most {PATH_MAX_BYTES} bytes long (got {len(os.fsencode(v))})"
    return None


def _train_dir_problem(v: str) -> Optional[str]:
    problem = _path_problem(v)
    if problem:
        return problem
    if os.path.realpath(v) == os.path.realpath(os.sep):
        return f"must not be the filesystem root (got {_show(v)})"
    return None


def _experiment_problem(v: str) -> Optional[str]:
    if v == "":
        return "must not be empty"
    if "/" in v or "\\" in v or (os.altsep and os.altsep in v):
        return f"must be one directory name, without '/' or '\\' (got {_show(v)})"
    if v in (".", ".."):
        return f"must not be '.' or '..' (got {_show(v)})"
    if len(v) > EXPERIMENT_NAME_MAX_LEN:
        return f"must be at most {EXPERIMENT_NAME_MAX_LEN} characters long (got {len(v)})"
    bad = next((c for c in v if c not in EXPERIMENT_NAME_CHARS), None)
    if bad is not None:
        return (f"may contain only letters, digits, spaces and _-.=,+@: (got {_show(v)}, "
                f"which contains {bad!r})")
    if not (v[0].isalnum() or v[0] == "_"):
        return f"must start with a letter, a digit or _ (got {_show(v)})"
    if v[-1] == " ":
        return f"must not end with a space (got {_show(v)})"
    return None


def _label_problem(v: str, max_len: int = 128, forbidden: str = "") -> Optional[str]:
    """A short name given to an outside service (W&B user, project, group, ...)."""
    if not v.strip():
        return "must not be empty"
    if _control_char(v) is not None:
        return f"must not contain control characters (got {_show(v)})"
    if len(v) > max_len:
        return f"must be at most {max_len} characters long (got {len(v)})"
    bad = next((c for c in v if c in forbidden), None)
    if bad is not None:
        return f"must not contain any of {forbidden} (got {_show(v)})"
    return None


def _wandb_project_problem(v: str) -> Optional[str]:
    return _label_problem(v, forbidden="/\\#?%:")


def _wandb_tags_problem(tags: list) -> Optional[str]:
    return next((f"entries {p}" for p in (_label_problem(t, max_len=64) for t in tags) if p), None)


def _env_name_problem(v: str) -> Optional[str]:  # the registry checks the name itself
    if not v:
        return "must not be empty"
    bad = _control_char(v)
    return f"must not contain control characters (got {_show(v)})" if bad is not None else None


def validate_experiment_name(name: Any, flag: str = "--experiment") -> None:
    """Raise ConfigError unless `name` is one plain directory name: 1..128 characters from letters, digits,
    spaces and _-.=,+@:, starting with a letter, digit or _, not ending with a space (so never '.', '..',
    a path or a hidden directory)."""
    if not isinstance(name, str):
        raise ConfigError(f"{flag}: expected a string, got {_show(name)}")
    problem = _experiment_problem(name)
    if problem:
        raise ConfigError(f"{flag} {problem}")


def validate_train_dir(train_dir: Any, flag: str = "--train_dir") -> None:
    """Raise ConfigError if `train_dir` is empty (the current directory), contains control characters, is
    absurdly long, or is / resolves to the filesystem root. Checks only; creates nothing."""
    if not isinstance(train_dir, (str, os.PathLike)):
        raise ConfigError(f"{flag}: expected a path, got {_show(train_dir)}")
    problem = _train_dir_problem(os.fspath(train_dir))
    if problem:
        raise ConfigError(f"{flag} {problem}")


def default_experiment_name(env: str) -> str:
    """The experiment name used when --experiment is not given: the env name made a valid directory name
    (gym:ALE/Breakout-v5 -> gym:ALE_Breakout-v5)."""
    name = "".join(c if c in EXPERIMENT_NAME_CHARS else "_" for c in env)[:EXPERIMENT_NAME_MAX_LEN].rstrip(" ")
    if not name or not (name[0].isalnum() or name[0] == "_"):
        name = "_" + name[:EXPERIMENT_NAME_MAX_LEN - 1]
    return name


P = Param
PARAMS: list[Param] = [
    # --- experiment ---
    P("env", str, None, "Environment name, e.g. doom_basic, doom_battle, atari_breakout, dmlab_<level>, gym:<id>, test_corridor",
      check=_env_name_problem),
    P("experiment", _opt_str, None, "Experiment name; its directory is train_dir/experiment (default: the env name). "
      f"One directory name: 1-{EXPERIMENT_NAME_MAX_LEN} letters, digits, spaces and _-.=,+@:, starting with a "
      "letter, digit or _", check=_experiment_problem),
    P("train_dir", str, "train_dir", "Root directory of experiments (not empty, not /)", check=_train_dir_problem),
    P("restart_behavior", str, "resume", "resume: continue from the latest checkpoint with the saved config; "
      "restart: move the old experiment directory aside; overwrite: delete it", choices=("resume", "restart", "overwrite"), scope="train"),
    P("seed", _opt_int, None, "Random seed of every stream of the run (model init, action sampling, minibatch order, envs). "
      "Not given: drawn at random; either way the seed used is printed and saved in config.json", min_value=0,
      max_value=2**32 - 1),
    P("sync_mode", str, "async", "async: Sample Factory's asynchronous APPO (policy lag varies); hts: HTS-RL's "
      "deterministic batch-synchronous mode (collection and training overlap, policy lag exactly 1 training batch, same "
      "seed and config => same weights); ppo: synchronous PPO (collect, train, repeat; policy lag 0). In hts and ppo a "
      "training batch is one --rollout of every env, split into SGD steps of --batch_size samples",
      choices=("async", "hts", "ppo"), scope="train"),
    P("sync_inference_chunk", int, 8, "hts/ppo: policy workers run the model on chunks of exactly this many "
      "observations (padded), so that an observation's actions do not depend on which others share its batch (CPU "
      "kernels give different bits for different batch sizes). Measured on 2 cores with the Doom models: ~0.5 ms per "
      "call plus ~0.2 ms per row; 8 wastes little on Doom's groups of 4-8 envs", scope="train", min_value=1,
      max_value=4096),
    P("device", str, "auto", "auto (CUDA when available, else CPU), cpu or cuda (Sample Factory's gpu: cuda)",
      choices=("auto", "cpu", "cuda")),
    P("serial_mode", str2bool, False, "Run every component in one process (for debugging)", scope="train"),
    # --- sampling ---
    P("num_workers", int, min(os.cpu_count() or 1, 200), "Number of rollout worker processes (at most 200: each "
      "policy worker is sent every rollout worker's reply queue, one file descriptor apiece, and a new process can be "
      "sent at most 251)", scope="train", min_value=1, max_value=200),
    P("num_envs_per_worker", int, 2, "Envs per rollout worker", scope="train", min_value=1, max_value=4096),
    P("worker_num_splits", int, 2, "Groups the envs of a worker are split into (2 = double-buffered sampling)", scope="train",
      min_value=1, max_value=4096),
    P("policy_workers_per_policy", int, 1, "Policy worker processes (batched inference) of each policy", scope="train",
      min_value=1, max_value=16),
    # --- populations (Sample Factory paper, section 3.5 and appendix A.3.1) ---
    P("num_policies", int, 1, "Policies trained together (a population): each has its own learner, policy workers, "
      "weights and checkpoint_p{i}; agents are mapped to policies by --policy_mapping", min_value=1, max_value=64),
    P("policy_mapping", str, "random", "random: each env draws a policy per agent, again every "
      "--policy_resample_episodes episodes (the paper); groups: the same draw made per group of envs a rollout worker "
      "steps together, from one random permutation of the population for all groups (equal shares, whole inference "
      "batches per policy: on a CPU 1.4x the frames/s of random with 4 policies); fixed: agent a of env e is always "
      "played by policy (e * agents_per_env + a) %% num_policies", choices=("random", "groups", "fixed"), scope="train"),
    P("policy_resample_episodes", int, 10, "--policy_mapping random/groups: episodes of an env between two draws of "
      "its agents' policies (a change takes effect at each agent's next episode start)", scope="train", min_value=1,
      max_value=10**9),
    P("pbt_mix_policies_in_one_env", str2bool, True, "Agents of one env may be played by different policies (False: "
      "every agent of an env by the same policy)", scope="train", nargs="?"),
    P("with_pbt", str2bool, False, "Population-based training (needs --num_policies 2 or more): every "
      "--pbt_period_env_steps the bottom 70%% of the policies mutate their hyperparameters, the worst 30%% copy the "
      "weights and hyperparameters of one of the best 30%%; False: independent policies", scope="train", nargs="?"),
    P("pbt_period_env_steps", int, 5_000_000, "PBT: env frames of a policy between two of its PBT decisions",
      scope="train", min_value=1, max_value=10**15),
    P("pbt_start_mutation", int, 20_000_000, "PBT: no decision before a policy trained on this many env frames",
      scope="train", min_value=0, max_value=10**15),
    P("pbt_replace_fraction", float, 0.3, "PBT: the best and the worst this fraction of the population (at least one "
      "policy each); the worst copy from the best", scope="train", min_value=0.0, max_value=0.5),
    P("pbt_mutation_rate", float, 0.15, "PBT: probability that each hyperparameter of a bottom policy mutates",
      scope="train", min_value=0.0, max_value=1.0),
    P("pbt_perturb_min", float, 1.2, "PBT: a mutation multiplies or divides by a factor drawn in [min, max] (the "
      "paper: 1.2)", scope="train", min_value=1.0, max_value=100.0),
    P("pbt_perturb_max", float, 1.2, "PBT: see --pbt_perturb_min", scope="train", min_value=1.0, max_value=100.0),
    P("pbt_replace_reward_gap", float, 0.1, "PBT: no copy when the objectives differ by at most this fraction of the "
      "better one's (or --pbt_replace_reward_gap_absolute, whichever is larger; the paper's duel rule: 0.35 absolute "
      "win rate)", scope="train", min_value=0.0, max_value=1e6),
    P("pbt_replace_reward_gap_absolute", float, 1e-6, "PBT: see --pbt_replace_reward_gap", scope="train",
      min_value=0.0, max_value=1e12),
    P("pbt_target_objective", str, "true_objective", "PBT: what ranks the policies (average over --stats_avg "
      "episodes): true_objective = the win rate for envs that report wins (self-play), else the game score where "
      "reported, else the reward", choices=("true_objective", "reward", "score", "win"), scope="train"),
    P("set_workers_cpu_affinity", str2bool, True, "Pin rollout workers to cores (round-robin)", scope="train"),
    P("num_traj_buffers", int, 0, "Trajectory buffer slots in shared memory (0: enough for all envs plus two training batches; "
      "--sync_mode hts/ppo always use two per env)",
      scope="train", min_value=0, max_value=2**24),
    P("max_env_restarts", int, 10, "An env that raises in a rollout worker is logged with its traceback and replaced by a "
      "fresh one (its episode ends there); after this many replacements in one worker the run stops with a checkpoint "
      "(0: the first error stops it)", scope="train", min_value=0, max_value=10**9),
    P("stall_timeout_sec", float, 120.0, "A process that gives no sign of life for this long while it and its env "
      "engines sleep or are stopped (stuck, e.g. on an engine that hangs) is reported with its Python stack, killed and "
      "replaced (without self-healing the run stops with a checkpoint); one that computes gets 6x as long, one that "
      "waits for a CPU is left alone with a warning (0: never)", scope="train", min_value=0.0, max_value=604800.0),
    P("max_restarts_per_hour", int, 10, "Self-healing: a rollout worker, policy worker or learner that dies (a signal, "
      "an exception, a stall) is replaced in place and the run goes on; more deaths than this of one process kind "
      "within an hour end the run with a checkpoint (a crash loop). 0: any death stops the run. --sync_mode hts/ppo "
      "never heal (their runs are bit-for-bit repeatable)", scope="train", min_value=0, max_value=10**6),
    P("policy_worker_torch_threads", int, 1, "torch threads of each policy worker", scope="train", min_value=1, max_value=1024),
    P("distributed_timeout_sec", float, 300.0, "torchrun (data-parallel learners): how long a learner waits for the "
      "other ranks (to form the group, at each training batch and SGD step) before the run stops; a rank that dies is "
      "noticed at once", scope="train", min_value=1.0, max_value=86400.0),
    P("learner_torch_threads", int, 0, "torch threads of the learner (0: the number of cores; with --sync_mode hts "
      "half of them, since collection runs beside training: measured on 2 cores, two learner threads contending with "
      "the workers cost hts 25-40%% of its throughput)", scope="train", min_value=0, max_value=1024),
    P("sampler_only", str2bool, False, "Benchmark: the learner returns trajectories unused (measures the sampler alone)", scope="train"),
    P("random_policy", str2bool, False, "Benchmark: policy workers sample uniform random actions without the network", scope="train"),
    # --- learning ---
    P("rollout", int, 32, "Trajectory length T (samples per trajectory)", min_value=1, max_value=65536),
    P("recurrence", int, 32, "Truncated BPTT length; must divide --rollout", min_value=1, max_value=65536),
    P("batch_size", int, 1024, "Minibatch size in samples (one SGD step); a multiple of --rollout", scope="train",
      min_value=1, max_value=2**24),
    P("num_batches_per_epoch", int, 1, "Minibatches per training batch", scope="train", min_value=1, max_value=65536),
    P("num_epochs", int, 1, "Passes over each training batch", scope="train", min_value=1, max_value=1024),
    P("learning_rate", float, 1e-4, "Adam learning rate", scope="train", min_value=0.0, min_exclusive=True, max_value=1.0),
    P("adam_eps", float, 1e-6, "Adam epsilon", scope="train", min_value=0.0, min_exclusive=True, max_value=1.0),
    P("adam_beta1", float, 0.9, "Adam beta1", scope="train", min_value=0.0, max_value=1.0, max_exclusive=True),
    P("adam_beta2", float, 0.999, "Adam beta2", scope="train", min_value=0.0, max_value=1.0, max_exclusive=True),
    P("gamma", float, 0.99, "Discount factor", scope="train", min_value=0.0, max_value=1.0),
    P("with_vtrace", str2bool, True, "V-trace targets (False: GAE)", scope="train"),
    P("vtrace_rho", float, 1.0, "V-trace rho-bar (importance weight clip)", scope="train", min_value=0.0, min_exclusive=True,
      max_value=1e6),
    P("vtrace_c", float, 1.0, "V-trace c-bar (trace cutting)", scope="train", min_value=0.0, min_exclusive=True, max_value=1e6),
    P("gae_lambda", float, 0.95, "GAE lambda (with --with_vtrace False)", scope="train", min_value=0.0, max_value=1.0),
    P("ppo_clip_ratio", float, 0.1, "PPO clip: ratio kept in [1/(1+x), 1+x]", scope="train", min_value=0.0, min_exclusive=True,
      max_value=10.0),
    P("ppo_clip_value", float, 1.0, "Value clipping around the behaviour value", scope="train", min_value=0.0, max_value=1e6),
    P("exploration_loss_coeff", float, 0.003, "Entropy bonus coefficient", scope="train", min_value=0.0, max_value=100.0),
    P("value_loss_coeff", float, 0.5, "Critic loss coefficient", scope="train", min_value=0.0, max_value=100.0),
    P("max_grad_norm", float, 4.0, "Gradient norm clip (0: off)", scope="train", min_value=0.0, max_value=1e6),
    P("normalize_advantage", str2bool, True, "Normalize advantages per minibatch", scope="train"),
    P("max_policy_lag", int, 100, "Samples older than this many SGD steps are masked out of the loss", scope="train",
      min_value=0, max_value=10**9),
    P("reward_scale", float, 1.0, "Env rewards are multiplied by this for training (then clipped to --reward_clip); "
      "reported returns are the env's own", scope="train", min_value=0.0, min_exclusive=True, max_value=1e6),
    P("reward_clip", float, 1000.0, "Training rewards (after --reward_scale) are clipped to [-x, x]", scope="train",
      min_value=0.0, min_exclusive=True, max_value=1e12),
    # --- model ---
    P("use_rnn", str2bool, True, "Recurrent core (False: feed-forward)"),
    P("rnn_type", str, "gru", "Recurrent core type", choices=("gru", "lstm")),
    P("rnn_size", int, 512, "Recurrent core size", min_value=1, max_value=65536),
    P("hidden_size", int, 512, "Size of the fully connected layer after the encoder", min_value=1, max_value=65536),
    P("encoder_conv_architecture", str, "auto", "Conv encoder for image observations",
      choices=("auto", "convnet_simple", "convnet_atari")),
    P("encoder_mlp_layers", int, [512, 512], f"MLP encoder layer sizes for vector observations (1-{LIST_MAX_LEN} layers)",
      nargs="+", min_value=1, max_value=65536),
    P("nonlinearity", str, "elu", "Activation", choices=("elu", "relu", "tanh")),
    P("normalize_input", str2bool, True, "Running mean/std normalization of vector observations"),
    P("normalize_returns", str2bool, False, "Train the critic on normalized returns"),
    # --- budget, checkpoints, monitoring ---
    P("train_for_env_steps", int, 10_000_000_000, "Stop after this many env frames", scope="train", min_value=1, max_value=10**15),
    P("train_for_seconds", int, 10_000_000_000, "Stop after this many seconds", scope="train", min_value=1, max_value=10**10),
    P("save_every_sec", int, 120, "Checkpoint period in seconds", scope="train", min_value=1, max_value=10**7),
    P("keep_checkpoints", int, 2, "Latest checkpoints kept (plus the best)", scope="train", min_value=1, max_value=1000),
    P("save_best_metric", str, "reward", "Metric of the best checkpoint (average over --stats_avg episodes)", choices=("reward", "score"), scope="train"),
    P("save_best_after", int, 100_000, "Keep a best checkpoint only after this many env frames", scope="train",
      min_value=0, max_value=10**15),
    P("save_milestones_sec", int, -1, "Every this many seconds, also keep a copy of the checkpoint in "
      "checkpoint_p0/milestones/ that is never pruned (-1 or 0: no milestones)", scope="train", min_value=-1,
      max_value=10**10),
    P("stats_avg", int, 100, "Episodes averaged for reward statistics", scope="train", min_value=1, max_value=10**6),
    P("report_interval_sec", float, 5.0, "Console report period", scope="train", min_value=0.1, max_value=86400.0),
    P("experiment_summaries_interval", float, 10.0, "TensorBoard summary period in seconds", scope="train",
      min_value=0.1, max_value=86400.0),
    # --- Weights & Biases (Sample Factory's flags) ---
    P("with_wandb", str2bool, False, "Log the run's summaries to Weights & Biases too", scope="train"),
    P("wandb_user", _opt_str, None, "W&B entity (user or team); None: the logged-in user's default", scope="train",
      check=_label_problem),
    P("wandb_project", str, "sf", "W&B project", scope="train", check=_wandb_project_problem),
    P("wandb_group", _opt_str, None, "W&B group of the run (None: none)", scope="train", check=_label_problem),
    P("wandb_job_type", _opt_str, None, "W&B job type of the run (None: none)", scope="train", check=_label_problem),
    P("wandb_tags", str, [], "W&B tags of the run (0 or more, each 1-64 characters)", nargs="*", scope="train",
      check=_wandb_tags_problem),
    # --- enjoy ---
    P("load_checkpoint_kind", str, "latest", "Checkpoint to load", choices=("latest", "best"), scope="enjoy"),
    P("no_render", str2bool, False, "Run headless (no window)", scope="enjoy", nargs="?"),
    P("save_video", str2bool, False, "Write an H.264 .mp4 of the episodes (yuv420p: plays in browsers and common players) "
      "at the game's render resolution", scope="enjoy", nargs="?"),
    P("video_name", _opt_str, None, "Video file name, ending in .mp4: a bare name goes in the experiment dir, a path is "
      "taken as given (default: replay_<experiment>.mp4 in the experiment dir)", scope="enjoy", check=_path_problem),
    P("video_gif", str2bool, False, "With --save_video: also write an animated GIF beside the .mp4 (same name, .gif; "
      "GIFs grow fast: keep them short with --video_frames)", scope="enjoy", nargs="?"),
    P("video_frames", int, 1_000_000_000, "Maximum frames written to the video", scope="enjoy", min_value=1, max_value=10**12),
    P("fps", int, 0, "Video/window frame rate (0: the env's natural rate)", scope="enjoy", min_value=0, max_value=1000),
    P("max_num_episodes", int, 1_000_000_000, "Stop after this many episodes", scope="enjoy", min_value=1, max_value=10**12),
    P("max_num_frames", int, 1_000_000_000, "Stop after this many env frames", scope="enjoy", min_value=1, max_value=10**15),
    P("eval_deterministic", str2bool, False, "Take the most likely action instead of sampling", scope="enjoy", nargs="?"),
    P("policy_index", int, [0], "The policies that play (a population): agent a of a multi-agent env is played by the "
      "a-th of them (cycling), a single-agent env by the first", scope="enjoy", nargs="+", min_value=0, max_value=63),
]
del P

# Parameters that describe the run's identity: never taken from a saved config.json over the command line.
_NOT_RESUMED = {"restart_behavior", "train_dir", "experiment"}

# Named checks an env parameter (a dict in sf_envs/params.py) may give as "check".
NAMED_CHECKS: dict[str, Callable[[Any], Optional[str]]] = {"path": _path_problem}


# --- Sample Factory's command lines ---------------------------------------------------------------------------
@dataclass(frozen=True)
class SFFlag:
    """A flag of Sample Factory's (1.x and 2.x) command lines that is not one of our parameters under that name, so
    that the training and enjoy commands of its documentation run here as written. `kind`:

    - "alias": our parameter `target` under Sample Factory's name. The value (converted by `type`, then mapped by
      `value` when given) is checked as the target's and stored under the target's name (config.json never has the
      alias). Given together with the target's own flag, the two must agree (`agrees`, else equality): one line
      otherwise. `value` may return _KEEP (e.g. SF's "None: the env's default"): as if not given.
    - "only": Sample Factory selects something with it; the values in `ok` are what this implementation does and are
      accepted (with `note`, a line in the run log); any other value is refused in one line: the flag, its value
      and `why`.
    - "ignored": no meaning here (tuning of Sample Factory's own internals): the value is checked for its type,
      not stored, and the run log has one line naming it and `why`.
    The README has the whole table (every Sample Factory flag: same / alias / implemented / refused / ignored)."""
    name: str
    kind: str
    why: str = ""
    target: Optional[str] = None
    type: Callable = str  # int, float, str2bool, str, _opt_int, _opt_str
    ok: tuple = ()
    value: Optional[Callable[[Any], Any]] = None
    agrees: Optional[Callable[[Any, Any], bool]] = None
    note: str = ""
    nargs: Optional[str] = None  # "?" for booleans (a bare flag means True, as SF's store_true flags), "*" for lists
    scope: str = "all"  # "all", "train", "enjoy" (an alias takes its target's)


_KEEP = object()  # an alias's value meaning "not given" (Sample Factory's "None / -1: the default")


def _one_layer(layers: list) -> int:
    if len(layers) != 1:
        raise _Bad(f"must be one layer here (the fully connected layer after the conv layers, --hidden_size), "
                   f"got {len(layers)}")
    return layers[0]


def _alias(name, target, why="", **kw) -> SFFlag:
    return SFFlag(name, "alias", why, target, **kw)


def _only(name, type, ok, why, nargs=None, **kw) -> SFFlag:
    return SFFlag(name, "only", why, type=type, ok=ok, nargs="?" if type is str2bool else nargs, **kw)


def _ignored(name, type, why, scope="train", nargs=None) -> SFFlag:
    return SFFlag(name, "ignored", why, type=type, nargs="?" if type is str2bool else nargs, scope=scope)


_BUFFERS = "trajectory buffer slots are sized by --num_traj_buffers here"
_DECORRELATE = "no start-up decorrelation delays here: envs are seeded apart"
_INTERNALS = "a setting of Sample Factory's own processes; nothing to set here"
_HUB = "uploading to the Hugging Face Hub is not implemented"
SF_FLAGS: list[SFFlag] = [
    # --- aliases: our parameter under Sample Factory's (1.x) name ---
    _alias("ppo_epochs", "num_epochs", "Sample Factory 1.x"),
    _alias("num_batches_per_iteration", "num_batches_per_epoch", "Sample Factory 1.x"),
    _alias("async_rl", "sync_mode", "True: --sync_mode async; False: synchronous PPO, --sync_mode ppo (or hts)",
           type=str2bool, value=lambda b: "async" if b else "ppo",
           agrees=lambda ours, given: (ours == "async") == (given == "async")),
    _alias("res_w", "doom_res_w", "Doom observation width"),
    _alias("res_h", "doom_res_h", "Doom observation height"),
    _alias("env_framestack", "atari_framestack", "frames are stacked for Atari only"),
    _alias("encoder_subtype", "encoder_conv_architecture", "Sample Factory 1.x"),
    _alias("encoder_conv_mlp_layers", "hidden_size", "exactly one layer, of --hidden_size", type=int, nargs="*",
           value=_one_layer),
    _alias("num_bots", "doom_num_bots", "-1: the scenario's default", type=int,
           value=lambda n: None if n == -1 else n),
    _alias("timelimit", "doom_bots_timelimit", "minutes; None: the default", type=_opt_str,
           value=lambda v: _KEEP if v is None else v),
    _alias("dmlab30_dataset", "dmlab_dataset_path"),
    _alias("dmlab_level_cache_path", "dmlab_level_cache_dir"),
    # --- selects something: what we do is accepted, anything else refused ---
    _only("algo", str, ("APPO",), "only APPO is implemented here (a sampling benchmark: --sampler_only True or "
          "--random_policy True)"),
    _only("num_agents", int, (-1, 1), "the env decides how many agents it hosts (doom_duel: 2): -1 (or 1)"),
    _only("pbt_optimize_batch_size", str2bool, (False,), "PBT mutates the learning rate, entropy coefficient, Adam "
          "beta1 and reward shaping here, not the batch size"),
    _only("pbt_optimize_gamma", str2bool, (False,), "PBT mutates the learning rate, entropy coefficient, Adam beta1 "
          "and reward shaping here, not gamma"),
    _only("num_humans", int, (0,), "human players are not implemented (0)"),
    _only("start_bot_difficulty", _opt_int, (None,), "Sample Factory's adaptive bot difficulty is not implemented; "
          "the bots' fixed skill is --doom_bots_difficulty (0-100)"),
    _only("wide_aspect_ratio", str2bool, (False,), "the game renders 4:3 (160x120) here; a wide aspect ratio is "
          "not implemented", note="what this implementation does (the game renders 4:3 at 160x120, downsampled "
          "to --doom_res_w x --doom_res_h)"),
    _only("kl_loss_coeff", float, (0.0,), "a KL penalty is not implemented (PPO clipping only): 0"),
    _only("aux_loss_coeff", float, (0.0,), "auxiliary losses are not implemented: 0"),
    _only("exploration_loss", str, ("entropy",), "only the entropy bonus is implemented (--exploration_loss_coeff)"),
    _only("optimizer", str, ("adam",), "only Adam is implemented"),
    _only("lr_schedule", str, ("constant",), "only a constant --learning_rate is implemented"),
    _only("rnn_num_layers", int, (1,), "the recurrent core has one layer here"),
    _only("decoder_mlp_layers", int, ([],), "no layers between the core and the heads here", nargs="*"),
    _only("encoder_type", str, ("conv", "mlp"), "resnet encoders are not implemented; conv or mlp is chosen from "
          "the observation space (--encoder_conv_architecture, --encoder_mlp_layers)",
          note="chosen from the observation space here (conv for images, MLP for vectors)"),
    _only("encoder_custom", _opt_str, (None,), "custom encoders are not implemented"),
    _only("encoder_extra_fc_layers", int, (1,), "one fully connected layer (--hidden_size) after the conv layers"),
    _only("use_cpc", str2bool, (False,), "CPC|A is not implemented"),
    _only("use_spectral_norm", str2bool, (False,), "spectral normalization is not implemented"),
    _only("experiments_root", _opt_str, (None,), "experiments are train_dir/experiment here: give the subdirectory "
          "in --train_dir"),
    _only("record_to", _opt_str, (None,), "recording ViZDoom demos is not implemented; --save_video writes an .mp4",
          scope="enjoy"),
    _only("policy_initialization", str, ("orthogonal",), "only orthogonal initialization is implemented"),
    _only("actor_critic_share_weights", str2bool, (True,), "the actor and the critic share the encoder and core here"),
    _only("adaptive_stddev", str2bool, (True,), "the Gaussian's log-std is an output of the network here"),
    _only("eval_env_frameskip", _opt_int, (None,), "enjoy steps the env with the training --env_frameskip",
          scope="enjoy"),
    _only("push_to_hub", str2bool, (False,), _HUB, scope="enjoy"),
    # --- no meaning here: accepted, a line in the log ---
    _ignored("benchmark", str2bool, "Sample Factory's benchmark mode; see --sampler_only, --random_policy"),
    _ignored("summaries_use_frameskip", str2bool, "summaries count env frames, frameskip included (Sample "
             "Factory's default True)"),
    _ignored("decorrelate_experience_max_seconds", int, _DECORRELATE),
    _ignored("decorrelate_envs_on_one_worker", str2bool, _DECORRELATE),
    _ignored("num_batches_to_accumulate", int, _BUFFERS),
    _ignored("num_minibatches_to_accumulate", int, _BUFFERS),
    _ignored("traj_buffers_excess_ratio", float, _BUFFERS),
    _ignored("batched_sampling", str2bool, "a rollout worker steps its envs one by one; the policy workers batch "
             "inference"),
    _ignored("shuffle_minibatches", str2bool, "trajectories are always shuffled into minibatches (seeded by --seed)"),
    _ignored("value_bootstrap", str2bool, "an episode cut by a time limit is always bootstrapped from the value of "
             "its final observation"),
    _ignored("lr_schedule_kl_threshold", float, "only for a KL-adaptive --lr_schedule"),
    _ignored("lr_adaptive_min", float, "only for a KL-adaptive --lr_schedule"),
    _ignored("lr_adaptive_max", float, "only for a KL-adaptive --lr_schedule"),
    _ignored("obs_subtract_mean", float, "image observations are scaled to [0, 1] in the encoder; vector "
             "observations are normalized by --normalize_input"),
    _ignored("obs_scale", float, "image observations are scaled to [0, 1] in the encoder; vector observations are "
             "normalized by --normalize_input"),
    _ignored("normalize_input_keys", str, "--normalize_input applies to every vector observation", nargs="*"),
    _ignored("actor_worker_gpus", int, "envs run on the CPU here", nargs="*"),
    _ignored("env_gpu_actions", str2bool, "envs run on the CPU here"),
    _ignored("env_gpu_observations", str2bool, "envs run on the CPU here"),
    _ignored("pixel_format", str, "observation layouts are handled by the env integrations"),
    _ignored("use_record_episode_statistics", str2bool, "episode statistics come from the env integrations"),
    _ignored("use_env_info_cache", str2bool, "the env is made once at start-up to check the configuration"),
    _ignored("force_envs_single_thread", str2bool, _INTERNALS),
    _ignored("default_niceness", int, _INTERNALS),
    _ignored("train_in_background_thread", str2bool, _INTERNALS),
    _ignored("learner_main_loop_num_cores", int, _INTERNALS),
    _ignored("reset_timeout_seconds", int, "a stuck env is found by --stall_timeout_sec"),
    _ignored("heartbeat_interval", int, "a stuck process is found by --stall_timeout_sec"),
    _ignored("heartbeat_reporting_interval", int, "a stuck process is found by --stall_timeout_sec"),
    _ignored("log_to_file", str2bool, "the log always goes to sf_log.txt in the experiment directory"),
    _ignored("flush_summaries_interval", int, "summaries are flushed as they are written"),
    _ignored("save_best_every_sec", int, "the best checkpoint is considered at every checkpoint (--save_every_sec)"),
    _ignored("policy_init_gain", float, "the initialization gains are fixed (orthogonal, sqrt(2) for the encoder)"),
    _ignored("initial_stddev", float, "the Gaussian's log-std is an output of the network"),
    _ignored("continuous_tanh_scale", float, "continuous actions are not squashed by tanh here"),
    _ignored("dmlab_one_task_per_worker", str2bool, "dmlab_30: env i runs level i % 30"),
    _ignored("dmlab_with_instructions", str2bool, "language instructions are not part of the observation here"),
    _ignored("dmlab_throughput_benchmark", str2bool, "see --random_policy"),
    _ignored("dmlab_gpus", int, "--dmlab_renderer chooses the renderer", nargs="*"),
    _ignored("sample_env_frames", int, "only for Sample Factory's DUMMY_SAMPLER (--algo)"),
    _ignored("cpc_forward_steps", int, "CPC|A options; CPC|A is not implemented (--use_cpc False)"),
    _ignored("cpc_time_subsample", int, "CPC|A options; CPC|A is not implemented (--use_cpc False)"),
    _ignored("cpc_forward_subsample", int, "CPC|A options; CPC|A is not implemented (--use_cpc False)"),
    _ignored("hf_repository", _opt_str, _HUB, scope="enjoy"),
    _ignored("train_script", _opt_str, _HUB, scope="enjoy"),
    _ignored("enjoy_script", _opt_str, _HUB, scope="enjoy"),
]
_SF_DEST = "_sf_flag:"  # argparse destination prefix of Sample Factory's flags (kept apart from the parameters)
# Values of our parameters under Sample Factory's spelling.
_SF_VALUES: dict[str, dict[str, str]] = {"device": {"gpu": "cuda"}}


def _sf_shown(v: Any) -> str:
    if isinstance(v, list):
        return " ".join(map(str, v)) if v else "(no value)"
    return str(v)


def check_sf_flags(given: dict[str, Any]) -> list[str]:
    """Sample Factory's flags given on the command line (`given`: its name -> the raw value), see SFFlag: values that
    select something not implemented raise one ConfigError (one line naming each refused flag and what is supported);
    returns the lines for the run log (accepted flags without meaning here). Aliases: `apply_sf_aliases`."""
    notes, refused, ignored = [], [], {}
    for f in SF_FLAGS:
        if f.name not in given or f.kind == "alias":
            continue
        try:
            v = convert(Param(f.name, f.type, None, f.why, nargs=f.nargs), given[f.name])
        except _Bad as e:
            raise ConfigError(_message(f"--{f.name}", str(e))) from None
        if f.kind == "ignored":
            ignored.setdefault(f.why, []).append(f"--{f.name} {_sf_shown(v)}")
        elif v not in f.ok:
            refused.append(f"--{f.name} {_sf_shown(v)}: {f.why}")
        elif f.note:
            notes.append(f"--{f.name} {_sf_shown(v)}: {f.note}")
    if refused:
        raise ConfigError("; ".join(refused))
    return notes + [f"{', '.join(flags)}: ignored; {why}" for why, flags in ignored.items()]


def apply_sf_aliases(given: dict[str, Any], explicit: dict[str, Any], params: dict[str, Param]) -> None:
    """Put the value of each alias in `given` (see SFFlag) into `explicit` under its target's name, checked as the
    target's value (errors name the alias). Given with the target's own flag too, they must agree: else one line."""
    for f in SF_FLAGS:
        if f.name not in given or f.kind != "alias":
            continue
        flag = f"--{f.name}"
        try:
            v = given[f.name]
            if f.value is not None:
                v = f.value(convert(Param(f.name, f.type, None, f.why, nargs=f.nargs), v))
            if v is _KEEP:
                continue
            v = convert(params[f.target], v)
        except _Bad as e:
            raise ConfigError(_message(flag, str(e))) from None
        if f.target not in explicit:
            explicit[f.target] = v
        elif not (f.agrees(v, explicit[f.target]) if f.agrees else v == explicit[f.target]):
            raise ConfigError(f"{flag} {_sf_shown(given[f.name])} conflicts with --{f.target} "
                              f"{_sf_shown(explicit[f.target])}: {flag} is Sample Factory's name for --{f.target}"
                              f"{f' ({f.why})' if f.why else ''}; give one of them")


def _sf_help(f: SFFlag) -> str:
    if f.kind == "alias":
        text = f"Sample Factory's name for --{f.target}{f' ({f.why})' if f.why else ''}"
    elif f.kind == "only":
        text = f"Accepted: {', '.join(_sf_shown(x) for x in f.ok)}; anything else is refused: {f.why}"
    else:
        text = f"Accepted and ignored, with a line in the log: {f.why}"
    return text.replace("%", "%%")


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
            check = p.get("check")
            p = Param(p["name"], typ, p.get("default"), p.get("help", ""), p.get("choices"), p.get("nargs"),
                      scope=p.get("scope", "all"), min_value=p.get("min_value"), max_value=p.get("max_value"),
                      min_exclusive=p.get("min_exclusive", False), max_exclusive=p.get("max_exclusive", False),
                      check=NAMED_CHECKS[check] if isinstance(check, str) else check)
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


# --- conversion and range checks: the same for the command line, presets and saved config.json ---------------
class _Bad(Exception):
    """What is wrong with one value: a phrase that follows the flag or the file and key."""


def _show(v: Any, limit: int = 60, text: Callable[[Any], str] = repr) -> str:
    """A value in a message: repr (or `text`), cut to `limit` characters."""
    try:
        s = text(v)
    except ValueError:  # an int of more than 4300 digits
        return "a huge number"
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _got(v: Any) -> str:
    return _show(v, text=str)


def _to_int(v: Any) -> int:
    """An int from an int, an integral float (32.0, 1e9) or its string form; raises ValueError otherwise."""
    if isinstance(v, bool):
        raise ValueError(v)
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        s = v.strip()
        try:
            return int(s, 10)
        except ValueError:
            v = float(s)  # "1e9", "32.0"; ValueError for anything else
    if isinstance(v, float) and v.is_integer():
        return int(v)
    raise ValueError(v)


def _kind(p: Param) -> tuple[str, bool]:
    """(kind, optional): kind is int, float, bool, str or custom; optional: None is a valid value."""
    kind = {int: "int", _opt_int: "int", float: "float", str2bool: "bool", str: "str", _opt_str: "str"}.get(p.type, "custom")
    return kind, p.type in (_opt_int, _opt_str)


def _fmt(x: Any) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return str(x)


def range_text(p: Param) -> Optional[str]:
    """'[0, 1)' for a parameter with bounds, else None."""
    if p.min_value is None and p.max_value is None:
        return None
    lo = "-inf" if p.min_value is None else _fmt(p.min_value)
    hi = "inf" if p.max_value is None else _fmt(p.max_value)
    return f"{'(' if p.min_exclusive else '['}{lo}, {hi}{')' if p.max_exclusive else ']'}"


def _out_of_range(p: Param, x: Any) -> bool:
    if p.min_value is not None and (x <= p.min_value if p.min_exclusive else x < p.min_value):
        return True
    return p.max_value is not None and (x >= p.max_value if p.max_exclusive else x > p.max_value)


_EXPECTED = {"int": "an integer", "float": "a number", "bool": "True or False", "str": "a string"}


def _convert_one(p: Param, kind: str, v: Any) -> Any:
    try:
        if kind == "int":
            return _to_int(v)
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
        raise _Bad(f"expected {_EXPECTED.get(kind, 'a valid value')}, got {_show(v)}") from None


def convert(p: Param, raw: Any) -> Any:
    """The value of `p` from a command-line string or a JSON value, checked (`check_value`); raises _Bad."""
    kind, optional = _kind(p)
    if optional and (raw is None or (isinstance(raw, str) and raw.strip().lower() == "none")):
        return None
    if p.nargs in ("+", "*"):
        if not isinstance(raw, list):
            raise _Bad(f"expected a list of {'integers' if kind == 'int' else 'values'}, got {_show(raw)}")
        value = [_convert_one(p, kind, x) for x in raw]
    else:
        value = _convert_one(p, kind, raw)
    check_value(p, value)
    return value


def check_value(p: Param, value: Any) -> None:
    """Raise _Bad unless `value` (already of the parameter's type) is valid for `p`."""
    kind, optional = _kind(p)
    if value is None:
        if optional:
            return
        raise _Bad(f"expected {_EXPECTED.get(kind, 'a value')}, got None")
    if p.nargs in ("+", "*"):
        if not isinstance(value, list):
            raise _Bad(f"expected a list, got {_show(value)}")
        least = 0 if p.nargs == "*" else 1
        if not least <= len(value) <= LIST_MAX_LEN:
            raise _Bad(f"must have {least} to {LIST_MAX_LEN} entries (got {len(value)})")
        items = value
    else:
        items = [value]
    for x in items:
        if kind == "int" and (isinstance(x, bool) or not isinstance(x, int)):
            raise _Bad(f"expected an integer, got {_show(x)}")
        if kind == "float" and (isinstance(x, bool) or not isinstance(x, (int, float))):
            raise _Bad(f"expected a number, got {_show(x)}")
        if kind == "bool" and not isinstance(x, bool):
            raise _Bad(f"expected True or False, got {_show(x)}")
        if kind == "str" and not isinstance(x, str):
            raise _Bad(f"expected a string, got {_show(x)}")
    if p.choices is not None and value not in p.choices:
        raise _Bad(f"must be one of {', '.join(map(str, p.choices))} (got {_show(value)})")
    if kind in ("int", "float"):
        rng = range_text(p)
        entries = "entries " if p.nargs in ("+", "*") else ""
        none = " or None" if optional else ""
        for x in items:
            if isinstance(x, float) and not math.isfinite(x):
                raise _Bad(f"{entries}must be a finite number in {rng}{none} (got {_got(value)})")
            if _out_of_range(p, x):
                raise _Bad(f"{entries}must be in {rng}{none} (got {_got(value)})")
    if p.check is not None:
        problem = p.check(value)
        if problem:
            raise _Bad(problem)


def _message(where: str, problem: str) -> str:
    # "--gamma must be in [0, 1] (got 50.0)"; "--rollout: expected an integer, got 'abc'"
    return f"{where}{': ' if problem.startswith('expected') else ' '}{problem}"


def _from_cli(p: Param, raw: Any) -> Any:
    try:
        return convert(p, raw)
    except _Bad as e:
        raise ConfigError(_message(f"--{p.name}", str(e))) from None


def _from_file(path: str, key: str, p: Param, raw: Any) -> Any:
    try:
        return convert(p, raw)
    except _Bad as e:
        raise ConfigError(_message(f"{path}: key {key!r}", str(e))) from None


def _read_json_object(path: Path, shown: str) -> dict:
    """The JSON object in `path`; one-line ConfigError (naming `shown`) for anything else."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RunError(f"cannot read {shown}: {e.strerror or e}") from None  # an I/O failure, not bad input
    except UnicodeDecodeError:
        raise ConfigError(f"{shown} is not valid JSON: not UTF-8 text") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"{shown} is not valid JSON: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{shown}: expected a JSON object {{\"key\": value, ...}}, got {_json_type(data)}")
    return data


def _json_type(v: Any) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null", dict: "an object"}.get(type(v), type(v).__name__)


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports mistakes as one line (with close matches for unknown flags), exit code 2."""

    def error(self, message):
        if message.startswith("unrecognized arguments"):
            bad = [a.split("=")[0] for a in message.split(":", 1)[1].split() if a.startswith("--")]
            known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
            hints = [m for b in bad for m in difflib.get_close_matches(b, known, n=3)]
            if hints:
                message += f" (did you mean {', '.join(hints)}?)"
        raise ConfigError(" ".join(message.split()) + "; see --help")


def build_parser(mode: str, prog: str) -> argparse.ArgumentParser:
    """The command-line parser: every parameter of the mode, with its range and default in the help text.
    Values are parsed as strings and converted and checked by `parse_cfg` (as those of presets and config.json)."""
    parser = _OneLineParser(prog=prog, argument_default=argparse.SUPPRESS, allow_abbrev=False,
                            description="Asynchronous PPO (Sample Factory architecture). Defaults shown are the "
                                        "table defaults; configs/<family>.json presets override them.")
    for p in all_params():
        if p.scope not in ("all", mode):
            continue
        rng = range_text(p)
        valid = f"; range {rng}{' or None' if _kind(p)[1] else ''}" if rng else ""
        kwargs = dict(type=str, help=f"{p.help}{valid} (default: {p.default})", metavar=p.name.upper())
        if p.choices:
            kwargs["metavar"] = "{" + ",".join(map(str, p.choices)) + "}"
        if p.nargs == "?":  # boolean switches: `--no_render` alone means True
            kwargs.update(nargs="?", const=True)
        elif p.nargs:
            kwargs["nargs"] = p.nargs
        parser.add_argument(f"--{p.name}", **kwargs)
    shown = {p.name for p in all_params() if p.scope in ("all", mode)}
    group = parser.add_argument_group(
        "Sample Factory's flags", "accepted so that Sample Factory's documented command lines run as written: "
        "aliases (stored under our name), flags selecting something not implemented (only what we do is accepted) "
        "and flags without meaning here (ignored, with a line in the log)")
    for f in SF_FLAGS:
        if (f.target not in shown) if f.kind == "alias" else f.scope not in ("all", mode):
            continue
        kwargs = dict(type=str, help=_sf_help(f), dest=_SF_DEST + f.name, metavar=f.name.upper())
        if f.nargs == "?":
            kwargs.update(nargs="?", const="True")
        elif f.nargs:
            kwargs["nargs"] = f.nargs
        group.add_argument(f"--{f.name}", **kwargs)
    return parser


def _preset_path_shown(path: Path) -> str:
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


# Env families that ship a preset (sf_envs/registry.py's built-in families): a missing file is a broken install.
FAMILIES_WITH_PRESETS = ("doom", "atari", "dmlab", "gym", "test")


def load_preset(env_name: str, family: str) -> dict:
    """Values of configs/<family>.json: its "defaults" then its "envs"[env_name] entry (raw JSON values,
    converted and checked by parse_cfg). ConfigError naming the file if it is not of that form.

    Every built-in family (FAMILIES_WITH_PRESETS) has a preset: a missing one is a ConfigError naming the file
    (an install without its package data would otherwise train silently with the table defaults). Families that
    users add with register_env() have none by design ({}: the table defaults), unless they put one in CONFIGS_DIR."""
    path = CONFIGS_DIR / f"{family}.json"
    if not path.exists():
        if family in FAMILIES_WITH_PRESETS:
            raise ConfigError(f"preset {path} of env family {family!r} is missing (an install without its package "
                              f"data sf_configs? reinstall: pip install .)")
        return {}
    shown = _preset_path_shown(path)
    data = _read_json_object(path, shown)
    defaults, envs = data.get("defaults", {}), data.get("envs", {})
    if not isinstance(defaults, dict):
        raise ConfigError(f"{shown}: key 'defaults': expected a JSON object, got {_json_type(defaults)}")
    if not isinstance(envs, dict):
        raise ConfigError(f"{shown}: key 'envs': expected a JSON object, got {_json_type(envs)}")
    entry = envs.get(env_name, {})
    if not isinstance(entry, dict):
        raise ConfigError(f"{shown}: key 'envs'.{env_name!r}: expected a JSON object, got {_json_type(entry)}")
    values = dict(defaults)
    values.update(entry)
    return values


def experiment_dir(cfg) -> Path:
    return Path(cfg.train_dir) / cfg.experiment


def parse_cfg(argv: Optional[Sequence[str]] = None, mode: str = "train", prog: str = "train.py") -> argparse.Namespace:
    """Resolve the configuration of one run (see the module docstring for the layers). Raises ConfigError.
    Reads the preset and the saved config.json; writes nothing."""
    parser = build_parser(mode, prog)
    raw = vars(parser.parse_args(argv))
    sf_given = {k[len(_SF_DEST):]: raw.pop(k) for k in list(raw) if k.startswith(_SF_DEST)}
    if not raw.get("env"):
        raise ConfigError("--env is required, e.g. --env doom_basic (see --help)")
    notes = check_sf_flags(sf_given)  # first: a run Sample Factory's flags ask for that is not implemented here
    params = {p.name: p for p in all_params()}
    for k, spelling in _SF_VALUES.items():  # e.g. Sample Factory's --device gpu
        if isinstance(raw.get(k), str) and raw[k] in spelling:
            raw[k] = spelling[raw[k]]
    explicit = {k: _from_cli(params[k], v) for k, v in raw.items()}
    apply_sf_aliases(sf_given, explicit, params)

    try:  # the env integrations are a package of their own, which the core does not need to import
        from sf_envs.registry import env_spec  # (it raises a one-line error with close matches)
    except ImportError as e:
        raise ConfigError(f"--env {explicit['env']}: the env integrations (package sf_envs) cannot be imported: {e}") from None
    try:
        spec = env_spec(explicit["env"])
    except ValueError as e:
        raise ConfigError(f"--env: {e}") from None

    values = {name: _copy(p.default) for name, p in params.items()}
    preset_shown = _preset_path_shown(CONFIGS_DIR / f"{spec.family}.json")
    for k, v in load_preset(spec.name, spec.family).items():  # every value checked, even one a flag overrides
        if k not in params:
            raise ConfigError(f"{preset_shown}: unknown parameter {k!r}")
        values[k] = _from_file(preset_shown, k, params[k], v)
    values.update(explicit)
    if values["experiment"] is None:
        values["experiment"] = default_experiment_name(values["env"])
    validate_train_dir(values["train_dir"])  # before the saved config is looked for under them
    validate_experiment_name(values["experiment"])

    saved_path = Path(values["train_dir"]) / values["experiment"] / "config.json"
    resuming = mode == "enjoy" or values["restart_behavior"] == "resume"
    try:
        has_saved = resuming and saved_path.exists()
    except OSError as e:
        raise RunError(f"cannot read {saved_path}: {e.strerror or e}") from None  # e.g. a path too long: I/O, exit 1
    if has_saved:
        saved = _read_json_object(saved_path, str(saved_path))
        for k, v in saved.items():  # keys that are not parameters (other versions) are ignored
            if k in params and k not in _NOT_RESUMED and k not in explicit and params[k].scope != "enjoy":
                values[k] = _from_file(str(saved_path), k, params[k], v)
    envs_given = "num_envs_per_worker" in explicit or (has_saved and "num_envs_per_worker" in saved)
    if mode == "train" and not envs_given:
        envs = scale_envs_per_worker(values["num_envs_per_worker"], values["num_workers"], values["worker_num_splits"])
        if envs != values["num_envs_per_worker"]:
            notes.append(f"--num_envs_per_worker {envs} (the default {values['num_envs_per_worker']} spread over "
                         f"{values['num_workers']} rollout workers on {os.cpu_count()} cores; set it to override)")
            values["num_envs_per_worker"] = envs
    if mode == "train" and values["with_pbt"] and values["num_policies"] < 2:
        notes.append(f"--with_pbt True with --num_policies {values['num_policies']}: population-based training needs "
                     "2 or more policies; nothing to do")
    if mode == "train" and values["seed"] is None:  # every run is reproducible from its config.json
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "") if os.environ.get("WORLD_SIZE", "1") != "1" else ""
        if run_id:  # torchrun: every rank must draw the same seed (rank 0's config.json keeps it)
            values["seed"] = int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "little") & 0x7FFFFFFF
        else:
            values["seed"] = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        notes.append(f"--seed {values['seed']} (drawn at random; config.json keeps it)")
    cfg = argparse.Namespace(**values)
    verify(cfg, mode)
    cfg._notes = notes  # for the log; not a parameter, not saved
    cfg._explicit = frozenset(explicit)  # the parameters given on the command line (a resumed PBT run: over its state)
    return cfg


def sync_minibatches(cfg) -> int:
    """--sync_mode hts/ppo: SGD steps per epoch, each on --batch_size samples of the training batch (one --rollout of
    every env); a --batch_size at least that large makes it one step on the whole batch."""
    return max(1, cfg.num_workers * cfg.num_envs_per_worker * cfg.rollout // cfg.batch_size)


def scale_envs_per_worker(envs: int, workers: int, splits: int, cores: Optional[int] = None) -> int:
    """Envs per rollout worker when the user did not choose it. The presets' values (the paper's 16 for Doom) are meant
    for one worker per core; with more workers than cores, the same number of envs per core is spread over them, never
    fewer than one env per split. Without this, `--num_workers 72` on 2 cores would start 1,152 VizDoom engines
    where 144 keep both cores busy."""
    cores = cores or os.cpu_count() or 1
    if workers <= cores:
        return envs
    per_worker = envs * cores // workers
    return max(splits, per_worker // splits * splits)


def verify(cfg, mode: str = "train") -> None:
    """Check every value (type, range or choices) and the cross-parameter rules; raise ConfigError with a
    one-line message naming the flag. Checks only: creates and writes nothing."""
    for p in all_params():
        try:
            check_value(p, getattr(cfg, p.name, None))
        except _Bad as e:
            if p.name == "env" and getattr(cfg, "env", None) is None:
                raise ConfigError("--env is required, e.g. --env doom_basic (see --help)") from None
            raise ConfigError(_message(f"--{p.name}", str(e))) from None
    validate_train_dir(cfg.train_dir)
    validate_experiment_name(cfg.experiment)
    if cfg.num_envs_per_worker % cfg.worker_num_splits:
        raise ConfigError(f"--num_envs_per_worker ({cfg.num_envs_per_worker}) must be divisible by "
                          f"--worker_num_splits ({cfg.worker_num_splits})")
    if cfg.num_workers * cfg.num_envs_per_worker > MAX_TOTAL_ENVS:
        raise ConfigError(f"--num_workers x --num_envs_per_worker must be at most {MAX_TOTAL_ENVS} envs in all "
                          f"(got {cfg.num_workers} x {cfg.num_envs_per_worker} = {cfg.num_workers * cfg.num_envs_per_worker})")
    if cfg.batch_size % cfg.rollout:
        raise ConfigError(f"--batch_size ({cfg.batch_size}) must be a multiple of --rollout ({cfg.rollout})")
    samples = cfg.batch_size * cfg.num_batches_per_epoch
    if samples > MAX_SAMPLES_PER_TRAINING_BATCH:
        raise ConfigError(f"--batch_size x --num_batches_per_epoch must be at most {MAX_SAMPLES_PER_TRAINING_BATCH} "
                          f"samples per training batch (got {cfg.batch_size} x {cfg.num_batches_per_epoch} = {samples})")
    if mode == "train" and cfg.sync_mode != "async" and cfg.sampler_only:
        raise ConfigError(f"--sampler_only measures the asynchronous sampler alone; with --sync_mode {cfg.sync_mode} "
                          "every interval waits for the learner: use --sync_mode async")
    if mode == "train" and cfg.sync_mode != "async":
        per_batch = cfg.num_workers * cfg.num_envs_per_worker * cfg.rollout
        if cfg.batch_size < per_batch and per_batch % cfg.batch_size:
            raise ConfigError(f"--sync_mode {cfg.sync_mode}: a training batch is one --rollout of every env "
                              f"({cfg.num_workers} x {cfg.num_envs_per_worker} x {cfg.rollout} = {per_batch} samples); "
                              f"--batch_size ({cfg.batch_size}) must divide it (or be at least {per_batch})")
    if mode == "train" and cfg.num_policies > 1 and cfg.sync_mode != "async":
        raise ConfigError(f"--sync_mode {cfg.sync_mode} trains one policy; a population (--num_policies "
                          f"{cfg.num_policies}) needs --sync_mode async")
    if mode == "train" and cfg.pbt_perturb_min > cfg.pbt_perturb_max:
        raise ConfigError(f"--pbt_perturb_min ({cfg.pbt_perturb_min}) must be at most --pbt_perturb_max "
                          f"({cfg.pbt_perturb_max})")
    if cfg.use_rnn and cfg.rollout % cfg.recurrence:
        raise ConfigError(f"--recurrence ({cfg.recurrence}) must divide --rollout ({cfg.rollout})")
    if mode == "train" and cfg.num_traj_buffers and cfg.sync_mode == "async":  # (hts/ppo: two slots per env)
        need = cfg.num_workers * cfg.num_envs_per_worker + samples // cfg.rollout
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


def resolve_device(cfg) -> str:
    """'cuda' or 'cpu' for --device auto/cpu/cuda."""
    device = cfg.device
    if device == "auto":
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and os.environ.get("WORLD_SIZE", "1") != "1":  # torchrun: this rank's GPU of the machine
        import torch
        local_rank, gpus = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
        if local_rank >= gpus:  # NCCL needs a GPU of its own per rank (it refuses two ranks on one device)
            raise ConfigError(f"--device cuda: local rank {local_rank} needs GPU {local_rank}, this machine has {gpus}: "
                              f"start at most {gpus} ranks per machine (torchrun --nproc-per-node {max(gpus, 1)})")
        device = f"cuda:{local_rank}"
    return device


def save_cfg(cfg, exp_dir: Path) -> Path:
    """Write the resolved configuration as exp_dir/config.json, atomically (write_json_atomic). Creates exp_dir if
    needed. Call it only after every check has passed. An OS error raises RunError (one line naming the file)."""
    values = {k: v for k, v in vars(cfg).items() if not k.startswith("_")}  # parameters only (not cfg._notes)
    return write_json_atomic(Path(exp_dir) / "config.json", values)


def write_json_atomic(path: Path, obj) -> Path:
    """Write `obj` as JSON to `path` atomically: a temporary file in the same directory is written, flushed and
    fsynced, then renamed over `path`, then the directory is fsynced; the temporary file is removed on failure. Creates
    the directory if needed. An OS error raises RunError (one line naming the file and the error)."""
    path = Path(path)
    directory = path.parent
    data = json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"  # fails before touching disk
    tmp = directory / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _fsync_dir(directory)
    except OSError as e:
        raise RunError(f"cannot write {path}: {e.strerror or e}") from None
    return path


def _fsync_dir(d: Path) -> None:
    """Make a rename in `d` durable. Filesystems that cannot fsync a directory are tolerated."""
    try:
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def cli_main(main: Callable[[argparse.Namespace], int], mode: str, prog: str, argv=None) -> int:
    """Parse the command line, run `main(cfg)`; errors as in run_guarded."""
    return run_guarded(prog, lambda: main(parse_cfg(argv, mode=mode, prog=prog)))


def run_guarded(prog: str, body: Callable[[], int]) -> int:
    """`body()`'s exit code. A ConfigError (bad input) becomes one line on stderr and exit code 2; a RunError (e.g.
    an I/O failure) one line and exit code 1: every entry point's user-facing errors look alike."""
    try:
        return body()
    except ConfigError as e:
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except RunError as e:
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return 1
