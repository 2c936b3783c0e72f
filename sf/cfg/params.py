"""The parameters of train.py and enjoy.py: one table (`PARAMS`), grouped by concern as Sample Factory's add_*_args,
plus the env integrations' parameters (sf_envs/params.py). Each entry declares its name, type, default, help and
which values are valid: both bounds of a number, the choices or a `check` of a string (sf/cfg/string_checks.py).
The order of the table is the order of --help."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from sf.cfg.mode import MODES
from sf.cfg.string_checks import (EXPERIMENT_NAME_MAX_LEN, env_name_problem, experiment_problem, label_problem,
                                  path_problem, train_dir_problem, wandb_project_problem, wandb_tags_problem)
from sf.processes.control import usable_cores

LIST_MAX_LEN = 64  # entries of a list parameter (nargs="+")


@dataclass(frozen=True)
class Param:
    name: str
    type: Callable  # int, float, str2bool, str, optional_int/float/str (None allowed), or a custom converter
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


# --- the value types of the table -------------------------------------------------------------------------------
def str2bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("true", "t", "1", "yes", "y", "on"):  # Sample Factory's str2bool spellings (t/f, y/n) included
        return True
    if s in ("false", "f", "0", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {v!r}")


def to_int(v: Any) -> int:
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


def optional_int(v: Any) -> Optional[int]:
    return None if v is None or str(v).lower() == "none" else to_int(v)


def optional_str(v: Any) -> Optional[str]:
    return None if v is None or str(v).lower() == "none" else str(v)


def optional_float(v: Any) -> Optional[float]:
    return None if v is None or str(v).lower() == "none" else float(v)


# The run: what it trains, where it writes, how it is seeded, its mode and device.
RUN_PARAMS: list[Param] = [
    Param("env", str, None, "Environment name, e.g. doom_basic, doom_battle, atari_breakout, dmlab_<level>, gym:<id>, "
          "test_corridor", check=env_name_problem),
    Param("experiment", optional_str, None, "Experiment name; its directory is train_dir/experiment (default: the env "
          f"name). One directory name: 1-{EXPERIMENT_NAME_MAX_LEN} letters, digits, spaces and _-.=,+@:, starting with "
          "a letter, digit or _", check=experiment_problem),
    Param("train_dir", str, "train_dir", "Root directory of experiments (not empty, not /)", check=train_dir_problem),
    Param("restart_behavior", str, "resume", "resume: continue from the latest checkpoint with the saved config; "
          "restart: move the old experiment directory aside; overwrite: delete it",
          choices=("resume", "restart", "overwrite"), scope="train"),
    Param("seed", optional_int, None, "Random seed of every stream of the run (model init, action sampling, minibatch "
          "order, envs). Not given: drawn at random; either way the seed used is printed and saved in config.json",
          min_value=0, max_value=2**32 - 1),
    Param("sync_mode", str, "async", "async: Sample Factory's asynchronous APPO (policy lag varies); hts: HTS-RL's "
          "deterministic batch-synchronous mode (collection and training overlap, policy lag exactly 1 training "
          "batch, same seed and config => same weights); ppo: synchronous PPO (collect, train, repeat; policy lag 0). "
          "In hts and ppo a training batch is one --rollout of every env, split into SGD steps of --batch_size samples",
          choices=MODES.keys(), scope="train"),  # (a live view: a mode added to MODES is a choice)
    Param("sync_inference_chunk", int, 8, "hts/ppo: policy workers run the model on chunks of exactly this many "
          "observations (padded), so that an observation's actions do not depend on which others share its batch (CPU "
          "kernels give different bits for different batch sizes). A call costs about as much as a few rows, so 8 "
          "wastes little on Doom's groups of 4-8 envs", scope="train", min_value=1, max_value=4096),
    Param("preset_set", optional_str, None, "A named set of the env family's preset (configs/<family>.json \"sets\") "
          "over its defaults: paper (Doom) reproduces the Sample Factory paper's Table A.5 settings; family: the "
          "family's defaults even where the env's group names a set (Doom's multiplayer scenarios: paper). Not given: "
          "the env's group's set, if any", choices=("family", "paper")),
    Param("device", str, "auto", "auto (CUDA when available, else CPU), cpu or cuda (Sample Factory's gpu: cuda)",
          choices=("auto", "cpu", "cuda")),
    Param("serial_mode", str2bool, False, "Run every component in one process (for debugging)", scope="train"),
]

# Sampling: rollout workers, their envs, policy workers.
SAMPLING_PARAMS: list[Param] = [
    Param("num_workers", int, min(usable_cores(), 200), "Number of rollout worker processes (default: the cores this "
          "process may use, its CPU affinity; at most 200: each "
          "policy worker is sent every rollout worker's reply queue, one file descriptor apiece, and a new process "
          "can be sent at most 251). auto: the layout python -m sf.autolayout measured for this env on this machine "
          "(cached; measured first, in under a minute, where none is): it also sets --num_envs_per_worker, "
          "--worker_num_splits, --policy_workers_per_policy and --learner_torch_threads unless given",
          scope="train", min_value=1, max_value=200),
    Param("num_envs_per_worker", int, 2, "Envs per rollout worker", scope="train", min_value=1, max_value=4096),
    Param("worker_num_splits", int, 2, "Groups the envs of a worker are split into (2 = double-buffered sampling)",
          scope="train", min_value=1, max_value=4096),
    Param("policy_workers_per_policy", int, 1, "Policy worker processes (batched inference) of each policy",
          scope="train", min_value=1, max_value=16),
]

# Populations and population-based training (Sample Factory paper, section 3.5 and appendix
# A.3.1).
POPULATION_PARAMS: list[Param] = [
    Param("num_policies", int, 1, "Policies trained together (a population): each has its own learner, policy "
          "workers, weights and checkpoint_p{i}; agents are mapped to policies by --policy_mapping", min_value=1,
          max_value=64),
    Param("policy_mapping", str, "random", "random: each env draws a policy per agent, again every "
          "--policy_resample_episodes episodes (the paper); groups: the same draw made per group of envs a rollout "
          "worker steps together, from one random permutation of the population for all groups (equal shares, whole "
          "inference batches per policy: fewer and fuller model calls than random); fixed: agent a of env e is always "
          "played by policy (e * agents_per_env + a) %% num_policies", choices=("random", "groups", "fixed"),
          scope="train"),
    Param("policy_resample_episodes", int, 10, "--policy_mapping random/groups: episodes of an env between two draws "
          "of its agents' policies (a change takes effect at each agent's next episode start)", scope="train",
          min_value=1, max_value=10**9),
    Param("pbt_mix_policies_in_one_env", str2bool, True, "Agents of one env may be played by different policies "
          "(False: every agent of an env by the same policy)", scope="train", nargs="?"),
    Param("with_pbt", str2bool, False, "Population-based training (needs --num_policies 2 or more): every "
          "--pbt_period_env_steps the bottom 70%% of the policies mutate their hyperparameters, the worst 30%% copy "
          "the weights and hyperparameters of one of the best 30%%; False: independent policies", scope="train",
          nargs="?"),
    Param("pbt_period_env_steps", int, 5_000_000, "PBT: env frames of a policy between two of its PBT decisions",
          scope="train", min_value=1, max_value=10**15),
    Param("pbt_start_mutation", int, 20_000_000, "PBT: no decision before a policy trained on this many env frames",
          scope="train", min_value=0, max_value=10**15),
    Param("pbt_replace_fraction", float, 0.3, "PBT: the best and the worst this fraction of the population (at least "
          "one policy each); the worst copy from the best", scope="train", min_value=0.0, max_value=0.5),
    Param("pbt_mutation_rate", float, 0.15, "PBT: probability that each hyperparameter of a bottom policy mutates",
          scope="train", min_value=0.0, max_value=1.0),
    Param("pbt_perturb_min", float, 1.2, "PBT: a mutation multiplies or divides by a factor drawn in [min, max] (the "
          "paper: 1.2)", scope="train", min_value=1.0, max_value=100.0),
    Param("pbt_perturb_max", float, 1.2, "PBT: see --pbt_perturb_min", scope="train", min_value=1.0, max_value=100.0),
    Param("pbt_replace_reward_gap", float, 0.1, "PBT: no copy when the objectives differ by at most this fraction of "
          "the better one's (or --pbt_replace_reward_gap_absolute, whichever is larger; the paper's duel rule: 0.35 "
          "absolute win rate)", scope="train", min_value=0.0, max_value=1e6),
    Param("pbt_replace_reward_gap_absolute", float, 1e-6, "PBT: see --pbt_replace_reward_gap", scope="train",
          min_value=0.0, max_value=1e12),
    Param("pbt_target_objective", str, "true_objective", "PBT: what ranks the policies (average over --stats_avg "
          "episodes): true_objective = the win rate for envs that report wins (self-play), else the game score where "
          "reported, else the reward", choices=("true_objective", "reward", "score", "win"), scope="train"),
]

# Processes at run time: cores, buffers, faults (env errors, stalls, deaths), threads, the
# data-parallel group, benchmark switches.
RUNTIME_PARAMS: list[Param] = [
    Param("set_workers_cpu_affinity", str2bool, True, "Pin rollout workers to cores (round-robin)", scope="train"),
    Param("num_traj_buffers", int, 0, "Trajectory buffer slots in shared memory (0: enough for all envs plus two "
          "training batches; --sync_mode hts/ppo always use two per env)", scope="train", min_value=0, max_value=2**24),
    Param("max_env_restarts", int, 10, "An env that raises in a rollout worker is logged with its traceback and "
          "replaced by a fresh one (its episode ends there); after this many replacements in one worker the run stops "
          "with a checkpoint (0: the first error stops it)", scope="train", min_value=0, max_value=10**9),
    Param("stall_timeout_sec", float, 120.0, "A process that gives no sign of life for this long while it and its env "
          "engines sleep or are stopped (stuck, e.g. on an engine that hangs) is reported with its Python stack, "
          "killed and replaced (without self-healing the run stops with a checkpoint); one that computes gets 6x as "
          "long, one that waits for a CPU is left alone with a warning (0: never)", scope="train", min_value=0.0,
          max_value=604800.0),
    Param("sigterm_grace_sec", float, 30.0, "A SIGTERM (Slurm's scancel or time limit, torchrun stopping its ranks, "
          "timeout(1)) is followed by SIGKILL after a grace period (Slurm's KillWait and torchrun's shutdown timeout: "
          "30 s by default): the run's stop after a SIGTERM ends within it, the learner's final checkpoint included "
          "when it can be written in time (else the last one written stays the run's). Ctrl-C and the end of the "
          "budget wait for the final checkpoint as long as it progresses (0: a SIGTERM too)", scope="train",
          min_value=0.0, max_value=604800.0),
    Param("max_restarts_per_hour", int, 10, "Self-healing: a rollout worker, policy worker or learner that dies (a "
          "signal, an exception, a stall) is replaced in place and the run goes on; more deaths than this of one "
          "process kind within an hour end the run with a checkpoint (a crash loop). 0: any death stops the run. "
          "--sync_mode hts/ppo never heal (their runs are bit-for-bit repeatable)", scope="train", min_value=0,
          max_value=10**6),
    Param("policy_worker_torch_threads", int, 1, "torch threads of each policy worker", scope="train", min_value=1,
          max_value=1024),
    Param("precision", str, "auto", "Arithmetic of the observation encoder in the learner and the policy workers: "
          "float32, or bfloat16 (torch.autocast; weights, optimizer state, RNN, heads, losses and V-trace stay "
          "float32). auto: bfloat16 for convolutional encoders in asynchronous mode where the hardware computes it "
          "natively (CPUs with AVX512-BF16 or AMX: about 1.4x faster learner steps on the paper's Doom model; CUDA "
          "GPUs with bf16), float32 otherwise and in --sync_mode hts/ppo", choices=("auto", "float32", "bfloat16"),
          scope="train"),
    Param("policy_worker_batch_wait_ms", float, 5.0, "Asynchronous mode: a policy worker that has fewer requests than "
          "one per rollout worker it serves waits up to this long for more before its forward pass (a forward costs "
          "nearly as much for a few rows as for many: fewer, larger batches save compute; the rollout workers step "
          "their other env group meanwhile). 0: serve whatever has arrived", scope="train", min_value=0.0,
          max_value=1000.0),
    Param("distributed_timeout_sec", float, 300.0, "torchrun (data-parallel learners): how long a learner waits for "
          "the other ranks (to form the group, at each training batch and SGD step) before the run stops; a rank that "
          "dies is noticed at once", scope="train", min_value=1.0, max_value=86400.0),
    Param("learner_torch_threads", int, 0, "torch threads of the learner (0: half the cores in async and hts modes, "
          "where collection runs beside training: learner threads contending with the workers for the cores spin at "
          "every barrier; every core in ppo mode, where the actors wait)", scope="train", min_value=0, max_value=1024),
    Param("sampler_only", str2bool, False, "Benchmark: the learner returns trajectories unused (measures the sampler "
          "alone)", scope="train"),
    Param("random_policy", str2bool, False, "Benchmark: policy workers sample uniform random actions without the "
          "network", scope="train"),
]

# Learning: trajectories, minibatches, the optimizer, the loss (V-trace or GAE, PPO clipping), rewards.
LEARNING_PARAMS: list[Param] = [
    Param("rollout", int, 32, "Trajectory length T (samples per trajectory)", min_value=1, max_value=65536),
    Param("recurrence", int, 32, "Truncated BPTT length; must divide --rollout", min_value=1, max_value=65536),
    Param("batch_size", int, 1024, "Minibatch size in samples (one SGD step); a multiple of --rollout", scope="train",
          min_value=1, max_value=2**24),
    Param("num_batches_per_epoch", int, 1, "Minibatches per training batch", scope="train", min_value=1,
          max_value=65536),
    Param("num_batches_to_accumulate", int, 2, "Asynchronous mode: training batches the learner may hold out of "
          "shared memory (the one training and those waiting) before experience collection stops; it resumes when a "
          "batch is trained on. Bounds the policy lag when the learner is the bottleneck (Sample Factory's semantics "
          "and default; collection that ran ahead filled every spare slot with experience several SGD steps stale)",
          scope="train", min_value=1, max_value=1000),
    Param("shuffle_minibatches", str2bool, True, "With several minibatches per batch, each epoch draws them from the "
          "batch's trajectories in a random order (seeded by --seed); False: in storage order, as Sample Factory's "
          "default does", scope="train"),
    Param("sample_minibatches", str2bool, False, "Minibatches of single samples of all the batch's steps (with "
          "--shuffle_minibatches: drawn at random, CleanRL's; Sample Factory 2's at --recurrence 1), the batch's GAE "
          "advantages computed once beforehand from the behaviour values, as Sample Factory's; needs --use_rnn False "
          "and --with_vtrace False. False: minibatches of whole trajectories, their targets from the learner's current "
          "values", scope="train"),
    Param("num_epochs", int, 1, "Passes over each training batch", scope="train", min_value=1, max_value=1024),
    Param("learning_rate", float, 1e-4, "Learning rate: the base rate that --lr_schedule scales (and PBT mutates)",
          scope="train", min_value=0.0, min_exclusive=True, max_value=1.0),
    Param("lr_schedule", str, "constant", "constant: --learning_rate throughout; linear_decay: from --learning_rate "
          "down to 0 at --train_for_env_steps, after every SGD step; kl_adaptive_minibatch / kl_adaptive_epoch: "
          "divided by 1.5 when the KL divergence of the policy from the behaviour policy (the last minibatch's / the "
          "mean of the last epoch's) exceeds 2x --lr_schedule_kl_threshold, multiplied by 1.5 when it is below half "
          "of it, kept in [--lr_adaptive_min, --lr_adaptive_max]",
          choices=("constant", "linear_decay", "kl_adaptive_minibatch", "kl_adaptive_epoch"), scope="train"),
    Param("lr_schedule_kl_threshold", float, 0.008, "KL divergence the kl_adaptive_* schedules aim at", scope="train",
          min_value=0.0, min_exclusive=True, max_value=1e6),
    Param("lr_adaptive_min", float, 1e-6, "Least learning rate of the kl_adaptive_* schedules", scope="train",
          min_value=0.0, min_exclusive=True, max_value=1.0),
    Param("lr_adaptive_max", float, 1e-2, "Greatest learning rate of the kl_adaptive_* schedules", scope="train",
          min_value=0.0, min_exclusive=True, max_value=1.0),
    Param("optimizer", str, "adam", "adam, or lamb (Adam's step scaled per parameter tensor by a trust ratio, "
          "weight decay 1e-4: Sample Factory's LAMB); both take --adam_beta1/2 and --adam_eps",
          choices=("adam", "lamb"), scope="train"),
    Param("adam_eps", float, 1e-6, "Adam epsilon", scope="train", min_value=0.0, min_exclusive=True, max_value=1.0),
    Param("adam_beta1", float, 0.9, "Adam beta1", scope="train", min_value=0.0, max_value=1.0, max_exclusive=True),
    Param("adam_beta2", float, 0.999, "Adam beta2", scope="train", min_value=0.0, max_value=1.0, max_exclusive=True),
    Param("gamma", float, 0.99, "Discount factor", scope="train", min_value=0.0, max_value=1.0),
    Param("with_vtrace", str2bool, True, "V-trace targets (False: GAE)", scope="train"),
    Param("value_bootstrap", str2bool, True, "An episode cut by a time limit (truncated) is bootstrapped from the "
          "value of its final observation (False: treated as a termination, nothing after it)", scope="train"),
    Param("vtrace_rho", float, 1.0, "V-trace rho-bar (importance weight clip)", scope="train", min_value=0.0,
          min_exclusive=True, max_value=1e6),
    Param("vtrace_c", float, 1.0, "V-trace c-bar (trace cutting)", scope="train", min_value=0.0, min_exclusive=True,
          max_value=1e6),
    Param("gae_lambda", float, 0.95, "GAE lambda (with --with_vtrace False)", scope="train", min_value=0.0,
          max_value=1.0),
    Param("ppo_clip_ratio", float, 0.1, "PPO clip: ratio kept in [1/(1+x), 1+x]", scope="train", min_value=0.0,
          min_exclusive=True, max_value=10.0),
    Param("ppo_clip_value", float, 1.0, "Value clipping around the behaviour value", scope="train", min_value=0.0,
          max_value=1e6),
    Param("exploration_loss_coeff", float, 0.003, "Coefficient of the exploration loss (--exploration_loss)",
          scope="train", min_value=0.0, max_value=100.0),
    Param("exploration_loss", str, "entropy", "entropy: an entropy bonus; symmetric_kl: a penalty on the symmetric KL "
          "divergence of each categorical head from the uniform distribution (grows without bound as a head becomes "
          "deterministic; discrete actions only)", choices=("entropy", "symmetric_kl"), scope="train"),
    Param("kl_loss_coeff", float, 0.0, "Coefficient of a penalty on the KL divergence of the policy from the behaviour "
          "policy (PPO paper's fixed KL penalty; Sample Factory recommends 0.1 for continuous actions)", scope="train",
          min_value=0.0, max_value=100.0),
    Param("value_loss_coeff", float, 0.5, "Critic loss coefficient", scope="train", min_value=0.0, max_value=100.0),
    Param("max_grad_norm", float, 4.0, "Gradient norm clip (0: off)", scope="train", min_value=0.0, max_value=1e6),
    Param("normalize_advantage", str2bool, True, "Normalize advantages per minibatch", scope="train"),
    Param("max_policy_lag", int, 100, "Samples older than this many SGD steps are masked out of the loss",
          scope="train", min_value=0, max_value=10**9),
    Param("reward_scale", float, 1.0, "Env rewards are multiplied by this for training (then clipped to "
          "--reward_clip); reported returns are the env's own", scope="train", min_value=0.0, min_exclusive=True,
          max_value=1e6),
    Param("reward_clip", float, 1000.0, "Training rewards (after --reward_scale) are clipped to [-x, x]", scope="train",
          min_value=0.0, min_exclusive=True, max_value=1e12),
]

# The model: encoder, core, activation, normalization.
MODEL_PARAMS: list[Param] = [
    Param("use_rnn", str2bool, True, "Recurrent core (False: feed-forward)",),
    Param("rnn_type", str, "gru", "Recurrent core type", choices=("gru", "lstm")),
    Param("rnn_size", int, 512, "Recurrent core size", min_value=1, max_value=65536),
    Param("rnn_num_layers", int, 1, "Layers of the recurrent core (a stacked GRU/LSTM; the RNN state holds every "
          "layer's)", min_value=1, max_value=64),
    Param("hidden_size", int, 512, "Size of the fully connected layer after the conv layers of image encoders (when "
          "--encoder_conv_mlp_layers is None)", min_value=1, max_value=65536),
    Param("encoder_conv_architecture", str, "auto", "Conv encoder for image observations (Sample Factory's): "
          "convnet_simple (Doom), convnet_impala, convnet_atari (Nature DQN), resnet_impala (IMPALA's residual "
          "network); auto: convnet_atari for 84x84 frames, else convnet_simple",
          choices=("auto", "convnet_simple", "convnet_impala", "convnet_atari", "resnet_impala")),
    Param("encoder_conv_mlp_layers", optional_int, None, "Sizes of the fully connected layers after the conv layers "
          f"of image encoders, each followed by the nonlinearity (0-{LIST_MAX_LEN} layers; the flag alone: none, the "
          "flattened conv output). None: one layer of --hidden_size (Sample Factory's default is [512])", nargs="*",
          min_value=1, max_value=65536),
    Param("encoder_mlp_layers", int, [512, 512], "MLP encoder layer sizes for vector observations "
          f"(0-{LIST_MAX_LEN} layers; the flag alone: none, the vector itself)", nargs="*", min_value=1,
          max_value=65536),
    Param("nonlinearity", str, "elu", "Activation", choices=("elu", "relu", "tanh")),
    Param("normalize_input", str2bool, True, "Running mean/std normalization of the observation keys of "
          "--normalize_input_keys",),
    Param("normalize_input_keys", optional_str, None, "Observation keys that --normalize_input normalizes, each a key "
          "of the env's observations (the flag alone: none). None: every vector key (Sample Factory's None also "
          "normalizes images, per pixel: list their keys for that)", nargs="*",
          check=lambda keys: next((f"entries {p}" for p in map(label_problem, keys) if p), None)),
    Param("obs_subtract_mean", float, 0.0, "Image observations: subtracted before the division by --obs_scale",
          min_value=-1e9, max_value=1e9),
    Param("obs_scale", float, 255.0, "Image observations are divided by this after --obs_subtract_mean (255: uint8 "
          "frames to [0, 1]). Vector observations are not scaled (see --normalize_input)", min_value=0.0,
          min_exclusive=True, max_value=1e9),
    Param("normalize_returns", str2bool, False, "Train the critic on normalized returns",),
    Param("actor_critic_share_weights", str2bool, True, "The actor and the critic share the encoder and the core "
          "(False: the critic has its own encoder and core, Sample Factory's separate weights: twice the encoder work, "
          "the RNN state holds both cores')"),
    Param("adaptive_stddev", str2bool, True, "Continuous (Box) actions: the Gaussian's log-std is an output of the "
          "network (False: one learned parameter per action dimension, independent of the observation, starting at "
          "log(--initial_stddev)). Other action spaces ignore it"),
    Param("initial_stddev", float, 1.0, "Box actions with --adaptive_stddev False: the initial standard deviation "
          "(log-stds are clamped to [-20, 2])", min_value=0.0, min_exclusive=True, max_value=7.389),
    Param("continuous_tanh_scale", float, 0.0, "Box actions with --adaptive_stddev False: s > 0 squashes the means to "
          "tanh(mean / s) * s (0: not squashed)", min_value=0.0, max_value=1e6),
    Param("policy_initialization", str, "orthogonal", "Initial weights of every linear and conv layer: orthogonal, "
          "xavier_uniform, or torch_default (torch's own); biases start at 0 in every case",
          choices=("orthogonal", "xavier_uniform", "torch_default")),
    Param("policy_init_gain", optional_float, None, "Gain of --policy_initialization for the layers Sample Factory "
          "2.1.1 initializes (its default is 1.0): the action heads, the critic, the Doom measurements' MLP and the "
          "ResNet; the conv encoder, the vector MLP encoder and the RNN keep torch's default, as they do there. None: "
          "per-layer gains, sqrt(2) for the encoder, 0.01 for the action heads, 1 for the critic, and with orthogonal "
          "the RNN orthogonal per gate too",
          min_value=0.0, min_exclusive=True, max_value=1000.0),
]

# Budget, checkpoints, statistics and summaries.
BUDGET_PARAMS: list[Param] = [
    Param("train_for_env_steps", int, 10_000_000_000, "Stop after this many env frames", scope="train", min_value=1,
          max_value=10**15),
    Param("train_for_seconds", int, 10_000_000_000, "Stop after this many seconds", scope="train", min_value=1,
          max_value=10**10),
    Param("save_every_sec", int, 120, "Checkpoint period in seconds", scope="train", min_value=1, max_value=10**7),
    Param("keep_checkpoints", int, 2, "Latest checkpoints kept (plus the best)", scope="train", min_value=1,
          max_value=1000),
    Param("save_best_metric", str, "reward", "Metric of the best checkpoint (average over --stats_avg episodes)",
          choices=("reward", "score"), scope="train"),
    Param("save_best_after", int, 100_000, "Keep a best checkpoint only after this many env frames", scope="train",
          min_value=0, max_value=10**15),
    Param("save_milestones_sec", int, -1, "Every this many seconds, also keep a copy of the checkpoint in "
          "checkpoint_p0/milestones/ that is never pruned (-1 or 0: no milestones)", scope="train", min_value=-1,
          max_value=10**10),
    Param("stats_avg", int, 100, "Episodes averaged for reward statistics", scope="train", min_value=1,
          max_value=10**6),
    Param("report_interval_sec", float, 5.0, "Console report period", scope="train", min_value=0.1, max_value=86400.0),
    Param("experiment_summaries_interval", float, 10.0, "TensorBoard summary period in seconds", scope="train",
          min_value=0.1, max_value=86400.0),
]

# Weights & Biases (Sample Factory's flags).
WANDB_PARAMS: list[Param] = [
    Param("with_wandb", str2bool, False, "Log the run's summaries to Weights & Biases too", scope="train"),
    Param("wandb_user", optional_str, None, "W&B entity (user or team); None: the logged-in user's default",
          scope="train", check=label_problem),
    Param("wandb_project", str, "sf", "W&B project", scope="train", check=wandb_project_problem),
    Param("wandb_group", optional_str, None, "W&B group of the run (None: none)", scope="train", check=label_problem),
    Param("wandb_job_type", optional_str, None, "W&B job type of the run (None: none)", scope="train",
          check=label_problem),
    Param("wandb_tags", str, [], "W&B tags of the run (0 or more, each 1-64 characters)", nargs="*", scope="train",
          check=wandb_tags_problem),
]

# enjoy.py: the checkpoint, rendering, the video, when to stop.
ENJOY_PARAMS: list[Param] = [
    Param("load_checkpoint_kind", str, "latest", "Checkpoint to load", choices=("latest", "best"), scope="enjoy"),
    Param("no_render", str2bool, False, "Run headless (no window)", scope="enjoy", nargs="?"),
    Param("save_video", str2bool, False, "Write an H.264 .mp4 of the episodes (yuv420p: plays in browsers and common "
          "players) at the game's render resolution", scope="enjoy", nargs="?"),
    Param("video_name", optional_str, None, "Video file name, ending in .mp4: a bare name goes in the experiment dir, "
          "a path is taken as given (default: replay_<experiment>.mp4 in the experiment dir)", scope="enjoy",
          check=path_problem),
    Param("video_gif", str2bool, False, "With --save_video: also write an animated GIF beside the .mp4 (same name, "
          ".gif; GIFs grow fast: keep them short with --video_frames)", scope="enjoy", nargs="?"),
    Param("video_frames", int, 1_000_000_000, "Maximum frames written to the video", scope="enjoy", min_value=1,
          max_value=10**12),
    Param("fps", int, 0, "Video/window frame rate (0: the env's natural rate)", scope="enjoy", min_value=0,
          max_value=1000),
    Param("max_num_episodes", int, 1_000_000_000, "Stop after this many episodes", scope="enjoy", min_value=1,
          max_value=10**12),
    Param("max_num_frames", int, 1_000_000_000, "Stop after this many env frames", scope="enjoy", min_value=1,
          max_value=10**15),
    Param("eval_deterministic", str2bool, False, "Take the most likely action instead of sampling", scope="enjoy",
          nargs="?"),
    Param("policy_index", int, [0], "The policies that play (a population): agent a of a multi-agent env is played by "
          "the a-th of them (cycling), a single-agent env by the first", scope="enjoy", nargs="+", min_value=0,
          max_value=63),
]

PARAMS: list[Param] = [*RUN_PARAMS, *SAMPLING_PARAMS, *POPULATION_PARAMS, *RUNTIME_PARAMS, *LEARNING_PARAMS,
                       *MODEL_PARAMS, *BUDGET_PARAMS, *WANDB_PARAMS, *ENJOY_PARAMS]

# Parameters that describe the run's identity: never taken from a saved config.json over the command line.
NOT_RESUMED = {"restart_behavior", "train_dir", "experiment"}

# Named checks an env parameter (a dict in sf_envs/params.py) may give as "check".
NAMED_CHECKS: dict[str, Callable[[Any], Optional[str]]] = {"path": path_problem}


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
                typ = optional_int if typ is int else optional_str
            check = p.get("check")
            p = Param(p["name"], typ, p.get("default"), p.get("help", ""), p.get("choices"), p.get("nargs"),
                      scope=p.get("scope", "all"), min_value=p.get("min_value"), max_value=p.get("max_value"),
                      min_exclusive=p.get("min_exclusive", False), max_exclusive=p.get("max_exclusive", False),
                      check=NAMED_CHECKS[check] if isinstance(check, str) else check)
        params.append(p)
    return params


def copy_default(v):
    """A default of the table for one configuration: a list is copied (a run may not change the table's)."""
    return list(v) if isinstance(v, list) else v
