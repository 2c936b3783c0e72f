"""Two learning rates x two seeds of VizDoom's basic scenario:
`python -m sf.launch examples/sweeps/doom_basic_seeds.py`.

Four short runs (100k env frames each; on two cores one at a time, each with both cores: a few minutes); then
`python -m sf.launch examples/sweeps/doom_basic_seeds.py --summary` and `python -m sf.plot train_dir/doom_basic_seeds`.
Sample Factory's sweep files have this shape (docs/sweeps.md shows one ported side by side).
"""
from sf.launch import Experiment, ParamGrid, RunDescription

_params = ParamGrid([
    ("seed", [0, 1111]),
    ("learning_rate", [1e-4, 3e-4]),
])

_experiments = [
    Experiment(
        "doom_basic",
        "python train.py --env doom_basic --train_for_env_steps 100000 --save_every_sec 30",
        _params.generate_params(randomize=False),
    ),
]

RUN_DESCRIPTION = RunDescription("doom_basic_seeds", experiments=_experiments)
