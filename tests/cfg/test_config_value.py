"""The configuration as a value (sf/cfg/config.py) and the run's shape computed once (sf/cfg/shape.py)."""
from __future__ import annotations

import dataclasses
import pickle
import typing

import pytest

from sf.cfg import Config, ConfigError, all_params, default_cfg, parse_cfg
from sf.cfg.config import RUN_FIELDS
from sf.cfg.shape import RunShape, num_envs


def test_every_parameter_is_a_typed_field_with_the_table_default():
    fields = {f.name: f for f in dataclasses.fields(Config)}
    cfg = Config()
    assert set(fields) == {p.name for p in all_params()} | set(RUN_FIELDS)
    hints = typing.get_type_hints(Config)
    for p in all_params():
        assert getattr(cfg, p.name) == p.default, p.name
        assert hints[p.name] is not typing.Any, p.name  # typed from its converter
    assert hints["learning_rate"] is float and hints["rollout"] is int and hints["use_rnn"] is bool
    assert hints["seed"] == typing.Optional[int] and hints["encoder_mlp_layers"] is list


def test_frozen_and_replace():
    cfg = default_cfg(env="test_corridor")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.learning_rate = 0.5
    other = cfg.replace(learning_rate=0.5, _notes=("a note",))
    assert (other.learning_rate, cfg.learning_rate, other._notes, cfg._notes) == (0.5, 1e-4, ("a note",), ())
    with pytest.raises(ConfigError, match="^unknown parameter 'learning_rat'$"):
        cfg.replace(learning_rat=0.5)
    with pytest.raises(ConfigError, match="unknown parameter 'lr'"):
        default_cfg(lr=0.5)


def test_a_list_default_is_never_shared():
    a, b = Config(), Config()
    a.encoder_mlp_layers.append(1)  # (a list stays a list: config.json holds it as one)
    assert b.encoder_mlp_layers == next(p.default for p in all_params() if p.name == "encoder_mlp_layers")


def test_pickles_and_saves_parameters_only(tmp_path):
    cfg = parse_cfg(["--env", "test_corridor", "--train_dir", str(tmp_path), "--seed", "3"])
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # (how every process receives it)
    saved = cfg.as_dict()
    assert set(saved) == {p.name for p in all_params()} and saved["seed"] == 3
    assert cfg._explicit == frozenset({"env", "train_dir", "seed"}) and isinstance(cfg._notes, tuple)


def _cfg(**kw):
    return default_cfg(env="test_corridor", num_workers=3, num_envs_per_worker=4, rollout=8, batch_size=64, **kw)


def test_run_shape_async_and_sync():
    shape = RunShape.of(_cfg(num_batches_per_epoch=2), agents_per_env=2)
    assert (shape.envs, shape.agents, shape.agents_per_worker) == (12, 24, 8)
    assert (shape.trajs_per_batch, shape.samples_per_batch) == (16, 128)  # 64 x 2 / 8
    assert shape.slots == 24 + 2 * 16  # every agent's slot and two batches of the one policy
    assert RunShape.of(_cfg(num_policies=3), agents_per_env=1).slots == 12 + 2 * 3 * 8
    assert RunShape.of(_cfg(num_traj_buffers=100), agents_per_env=1).slots == 100
    hts = RunShape.of(_cfg(sync_mode="hts", num_traj_buffers=100), agents_per_env=2)
    assert (hts.trajs_per_batch, hts.samples_per_batch, hts.slots) == (24, 192, 48)  # one rollout of every agent, x2
    assert num_envs(_cfg()) == 12


def test_run_shape_refuses_what_cannot_run():
    with pytest.raises(ConfigError, match=r"--num_traj_buffers 19 is too small: need at least .* = 20$"):
        RunShape.of(_cfg(num_traj_buffers=19), agents_per_env=1)  # 12 agents + one batch of 8
    RunShape.of(_cfg(num_traj_buffers=20), agents_per_env=1)
    with pytest.raises(ConfigError, match="--policy_mapping fixed: 13 policies but 12 agents"):
        RunShape.of(_cfg(num_policies=13, policy_mapping="fixed"), agents_per_env=1)
    RunShape.of(_cfg(num_policies=13, policy_mapping="fixed"), agents_per_env=2)  # 24 agents: each policy plays
