"""Sample Factory's command lines run as written: each flag of Sample Factory's (1.x and 2.x) that is not one of our
parameters under that name is an alias of one (stored under our name), selects something not implemented (only what
we do is accepted, anything else is one line naming the flag) or has no meaning here (accepted, not stored, one line
in the run log). `SF_FLAGS` lists them; --help shows them under their own heading."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from sf.cfg.params import Param, optional_int, optional_str, str2bool
from sf.cfg.validate import ValueProblem, convert, problem_message
from sf.utils.errors import ConfigError


@dataclass(frozen=True)
class SFFlag:
    """A flag of Sample Factory's (1.x and 2.x) command lines that is not one of our parameters under that name, so
    that the training and enjoy commands of its documentation run here as written. `kind`:

    - "alias": our parameter `target` under Sample Factory's name. The value (converted by `type`, then mapped by
      `value` when given) is checked as the target's and stored under the target's name (config.json never has the
      alias). Given together with the target's own flag, the two must agree (`agrees`, else equality): one line
      otherwise. `value` may return _NOT_GIVEN (e.g. SF's "None: the env's default"): as if not given.
    - "only": Sample Factory selects something with it; the values in `ok` are what this implementation does and are
      accepted (with `note`, a line in the run log); any other value is refused in one line: the flag, its value
      and `why`.
    - "ignored": no meaning here (tuning of Sample Factory's own internals): the value is checked for its type,
      not stored, and the run log has one line naming it and `why`.
    docs/sf_flags.md has the whole table (every Sample Factory flag: same / alias / implemented / refused / ignored)."""
    name: str
    kind: str
    why: str = ""
    target: Optional[str] = None
    type: Callable = str  # int, float, str2bool, str, optional_int, optional_str
    ok: tuple = ()
    value: Optional[Callable[[Any], Any]] = None
    agrees: Optional[Callable[[Any, Any], bool]] = None
    note: str = ""
    nargs: Optional[str] = None  # "?" for booleans (a bare flag means True, as SF's store_true flags), "*" for lists
    scope: str = "all"  # "all", "train", "enjoy" (an alias takes its target's)


_NOT_GIVEN = object()  # an alias's value meaning "not given" (Sample Factory's "None / -1: the default")


def _one_layer(layers: list) -> int:
    if len(layers) != 1:
        raise ValueProblem(f"must be one layer here (the fully connected layer after the conv layers, --hidden_size), "
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
    _alias("timelimit", "doom_bots_timelimit", "minutes; None: the default", type=optional_str,
           value=lambda v: _NOT_GIVEN if v is None else v),
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
    _only("start_bot_difficulty", optional_int, (None,), "Sample Factory's adaptive bot difficulty is not implemented; "
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
    _only("encoder_custom", optional_str, (None,), "custom encoders are not implemented"),
    _only("encoder_extra_fc_layers", int, (1,), "one fully connected layer (--hidden_size) after the conv layers"),
    _only("use_cpc", str2bool, (False,), "CPC|A is not implemented"),
    _only("use_spectral_norm", str2bool, (False,), "spectral normalization is not implemented"),
    _only("experiments_root", optional_str, (None,), "experiments are train_dir/experiment here: give the subdirectory "
          "in --train_dir"),
    _only("record_to", optional_str, (None,), "recording ViZDoom demos is not implemented; --save_video writes an .mp4",
          scope="enjoy"),
    _only("policy_initialization", str, ("orthogonal",), "only orthogonal initialization is implemented"),
    _only("actor_critic_share_weights", str2bool, (True,), "the actor and the critic share the encoder and core here"),
    _only("adaptive_stddev", str2bool, (True,), "the Gaussian's log-std is an output of the network here"),
    _only("eval_env_frameskip", optional_int, (None,), "enjoy steps the env with the training --env_frameskip",
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
    _ignored("hf_repository", optional_str, _HUB, scope="enjoy"),
    _ignored("train_script", optional_str, _HUB, scope="enjoy"),
    _ignored("enjoy_script", optional_str, _HUB, scope="enjoy"),
]
SF_DEST = "_sf_flag:"  # argparse destination prefix of Sample Factory's flags (kept apart from the parameters)
# Values of our parameters under Sample Factory's spelling.
SF_VALUES: dict[str, dict[str, str]] = {"device": {"gpu": "cuda"}}


def _shown_as_given(v: Any) -> str:
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
        except ValueProblem as e:
            raise ConfigError(problem_message(f"--{f.name}", str(e))) from None
        if f.kind == "ignored":
            ignored.setdefault(f.why, []).append(f"--{f.name} {_shown_as_given(v)}")
        elif v not in f.ok:
            refused.append(f"--{f.name} {_shown_as_given(v)}: {f.why}")
        elif f.note:
            notes.append(f"--{f.name} {_shown_as_given(v)}: {f.note}")
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
            if v is _NOT_GIVEN:
                continue
            v = convert(params[f.target], v)
        except ValueProblem as e:
            raise ConfigError(problem_message(flag, str(e))) from None
        if f.target not in explicit:
            explicit[f.target] = v
        elif not (f.agrees(v, explicit[f.target]) if f.agrees else v == explicit[f.target]):
            raise ConfigError(f"{flag} {_shown_as_given(given[f.name])} conflicts with --{f.target} "
                              f"{_shown_as_given(explicit[f.target])}: {flag} is Sample Factory's name for --{f.target}"
                              f"{f' ({f.why})' if f.why else ''}; give one of them")


def sf_flag_help(f: SFFlag) -> str:
    if f.kind == "alias":
        text = f"Sample Factory's name for --{f.target}{f' ({f.why})' if f.why else ''}"
    elif f.kind == "only":
        text = f"Accepted: {', '.join(_shown_as_given(x) for x in f.ok)}; anything else is refused: {f.why}"
    else:
        text = f"Accepted and ignored, with a line in the log: {f.why}"
    return text.replace("%", "%%")
