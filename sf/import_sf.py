"""A Sample Factory 2.x experiment as one of ours: enjoy.py, python -m sf.eval / sf.export / sf.card and resumed
training then work on it as on one that train.py wrote.

    python -m sf.import_sf SF_EXPERIMENT_DIR --experiment NAME [--train_dir DIR]

SF_EXPERIMENT_DIR is what Sample Factory 2.x writes (and its model repositories hold): config.json and
checkpoint_p{N}/checkpoint_*.pth for each policy N < its num_policies. Writes DIR/NAME (default DIR: train_dir) as
train.py's runner would: config.json (sf.cfg.save_cfg) and, for each policy, its newest Sample Factory checkpoint as
one of ours (sf.learning.checkpoint.make_checkpoint_state, written by CheckpointManager.save).

The configuration. Each key of Sample Factory's config.json that is one of its flags (sf/cfg/sf_flag_list.py) is given
to sf.cfg.parse_cfg as that flag, so it is checked and mapped exactly as on train.py's command line (our parameter
under the same name, an alias, a value that only what is implemented here may take, or a flag without meaning here,
listed as a note). The host's and the run's own keys (device, train_dir, experiment, command_line, git_hash, ...) and
evaluation-only settings (fps, eval_env_frameskip, ...) are not imported. normalize_input with normalize_input_keys
None normalizes every observation key in Sample Factory (images too, per pixel): here that is normalize_input_keys =
every key.

The model. Weights are mapped by module (Sample Factory's encoder of each observation key, core, critic_linear,
action_parameterization; actor_*/critic_* with separate weights) and, inside each, by order and shape; the action
head's rows are split over our per-sub-space heads. The observation normalizer (running mean, var, count per key) and
the returns normalizer become ours (float32 statistics; Sample Factory keeps float64). Its train_step is our policy
version, its env_steps our env frames (times the frameskip where it counted agent steps: summaries_use_frameskip
False). Its optimizer state (Adam or LAMB moments) is mapped by the same parameter mapping; where it does not fit,
resumed training starts a fresh one (a line says so). The learning-rate schedule carries on: linear_decay from the env
frames trained, kl_adaptive_* from its current rate.

One difference in what the model computes: Sample Factory clamps the normalized value to [-5, 5] before denormalizing
it (values beyond 5 return standard deviations from the running mean); ours does not.

Everything is read and checked before anything is written; the experiment appears under its name at once (built in a
temporary directory beside it, then renamed). Bad input (no such directory, no config.json, a key that cannot be
honoured, no checkpoint, a checkpoint of another architecture, an existing DIR/NAME) is one line on stderr and exit
code 2, with nothing written.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from sf.cfg import (ConfigError, OneLineArgumentParser, RunError, all_params, default_cfg, parse_cfg, run_guarded,
                    save_cfg, validate_experiment_name, validate_train_dir)
from sf.cfg.parse import read_json_object
from sf.cfg.sf_compat import SF_FLAGS
from sf.cfg.sf_flag_list import SF_2_1_1_FLAGS
from sf.policy_loading import open_env
from sf.utils.files import fsync_dir, one_line, temp_path
from sf_envs.registry import env_spec

if TYPE_CHECKING:
    from sf.cfg.config import Config

# torch and what imports it (the model, the learner, the checkpoint code) are imported where used: --help and bad
# input answer at once.

# Keys of Sample Factory's config.json that describe the host or the run, not the experiment.
HOST_KEYS = frozenset({"device", "train_dir", "experiment", "experiments_root", "restart_behavior", "command_line",
                       "cli_args", "git_hash", "git_repo_name", "help"})
SF_OBS_NORMALIZER = "obs_normalizer.running_mean_std.running_mean_std."
SF_RETURNS_NORMALIZER = "returns_normalizer."
SF_BUFFER_PREFIXES = ("obs_normalizer.", "returns_normalizer.")  # all else in its state dict are parameters


class Entry(NamedTuple):
    """One tensor of our model's state dict, taken from Sample Factory's `sf_key` (rows `rows` of it, when not None)."""
    ours: str
    sf_key: str
    rows: Optional[tuple[int, int]] = None


# --- Sample Factory's experiment directory ---------------------------------------------------------------------------
def read_sf_config(sf_dir: Path) -> dict:
    """Its config.json; one-line ConfigError unless `sf_dir` is a directory holding one (a JSON object)."""
    try:
        if not sf_dir.is_dir():
            what = "is not a directory" if os.path.lexists(sf_dir) else "does not exist"
            raise ConfigError(f"Sample Factory experiment directory {sf_dir} {what}")
        path = sf_dir / "config.json"
        if not path.is_file():
            raise ConfigError(f"{sf_dir} is not a Sample Factory experiment directory (no config.json); give the "
                              "directory that holds config.json and checkpoint_p0/")
    except OSError as e:
        raise RunError(f"cannot read {sf_dir}: {e.strerror or e}") from None
    return read_json_object(path, str(path))


def _flag_args(key: str, value: Any) -> list[str]:
    """`--key=value` as parse_cfg takes it (None as None); a list as its entries (none: the flag alone)."""
    if isinstance(value, list):
        return [f"--{key}", *map(str, value)]
    return [f"--{key}={value}"]  # `=`: a value that starts with '-' stays the flag's


def config_argv(sf_cfg: dict, shown: str) -> list[str]:
    """The flags of Sample Factory's configuration `sf_cfg` (see the module docstring). ConfigError naming every key
    that is not one of Sample Factory 2.1.1's flags (nothing here could honour it)."""
    evaluation = {p.name for p in all_params() if p.scope == "enjoy"} | {f.name for f in SF_FLAGS if f.scope == "enjoy"}
    unknown = [k for k in sf_cfg if k not in SF_2_1_1_FLAGS and k not in HOST_KEYS]
    if unknown:
        raise ConfigError(f"{shown}: key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}: not "
                          "a flag of Sample Factory 2.1.1 (an env's own parameter?); cannot honour it here")
    if not isinstance(sf_cfg.get("env"), str):
        raise ConfigError(f"{shown}: no 'env' (a string) in it; not a Sample Factory configuration")
    argv = []
    for key, value in sf_cfg.items():
        if key in HOST_KEYS or key in evaluation:
            continue
        if value is None and key == "normalize_input_keys":  # Sample Factory's "every key": set from the env below
            continue
        argv += _flag_args(key, value)
    return argv


def resolve_cfg(sf_cfg: dict, shown: str, experiment: str, train_dir: str, prog: str):
    """Our configuration of the experiment (ConfigError naming the config.json for anything refused) and the env's
    (observation space, action space)."""
    argv = config_argv(sf_cfg, shown) + ["--experiment", experiment, "--train_dir", train_dir]

    def parse(extra):
        try:
            return parse_cfg(argv + extra, mode="train", prog=prog)
        except ConfigError as e:
            raise ConfigError(f"{shown}: {e}") from None

    cfg = parse([])
    env = open_env(cfg)
    try:
        obs_space, action_space = env.observation_space, env.action_space
    finally:
        env.close()
    if cfg.normalize_input and sf_cfg.get("normalize_input_keys") is None:
        from sf.model.action_spaces import ACTION_MASK_KEY
        cfg = parse(["--normalize_input_keys", *(k for k in obs_space.spaces if k != ACTION_MASK_KEY)])
    _check_obs_preprocessing(cfg, obs_space, shown)
    return cfg, obs_space, action_space


def _check_obs_preprocessing(cfg: Config, obs_space, shown: str) -> None:
    """Sample Factory applies obs_subtract_mean and obs_scale to the key "obs" only, whatever its shape; here they apply
    to every image key and never to a vector: refused where the two differ."""
    if cfg.obs_scale == 1.0 and cfg.obs_subtract_mean == 0.0:
        return
    from sf.model.action_spaces import ACTION_MASK_KEY
    for key, space in obs_space.spaces.items():
        image = len(space.shape) == 3
        if image != (key == "obs") and key != ACTION_MASK_KEY:
            raise ConfigError(f"{shown}: obs_scale {cfg.obs_scale} / obs_subtract_mean {cfg.obs_subtract_mean}: Sample "
                              f"Factory applies them to the key 'obs' only, here to every image key: observation key "
                              f"{key!r} ({list(space.shape)}) would be preprocessed differently")


def newest_checkpoint(sf_dir: Path, policy: int) -> Path:
    """Policy `policy`'s newest regular checkpoint, as Sample Factory picks it (the last name in sorted order)."""
    ckpt_dir = sf_dir / f"checkpoint_p{policy}"
    try:
        names = sorted(p.name for p in ckpt_dir.glob("checkpoint_*.pth")) if ckpt_dir.is_dir() else []
    except OSError as e:
        raise RunError(f"cannot read {ckpt_dir}: {e.strerror or e}") from None
    if not names:
        raise ConfigError(f"no Sample Factory checkpoint (checkpoint_*.pth) in {ckpt_dir}")
    return ckpt_dir / names[-1]


def _numpy_scalars() -> list:
    """What rebuilds a numpy scalar (a dtype and its bytes: data, no code), for torch.load(weights_only=True): Sample
    Factory stores its best_performance as one (the mean of episode stats) once it has saved a best checkpoint. Files
    pickled under numpy 1 or 2 name the constructor differently."""
    import numpy as np
    scalar = (np._core if hasattr(np, "_core") else np.core).multiarray.scalar
    dtypes = [type(np.dtype(t)) for t in ("f8", "f4", "i8", "i4", "?")]
    return [(scalar, "numpy.core.multiarray.scalar"), (scalar, "numpy._core.multiarray.scalar"), np.dtype, *dtypes]


def load_sf_checkpoint(path: Path) -> dict:
    """The checkpoint's content (loaded with weights_only=True: no pickled code runs); one-line ConfigError unless it
    has Sample Factory's keys."""
    import torch
    try:
        with torch.serialization.safe_globals(_numpy_scalars()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as e:
        raise RunError(f"cannot read {path}: {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001 - not a torch file, or one holding objects weights_only refuses
        code = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        why = (f"it holds a {code.group(1)}, which is loaded only by running pickled code" if code
               else f"not a file that torch.save wrote: {type(e).__name__}")
        raise ConfigError(f"{path} is not a readable Sample Factory checkpoint ({why})") from None
    model = state.get("model") if isinstance(state, dict) else None
    counts = [state.get(k) for k in ("train_step", "env_steps")] if isinstance(state, dict) else [None]
    if (not isinstance(model, dict) or not all(torch.is_tensor(t) for t in model.values())
            or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)):
        raise ConfigError(f"{path} is not a Sample Factory checkpoint (expected a dict with model, train_step, "
                          "env_steps)")
    return state


# --- the weights ---------------------------------------------------------------------------------------------------
class ArchitectureMismatch(Exception):
    """The checkpoint's tensors do not fit the model of the configuration; the message says where."""


def _encoder_prefixes(sf_keys: list[str], sf_enc: str, ours: str, keys: list[str]) -> list[tuple[str, str]]:
    """(Sample Factory's prefix, ours) of each observation key's encoder: MultiInputEncoder's `encoders.<key>`, or the
    Doom examples' VizdoomEncoder (`basic_encoder` for obs, `measurements_head`). Its MultiInputEncoder concatenates the
    keys in sorted order, ours "obs" first: a checkpoint where those orders differ is refused."""
    pairs, multi = [], f"{sf_enc}.encoders."
    for key in keys:
        names = [f"{multi}{key}."] + ([f"{sf_enc}.basic_encoder."] if key == "obs" else []) + (
            [f"{sf_enc}.measurements_head."] if key == "measurements" else [])
        found = [n for n in names if any(k.startswith(n) for k in sf_keys)]
        if not found:
            raise ArchitectureMismatch(f"it has no encoder of observation key {key!r} under {sf_enc}.")
        pairs.append((found[0], f"{ours}.{key}_encoder."))
    in_multi = [k for k in keys if any(s.startswith(f"{multi}{k}.") for s in sf_keys)]
    if len(in_multi) > 1 and in_multi != sorted(in_multi):
        raise ArchitectureMismatch(f"its encoder concatenates the observation keys as {', '.join(sorted(in_multi))}, "
                                   f"this model as {', '.join(in_multi)}")
    return pairs


def weight_plan(sf_model: dict, model) -> list[Entry]:
    """Where each tensor of `model`'s state dict comes from in Sample Factory's state dict `sf_model` (see the module
    docstring). ArchitectureMismatch naming the first tensor that has no counterpart, or one of another shape."""
    sf_keys = list(sf_model)
    ours = model.state_dict()
    params = [n for n, _ in model.named_parameters()]
    separate = model.critic_encoder is not None
    modules = [("actor_encoder" if separate else "encoder", "encoder", model.encoder)]
    cores = [("actor_core" if separate else "core", "core", model.core)]
    if separate:
        modules.append(("critic_encoder", "critic_encoder", model.critic_encoder))
        cores.append(("critic_core", "critic_core", model.critic_core))
    groups = []  # (Sample Factory's prefix, ours): matched by order and shape
    for sf_enc, enc_name, enc in modules:
        groups += _encoder_prefixes(sf_keys, sf_enc, enc_name, enc.keys)
    groups += [(f"{sf_core}.core.", f"{name}.rnn.") for sf_core, name, core in cores if model.is_recurrent]
    groups.append(("critic_linear.", "critic."))
    plan: list[Entry] = []
    for sf_prefix, prefix in groups:
        theirs = [k for k in sf_keys if k.startswith(sf_prefix)]
        mine = [n for n in params if n.startswith(prefix)]
        if len(theirs) != len(mine):
            raise ArchitectureMismatch(f"it has {len(theirs)} tensors under {sf_prefix}, this model {len(mine)} under "
                                       f"{prefix}")
        plan += [Entry(m, t) for m, t in zip(mine, theirs)]
    plan += _head_plan(sf_model, model)
    plan += _normalizer_plan(sf_model, model, [enc for _, _, enc in modules], [name for _, name, _ in modules])
    for e in plan:  # shapes
        t = sf_model[e.sf_key]
        shape = list(t.shape) if e.rows is None else [e.rows[1] - e.rows[0], *t.shape[1:]]
        scalar = e.sf_key.startswith(SF_BUFFER_PREFIXES) and t.numel() == ours[e.ours].numel() == 1  # [1] -> []
        if shape != list(ours[e.ours].shape) and not scalar:
            raise ArchitectureMismatch(f"its {e.sf_key} has shape {shape}, this model's {e.ours} "
                                       f"{list(ours[e.ours].shape)}")
    used = {e.sf_key for e in plan}
    left = [k for k in sf_keys if k not in used]
    if left:
        raise ArchitectureMismatch(f"its {left[0]} has no counterpart in this model")
    filled = {e.ours for e in plan}
    missing = [k for k in ours if k not in filled]
    if missing:
        raise ArchitectureMismatch(f"it has nothing for this model's {missing[0]}")
    return plan


def _head_plan(sf_model: dict, model) -> list[Entry]:
    """The action heads: Sample Factory's one distribution_linear over every sub-space, split by rows over ours; its
    learned_stddev (Box actions without adaptive stddev) is our action_log_std."""
    sf_head = "action_parameterization.distribution_linear."
    plan, row = [], 0
    for i, head in enumerate(model.action_heads):
        n = head.out_features
        plan += [Entry(f"action_heads.{i}.{p}", f"{sf_head}{p}", (row, row + n)) for p in ("weight", "bias")]
        row += n
    if not all(f"{sf_head}{p}" in sf_model for p in ("weight", "bias")):
        raise ArchitectureMismatch(f"it has no {sf_head}weight and bias (the action head)")
    if sf_model[f"{sf_head}weight"].shape[0] != row:
        raise ArchitectureMismatch(f"its action head has {sf_model[f'{sf_head}weight'].shape[0]} outputs, this model "
                                   f"{row} (another action space?)")
    if model.action_log_std is not None:
        plan.append(Entry("action_log_std", "action_parameterization.learned_stddev"))
    return [e if e.rows != (0, sf_model[e.sf_key].shape[0]) else e._replace(rows=None) for e in plan]


def _normalizer_plan(sf_model: dict, model, encoders: list, names: list[str]) -> list[Entry]:
    """Sample Factory's observation normalizer (one per key) for each of our encoders' normalizers (separate weights:
    both encoders get the same statistics), and its returns normalizer."""
    plan = []
    for enc, name in zip(encoders, names):
        for key in enc.keys:
            if hasattr(enc, f"{key}_normalizer"):
                sf_prefix = f"{SF_OBS_NORMALIZER}{key}."
                if f"{sf_prefix}running_mean" not in sf_model:
                    raise ArchitectureMismatch(f"it has no input normalizer of observation key {key!r} "
                                               f"({sf_prefix}running_mean)")
                plan += [Entry(f"{name}.{key}_normalizer.{b}", f"{sf_prefix}{s}")
                         for b, s in (("mean", "running_mean"), ("var", "running_var"), ("count", "count"))]
    if model.returns_normalizer is not None:
        plan += [Entry(f"returns_normalizer.{b}", f"{SF_RETURNS_NORMALIZER}{s}")
                 for b, s in (("mean", "running_mean"), ("var", "running_var"), ("count", "count"))]
    return plan


def _take(t, entry: Entry, like):
    """Sample Factory's tensor `t` as our `like` (its rows, shape and dtype)."""
    if entry.rows is not None:
        t = t[entry.rows[0]:entry.rows[1]]
    return t.reshape(like.shape).to(like.dtype).clone()


def load_weights(model, sf_model: dict, plan: list[Entry]) -> None:
    state = model.state_dict()
    model.load_state_dict({e.ours: _take(sf_model[e.sf_key], e, state[e.ours]) for e in plan})


def map_optimizer_state(sf_state: Any, sf_model: dict, plan: list[Entry], model, optimizer) -> Optional[str]:
    """Load Sample Factory's optimizer state into `optimizer` (built over model.parameters()): its parameters are those
    of its state dict in order, normalizers left out; each of ours takes the state of the one it was mapped from (rows
    and shape as the weight). Returns why it could not, or None."""
    import torch
    if sf_state is None:
        return "the checkpoint has none"
    if not (isinstance(sf_state, dict) and isinstance(sf_state.get("state"), dict)
            and isinstance(sf_state.get("param_groups"), list) and len(sf_state["param_groups"]) == 1):
        return "not one parameter group"
    sf_params = [k for k in sf_model if not k.startswith(SF_BUFFER_PREFIXES)]
    if len(sf_state["param_groups"][0].get("params", [])) != len(sf_params):
        return f"{len(sf_state['param_groups'][0].get('params', []))} parameters, its model {len(sf_params)}"
    index = {k: sf_state["param_groups"][0]["params"][i] for i, k in enumerate(sf_params)}
    by_ours = {e.ours: e for e in plan}
    state = {}
    for i, (name, p) in enumerate(n for n in model.named_parameters() if n[1].requires_grad):
        e = by_ours[name]
        theirs = sf_state["state"].get(index[e.sf_key])
        if theirs is None:  # never stepped there: none here either
            continue
        shape = sf_model[e.sf_key].shape
        state[i] = {k: (_take(v, e, p.detach()) if torch.is_tensor(v) and v.shape == shape else v)
                    for k, v in theirs.items()}
    try:
        optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})
    except (ValueError, KeyError, RuntimeError, TypeError) as e:
        return one_line(e, 160)
    return None


# --- one policy ------------------------------------------------------------------------------------------------------
def import_policy(cfg: Config, obs_space, action_space, policy: int, path: Path, sf_state: dict, frameskip: int,
                  frames_counted_with_frameskip: bool) -> tuple[dict, str]:
    """Our checkpoint state of Sample Factory's checkpoint `sf_state` (from `path`), and a line on what was imported."""
    import torch
    from sf.learning.appo import APPO
    from sf.learning.checkpoint import make_checkpoint_state
    from sf.learning.learner import checkpoint_meta
    from sf.model.actor_critic import create_actor_critic
    from sf.processes.shared_state import shared_hyperparams
    model = create_actor_critic(cfg, obs_space, action_space)
    try:
        plan = weight_plan(sf_state["model"], model)
    except ArchitectureMismatch as e:
        raise ConfigError(f"{path} is a checkpoint of another architecture than its config.json describes: "
                          f"{e}") from None
    load_weights(model, sf_state["model"], plan)
    version = int(sf_state["train_step"])
    frames = int(sf_state["env_steps"]) * (1 if frames_counted_with_frameskip else frameskip)
    appo = APPO(model, cfg, torch.device("cpu"), policy_id=policy)
    why = map_optimizer_state(sf_state.get("optimizer"), sf_state["model"], plan, model, appo.optimizer)
    curr_lr = sf_state.get("curr_lr")
    schedule = {"kind": cfg.lr_schedule, "frames": float(frames)}
    if isinstance(curr_lr, (int, float)) and not isinstance(curr_lr, bool):  # kl_adaptive_*: the rate it adapted to
        schedule.update(adapted_rate=float(curr_lr), adapted_from=float(cfg.learning_rate))
    appo.load_training_state({"lr_schedule": schedule})  # (and the rate in force: the checkpoint's lr)
    extra = {"minibatch_rng": appo.generator.get_state(), "policy_id": policy,
             "hyperparams": shared_hyperparams(cfg), "world_size": 1,
             **appo.training_state(), "imported_from": str(path)}
    state = make_checkpoint_state(model, appo.optimizer if why is None else None, version, frames,
                                  checkpoint_meta(cfg, obs_space, action_space, model), extra=extra)
    note = (f"policy {policy}: {path} (policy version {version}, {frames} env frames), optimizer state "
            + ("mapped" if why is None else f"not mapped ({why}): resumed training starts a fresh one"))
    return state, note


# --- the command -----------------------------------------------------------------------------------------------------
def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog=prog, allow_abbrev=False,
                                   description="Import a Sample Factory 2.x experiment (config.json and "
                                               "checkpoint_p*/checkpoint_*.pth) as an experiment of this trainer.")
    parser.add_argument("sf_dir", metavar="SF_EXPERIMENT_DIR", help="Sample Factory's experiment directory")
    parser.add_argument("--experiment", required=True, help="the name of the imported experiment (a new one)")
    parser.add_argument("--train_dir", default=None, help="the directory to write it in (default: train_dir)")
    return parser


def run_import(args: argparse.Namespace, prog: str) -> Path:
    """Checks and converts everything (ConfigError), then writes the experiment; returns its directory."""
    train_dir = args.train_dir if args.train_dir is not None else default_cfg().train_dir
    validate_train_dir(train_dir)
    validate_experiment_name(args.experiment)
    exp_dir = Path(train_dir) / args.experiment
    _check_new(exp_dir)
    sf_dir = Path(args.sf_dir)
    sf_cfg = read_sf_config(sf_dir)
    shown = str(sf_dir / "config.json")
    cfg, obs_space, action_space = resolve_cfg(sf_cfg, shown, args.experiment, train_dir, prog)
    frameskip = env_spec(cfg.env, cfg).frameskip
    with_frameskip = sf_cfg.get("summaries_use_frameskip", True) is not False
    states, notes = [], []
    for p in range(cfg.num_policies):
        path = newest_checkpoint(sf_dir, p)
        state, note = import_policy(cfg, obs_space, action_space, p, path, load_sf_checkpoint(path), frameskip,
                                    with_frameskip)
        states.append(state)
        notes.append(note)
    write_experiment(cfg, exp_dir, states)
    ignored = [n for n in cfg._notes if ": ignored; " in n]  # Sample Factory's internals: named, not explained
    flags = [f for n in ignored for f in re.findall(r"--(\w+)", n.split(": ignored; ")[0])]
    notes += [f"note: {n}" for n in cfg._notes if n not in ignored]
    notes += [f"note: without meaning here (see docs/sf_flags.md): {', '.join(flags)}"] if flags else []
    print(f"Imported the Sample Factory experiment {sf_dir} as {exp_dir} (env {cfg.env}):")
    for line in notes:
        print(f"  {line}")
    return exp_dir


def _check_new(exp_dir: Path) -> None:
    if os.path.lexists(exp_dir):
        raise ConfigError(f"{exp_dir} exists; importing writes a new experiment: give another --experiment or "
                          "--train_dir")


def write_experiment(cfg: Config, exp_dir: Path, states: list[dict]) -> None:
    """config.json and each policy's checkpoint, in a temporary directory beside `exp_dir` renamed onto it at the end:
    the experiment appears whole or not at all."""
    from sf.learning.checkpoint import CheckpointError
    from sf.learning.checkpoint_store import CheckpointManager
    tmp = temp_path(exp_dir)
    try:
        exp_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        for p, state in enumerate(states):
            CheckpointManager(tmp, policy_id=p, keep_checkpoints=cfg.keep_checkpoints).save(
                state, state["policy_version"], state["env_steps"])
        save_cfg(cfg, tmp)
        _check_new(exp_dir)  # made meanwhile? never replaced
        os.rename(tmp, exp_dir)
        fsync_dir(exp_dir.parent)
    except OSError as e:
        raise RunError(f"cannot write the experiment {exp_dir}: {e.strerror or e}") from None
    except CheckpointError as e:
        raise RunError(str(e)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None, *, prog: str = "python -m sf.import_sf") -> int:
    """`python -m sf.import_sf`: bad input is one line on stderr and exit code 2, an I/O failure one line and exit 1."""
    def body() -> int:
        run_import(build_parser(prog).parse_args(argv), prog)
        return 0

    return run_guarded(prog, body)


if __name__ == "__main__":
    sys.exit(main())
