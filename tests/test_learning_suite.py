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
    task, budget, done, train, evaluation, course, anchor, source, wall, fps, sf = row
    assert (task, budget, done) == ("doom_basic", "24,000", "1/1")
    assert re.fullmatch(rf"{NUMBER} \[1 seed\]", train), train  # the last reward/reward of the run
    m = re.fullmatch(rf"({NUMBER}) ± ({NUMBER}) \[1 seed, 5 ep\]", evaluation)  # sf.eval's 5 episodes, 95% CI
    assert m and float(m.group(2)) >= 0, evaluation
    assert -2.0 <= float(m.group(1)) <= 1.0, evaluation  # doom_basic's returns (scenario reward x 0.01)
    assert anchor == "≈ 0.75" and "model card" in source
    assert float(wall) > 0 and float(fps) > 0
    assert (course, sf) == ("-", "-")
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
