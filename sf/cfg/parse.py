"""The command line and the layers of a configuration: the argparse parser, the presets (configs/<family>.json),
`parse_cfg`, the saved config.json (read on resume and by enjoy, written by `save_cfg`), and the entry points'
one-line errors (`cli_main`, `run_guarded`).

    table defaults  <  configs/<family>.json "defaults"  <  its "envs"[<env>]  <  saved config.json
    (resume / enjoy)  <  flags given on the command line

The tools that only act on a saved experiment (enjoy mode: enjoy.py, sf.eval, sf.export, sf.card) skip its
MACHINE_KEYS: their device is this machine's (the flag given, else auto), so a run trained on CUDA plays where there
is none. A resumed training run keeps its saved device.
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from sf.cfg.config import Config, make_config
from sf.cfg.params import NOT_RESUMED, Param, all_params, copy_default
from sf.cfg.sf_compat import SF_DEST, SF_FLAGS, SF_VALUES, apply_sf_aliases, check_sf_flags, sf_flag_help
from sf.cfg.string_checks import default_experiment_name, validate_experiment_name, validate_train_dir
from sf.cfg.validate import from_command_line, from_file, range_text, scale_envs_per_worker, value_kind, verify
from sf.processes.control import usable_cores
from sf.utils.errors import ConfigError, RunError
from sf.utils.files import one_line, write_json_atomic

REPO_ROOT = Path(__file__).resolve().parent.parent.parent  # sf/cfg/parse.py -> the clone (or site-packages)
# The presets (configs/<family>.json): in an installed copy (wheel, `pip install .`) the package data `sf_configs`
# beside `sf` (setup.py maps the clone's configs/ to it); in a clone, also under `pip install -e .`, configs/ itself.
CONFIGS_DIR = next((d for d in (REPO_ROOT / "sf_configs", REPO_ROOT / "configs") if d.is_dir()), REPO_ROOT / "configs")
# Env families that ship a preset (the built-in families, listed in sf_envs/families.py, a module without imports):
# a missing file is a broken install.
try:
    from sf_envs.families import FAMILY_NAMES as FAMILIES_WITH_PRESETS
except ImportError:  # the env package is optional for the core library (as in sf.cfg.params.all_params)
    FAMILIES_WITH_PRESETS = ()
# Saved parameters that belong to the machine that trained, not to the experiment: enjoy mode does not layer them.
MACHINE_KEYS = frozenset({"device"})


# --- the command line -----------------------------------------------------------------------------------------------
class OneLineArgumentParser(argparse.ArgumentParser):
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
    parser = OneLineArgumentParser(prog=prog, argument_default=argparse.SUPPRESS, allow_abbrev=False,
                                   description="Asynchronous PPO (Sample Factory architecture). Defaults shown are "
                                               "the table defaults; configs/<family>.json presets override them.")
    for p in all_params():
        if p.scope not in ("all", mode):
            continue
        rng = range_text(p)
        valid = f"; range {rng}{' or None' if value_kind(p)[1] else ''}" if rng else ""
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
        kwargs = dict(type=str, help=sf_flag_help(f), dest=SF_DEST + f.name, metavar=f.name.upper())
        if f.nargs == "?":
            kwargs.update(nargs="?", const="True")
        elif f.nargs:
            kwargs["nargs"] = f.nargs
        group.add_argument(f"--{f.name}", **kwargs)
    return parser


# --- JSON files: presets and the saved config.json ------------------------------------------------------------------
def read_json_object(path: Path, shown: str) -> dict:
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
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{shown} is not valid JSON: {first}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{shown}: expected a JSON object {{\"key\": value, ...}}, got {_json_type(data)}")
    return data


def _json_type(v: Any) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null", dict: "an object"}.get(type(v), type(v).__name__)


def _preset_path_shown(path: Path) -> str:
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def load_preset(env_name: str, family: str, preset_set: Optional[str] = None) -> dict:
    """Values of configs/<family>.json: its "defaults", then the named set of its "sets" (`preset_set`; not given:
    the set that the env's group in "groups" names, if any; "family": none), then its "envs"[env_name] entry (raw
    JSON values, converted and checked by parse_cfg). ConfigError naming the file if it is not of that form, or
    naming --preset_set if the family has no such set.

    Every built-in family (FAMILIES_WITH_PRESETS) has a preset: a missing one is a ConfigError naming the file
    (an install without its package data would otherwise train silently with the table defaults). Families that
    users add with register_env() have none by design ({}: the table defaults), unless they put one in CONFIGS_DIR."""
    path = CONFIGS_DIR / f"{family}.json"
    if not path.exists():
        if family in FAMILIES_WITH_PRESETS:
            raise ConfigError(f"preset {path} of env family {family!r} is missing (an install without its package "
                              f"data sf_configs? reinstall: pip install .)")
        if preset_set not in (None, "family"):
            raise ConfigError(f"--preset_set {preset_set}: env family {family!r} has no preset; leave it out")
        return {}
    shown = _preset_path_shown(path)
    data = read_json_object(path, shown)
    defaults, sets, groups, envs = (_json_object(data, key, shown) for key in ("defaults", "sets", "groups", "envs"))
    for name, group in groups.items():
        members = _json_object(groups, name, shown, "groups")
        if not isinstance(members.get("envs", []), list) or members.get("set", "family") not in (*sets, "family"):
            raise ConfigError(f"{shown}: key 'groups'.{name!r}: expected {{\"envs\": [env names], \"set\": one of "
                              f"{', '.join(sets) or 'its sets'}}}")
        if preset_set is None and env_name in members.get("envs", []):
            preset_set = members.get("set")
    values = dict(defaults)
    if preset_set not in (None, "family"):
        if preset_set not in sets:
            raise ConfigError(f"--preset_set {preset_set}: {shown} has no such set (its sets: "
                              f"{', '.join(['family', *sets])})")
        values.update(_json_object(sets, preset_set, shown, "sets"))
    values.update(_json_object(envs, env_name, shown, "envs"))
    return values


def _json_object(data: dict, key: str, shown: str, parent: str = "") -> dict:
    """data[key] if it is a JSON object ({} when absent); ConfigError naming `shown` and the key (under `parent`'s)
    otherwise."""
    value = data.get(key, {})
    if not isinstance(value, dict):
        where = f"{parent!r}.{key!r}" if parent else repr(key)
        raise ConfigError(f"{shown}: key {where}: expected a JSON object, got {_json_type(value)}")
    return value


def save_cfg(cfg: Config, exp_dir: Path) -> Path:
    """Write the resolved configuration as exp_dir/config.json, atomically (write_json_atomic). Creates exp_dir if
    needed. Call it only after every check has passed. An OS error raises RunError (one line naming the file)."""
    return write_json_atomic(Path(exp_dir) / "config.json", cfg.as_dict())  # parameters only (not cfg._notes)


# --- one configuration, layer over layer ----------------------------------------------------------------------------
def parse_cfg(argv: Optional[Sequence[str]] = None, mode: str = "train", prog: str = "train.py",
              auto_layout: Optional[Callable] = None) -> Config:
    """Resolve the configuration of one run (see the module docstring for the layers). Raises ConfigError.
    Reads the preset and the saved config.json; writes nothing.

    `--num_workers auto` (train mode): `auto_layout(cfg, explicit) -> (source, {parameter: value}, log line)` gives
    the layout over every other layer except the flags given (sf.train passes sf.autolayout.resolve_auto, which reads
    its cache or measures); without it, "auto" is one line naming the flag."""
    raw = vars(build_parser(mode, prog).parse_args(argv))
    auto = mode == "train" and isinstance(raw.get("num_workers"), str) and raw["num_workers"].strip().lower() == "auto"
    if auto:
        if auto_layout is None:
            raise ConfigError("--num_workers auto (a measured layout) is train.py's (python -m sf.train); here give a "
                              "number in [1, 200]")
        del raw["num_workers"]
    sf_given = {k[len(SF_DEST):]: raw.pop(k) for k in list(raw) if k.startswith(SF_DEST)}
    if not raw.get("env"):
        raise ConfigError("--env is required, e.g. --env doom_basic (see --help)")
    notes = check_sf_flags(sf_given)  # first: a run Sample Factory's flags ask for that is not implemented here
    params = {p.name: p for p in all_params()}
    for k, spelling in SF_VALUES.items():  # e.g. Sample Factory's --device gpu
        if isinstance(raw.get(k), str) and raw[k] in spelling:
            raw[k] = spelling[raw[k]]
    explicit = {k: from_command_line(params[k], v) for k, v in raw.items()}
    apply_sf_aliases(sf_given, explicit, params)

    values = _preset_values(explicit["env"], params, explicit.get("preset_set"))
    values.update(explicit)
    if values["experiment"] is None:
        values["experiment"] = default_experiment_name(values["env"])
    validate_train_dir(values["train_dir"])  # before the saved config is looked for under them
    validate_experiment_name(values["experiment"])
    saved = _layer_saved_config(values, explicit, params, mode)
    if auto:  # the measured layout, under the flags given (checked as a file's values, naming the file)
        pre = dict(values, num_workers=1)  # bad input is one line before anything is measured; the layout to come
        pre["worker_num_splits"] = values["worker_num_splits"] if "worker_num_splits" in explicit else 1  # fits any
        pre["num_envs_per_worker"] = values["num_envs_per_worker"] if "num_envs_per_worker" in explicit else \
            pre["worker_num_splits"]
        verify(make_config(pre), mode)
        source, layout, note = auto_layout(make_config(values), frozenset(explicit))
        values.update({k: from_file(source, k, params[k], v) for k, v in layout.items() if k not in explicit})
        notes.append(note)
    if mode == "train":
        envs_given = "num_envs_per_worker" in explicit or "num_envs_per_worker" in saved or auto
        notes += _training_defaults(values, envs_given, set(explicit) | set(saved))
    # _notes: for the log (not saved); _explicit: the parameters given on the command line (a resumed PBT run: over
    # its state), --num_workers auto one of them
    cfg = make_config(values, _notes=tuple(notes), _explicit=frozenset(explicit) | ({"num_workers"} if auto else set()))
    verify(cfg, mode)
    return cfg


def _preset_values(env: str, params: dict[str, Param], preset_set: Optional[str] = None) -> dict[str, Any]:
    """The table defaults with the env family's preset over them (`preset_set`: see load_preset), every value of the
    preset checked."""
    try:  # the env integrations are a package of their own, which the core does not need to import
        from sf_envs.registry import env_spec  # (it raises a one-line error with close matches)
    except ImportError as e:
        raise ConfigError(f"--env {env}: the env integrations (package sf_envs) cannot be imported: {e}") from None
    try:
        spec = env_spec(env)
    except ValueError as e:
        raise ConfigError(f"--env: {e}") from None
    values = {name: copy_default(p.default) for name, p in params.items()}
    preset_shown = _preset_path_shown(CONFIGS_DIR / f"{spec.family}.json")
    # every value checked, even one a flag overrides
    for k, v in load_preset(spec.name, spec.family, preset_set).items():
        if k not in params:
            raise ConfigError(f"{preset_shown}: unknown parameter {k!r}")
        values[k] = from_file(preset_shown, k, params[k], v)
    return values


def _layer_saved_config(values: dict, explicit: dict, params: dict[str, Param], mode: str) -> dict:
    """Put the experiment's saved config.json (resume, enjoy) into `values`, under the flags given; returns what it
    held ({} when it is not read). Keys that are not parameters (other versions wrote them), the run's identity,
    enjoy-only parameters, in enjoy mode the MACHINE_KEYS, and those given as flags (so a flag repairs a bad saved
    value) are neither used nor checked."""
    saved_path = Path(values["train_dir"]) / values["experiment"] / "config.json"
    resuming = mode == "enjoy" or values["restart_behavior"] == "resume"
    try:
        has_saved = resuming and saved_path.exists()
    except OSError as e:
        raise RunError(f"cannot read {saved_path}: {e.strerror or e}") from None  # e.g. a path too long: I/O, exit 1
    if not has_saved:
        return {}
    saved = read_json_object(saved_path, str(saved_path))
    skipped = NOT_RESUMED | (MACHINE_KEYS if mode == "enjoy" else frozenset())
    for k, v in saved.items():
        if k in params and k not in skipped and k not in explicit and params[k].scope != "enjoy":
            values[k] = from_file(str(saved_path), k, params[k], v)
    return saved


def _training_defaults(values: dict, envs_given: bool, chosen: set) -> list[str]:
    """Train mode's defaults that depend on the machine or on other values (envs per worker, the seed, a preset's
    sample minibatches), set in `values`; chosen: the parameters given on the command line or by a saved config.json.
    Returns their lines for the run log."""
    notes = []
    if values["sample_minibatches"] and (values["use_rnn"] or values["with_vtrace"]) and \
            "sample_minibatches" not in chosen:  # (the Atari preset's, under Sample Factory's --use_rnn True, say)
        given = "--use_rnn True" if values["use_rnn"] else "--with_vtrace True"
        notes.append(f"--sample_minibatches False (the preset's True needs a feed-forward policy with GAE, and {given} "
                     "was given): minibatches of whole trajectories")
        values["sample_minibatches"] = False
    if not envs_given:
        envs = scale_envs_per_worker(values["num_envs_per_worker"], values["num_workers"], values["worker_num_splits"])
        if envs != values["num_envs_per_worker"]:
            notes.append(f"--num_envs_per_worker {envs} (the default {values['num_envs_per_worker']} spread over "
                         f"{values['num_workers']} rollout workers on {usable_cores()} cores; set it to override)")
            values["num_envs_per_worker"] = envs
    if values["with_pbt"] and values["num_policies"] < 2:
        notes.append(f"--with_pbt True with --num_policies {values['num_policies']}: population-based training needs "
                     "2 or more policies; nothing to do")
    if values["seed"] is None:  # every run is reproducible from its config.json
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "") if os.environ.get("WORLD_SIZE", "1") != "1" else ""
        if run_id:  # torchrun: every rank must draw the same seed (rank 0's config.json keeps it)
            values["seed"] = int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "little") & 0x7FFFFFFF
        else:
            values["seed"] = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        notes.append(f"--seed {values['seed']} (drawn at random; config.json keeps it)")
    return notes


# --- entry points -----------------------------------------------------------------------------------------------------
def cli_main(main: Callable[[Config], int], mode: str, prog: str, argv=None,
             auto_layout: Optional[Callable] = None) -> int:
    """Parse the command line, run `main(cfg)`; errors as in run_guarded."""
    return run_guarded(prog, lambda: main(parse_cfg(argv, mode=mode, prog=prog, auto_layout=auto_layout)))


def run_guarded(prog: str, body: Callable[[], int]) -> int:
    """`body()`'s exit code. A ConfigError (bad input) becomes one line on stderr and exit code 2; a RunError (e.g.
    an I/O failure) one line and exit code 1: every entry point's user-facing errors look alike."""
    try:
        return body()
    except ConfigError as e:
        print(f"{prog}: error: {one_line(e, limit=None)}", file=sys.stderr)
        return 2
    except RunError as e:
        print(f"{prog}: error: {one_line(e, limit=None)}", file=sys.stderr)
        return 1
