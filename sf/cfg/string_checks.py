"""Checks of string values (paths, the experiment name, names given to W&B, the env name): each returns what is
wrong, a phrase that follows the flag, or None. Also the rules of a valid experiment name and train dir as
ConfigError-raising functions, and how a value is shown in a message."""
from __future__ import annotations

import os
import string
from typing import Any, Callable, Optional

from sf.utils.errors import ConfigError

EXPERIMENT_NAME_MAX_LEN = 128  # well under NAME_MAX (255): the runner appends suffixes such as _old_<stamp>_<n>
EXPERIMENT_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_-.=,+@: ")
PATH_MAX_BYTES = 4000  # under PATH_MAX (4096), for paths given as parameters


def shown(v: Any, limit: int = 60, text: Callable[[Any], str] = repr) -> str:
    """A value in a message: repr (or `text`), cut to `limit` characters."""
    try:
        s = text(v)
    except ValueError:  # an int of more than 4300 digits
        return "a huge number"
    return s if len(s) <= limit else s[:limit - 3] + "..."


def shown_str(v: Any) -> str:
    """A value in a message as str() shows it ('(got 50.0)', '(got [1, 2])'), cut as by `shown`."""
    return shown(v, text=str)


def control_char(s: str) -> Optional[str]:
    return next((c for c in s if ord(c) < 32 or ord(c) == 127), None)


def path_problem(v: str) -> Optional[str]:
    if not v.strip():
        return "must not be empty"
    bad = control_char(v)
    if bad is not None:
        return f"must not contain control characters such as {bad!r} (got {shown(v)})"
    if len(os.fsencode(v)) > PATH_MAX_BYTES:
        return f"must be at most {PATH_MAX_BYTES} bytes long (got {len(os.fsencode(v))})"
    return None


def train_dir_problem(v: str) -> Optional[str]:
    problem = path_problem(v)
    if problem:
        return problem
    if os.path.realpath(v) == os.path.realpath(os.sep):
        return f"must not be the filesystem root (got {shown(v)})"
    return None


def experiment_problem(v: str) -> Optional[str]:
    if v == "":
        return "must not be empty"
    if "/" in v or "\\" in v or (os.altsep and os.altsep in v):
        return f"must be one directory name, without '/' or '\\' (got {shown(v)})"
    if v in (".", ".."):
        return f"must not be '.' or '..' (got {shown(v)})"
    if len(v) > EXPERIMENT_NAME_MAX_LEN:
        return f"must be at most {EXPERIMENT_NAME_MAX_LEN} characters long (got {len(v)})"
    bad = next((c for c in v if c not in EXPERIMENT_NAME_CHARS), None)
    if bad is not None:
        return (f"may contain only letters, digits, spaces and _-.=,+@: (got {shown(v)}, "
                f"which contains {bad!r})")
    if not (v[0].isalnum() or v[0] == "_"):
        return f"must start with a letter, a digit or _ (got {shown(v)})"
    if v[-1] == " ":
        return f"must not end with a space (got {shown(v)})"
    return None


def label_problem(v: str, max_len: int = 128, forbidden: str = "") -> Optional[str]:
    """A short name given to an outside service (W&B user, project, group, ...)."""
    if not v.strip():
        return "must not be empty"
    if control_char(v) is not None:
        return f"must not contain control characters (got {shown(v)})"
    if len(v) > max_len:
        return f"must be at most {max_len} characters long (got {len(v)})"
    bad = next((c for c in v if c in forbidden), None)
    if bad is not None:
        return f"must not contain any of {forbidden} (got {shown(v)})"
    return None


def wandb_project_problem(v: str) -> Optional[str]:
    return label_problem(v, forbidden="/\\#?%:")


def wandb_tags_problem(tags: list) -> Optional[str]:
    return next((f"entries {p}" for p in (label_problem(t, max_len=64) for t in tags) if p), None)


def env_name_problem(v: str) -> Optional[str]:  # the registry checks the name itself
    if not v:
        return "must not be empty"
    bad = control_char(v)
    return f"must not contain control characters (got {shown(v)})" if bad is not None else None


def validate_experiment_name(name: Any, flag: str = "--experiment") -> None:
    """Raise ConfigError unless `name` is one plain directory name: 1..128 characters from letters, digits,
    spaces and _-.=,+@:, starting with a letter, digit or _, not ending with a space (so never '.', '..',
    a path or a hidden directory)."""
    if not isinstance(name, str):
        raise ConfigError(f"{flag}: expected a string, got {shown(name)}")
    problem = experiment_problem(name)
    if problem:
        raise ConfigError(f"{flag} {problem}")


def validate_train_dir(train_dir: Any, flag: str = "--train_dir") -> None:
    """Raise ConfigError if `train_dir` is empty (the current directory), contains control characters, is
    absurdly long, or is / resolves to the filesystem root. Checks only; creates nothing."""
    if not isinstance(train_dir, (str, os.PathLike)):
        raise ConfigError(f"{flag}: expected a path, got {shown(train_dir)}")
    problem = train_dir_problem(os.fspath(train_dir))
    if problem:
        raise ConfigError(f"{flag} {problem}")


def default_experiment_name(env: str) -> str:
    """The experiment name used when --experiment is not given: the env name made a valid directory name
    (gym:ALE/Breakout-v5 -> gym:ALE_Breakout-v5)."""
    name = "".join(c if c in EXPERIMENT_NAME_CHARS else "_" for c in env)[:EXPERIMENT_NAME_MAX_LEN].rstrip(" ")
    if not name or not (name[0].isalnum() or name[0] == "_"):
        name = "_" + name[:EXPERIMENT_NAME_MAX_LEN - 1]
    return name
