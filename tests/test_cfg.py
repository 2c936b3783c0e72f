"""The configuration system: defaults, presets, saved config, and one-line errors for bad input."""
import json

import pytest

from sf.cfg import ConfigError, PARAMS, default_cfg, parse_cfg


def test_every_parameter_in_help(entry):
    res = entry("train.py", "--help")
    assert res.returncode == 0
    for p in PARAMS:
        if p.scope in ("all", "train"):
            assert f"--{p.name}" in res.stdout, p.name
    assert "(default: 32)" in " ".join(res.stdout.split())  # defaults are shown (help text is wrapped)


def test_enjoy_help_lists_enjoy_flags(entry):
    res = entry("enjoy.py", "--help")
    assert res.returncode == 0
    for flag in ("--save_video", "--max_num_episodes", "--eval_deterministic", "--load_checkpoint_kind"):
        assert flag in res.stdout
    assert "--num_workers" not in res.stdout


def test_layers_preset_then_command_line(tmp_path):
    cfg = parse_cfg(["--env", "doom_battle", "--train_dir", str(tmp_path)])
    assert cfg.batch_size == 2048 and cfg.num_envs_per_worker == 16  # configs/doom.json over the table
    assert cfg.experiment == "doom_battle"
    cfg = parse_cfg(["--env", "doom_basic", "--train_dir", str(tmp_path)])
    assert cfg.batch_size == 128 and cfg.num_epochs == 4 and cfg.use_rnn is False  # its "envs" entry over "defaults"
    assert cfg.rollout == 32  # from "defaults"
    cfg = parse_cfg(["--env", "doom_basic", "--train_dir", str(tmp_path), "--batch_size", "512", "--use_rnn", "False"])
    assert cfg.batch_size == 512 and cfg.use_rnn is False


def test_saved_config_is_resumed_and_flags_override(tmp_path):
    exp = tmp_path / "e1"
    exp.mkdir()
    saved = vars(default_cfg(env="test_corridor", learning_rate=0.123, rollout=8, recurrence=8, batch_size=64))
    (exp / "config.json").write_text(json.dumps(saved))
    cfg = parse_cfg(["--env", "test_corridor", "--experiment", "e1", "--train_dir", str(tmp_path), "--rollout", "4",
                     "--recurrence", "4"])
    assert cfg.learning_rate == 0.123  # from config.json
    assert cfg.rollout == 4  # the command line wins
    cfg = parse_cfg(["--env", "test_corridor", "--experiment", "e1", "--train_dir", str(tmp_path),
                     "--restart_behavior", "overwrite"])
    assert cfg.learning_rate != 0.123  # not resuming: the saved config is ignored


@pytest.mark.parametrize("args, needle", [
    (["--env", "doom_basc"], "doom_basic"),  # unknown env lists close matches
    (["--env", "doom_basic", "--num_workers", "0"], "--num_workers"),
    (["--env", "doom_basic", "--batch_size", "-5"], "--batch_size"),
    (["--env", "doom_basic", "--num_envs_per_worker", "5", "--worker_num_splits", "2"], "--worker_num_splits"),
    (["--env", "doom_basic", "--batch_size", "1000", "--rollout", "32"], "multiple of --rollout"),
    (["--env", "doom_battle", "--rollout", "32", "--recurrence", "5"], "--recurrence"),
    (["--env", "doom_basic", "--device", "cuda"], "CUDA"),
    (["--env", "doom_basic", "--train_dir", "/etc/hostname/sub"], "--train_dir"),
    (["--env", "doom_basic", "--num_wokers", "2"], "--num_workers"),  # unknown flag, with a suggestion
    (["--env", "doom_basic", "--rollout", "abc"], "--rollout"),
    (["--env", "doom_basic", "--rnn_type", "transformer"], "--rnn_type"),
    (["--num_workers", "2"], "--env"),
])
def test_bad_configuration_one_line_exit_2(entry, tmp_path, args, needle):
    if "--train_dir" not in args:
        args = args + ["--train_dir", str(tmp_path)]
    res = entry("train.py", *args)
    assert res.returncode == 2, res.stderr
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr and needle in lines[0], lines[0]
    assert not (tmp_path / "doom_basic").exists()  # nothing written for a rejected configuration


def test_parse_errors_raise_config_error(tmp_path):
    with pytest.raises(ConfigError):
        parse_cfg(["--env", "doom_basic", "--train_dir", str(tmp_path), "--num_epochs", "0"])
