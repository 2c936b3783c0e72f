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
    category: str = ""  # "ignored" flags: why ignoring them changes nothing that is trained (a key of COSMETIC)


# Why an ignored flag changes nothing that is trained: the only reasons a Sample Factory flag may be accepted and
# ignored (tests/cfg/test_sf_flag_walk.py). A flag that would change what is trained is implemented or refused.
COSMETIC = {
    "logging": "what is logged, counted or reported, and how often",
    "checkpoints": "when checkpoints are written",
    "internals": "how Sample Factory's own processes are run (threads, GPUs for envs, buffers, start-up delays, "
                 "timeouts); the samples and the updates are those of this implementation's processes",
    "refused": "an option of a feature that is refused here (CPC|A, instruction encoders, the dummy sampler)",
    "hub": "uploading to the Hugging Face Hub",
}

_NOT_GIVEN = object()  # an alias's value meaning "not given" (Sample Factory's "None / -1: the default")


def _alias(name, target, why="", **kw) -> SFFlag:
    return SFFlag(name, "alias", why, target, **kw)


def _only(name, type, ok, why, nargs=None, **kw) -> SFFlag:
    return SFFlag(name, "only", why, type=type, ok=ok, nargs="?" if type is str2bool else nargs, **kw)


def _ignored(name, category, type, why, scope="train", nargs=None) -> SFFlag:
    assert category in COSMETIC, category
    return SFFlag(name, "ignored", why, type=type, nargs="?" if type is str2bool else nargs, scope=scope,
                  category=category)


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
    _only("aux_loss_coeff", float, (0.0,), "auxiliary losses are not implemented: 0"),
    _only("decoder_mlp_layers", int, ([],), "no layers between the core and the heads here", nargs="*"),
    _only("encoder_type", str, ("conv", "mlp", "resnet"), "conv, mlp or resnet: the encoder is chosen from the "
          "observation space (--encoder_conv_architecture for images, --encoder_mlp_layers for vectors)",
          note="chosen from the observation space here (--encoder_conv_architecture for images, e.g. resnet_impala "
          "(--encoder_subtype); MLP for vectors)"),
    _only("encoder_custom", optional_str, (None,), "custom encoders are not implemented"),
    _only("encoder_extra_fc_layers", int, (1,), "one fully connected layer (--hidden_size) after the conv layers; "
          "for other layers give --encoder_conv_mlp_layers"),
    _only("use_cpc", str2bool, (False,), "CPC|A is not implemented"),
    _only("use_spectral_norm", str2bool, (False,), "spectral normalization is not implemented"),
    _only("experiments_root", optional_str, (None,), "experiments are train_dir/experiment here: give the subdirectory "
          "in --train_dir"),
    _only("record_to", optional_str, (None,), "recording ViZDoom demos is not implemented; --save_video writes an .mp4",
          scope="enjoy"),
    _only("eval_env_frameskip", optional_int, (None,), "enjoy steps the env with the training --env_frameskip",
          scope="enjoy"),
    _only("push_to_hub", str2bool, (False,), _HUB, scope="enjoy"),
    # --- no meaning here: accepted, a line in the log ---
    _ignored("benchmark", 'internals', str2bool,
             "Sample Factory's benchmark mode; see --sampler_only, --random_policy"),
    _ignored("summaries_use_frameskip", 'logging', str2bool, "summaries count env frames, frameskip included (Sample "
             "Factory's default True)"),
    _ignored("decorrelate_experience_max_seconds", 'internals', int, _DECORRELATE),
    _ignored("decorrelate_envs_on_one_worker", 'internals', str2bool, _DECORRELATE),
    _ignored("num_minibatches_to_accumulate", 'internals', int, _BUFFERS),
    _ignored("traj_buffers_excess_ratio", 'internals', float, _BUFFERS),
    _ignored("batched_sampling", 'internals', str2bool, "a rollout worker steps its envs one by one; the policy "
             "workers batch inference"),
    _ignored("actor_worker_gpus", 'internals', int, "envs run on the CPU here", nargs="*"),
    _ignored("env_gpu_actions", 'internals', str2bool, "envs run on the CPU here"),
    _ignored("env_gpu_observations", 'internals', str2bool, "envs run on the CPU here"),
    _ignored("pixel_format", 'internals', str, "observation layouts are handled by the env integrations"),
    _ignored("use_record_episode_statistics", 'logging', str2bool, "episode statistics come from the env integrations"),
    _ignored("use_env_info_cache", 'internals', str2bool,
             "the env is made once at start-up to check the configuration"),
    _ignored("force_envs_single_thread", 'internals', str2bool, _INTERNALS),
    _ignored("default_niceness", 'internals', int, _INTERNALS),
    _ignored("train_in_background_thread", 'internals', str2bool, _INTERNALS),
    _ignored("learner_main_loop_num_cores", 'internals', int, _INTERNALS),
    _ignored("reset_timeout_seconds", 'internals', int, "a stuck env is found by --stall_timeout_sec"),
    _ignored("heartbeat_interval", 'internals', int, "a stuck process is found by --stall_timeout_sec"),
    _ignored("heartbeat_reporting_interval", 'logging', int, "a stuck process is found by --stall_timeout_sec"),
    _ignored("log_to_file", 'logging', str2bool, "the log always goes to sf_log.txt in the experiment directory"),
    _ignored("flush_summaries_interval", 'logging', int, "summaries are flushed as they are written"),
    _ignored("save_best_every_sec", 'checkpoints', int,
             "the best checkpoint is considered at every checkpoint (--save_every_sec)"),
    _ignored("dmlab_one_task_per_worker", 'internals', str2bool, "dmlab_30: env i runs level i % 30"),
    _ignored("dmlab_with_instructions", 'refused', str2bool,
             "language instructions are not part of the observation here"),
    _ignored("dmlab_throughput_benchmark", 'internals', str2bool, "see --random_policy"),
    _ignored("dmlab_gpus", 'internals', int, "--dmlab_renderer chooses the renderer", nargs="*"),
    _ignored("sample_env_frames", 'refused', int, "only for Sample Factory's DUMMY_SAMPLER (--algo)"),
    _ignored("cpc_forward_steps", 'refused', int, "CPC|A options; CPC|A is not implemented (--use_cpc False)"),
    _ignored("cpc_time_subsample", 'refused', int, "CPC|A options; CPC|A is not implemented (--use_cpc False)"),
    _ignored("cpc_forward_subsample", 'refused', int, "CPC|A options; CPC|A is not implemented (--use_cpc False)"),
    _ignored("hf_repository", 'hub', optional_str, _HUB, scope="enjoy"),
    _ignored("train_script", 'hub', optional_str, _HUB, scope="enjoy"),
    _ignored("enjoy_script", 'hub', optional_str, _HUB, scope="enjoy"),
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
