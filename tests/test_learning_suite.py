"""benchmarks/learning_suite.py: its --quick mode end to end (a sweep of sf.launch, sf.eval of the final policy, the
table's row with real figures), that a second invocation resumes (the finished run skipped, its evaluation read back)
and prints the same row, and that bad input is one line with exit code 2."""
import importlib.util
import re
import subprocess
import sys

import pytest

from e2e_helpers import ROOT, skip_if_unavailable

SCRIPT = ROOT / "benchmarks" / "learning_suite.py"
NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"


def _suite():
    spec = importlib.util.spec_from_file_location("learning_suite", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def _quick(train_dir) -> tuple[str, list[str]]:
    """(stdout, the table's doom_basic row split into its cells) of one --quick invocation, which must exit 0."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--train_dir", str(train_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = [line for line in proc.stdout.splitlines() if re.match(r"doom_basic +\| ", line)]
    assert len(rows) == 1, proc.stdout[-4000:]
    return proc.stdout, [c.strip() for c in rows[0].split(" | ")]


@pytest.mark.e2e
def test_quick_prints_a_row_with_real_figures_and_resumes(tmp_path):
    skip_if_unavailable("doom_basic")
    out, row = _quick(tmp_path)
    task, budget, done, train, evaluation, course, anchor, source, wall, fps = row  # (no --with_sf: no SF column)
    assert (task, budget, done) == ("doom_basic", "24,000", "1/1")
    assert re.fullmatch(rf"{NUMBER} \[1 seed\]", train), train  # the last reward/reward of the run
    m = re.fullmatch(rf"({NUMBER}) ± ({NUMBER}) \[1 seed, 5 ep\]", evaluation)  # sf.eval's 5 episodes, 95% CI
    assert m and float(m.group(2)) >= 0, evaluation
    assert -2.0 <= float(m.group(1)) <= 1.0, evaluation  # doom_basic's returns (scenario reward x 0.01)
    assert anchor == "≈ 0.75" and "model card" in source
    assert float(wall) > 0 and float(fps) > 0
    assert course == "-"
    assert "Tuning tasks: the families' settings were chosen on these" in out and "Held-out tasks" not in out
    run_dir = tmp_path / "learning_suite_quick" / "00_doom_basic_see_0"
    assert len(list(run_dir.glob("eval_latest_*f_seed0_5ep.csv"))) == 1
    assert (tmp_path / "learning_suite_quick" / "curves_doom_basic.png").stat().st_size > 0
    assert "evaluate 00_doom_basic_see_0" in out

    again, row_again = _quick(tmp_path)
    assert "skip 00_doom_basic_see_0: done" in again and "nothing to run" in again
    assert "evaluate " not in again  # the evaluation's CSV is read back, not redone
    assert row_again == row


@pytest.mark.parametrize("args, message", [
    (["--tasks", "doom_nope"], "--tasks: unknown task 'doom_nope'"),
    (["--seeds", "0"], "--seeds '0': must be an integer from 1 to 100"),
    (["--quick", "--tasks", "doom_basic"], "--quick runs doom_basic alone"),
    (["--with_sf", "same", "theirs"], "argument --with_sf: invalid choice: 'theirs' (choose from 'same', 'defaults')"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    assert _suite().main([*args, "--train_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not any(tmp_path.iterdir())  # nothing started or written


def test_cells_over_seeds_and_the_course_rule():
    suite = _suite()
    # 3 seeds: the mean of each seed's evaluation, t(0.975, 2) = 4.303 * std / sqrt(3) of those means (1, 2, 3)
    assert suite.eval_cell([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], 2) == "2 ± 2.484 [3 seeds x 2 ep]"
    # one seed: over its episodes, t(0.975, 3) = 3.182 * 1.291 / 2
    assert suite.eval_cell([[1.0, 2.0, 3.0, 4.0]], 4) == "2.5 ± 2.054 [1 seed, 4 ep]"
    # the course: mean - std >= 5 passes (8 - 1 = 7; 6 - 2.828 = 3.172)
    assert suite.course_cell({0: [7.0, 8.0, 9.0], 1: [4.0, 8.0]}) == "s0 7 PASS, s1 3.172 FAIL"


def test_reward_at_equal_frames_and_equal_seconds():
    suite = _suite()
    curve = [(1000, 5.0, 1.0), (2000, 10.0, 2.0), (3000, 20.0, 3.0)]  # (frames, seconds, reward)
    assert suite.reward_at(curve, frames=2500) == 2.0 and suite.reward_at(curve, frames=3000) == 3.0
    assert suite.reward_at(curve, seconds=19.9) == 2.0 and suite.reward_at(curve, seconds=4.0) != 2.0
    assert suite.reward_at(curve, seconds=4.0) != suite.reward_at(curve, seconds=4.0)  # nan: no point yet
    assert [t.name for t in suite.TASKS.values() if t.held_out and not t.slow] == [
        "doom_defend_the_line", "doom_health_gathering", "doom_my_way_home", "doom_deadly_corridor"]


def _sf_same_settings():
    spec = importlib.util.spec_from_file_location("sf_same_settings", ROOT / "benchmarks" / "sf_same_settings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_same_settings_give_sample_factory_our_values_where_they_differ():
    """Each Sample Factory flag takes our value of the parameter of its name or of the one it aliases, and is given
    only where that differs from its default; the run's identity and other families' parameters are never given; what
    has no flag there is named."""
    from sf.cfg.parse import parse_cfg
    ours = parse_cfg(["--env", "doom_my_way_home", "--num_workers", "2", "--seed", "3", "--num_epochs", "2"]).as_dict()
    theirs = {"batch_size": ours["batch_size"], "learning_rate": 1e-4 if ours["learning_rate"] != 1e-4 else 3e-4,
              "ppo_epochs": 1, "num_epochs": 1, "async_rl": True, "seed": 7, "train_dir": "x", "env_framestack": 1,
              "with_vtrace": not ours["with_vtrace"], "normalize_input_keys": None}
    flags, untranslated = _sf_same_settings().translate(ours, theirs)
    assert flags == [f"--learning_rate={ours['learning_rate']}", "--ppo_epochs=2", "--num_epochs=2",
                     f"--with_vtrace={ours['with_vtrace']}", "--normalize_input_keys", "obs"]
    assert "sample_minibatches" in untranslated and "batch_size" not in untranslated
    assert not any(k.startswith("atari_") for k in untranslated) and "seed" not in untranslated
    ppo = parse_cfg(["--env", "doom_my_way_home", "--sync_mode", "ppo"]).as_dict()
    assert _sf_same_settings().translate(ppo, {"async_rl": True})[0] == ["--async_rl=False"]


def test_same_settings_give_sample_factory_our_minibatch_composition():
    """A feed-forward run of ours trains on minibatches of whole trajectories (random ones with shuffle); Sample
    Factory's are mini-trajectories of --recurrence steps, 1 without an RNN: single samples. The translation gives it
    our rollout as its recurrence, and a --sample_minibatches run of ours its single samples, shuffled."""
    from sf.cfg.parse import parse_cfg
    theirs = {"async_rl": False, "recurrence": 1, "shuffle_minibatches": False, "num_batches_per_epoch": 16,
              "batch_size": 128}
    whole = parse_cfg(["--env", "mujoco_swimmer", "--num_workers", "2"]).as_dict()
    assert not whole["use_rnn"] and not whole["sample_minibatches"] and whole["shuffle_minibatches"]
    flags, untranslated = _sf_same_settings().translate(whole, theirs)
    assert f"--recurrence={whole['rollout']}" in flags and "--shuffle_minibatches=True" in flags, flags
    assert "sample_minibatches" not in untranslated
    samples = parse_cfg(["--env", "mujoco_swimmer", "--num_workers", "2", "--sample_minibatches", "True"]).as_dict()
    flags, _ = _sf_same_settings().translate(samples, theirs)
    assert "--shuffle_minibatches=True" in flags and not any(f.startswith("--recurrence") for f in flags), flags
    in_order = dict(whole, shuffle_minibatches=False)  # whole trajectories in order: its slices of the batch
    assert not any(f.startswith(("--recurrence", "--shuffle")) for f in _sf_same_settings().translate(in_order,
                                                                                                      theirs)[0])


def test_same_settings_of_a_ppo_run_give_sample_factorys_sync_mode_whole_rollouts():
    """ppo mode (MuJoCo's): our SGD steps per epoch are one per --batch_size samples of the batch, whatever
    --num_batches_per_epoch says; Sample Factory's sync mode reads them from --num_batches_per_epoch and refuses to
    start unless num_workers x envs x rollout is a whole multiple of num_batches_per_epoch x batch_size (its 'Ratio is
    0.25 (should be a positive integer)', seen with 2 x 16 x 64 samples and 4 x 128)."""
    from sf.cfg.parse import parse_cfg
    ours = parse_cfg(["--env", "mujoco_ant", "--num_workers", "2", "--num_envs_per_worker", "16"]).as_dict()
    assert ours["sync_mode"] == "ppo" and ours["batch_size"] == 128 and ours["num_batches_per_epoch"] == 4
    flags, _ = _sf_same_settings().translate(ours, {"async_rl": False, "num_batches_per_epoch": 1, "batch_size": 1024})
    given = dict(f[2:].split("=") for f in flags)
    assert given["num_batches_per_epoch"] == "16" and given["batch_size"] == "128", flags
    assert 2 * 16 * ours["rollout"] % (int(given["num_batches_per_epoch"]) * int(given["batch_size"])) == 0


@pytest.mark.e2e
def test_same_settings_against_sample_factorys_own_parser(tmp_path):
    """Sample Factory 2.1.1's VizDoom trainer reads every flag given (its parser refuses unknown ones): with them its
    configuration equals ours wherever a flag names both."""
    from test_import_sf import SF_PYTHON
    if not SF_PYTHON.exists():
        pytest.skip(f"{SF_PYTHON} is absent (make setup-sf)")
    from sf.cfg.parse import parse_cfg
    same = _sf_same_settings()
    ours = parse_cfg(["--env", "doom_defend_the_line", "--num_workers", "2"]).as_dict()
    flags, _ = same.translate(ours, same.sf_defaults(str(SF_PYTHON), "sf_examples.vizdoom.train_vizdoom", ours["env"]))
    script = ("import json, sys; from sf_examples.vizdoom.train_vizdoom import parse_vizdoom_cfg; "
              "print('CFG ' + json.dumps({k: v for k, v in vars(parse_vizdoom_cfg(argv=sys.argv[1:])).items() "
              "if isinstance(v, (bool, int, float, str, list, type(None)))}))")
    out = subprocess.run([str(SF_PYTHON), "-c", script, "--env", ours["env"], *flags], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    theirs = __import__("json").loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("CFG "))[4:])
    assert same.translate(ours, theirs)[0] == []  # nothing left to give: every translatable value is ours
    assert (theirs["batch_size"], theirs["with_vtrace"], theirs["num_envs_per_worker"]) == (1024, False, 16)
