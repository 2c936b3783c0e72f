"""The configuration of one run as a value: `Config`, a frozen dataclass generated from the parameter table.

Every parameter of `all_params()` is a field, typed from its converter (int, float, bool, str, Optional[...], list
for a list parameter) with the table's default: no default is written anywhere else. A configuration never changes once
made: a variant is `cfg.replace(name=value, ...)` (a new Config; an unknown name is a ConfigError), so what a
process was handed is what every other process was handed.

Besides the parameters, three fields that are not saved in config.json (their names start with `_`):

    _explicit   frozenset of the parameters given on the command line (a resumed PBT run keeps them over its state)
    _notes      tuple of lines for the run log (e.g. Sample Factory flags that mean nothing here)
    _eval_plan  sf.eval's plan (EvalPlan) of an evaluation run; None in training

and one derived value, `cfg.mode` (sf/cfg/mode.py's RunMode: what --sync_mode, sf.eval and --serial_mode mean for
every stage), resolved on first use and carried with the configuration to every process.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

from sf.cfg.mode import RunMode
from sf.cfg.params import all_params, copy_default, optional_float, optional_int, optional_str, str2bool
from sf.utils.errors import ConfigError

# a parameter's converter -> its field's type (sf/cfg/stub.py writes them into config.pyi)
FIELD_TYPES = {int: int, float: float, str: str, str2bool: bool, optional_int: Optional[int],
               optional_float: Optional[float], optional_str: Optional[str]}
RUN_FIELDS = ("_explicit", "_notes", "_eval_plan")


class _ConfigMethods:
    """What every Config can do besides holding its values."""

    __slots__ = ()

    def replace(self, **changes: Any) -> "Config":
        """A copy with `changes` (parameter name -> value; values are not converted: give them typed)."""
        _refuse_unknown(set(changes) - set(RUN_FIELDS))
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The parameters (name -> value, lists copied), as config.json holds them: no run field."""
        return {name: copy_default(getattr(self, name)) for name in PARAMETER_NAMES_IN_ORDER}

    @functools.cached_property
    def mode(self) -> RunMode:
        """The run's mode (RunMode.of): resolved once per Config (a replace() makes a new one), pickled with it."""
        return RunMode.of(self)  # type: ignore[arg-type]


def _field(p) -> tuple[str, Any, dataclasses.Field]:
    if p.nargs in ("+", "*"):  # a list parameter (None where that is its default)
        annotation = list if p.default is not None else Optional[list]
    else:
        annotation = FIELD_TYPES.get(p.type, Any)
    if isinstance(p.default, list):
        return p.name, annotation, dataclasses.field(default_factory=lambda d=p.default: list(d))
    return p.name, annotation, dataclasses.field(default=p.default)


PARAMETER_NAMES_IN_ORDER = tuple(p.name for p in all_params())
PARAMETER_NAMES = frozenset(PARAMETER_NAMES_IN_ORDER)

Config = dataclasses.make_dataclass(
    "Config",
    [_field(p) for p in all_params()] + [("_explicit", frozenset, dataclasses.field(default=frozenset())),
                                         ("_notes", tuple, dataclasses.field(default=())),
                                         ("_eval_plan", Any, dataclasses.field(default=None))],
    bases=(_ConfigMethods,), frozen=True, eq=True)
Config.__module__ = __name__  # (pickled by name: processes receive it)
Config.__doc__ = "One run's parameters (see the module docstring): frozen; a variant is cfg.replace(...)."


def make_config(values: dict[str, Any], **run_fields: Any) -> "Config":
    """A Config of `values` (every parameter, already converted and checked) and the run fields given; a name that is
    not a parameter is a ConfigError."""
    _refuse_unknown(set(values))
    return Config(**values, **run_fields)


def _refuse_unknown(names: set[str]) -> None:
    unknown = sorted(names - PARAMETER_NAMES)
    if unknown:
        raise ConfigError(f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}")


def default_cfg(**overrides: Any) -> "Config":
    """Every parameter at its table default (no preset), with `overrides` applied. For tests and scripts."""
    return Config().replace(**overrides)
