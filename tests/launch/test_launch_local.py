"""sf.launch with the local backend: sweep files (Sample Factory's RunDescription, JSON) -> runs with Sample Factory's
names, bad input in one line, the summary's statistics against a hand computation, and real sweeps of tiny train.py
runs: the cores divided, every run finished, the summary against the event files, and a sweep stopped with SIGINT
and launched again (finished runs skipped, the others resumed from their checkpoints)."""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from e2e_helpers import ROOT, SMALL, wait_for
from sf.launch import Experiment, ParamGrid, ParamList, RunDescription
from sf.launch import summary as summ
from sf.launch.__main__ import main as launch_main
from sf.launch.local import core_shares
from sf.launch.state import checkpoint_frames, read_launch, run_state
from sf.launch.sweep import SweepError, load_sweep, runs_of, train_args
from sf.runner.stats import read_event_scalars

SF_PYTHON = ROOT / ".venv-sf" / "bin" / "python"
TINY = " ".join(SMALL)


def write_py(path: Path, body: str) -> Path:
    path.write_text("from sf.launch import Experiment, ParamGrid, ParamList, RunDescription\n" + body)
    return path


# --- naming and grids ---

def test_grid_order_and_sample_factory_names(tmp_path):
    grid = ParamGrid([("seed", [0, 11]), ("learning_rate", [1e-4, 3e-4]), (("gamma", "gae_lambda"), [(0.99, 0.95)])])
    combos = list(grid.generate_params(randomize=False))
    assert combos == [{"seed": s, "learning_rate": lr, "gamma": 0.99, "gae_lambda": 0.95}
                      for s in (0, 11) for lr in (1e-4, 3e-4)]  # the first parameter varies slowest
    rd = RunDescription("sw", [Experiment("base", "python train.py --env test_image", combos)])
    runs = runs_of(rd, tmp_path / "sw.py", tmp_path / "td" / "sw")
    # Sample Factory's shorthands: first letters of all words but the last, then 3 letters of the last
    assert runs[0].name == "00_base_see_0_l.rat_0.0001_gam_0.99_g.lam_0.95"
    assert [r.name[:2] for r in runs] == ["00", "01", "02", "03"]
    assert runs[3].config == "base_l.rat_0.0003_gam_0.99_g.lam_0.95" and runs[3].seed == 11
    assert runs[0].config == runs[2].config != runs[1].config  # seeds grouped, configurations apart
    assert runs[1].argv == ["--env", "test_image", "--seed=0", "--learning_rate=0.0003", "--gamma=0.99",
                            "--gae_lambda=0.95", "--experiment", runs[1].name, "--train_dir", str(tmp_path / "td/sw")]
    assert runs[1].exp_dir == tmp_path / "td" / "sw" / runs[1].name


def test_shorthand_collisions_grow_as_sample_factory_does(tmp_path):
    rd = RunDescription("sw", [Experiment("e", "train.py", [{"num_workers": 1, "num_envs_per_worker": 2,
                                                              "num_epochs": 1}])])
    (run,) = runs_of(rd, tmp_path / "x.py", tmp_path)
    assert run.name == "00_e_n.wor_1_n.e.p.wor_2_n.epo_1"


def test_randomized_order_is_the_same_on_every_launch():
    combos = [{"seed": i} for i in range(8)]
    first = list(ParamList(combos).generate_params(randomize=True))
    assert first == list(ParamList(combos).generate_params(randomize=True)) and sorted(
        c["seed"] for c in first) == list(range(8))
    grid = ParamGrid([("seed", list(range(6)))])
    assert list(grid.generate_params(randomize=True)) == list(grid.generate_params(randomize=True))


@pytest.mark.e2e
@pytest.mark.skipif(not SF_PYTHON.exists(), reason="Sample Factory 2.1.1's venv (.venv-sf) is not here")
def test_names_equal_sample_factory_2_1_1s(tmp_path):
    """The oracle: Sample Factory's own RunDescription.generate_experiments on the same sweep file."""
    body = ('RUN_DESCRIPTION = RunDescription("cmp", experiments=[Experiment("doom", '
            '"python train.py --env doom_basic", ParamGrid([("seed", [0, 1111]), ("learning_rate", [0.0001, 0.001]),'
            ' ("num_envs_per_worker", [4]), ("num_workers", [2])]).generate_params(randomize=False))])\n')
    ours = write_py(tmp_path / "ours.py", body)
    theirs = tmp_path / "theirs.py"
    theirs.write_text("from sample_factory.launcher.run_description import Experiment, ParamGrid, RunDescription\n"
                      + body + "import json\nprint(json.dumps([n for _, n, _, _ in "
                      "RUN_DESCRIPTION.generate_experiments('td', makedirs=False)]))\n")
    res = subprocess.run([str(SF_PYTHON), str(theirs)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    sf_names = json.loads(res.stdout.strip().splitlines()[-1])
    assert [r.name for r in load_sweep(str(ours), str(tmp_path / "td"), check=False).runs] == sf_names


def test_train_commands_map_onto_train_py():
    for cmd in ("python train.py --env doom_basic", "python3 /x/train.py --env doom_basic", "sf-train --env doom_basic",
                "python -m sf.train --env doom_basic", "python -m sf_examples.vizdoom.train_vizdoom --env doom_basic",
                "OMP_NUM_THREADS=1 python -m sf_examples.atari.train_atari --env doom_basic"):
        assert train_args(cmd, "x") == ["--env", "doom_basic"], cmd
    with pytest.raises(SweepError, match="is not train.py's"):
        train_args("python -m sf_examples.brax.train_brax --env x", "x")


# --- loading ---

def test_json_and_python_sweeps_give_the_same_runs(tmp_path):
    cmd = "python train.py --env test_image --train_for_env_steps 1000"
    (tmp_path / "s.json").write_text(json.dumps({"name": "s", "command": cmd, "grid": {"learning_rate": [1e-4, 3e-4]},
                                                 "seeds": [0, 1]}))
    write_py(tmp_path / "s.py", f'RUN_DESCRIPTION = RunDescription("s", [Experiment("s", "{cmd}", ParamGrid(['
                                '("seed", [0, 1]), ("learning_rate", [1e-4, 3e-4])]).generate_params(False))])\n')
    a, b = (load_sweep(str(tmp_path / f), str(tmp_path / "td")) for f in ("s.json", "s.py"))
    assert [(r.name, r.config, r.seed, r.argv) for r in a.runs] == [(r.name, r.config, r.seed, r.argv) for r in b.runs]
    assert a.train_dir == tmp_path / "td" / "s" and len(a.runs) == 4 and a.runs[0].budget == 1000
    assert not (tmp_path / "td").exists()  # loading writes nothing


def test_json_name_pattern(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"command": ["train.py", "--env", "test_image"], "seeds": [3, 4],
                                                 "grid": {"gamma": [0.9]}, "experiment": "g{gamma}_s{seed}"}))
    sw = load_sweep(str(tmp_path / "p.json"), str(tmp_path / "td"))
    assert sw.name == "p" and [r.name for r in sw.runs] == ["g0.9_s3", "g0.9_s4"]
    assert {r.config for r in sw.runs} == {"p_gam_0.9"}


BAD = {
    "missing": (None, "no such sweep file"),
    "unknown_flag": ('{"command": "python train.py --env test_image", "grid": {"learning_rat": [1]}}',
                     "unrecognized arguments: --learning_rat=1 (did you mean --learning_rate?)"),
    "out_of_range": ('{"command": "python train.py --env test_image", "grid": {"gamma": [0.9, 5]}}',
                     "run 01_bad_gam_5: --gamma must be in [0, 1] (got 5.0)"),
    "unknown_env": ('{"command": "python train.py --env nope_env"}', "--env"),
    "not_json": ("{", "is not valid JSON"),
    "unknown_key": ('{"command": "train.py --env test_image", "grids": {}}', "unknown key 'grids'"),
    "no_command": ('{"grid": {}}', "key 'command' is required"),
    "other_program": ('{"command": "python other.py --env test_image"}', "is not train.py's"),
    "sets_experiment": ('{"command": "train.py --env test_image --experiment x"}',
                        "--experiment is set by the launcher"),
    "bad_pattern": ('{"command": "train.py --env test_image", "experiment": "{lr}"}', "is not a field"),
    "same_names": ('{"command": "train.py --env test_image", "seeds": [1, 2], "experiment": "x"}',
                   "two runs are named 'x'"),
    "py_syntax": ("RUN_DESCRIPTION = (", "line 1"),
    "py_sf_import": ("from sample_factory.launcher.run_description import RunDescription\n",
                     "import from sf.launch instead"),
    "py_no_description": ("X = 1\n", "defines no RUN_DESCRIPTION"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sweep_is_one_line_and_exit_2(tmp_path, capsys, case):
    text, expect = BAD[case]
    path = tmp_path / ("bad.py" if case.startswith("py_") else "bad.json")
    if text is not None:
        path.write_text(text)
    assert launch_main([str(path), "--train_dir", str(tmp_path / "td")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("python -m sf.launch: error: "), err
    assert expect in err and (case == "missing" or str(path) in err), err
    assert not (tmp_path / "td").exists()  # nothing written, nothing started


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "100000"])
def test_bad_max_parallel(tmp_path, capsys, value):
    (tmp_path / "s.json").write_text('{"command": "train.py --env test_image"}')
    assert launch_main([str(tmp_path / "s.json"), "--max_parallel", value, "--train_dir", str(tmp_path / "td")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"--max_parallel {value!r}: must be an integer from 1 to" in err
    assert not (tmp_path / "td").exists()


def test_dry_run_prints_the_commands_with_their_cores_and_starts_nothing(tmp_path, capsys):
    (tmp_path / "s.json").write_text(json.dumps({"command": "train.py --env test_image", "seeds": [0, 1, 2]}))
    assert launch_main([str(tmp_path / "s.json"), "--max_parallel", "2", "--dry_run",
                        "--train_dir", str(tmp_path / "td")]) == 0
    lines = capsys.readouterr().out.splitlines()
    shares = core_shares(sorted(os.sched_getaffinity(0)), 2)
    assert lines[0].startswith(f"[cores {','.join(map(str, shares[0]))}] {sys.executable} -m sf.train --env test_image")
    assert lines[0].endswith(f"--num_workers {len(shares[0])}") and "--experiment 00_s_see_0" in lines[0]
    assert len(lines) == 4 and "nothing started" in lines[3]
    assert not (tmp_path / "td").exists()


def test_core_shares():
    assert core_shares([0, 1, 2, 3, 4], 2) == [[0, 1], [2, 3, 4]]
    assert core_shares([0, 1], 2) == [[0], [1]]
    assert core_shares([4, 6], 3) == [[4], [6], [4]]  # more runs than cores: one core each, round-robin


# --- statistics ---

T975 = {1: 12.7062047, 2: 4.3026527, 3: 3.1824463, 4: 2.7764451, 9: 2.2621572, 29: 2.0452296}  # printed tables


@pytest.mark.parametrize("values", [[1.0, 2.0], [5.0, 5.5, 7.25], [-3.0, 0.5, 2.0, 10.0, 4.0], list(range(10)),
                                    [0.1 * i * i for i in range(30)]])
def test_describe_against_a_hand_computation(values):
    n = len(values)
    mean = sum(values) / n
    var = 0.0
    for v in values:
        var += (v - mean) * (v - mean)
    std = (var / (n - 1)) ** 0.5
    half = T975[n - 1] * std / n ** 0.5
    s = summ.describe(values)
    assert s.n == n and s.mean == pytest.approx(mean, rel=1e-12) and s.std == pytest.approx(std, rel=1e-12)
    assert s.ci == pytest.approx((mean - half, mean + half), rel=1e-6, abs=1e-9)


def test_describe_one_and_none():
    assert summ.describe([]) is None
    one = summ.describe([2.5])
    assert (one.n, one.mean, one.std, one.ci) == (1, 2.5, None, None)


def test_t_quantile():
    for df, t in T975.items():
        assert summ.t_quantile(0.975, df) == pytest.approx(t, rel=1e-6)


# --- real sweeps ---

def launch_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "sf.launch", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))


@pytest.mark.e2e
def test_sweep_of_two_configs_by_two_seeds_runs_to_the_end(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps({
        "name": "grid", "command": f"python train.py --env test_image --train_for_env_steps 1200 {TINY}",
        "grid": {"learning_rate": [0.0001, 0.001]}, "seeds": [1, 2]}))
    res = launch_cli(tmp_path / "s.json", "--max_parallel", "2", "--train_dir", tmp_path / "td")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sweep = load_sweep(str(tmp_path / "s.json"), str(tmp_path / "td"))
    shares = [set(s) for s in core_shares(sorted(os.sched_getaffinity(0)), 2)]
    for r in sweep.runs:
        rec = read_launch(r.exp_dir)
        assert rec["state"] == "done" and rec["rc"] == 0 and rec["backend"] == "local"
        assert set(rec["cores"]) in shares  # the affinity the process had, read back from it
        config = json.loads((r.exp_dir / "config.json").read_text())
        assert config["num_workers"] == rec["num_workers"] == len(rec["cores"])  # fitted to its share
        assert checkpoint_frames(r.exp_dir) >= 1200 and run_state(r).state == "done"
        assert (r.exp_dir / "launch.log").read_text().count("Done: ") == 1
    # the summary's numbers: each run's last and best reward/reward from its event files, by hand
    states = summ.status_rows(sweep)
    rows = {c.config: c for c in summ.summarize(sweep, states)}
    assert list(rows) == ["grid_l.rat_0.0001", "grid_l.rat_0.001"]
    for config, row in rows.items():
        rewards = [[v for _, v in read_event_scalars(r.exp_dir)["reward/reward"]] for r in sweep.runs
                   if r.config == config]
        final, best = [r[-1] for r in rewards], [max(r) for r in rewards]
        for got, xs in ((row.final, final), (row.best, best)):
            mean = (xs[0] + xs[1]) / 2
            std = abs(xs[0] - xs[1]) / 2 ** 0.5
            assert got.n == 2 and got.mean == pytest.approx(mean) and got.std == pytest.approx(std, abs=1e-9)
            assert got.ci == pytest.approx((mean - T975[1] * std / 2 ** 0.5, mean + T975[1] * std / 2 ** 0.5),
                                           abs=1e-6)
        assert row.done == row.runs == 2
    # --summary and --status print them; a second launch starts nothing
    res2 = launch_cli(tmp_path / "s.json", "--train_dir", tmp_path / "td", "--status", "--summary")
    assert res2.returncode == 0 and "4 runs: 4 done" in res2.stdout, res2.stdout
    assert len(re.findall(r"^\d\d_grid_see_\d_l\.rat_\S+ +done ", res2.stdout, flags=re.M)) == 4, res2.stdout
    assert f"{rows['grid_l.rat_0.0001'].final.mean:.3f}" in res2.stdout
    started = [read_launch(r.exp_dir)["started"] for r in sweep.runs]
    res3 = launch_cli(tmp_path / "s.json", "--train_dir", tmp_path / "td")
    assert res3.returncode == 0 and res3.stdout.count("skip ") == 4 and "nothing to run" in res3.stdout
    assert [read_launch(r.exp_dir)["started"] for r in sweep.runs] == started
    # the plot: one line per configuration
    res4 = subprocess.run([sys.executable, "-m", "sf.plot", str(tmp_path / "td" / "grid")], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert res4.returncode == 0 and (tmp_path / "td" / "grid" / "learning_curves.png").exists(), res4.stderr


def _frames_logged(log: Path, after: str = "") -> int:
    """The latest 'Total num frames: N' of a run's log (after the last line containing `after`; 0 before a report)."""
    text = log.read_text() if log.exists() else ""
    text = text.rsplit(after, 1)[-1] if after else text
    found = re.findall(r"Total num frames: (\d+)", text)
    return int(found[-1]) if found else 0


@pytest.mark.e2e
def test_interrupted_sweep_resumes_and_skips_finished_runs(tmp_path):
    """A short run finishes, a long one is stopped by SIGINT to the launcher (final checkpoint); launched again, the
    finished one is not started and the other resumes from its checkpoint's frames."""
    sweep_file = write_py(tmp_path / "stop.py", (
        f'RUN_DESCRIPTION = RunDescription("stop", [Experiment("e", "python train.py --env test_image {TINY}",\n'
        '    ParamList([{"seed": 1, "train_for_env_steps": 600}, {"seed": 2, "train_for_env_steps": 10**7}])'
        '.generate_params(randomize=False))])\n'))
    sweep = load_sweep(str(sweep_file), str(tmp_path / "td"))
    short, long = sweep.runs
    cmd = [sys.executable, "-m", "sf.launch", str(sweep_file), "--max_parallel", "2",
           "--train_dir", str(tmp_path / "td")]
    out1 = tmp_path / "launch1.txt"
    with open(out1, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_for(lambda: read_launch(short.exp_dir).get("state") == "done", 240, "the short run to finish", out1)
        wait_for(lambda: _frames_logged(long.exp_dir / "launch.log") > 0, 120, "the long run's frames",
                 long.exp_dir / "launch.log")
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=120) == 130, out1.read_text()
    finally:
        if p.poll() is None:
            p.kill()
    rec = read_launch(long.exp_dir)
    assert rec["state"] == "interrupted" and rec["rc"] == 0  # train.py stopped cleanly: its final checkpoint
    frames = checkpoint_frames(long.exp_dir)
    assert 0 < frames < 10**7 and run_state(long).state == "interrupted"
    assert not psutil_alive(rec["pid"])
    short_started = read_launch(short.exp_dir)["started"]

    out2 = tmp_path / "launch2.txt"
    with open(out2, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        log = long.exp_dir / "launch.log"  # appended to: the second launch's lines follow the first's
        wait_for(lambda: "Resumed from checkpoint" in log.read_text(), 120, "the long run to resume", log)
        wait_for(lambda: _frames_logged(log, after="Resumed from checkpoint") > frames, 120,
                 "frames past the checkpoint", log)
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=120) == 130, out2.read_text()
    finally:
        if p.poll() is None:
            p.kill()
    text = out2.read_text()
    assert f"skip {short.name}: done" in text and f"start {short.name}" not in text
    assert read_launch(short.exp_dir)["started"] == short_started  # not restarted
    resumed = re.findall(r"Resumed from checkpoint: policy version \d+, (\d+) env frames", log.read_text())
    assert resumed and int(resumed[-1]) == frames  # continued from the checkpoint's frames
    assert checkpoint_frames(long.exp_dir) > frames
    assert read_launch(long.exp_dir)["wall_before"] > 0  # the first launch's time is kept


def psutil_alive(pid: int) -> bool:
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_last_line_of_a_failed_run_names_the_exception(tmp_path):
    """A run that died of a Python traceback: its failure line is the exception (`Type: message`), not "Traceback
    (most recent call last):"; train.py's one-line errors and the runner's [ERROR] lines are taken as they are."""
    from sf.launch.state import LAUNCH_LOG, last_line
    script = tmp_path / "boom.py"
    script.write_text("def f(x):\n    raise ValueError(f'bad value {x}: (ours)')\n\nf(3)\n")
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    chained = subprocess.run([sys.executable, "-c",
                              "try:\n    {}['k']\nexcept KeyError:\n    raise RuntimeError('second')"],
                             capture_output=True, text=True)
    for log, expected in [
            ("started\n" + res.stderr + "\n", "ValueError: bad value 3: (ours)"),
            ("started\n" + chained.stderr, "RuntimeError: second"),  # the last of chained tracebacks
            ("x\ntrain.py: error: --lr: not a number\n", "train.py: error: --lr: not a number"),
            ("x\n[2026][1][ERROR] learner died\nDone: 0 frames\n", "[2026][1][ERROR] learner died"),
            ("x\nTraceback (most recent call last):\n", "Traceback (most recent call last):")]:
        (tmp_path / LAUNCH_LOG).write_text(log)
        assert last_line(tmp_path, failure=True) == expected, log
    assert last_line(tmp_path, failure=False) == "Traceback (most recent call last):"
