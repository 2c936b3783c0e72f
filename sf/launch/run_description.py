"""Sample Factory 2.1.1's sweep description (sample_factory/launcher/run_description.py): the same classes, signatures
and experiment names, so that a sweep file of theirs runs here after changing its import line.

    RUN_DESCRIPTION = RunDescription("doom_basic_seeds", experiments=[
        Experiment("basic", "python train.py --env doom_basic --train_for_env_steps 500000",
                   ParamGrid([("seed", [0, 1]), ("learning_rate", [1e-4, 3e-4])]).generate_params(randomize=False)),
    ])

An experiment's name is Sample Factory's: its index within its Experiment (two digits), the Experiment's name, then
`<shorthand>_<value>` for every parameter of its combination, the shorthand being the first letter of each `_`, `.` or
`-` separated word but the last, then the last word's first three letters (more when two parameters would share one):
`00_basic_see_0_l.rat_0.0001`. Unlike Sample Factory, a randomized order (`randomize=True`) is drawn from a generator
seeded by the combinations themselves: launching the same sweep again gives every run the same name, so that finished
runs are found and unfinished ones resumed.
"""
from __future__ import annotations

import random
import re
from collections import OrderedDict
from typing import Any, Iterable, Iterator, Optional


def _stable_shuffle(items: list) -> list:
    """items in an order that looks random but is the same on every launch (seeded by their text)."""
    out = list(items)
    random.Random(repr(out)).shuffle(out)
    return out


class ParamGenerator:
    def generate_params(self, randomize: bool = True) -> Iterator[dict]:
        """Yields dicts: parameter name -> value."""
        raise NotImplementedError


class ParamList(ParamGenerator):
    """An explicit list of parameter combinations (dicts)."""

    def __init__(self, combinations: list[dict]):
        super().__init__()
        self.combinations = combinations

    def generate_params(self, randomize: bool = True) -> Iterator[dict]:
        yield from (_stable_shuffle(self.combinations) if randomize else self.combinations)


class ParamGrid(ParamGenerator):
    """Every combination of the values of each parameter, the first parameter varying slowest. A key may be a tuple of
    names whose values are tuples, set together: (("lr", "gamma"), [(1e-4, 0.99), (3e-4, 0.995)])."""

    def __init__(self, grid_tuples: Iterable[tuple[Any, list]]):
        super().__init__()
        self.grid = OrderedDict(grid_tuples)

    def _combinations(self) -> list[list]:
        combos: list[list] = [[]]
        for values in self.grid.values():
            combos = [c + [v] for c in combos for v in values]
        return combos

    def generate_params(self, randomize: bool = False) -> Iterator[dict]:
        if not self.grid:
            return
        combos = self._combinations()
        if randomize:
            combos = _stable_shuffle(combos)
        names = tuple(self.grid.keys())
        for combo in combos:
            d: dict = {}
            for name, value in zip(names, combo):
                if isinstance(name, (list, tuple)):
                    d.update(zip(name, value))
                else:
                    d[name] = value
            yield d


def param_shorthands(names: Iterable[str]) -> list[str]:
    """Sample Factory's shorthand of each parameter name, in order (unique among them): 'learning_rate' -> 'l.rat',
    'seed' -> 'see' (the rule of the module docstring, as Sample Factory's Experiment.generate_experiments)."""
    out: list[str] = []
    for param in names:
        tokens = re.split("[._-]", param)
        head = [t[0] for t in tokens[:-1] if t]
        n = min(3, len(tokens[-1]))
        short = ".".join(head + [tokens[-1][:n]])
        while n <= len(tokens[-1]) and short in out:
            n += 1
            short = ".".join(head + [tokens[-1][:n]])
        out.append(short)
    return out


class Experiment:
    """A base command and the parameter combinations to run it with (one run each; none: the command once)."""

    def __init__(self, name: str, cmd: str, param_generator: Iterable[dict] = (), env_vars: Optional[dict] = None):
        self.base_name = name
        self.cmd = cmd
        self.params = list(param_generator)
        self.env_vars = env_vars

    def experiment_names(self, customize_experiment_name: bool = True) -> list[tuple[str, dict, list[str]]]:
        """[(experiment name, its parameters, the `<shorthand>_<value>` token of each parameter)] in order."""
        out = []
        for idx, params in enumerate(self.params or [{}]):
            tokens = [f"{s}_{v}" for s, v in zip(param_shorthands(params), params.values())]
            name = (f"{idx:02d}_" + "_".join([self.base_name] + tokens) if customize_experiment_name
                    else f"{idx:02d}_{self.base_name}")
            out.append((name, dict(params), tokens))
        return out


class RunDescription:
    """A sweep: its name (the folder under --train_dir that holds its experiments) and its Experiments."""

    def __init__(self, run_name: str, experiments: list[Experiment], experiment_arg_name: str = "--experiment",
                 experiment_dir_arg_name: str = "--train_dir", customize_experiment_name: bool = True,
                 param_prefix: str = "--"):
        self.run_name = run_name
        self.experiments = experiments
        self.experiment_suffix = ""
        self.experiment_arg_name = experiment_arg_name
        self.experiment_dir_arg_name = experiment_dir_arg_name
        self.customize_experiment_name = customize_experiment_name
        self.param_prefix = param_prefix
