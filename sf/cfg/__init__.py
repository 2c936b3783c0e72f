"""Parameters of train.py and enjoy.py: one table, presets per env family, validation, config.json.

    params.py         the table (`PARAMS`, grouped by concern) and the env integrations' parameters
    config.py         `Config`: one run's parameters as a frozen, typed value generated from the table
    mode.py           `RunMode` (`cfg.mode`): what --sync_mode, sf.eval and --serial_mode mean, as named properties
    string_checks.py  checks of string values: paths, the experiment name, W&B names
    sf_compat.py      Sample Factory's flag names: aliases, refusals, flags without meaning here
    validate.py       conversion and checks of one value, of a whole configuration (`verify`), the device
    parse.py          the command line, presets, `parse_cfg`, the saved config.json, the entry points' errors

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

`parse_cfg` returns a `Config` (frozen: a variant is `cfg.replace(...)`) and writes nothing (it reads the preset and
the saved config.json).
Bad input raises `ConfigError`, whose message is one line; entry points print it and exit with code 2
(`cli_main`). A failure that is not the user's input (an OS error writing config.json) raises `RunError`: one line,
exit code 1. config.json is written by `save_cfg`, which the runner calls only after every check has passed:
atomically (sf/utils/files.py: temporary file, fsync, rename, fsync of the directory).
"""
from sf.cfg.config import Config, default_cfg, make_config
from sf.cfg.params import LIST_MAX_LEN, NAMED_CHECKS, PARAMS, Param, all_params, optional_int, optional_str, str2bool
from sf.cfg.parse import (CONFIGS_DIR, FAMILIES_WITH_PRESETS, REPO_ROOT, OneLineArgumentParser, build_parser,
                          cli_main, load_preset, parse_cfg, run_guarded, save_cfg)
from sf.cfg.mode import MODES, RunMode
from sf.cfg.sf_compat import SF_FLAGS, SFFlag, apply_sf_aliases, check_sf_flags
from sf.cfg.string_checks import (EXPERIMENT_NAME_CHARS, EXPERIMENT_NAME_MAX_LEN, PATH_MAX_BYTES,
                                  default_experiment_name, validate_experiment_name, validate_train_dir)
from sf.cfg.validate import (MAX_SAMPLES_PER_TRAINING_BATCH, MAX_TOTAL_ENVS, ValueProblem, check_value, convert,
                             experiment_dir, range_text, resolve_device, scale_envs_per_worker,
                             value_kind, verify)
from sf.utils.errors import ConfigError, RunError

__all__ = [
    "CONFIGS_DIR", "Config", "EXPERIMENT_NAME_CHARS", "EXPERIMENT_NAME_MAX_LEN", "FAMILIES_WITH_PRESETS",
    "LIST_MAX_LEN", "MAX_SAMPLES_PER_TRAINING_BATCH", "MAX_TOTAL_ENVS", "MODES", "NAMED_CHECKS", "PARAMS",
    "PATH_MAX_BYTES", "REPO_ROOT", "SF_FLAGS", "ConfigError", "OneLineArgumentParser", "Param", "RunError", "RunMode",
    "SFFlag", "ValueProblem",
    "all_params", "apply_sf_aliases", "build_parser", "check_sf_flags", "check_value", "cli_main", "convert",
    "default_cfg", "default_experiment_name", "make_config", "experiment_dir", "load_preset", "optional_int",
    "optional_str", "parse_cfg", "range_text", "resolve_device", "run_guarded", "save_cfg", "scale_envs_per_worker",
    "str2bool", "validate_experiment_name", "validate_train_dir", "value_kind", "verify",
]
