"""The configuration system: defaults, presets, saved config, and one-line errors for bad input."""
import json
import os

import pytest

import sf.cfg
from sf.cfg import (CONFIGS_DIR, PARAMS, ConfigError, RunError, all_params, check_value, cli_main, convert,
                    default_cfg, default_experiment_name, parse_cfg, range_text, save_cfg, validate_experiment_name,
                    validate_train_dir)
from sf.cfg import value_kind as _kind


@pytest.mark.e2e
def test_every_parameter_in_help(entry):
    res = entry("train.py", "--help")
    assert res.returncode == 0
    for p in PARAMS:
        if p.scope in ("all", "train"):
            assert f"--{p.name}" in res.stdout, p.name
    assert "(default: 32)" in " ".join(res.stdout.split())  # defaults are shown (help text is wrapped)


@pytest.mark.e2e
def test_enjoy_help_lists_enjoy_flags(entry):
    res = entry("enjoy.py", "--help")
    assert res.returncode == 0
    for flag in ("--save_video", "--max_num_episodes", "--eval_deterministic", "--load_checkpoint_kind"):
        assert flag in res.stdout
    assert "--num_workers" not in res.stdout


def test_layers_preset_then_command_line(tmp_path):
    cfg = parse_cfg(["--env", "doom_battle", "--train_dir", str(tmp_path)])
    assert cfg.exploration_loss == "symmetric_kl" and cfg.num_envs_per_worker == 16  # configs/doom.json over the table
    assert cfg.experiment == "doom_battle"
    cfg = parse_cfg(["--env", "doom_basic", "--train_dir", str(tmp_path)])
    assert cfg.batch_size == 128 and cfg.num_epochs == 4 and cfg.use_rnn is False  # its "envs" entry over "defaults"
    assert cfg.rollout == 32  # from "defaults"
    cfg = parse_cfg(["--env", "doom_basic", "--train_dir", str(tmp_path), "--batch_size", "512", "--use_rnn", "False"])
    assert cfg.batch_size == 512 and cfg.use_rnn is False


def test_saved_config_is_resumed_and_flags_override(tmp_path):
    exp = tmp_path / "e1"
    exp.mkdir()
    saved = default_cfg(env="test_corridor", learning_rate=0.123, rollout=8, recurrence=8, batch_size=64).as_dict()
    (exp / "config.json").write_text(json.dumps(saved))
    cfg = parse_cfg(["--env", "test_corridor", "--experiment", "e1", "--train_dir", str(tmp_path), "--rollout", "4",
                     "--recurrence", "4"])
    assert cfg.learning_rate == 0.123  # from config.json
    assert cfg.rollout == 4  # the command line wins
    cfg = parse_cfg(["--env", "test_corridor", "--experiment", "e1", "--train_dir", str(tmp_path),
                     "--restart_behavior", "overwrite"])
    assert cfg.learning_rate != 0.123  # not resuming: the saved config is ignored


@pytest.mark.e2e
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
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr and needle in lines[0], lines[0]
    assert not (tmp_path / "doom_basic").exists()  # nothing written for a rejected configuration


def test_parse_errors_raise_config_error(tmp_path):
    with pytest.raises(ConfigError):
        parse_cfg(["--env", "doom_basic", "--train_dir", str(tmp_path), "--num_epochs", "0"])


# --- valid values: every parameter declares them; the same checks for the command line and for files ---------
def _numeric(p):
    return _kind(p)[0] in ("int", "float")


def _mode(p):
    return "enjoy" if p.scope == "enjoy" else "train"


def _parse(tmp_path, *args, mode="train", env="test_corridor"):
    return parse_cfg(["--env", env, "--train_dir", str(tmp_path), *args], mode=mode)


def _rejected(tmp_path, *args, mode="train", env="test_corridor") -> str:
    with pytest.raises(ConfigError) as e:
        _parse(tmp_path, *args, mode=mode, env=env)
    msg = str(e.value)
    assert "\n" not in msg and msg.strip() == msg, msg
    return msg


def test_every_parameter_declares_its_valid_values():
    """A new parameter without a range (numbers) or choices/check (strings) fails here."""
    missing = []
    for p in all_params():
        kind, _ = _kind(p)
        if kind in ("int", "float") and (p.min_value is None or p.max_value is None):
            missing.append(f"{p.name}: both min_value and max_value")
        elif kind == "str" and not (p.choices or p.check):
            missing.append(f"{p.name}: choices or check")
        elif kind == "custom":
            missing.append(f"{p.name}: a known type (int, float, bool, str or their optional forms)")
        elif kind == "bool" and (p.min_value is not None or p.max_value is not None):
            missing.append(f"{p.name}: no range for a boolean")
    assert not missing, missing


def test_table_defaults_are_valid():
    for p in all_params():
        if p.name == "env":
            continue  # required: no default
        check_value(p, p.default)  # raises ValueProblem


def test_presets_are_valid():
    params = {p.name: p for p in all_params()}
    for path in sorted(CONFIGS_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        for entry in [data.get("defaults", {}), *data.get("envs", {}).values()]:
            for k, v in entry.items():
                assert k in params, (path.name, k)
                convert(params[k], v)  # raises ValueProblem


def test_doom_single_player_scenarios_share_one_set_and_the_papers_is_one_flag_away():
    """Every single-player Doom scenario trains with the family's defaults (Sample Factory 2's Doom settings: PPO with
    GAE, symmetric-KL exploration, gain-1 initialization, the screen normalized per pixel); only doom_basic's entry
    changes the optimisation. --preset_set paper gives the paper's Table A.5 settings, the multiplayer scenarios' own
    by default (their group's), and --preset_set family the family's there."""
    from sf.cfg.parse import parse_cfg
    shape = lambda c: (c.with_vtrace, c.batch_size, c.exploration_loss, c.exploration_loss_coeff,  # noqa: E731
                       c.policy_init_gain, c.normalize_input_keys, c.normalize_returns, c.learning_rate)
    family = (False, 1024, "symmetric_kl", 0.001, 1.0, ["obs"], True, 1e-4)
    paper = (True, 2048, "entropy", 0.003, None, None, False, 1e-4)
    for env in ("doom_health_gathering_supreme", "doom_defend_the_center", "doom_my_way_home", "doom_battle"):
        assert shape(parse_cfg(["--env", env])) == family, env
        assert shape(parse_cfg(["--env", env, "--preset_set", "paper"])) == paper, env
    for env in ("doom_duel_bots", "doom_deathmatch_bots", "doom_duel", "doom_deathmatch_full"):
        assert shape(parse_cfg(["--env", env])) == paper, env
        assert shape(parse_cfg(["--env", env, "--preset_set", "family"])) == family, env
        assert parse_cfg(["--env", env]).gamma == 0.995  # the scenario's own (Table A.5), under either set
    assert parse_cfg(["--env", "doom_my_way_home", "--preset_set", "paper", "--batch_size", "512"]).batch_size == 512
    with pytest.raises(ConfigError, match=r"--preset_set paper: configs/atari.json has no such set \(its sets: "
                                          r"family\)"):
        parse_cfg(["--env", "atari_pong", "--preset_set", "paper"])


def test_preset_groups_and_sets_of_a_bad_form_are_one_line(tmp_path, monkeypatch):
    from sf.cfg import parse
    monkeypatch.setattr(parse, "CONFIGS_DIR", tmp_path)
    for text, needle in [('{"sets": []}', "key 'sets': expected a JSON object, got a list"),
                         ('{"groups": {"g": {"envs": ["doom_basic"], "set": "nope"}}}',
                          "key 'groups'.'g': expected {\"envs\": [env names], \"set\": one of its sets}"),
                         ('{"groups": {"g": 3}}', "key 'groups'.'g': expected a JSON object, got a number")]:
        (tmp_path / "doom.json").write_text(text)
        with pytest.raises(ConfigError) as e:
            parse.load_preset("doom_basic", "doom")
        assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("flag, value, needle", [
    ("learning_rate", "nan", "--learning_rate must be a finite number in (0, 1] (got nan)"),
    ("learning_rate", "0", "--learning_rate must be in (0, 1]"),
    ("gamma", "50", "--gamma must be in [0, 1] (got 50.0)"),
    ("adam_beta1", "5", "--adam_beta1 must be in [0, 1) (got 5.0)"),
    ("adam_beta2", "1", "--adam_beta2 must be in [0, 1)"),
    ("adam_eps", "0", "--adam_eps must be in (0, 1]"),
    ("ppo_clip_ratio", "inf", "--ppo_clip_ratio must be a finite number"),
    ("vtrace_rho", "nan", "--vtrace_rho must be a finite number"),
    ("vtrace_c", "0", "--vtrace_c must be in (0, "),
    ("seed", "-1", "--seed must be in [0, 4294967295] or None (got -1)"),
    ("seed", str(2**70), "--seed must be in [0, 4294967295]"),
    ("seed", str(2**32), "--seed must be in [0, 4294967295]"),
    ("seed", "2**70", "--seed: expected an integer, got '2**70'"),
    ("seed", "1.5", "--seed: expected an integer"),
    ("num_workers", "1000000", "--num_workers must be in [1, 200] (got 1000000)"),
    ("rnn_size", "10000000", "--rnn_size must be in [1, 65536] (got 10000000)"),
    ("hidden_size", "0", "--hidden_size must be in [1, 65536]"),
    ("rollout", "abc", "--rollout: expected an integer, got 'abc'"),
    ("rollout", "32.5", "--rollout: expected an integer"),
    ("use_rnn", "maybe", "--use_rnn: expected True or False"),
    ("rnn_type", "transformer", "--rnn_type must be one of gru, lstm"),
    ("doom_num_bots", "16", "--doom_num_bots must be in [0, 15] or None"),
    ("doom_bots_difficulty", "101", "--doom_bots_difficulty must be in [0, 100]"),
    ("doom_res_w", "8", "--doom_res_w must be in [36, "),
    ("atari_repeat_action_probability", "1.5", "--atari_repeat_action_probability must be in [0, 1]"),
    ("doom_rew_frag", "inf", "--doom_rew_frag must be a finite number"),
    ("doom_scenarios_dir", "", "--doom_scenarios_dir must not be empty"),
    ("env_frameskip", "0", "--env_frameskip must be in [1, 64] or None"),
])
def test_bad_values_rejected(tmp_path, flag, value, needle):
    assert needle in _rejected(tmp_path, f"--{flag}={value}")


@pytest.mark.parametrize("args, needle", [
    (["--encoder_mlp_layers", "64", "0"], "--encoder_mlp_layers entries must be in [1, 65536] (got [64, 0])"),
    (["--encoder_mlp_layers", *["8"] * 65], "--encoder_mlp_layers must have 0 to 64 entries (got 65)"),
    (["--encoder_mlp_layers", "64", "x"], "--encoder_mlp_layers: expected an integer, got 'x'"),
    (["--num_workers", "200", "--num_envs_per_worker", "512", "--worker_num_splits", "2"], "at most 65536 envs"),
    (["--batch_size", str(2**24), "--num_batches_per_epoch", "2", "--rollout", "16"], "samples per training batch"),
    (["--num_workers", "2", "--num_envs_per_worker", "4", "--num_traj_buffers", "5"],
     "--num_traj_buffers (5) must be 0 or at least"),
])
def test_bad_combinations_rejected(tmp_path, args, needle):
    assert needle in _rejected(tmp_path, *args)


def _float_params():
    return [p for p in all_params() if _kind(p)[0] == "float"]


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_every_float_rejects_non_finite(tmp_path, value):
    assert _float_params()
    for p in _float_params():
        msg = _rejected(tmp_path, f"--{p.name}={value}", mode=_mode(p))
        assert msg.startswith(f"--{p.name} must be a finite number in "), msg


def test_every_numeric_parameter_enforces_both_bounds(tmp_path):
    for p in [p for p in all_params() if _numeric(p)]:
        int_kind = _kind(p)[0] == "int"
        eps = 0 if int_kind else max(abs(p.max_value), abs(p.min_value), 1.0) * 1e-9
        below = p.min_value - 1 if int_kind else (p.min_value if p.min_exclusive else p.min_value - max(eps, 1e-9))
        above = p.max_value + 1 if int_kind else (p.max_value if p.max_exclusive else p.max_value + max(eps, 1e-9))
        for bad in (below, above):
            msg = _rejected(tmp_path, f"--{p.name}={bad!r}" if p.nargs != "+" else f"--{p.name}={bad}", mode=_mode(p))
            assert msg.startswith(f"--{p.name} ") and f"must be in {range_text(p)}" in msg, msg


def test_integers_accept_integral_numbers_everywhere(tmp_path):
    """(and a seed of None, given or saved, is drawn at random: every run records the seed it used)"""
    cfg = _parse(tmp_path, "--train_for_env_steps", "1e9", "--rollout", "16.0", "--seed", "None")
    assert cfg.train_for_env_steps == 10**9 and isinstance(cfg.train_for_env_steps, int)
    assert cfg.rollout == 16 and isinstance(cfg.rollout, int)
    assert isinstance(cfg.seed, int) and f"--seed {cfg.seed} (drawn at random" in cfg._notes[-1]  # None: drawn, noted
    exp = tmp_path / "e"
    exp.mkdir()
    (exp / "config.json").write_text(json.dumps({"rollout": 16.0, "seed": None, "use_rnn": False, "gamma": 1}))
    cfg = _parse(tmp_path, "--experiment", "e")
    assert cfg.rollout == 16 and isinstance(cfg.rollout, int) and isinstance(cfg.seed, int) and cfg.use_rnn is False
    assert cfg.gamma == 1.0 and isinstance(cfg.gamma, float)
    (exp / "config.json").write_text(json.dumps({"rollout": 16.5}))
    assert "'rollout': expected an integer, got 16.5" in _rejected(tmp_path, "--experiment", "e")


# --- experiment names and train dir ---------------------------------------------------------------------------
BAD_NAMES = ["", ".", "..", "../victim", "../../x", "a/b", "/abs", "a\\b", "x" * 129, "x" * 300, "x\n", "x\ty",
             "a\x00b", ".hidden", "-x", " lead", "trail ", "semi;colon", "star*", "quote'", "tilde~", "e\u0301"]


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize("mode", ["train", "enjoy"])
def test_bad_experiment_names_rejected(tmp_path, name, mode):
    msg = _rejected(tmp_path, f"--experiment={name}", mode=mode)
    assert msg.startswith("--experiment "), msg
    with pytest.raises(ConfigError):
        validate_experiment_name(name)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["Experiment Name", "run-1.2_b", "lr=3e-4,bs=128+x@y:z", "_x", "9", "x" * 128, "a..b"])
def test_valid_experiment_names_accepted(tmp_path, name):
    validate_experiment_name(name)
    assert _parse(tmp_path, "--experiment", name).experiment == name
    assert parse_cfg(["--env", "test_corridor", "--train_dir", str(tmp_path), "--experiment", name],
                     mode="enjoy").experiment == name


def test_default_experiment_name_is_a_valid_name(tmp_path):
    assert _parse(tmp_path).experiment == "test_corridor"
    for env in ("gym:ALE/Breakout-v5", "gym:my.module:Env-v0", "doom_basic", "x" * 300, ".x", "a\\b"):
        name = default_experiment_name(env)
        validate_experiment_name(name)
    assert default_experiment_name("gym:ALE/Breakout-v5") == "gym:ALE_Breakout-v5"


@pytest.mark.parametrize("train_dir, needle", [
    ("", "--train_dir must not be empty"),
    ("  ", "--train_dir must not be empty"),
    ("/", "--train_dir must not be the filesystem root"),
    ("//", "--train_dir must not be the filesystem root"),
    ("/tmp/../..", "--train_dir must not be the filesystem root"),
    ("a\nb", "--train_dir must not contain control characters"),
    ("x" * 5000, "--train_dir must be at most"),
])
@pytest.mark.parametrize("mode", ["train", "enjoy"])
def test_bad_train_dir_rejected(train_dir, needle, mode):
    with pytest.raises(ConfigError) as e:
        parse_cfg(["--env", "test_corridor", f"--train_dir={train_dir}"], mode=mode)
    assert needle in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError):
        validate_train_dir(train_dir)


def test_train_dir_symlink_to_root_rejected(tmp_path):
    (tmp_path / "root").symlink_to("/")
    assert "filesystem root" in _rejected(tmp_path / "root")


def test_experiment_path_that_is_a_file_rejected(tmp_path):
    (tmp_path / "e").write_text("not a directory")
    assert "is not a directory" in _rejected(tmp_path, "--experiment", "e")


def test_parse_cfg_writes_nothing(tmp_path):
    train_dir = tmp_path / "a" / "b"
    _parse(train_dir, "--experiment", "e")
    assert list(tmp_path.iterdir()) == []


# --- saved config.json and presets: type and range errors name the file and the key -------------------------
@pytest.mark.parametrize("content, needle", [
    ('{"rollout": "abc"}', "config.json: key 'rollout': expected an integer, got 'abc'"),
    ('{"rollout": true}', "config.json: key 'rollout': expected an integer, got True"),
    ('{"rollout": null}', "config.json: key 'rollout': expected an integer, got None"),
    ('{"rollout": [16]}', "config.json: key 'rollout': expected an integer, got [16]"),
    ('{"encoder_mlp_layers": 64}', "config.json: key 'encoder_mlp_layers': expected a list of integers, got 64"),
    ('{"encoder_mlp_layers": [[64]]}', "config.json: key 'encoder_mlp_layers': expected an integer, got [64]"),
    ('{"encoder_mlp_layers": [%s]}' % ", ".join(["8"] * 65),
     "config.json: key 'encoder_mlp_layers' must have 0 to 64 entries (got 65)"),
    ('{"gamma": NaN}', "config.json: key 'gamma' must be a finite number in [0, 1] (got nan)"),
    ('{"gamma": Infinity}', "config.json: key 'gamma' must be a finite number"),
    ('{"gamma": 50}', "config.json: key 'gamma' must be in [0, 1] (got 50.0)"),
    ('{"gamma": "high"}', "config.json: key 'gamma': expected a number, got 'high'"),
    ('{"gamma": {"a": 1}}', "config.json: key 'gamma': expected a number"),
    ('{"use_rnn": "maybe"}', "config.json: key 'use_rnn': expected True or False, got 'maybe'"),
    ('{"use_rnn": 2}', "config.json: key 'use_rnn': expected True or False, got 2"),
    ('{"rnn_type": 5}', "config.json: key 'rnn_type': expected a string, got 5"),
    ('{"rnn_type": "transformer"}', "config.json: key 'rnn_type' must be one of gru, lstm"),
    ('{"seed": -1}', "config.json: key 'seed' must be in [0, 4294967295] or None (got -1)"),
    ('{"seed": 1e400}', "config.json: key 'seed': expected an integer, got inf"),
    ('{"rnn_size": 10000000}', "config.json: key 'rnn_size' must be in [1, 65536]"),
    ("[1, 2]", "config.json: expected a JSON object"),
    ("5", "config.json: expected a JSON object"),
    ('"text"', "config.json: expected a JSON object"),
    ("null", "config.json: expected a JSON object"),
    ("{", "config.json is not valid JSON"),
    ("", "config.json is not valid JSON"),
    ("[" * 100_000, "config.json is not valid JSON"),
])
@pytest.mark.parametrize("mode", ["train", "enjoy"])
def test_forged_saved_config_one_line_naming_file_and_key(tmp_path, content, needle, mode):
    exp = tmp_path / "x"
    exp.mkdir()
    (exp / "config.json").write_text(content)
    msg = _rejected(tmp_path, "--experiment", "x", mode=mode)
    assert msg.startswith(str(exp / "config.json")) and needle in msg, msg


def test_saved_config_not_utf8_or_unreadable(tmp_path):
    exp = tmp_path / "x"
    exp.mkdir()
    (exp / "config.json").write_bytes(b'{"rollout": "\xff"}')
    assert "is not valid JSON" in _rejected(tmp_path, "--experiment", "x")
    (exp / "config.json").unlink()
    (exp / "config.json").mkdir()  # unreadable: an I/O failure (RunError, exit 1), not bad input
    with pytest.raises(RunError, match="cannot read .*config.json: Is a directory"):
        parse_cfg(["--env", "test_corridor", "--train_dir", str(tmp_path), "--experiment", "x"])


def test_saved_config_unknown_keys_ignored_and_flags_override_bad_values(tmp_path):
    exp = tmp_path / "x"
    exp.mkdir()
    (exp / "config.json").write_text(json.dumps({"an_old_parameter": [1, 2], "learning_rate": 5.0, "use_rnn": True,
                                                 "experiment": "../elsewhere", "save_video": "garbage"}))
    cfg = _parse(tmp_path, "--experiment", "x", "--learning_rate", "0.01")  # the flag replaces the poisoned value
    assert cfg.learning_rate == 0.01 and cfg.use_rnn is True and cfg.experiment == "x"
    assert not hasattr(cfg, "an_old_parameter")
    assert "key 'learning_rate'" in _rejected(tmp_path, "--experiment", "x")
    cfg = _parse(tmp_path, "--experiment", "x", "--restart_behavior", "overwrite")  # not resuming: not read
    assert cfg.learning_rate != 5.0


def test_preset_errors_name_file_and_key(tmp_path, monkeypatch):
    presets = tmp_path / "presets"
    presets.mkdir()
    monkeypatch.setattr(sf.cfg.parse, "CONFIGS_DIR", presets)
    train_dir = tmp_path / "train"
    cases = [
        ('{"defaults": {"rollout": "abc"}}', "test.json: key 'rollout': expected an integer, got 'abc'"),
        ('{"defaults": {"gamma": 2}}', "test.json: key 'gamma' must be in [0, 1] (got 2.0)"),
        ('{"envs": {"test_corridor": {"use_rnn": "x"}}}', "test.json: key 'use_rnn': expected True or False"),
        ('{"defaults": {"no_such_param": 1}}', "test.json: unknown parameter 'no_such_param'"),
        ('{"defaults": [1]}', "test.json: key 'defaults': expected a JSON object, got a list"),
        ('{"envs": {"test_corridor": 3}}', "test.json: key 'envs'.'test_corridor': expected a JSON object"),
        ("[]", "test.json: expected a JSON object"),
        ("{", "test.json is not valid JSON"),
    ]
    for content, needle in cases:
        (presets / "test.json").write_text(content)
        assert needle in _rejected(train_dir, "--rollout", "16"), content  # even a value a flag overrides


# --- config.json written atomically; exit codes ---------------------------------------------------------------
def test_save_cfg_atomic_and_round_trips(tmp_path, monkeypatch):
    cfg = _parse(tmp_path, "--experiment", "e", "--seed", "3", "--learning_rate", "0.002")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    exp = tmp_path / "e"
    path = save_cfg(cfg, exp)
    assert path == exp / "config.json" and len(synced) == 2  # the file, then the directory
    assert sorted(p.name for p in exp.iterdir()) == ["config.json"]  # no temporary file left
    assert json.loads(path.read_text())["learning_rate"] == 0.002
    again = _parse(tmp_path, "--experiment", "e")
    assert again.as_dict() == cfg.as_dict()  # what is written reads back unchanged


def test_save_cfg_failure_leaves_old_file_and_no_temporary(tmp_path, monkeypatch):
    cfg = _parse(tmp_path, "--experiment", "e")
    exp = tmp_path / "e"
    save_cfg(cfg, exp)
    before = (exp / "config.json").read_text()

    def fail(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", fail)
    cfg = cfg.replace(learning_rate=0.5)
    with pytest.raises(RunError) as e:
        save_cfg(cfg, exp)
    assert str(e.value) == f"cannot write {exp / 'config.json'}: No space left on device"
    assert (exp / "config.json").read_text() == before
    assert sorted(p.name for p in exp.iterdir()) == ["config.json"]


def test_save_cfg_os_error_is_run_error(tmp_path):
    cfg = _parse(tmp_path, "--experiment", "e")
    (tmp_path / "file").write_text("")
    with pytest.raises(RunError) as e:
        save_cfg(cfg, tmp_path / "file" / "e")
    assert "cannot write" in str(e.value) and "\n" not in str(e.value)


def test_cli_main_one_line_and_exit_codes(tmp_path, capsys):
    def never(cfg):
        raise AssertionError("main must not run for a rejected configuration")

    base = ["--env", "test_corridor", "--train_dir", str(tmp_path)]
    assert cli_main(never, "train", "train.py", base + ["--gamma", "50"]) == 2
    err = capsys.readouterr().err
    assert err == "train.py: error: --gamma must be in [0, 1] (got 50.0)\n"

    def io_failure(cfg):
        raise RunError("cannot write x/config.json: Read-only file system")
    assert cli_main(io_failure, "train", "train.py", base) == 1
    assert capsys.readouterr().err == "train.py: error: cannot write x/config.json: Read-only file system\n"

    def multi_line(cfg):
        raise ConfigError("first line\nsecond line")
    assert cli_main(multi_line, "enjoy", "enjoy.py", base) == 2
    assert capsys.readouterr().err == "enjoy.py: error: first line second line\n"
    assert cli_main(lambda cfg: 0, "train", "train.py", base) == 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.e2e
@pytest.mark.parametrize("args, needle", [
    (["--learning_rate", "nan"], "--learning_rate"),
    (["--seed", "-1"], "--seed"),
    (["--experiment", "../victim"], "--experiment"),
    (["--train_dir="], "--train_dir"),
])
def test_entry_points_reject_bad_values_one_line_exit_2(entry, tmp_path, args, needle):
    for script in ("train.py", "enjoy.py"):
        res = entry(script, "--env", "test_corridor", "--train_dir", str(tmp_path / "t"), *args)
        assert res.returncode == 2, res.stderr
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.e2e
def test_entry_point_forged_saved_config_one_line_exit_2(entry, tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.json").write_text('{"rollout": "abc"}')
    for script in ("train.py", "enjoy.py"):
        res = entry(script, "--env", "test_corridor", "--train_dir", str(tmp_path), "--experiment", "x")
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip() == (f"{script}: error: {tmp_path / 'x' / 'config.json'}: "
                                      "key 'rollout': expected an integer, got 'abc'")


def test_default_num_workers_is_the_cores_this_process_may_use():
    """--num_workers defaults to the cores of the process's CPU affinity (taskset, a Slurm allocation, a cpuset), not
    every core of the machine: with one core allowed, one rollout worker."""
    import subprocess
    import sys
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); from sf.cfg import parse_cfg; "
            "print(parse_cfg(['--env', 'test_image', '--train_dir', '/tmp/unused']).num_workers)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "1"
