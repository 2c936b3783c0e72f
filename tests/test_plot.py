"""sf.plot: learning curves from TensorBoard event files (written here with tensorboardX, as training does, and by a
real tiny training run), read back with TensorBoard's reader, which sf.runner.stats.read_event_scalars uses too."""
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tensorboardX import SummaryWriter

from sf import plot
from sf.runner.stats import read_event_scalars

ROOT = Path(__file__).resolve().parent.parent
WALL0 = 1_700_000_000.0
LAG_TAGS = ("train/policy_lag_min", "train/policy_lag_avg", "train/policy_lag_max")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_experiment(exp_dir: Path, points: dict[str, list[tuple[int, float, float]]], suffix: str = "") -> None:
    """Writes tag -> [(step, wall_time, value)] as training does (tensorboardX add_scalar, one event per scalar),
    interleaving the tags point by point."""
    w = SummaryWriter(str(exp_dir), filename_suffix=suffix)
    for i in range(max(len(p) for p in points.values())):
        for tag, pts in points.items():
            if i < len(pts):
                step, wall, value = pts[i]
                w.add_scalar(tag, value, step, walltime=wall)
    w.close()


def fake_points(n: int, reward, fps, wall_step: float) -> dict[str, list[tuple[int, float, float]]]:
    """Known values, all exact in float32 (TensorBoard stores scalars as float32)."""
    rows = [(1000 * (i + 1), WALL0 + wall_step * i) for i in range(n)]
    return {
        "reward/reward": [(s, t, reward(i)) for i, (s, t) in enumerate(rows)],
        "perf/_fps": [(s, t, fps(i)) for i, (s, t) in enumerate(rows)],
        "perf/total_frames": [(s, t, float(s)) for s, t in rows],
        "train/policy_lag_min": [(s, t, float(i % 2)) for i, (s, t) in enumerate(rows)],
        "train/policy_lag_avg": [(s, t, 2.0 + (i % 3) * 0.5) for i, (s, t) in enumerate(rows)],
        "train/policy_lag_max": [(s, t, 5.0 + i % 4) for i, (s, t) in enumerate(rows)],
    }


@pytest.fixture
def fake_train_dir(tmp_path):
    """train_dir/alpha (20 summaries 30 s apart, a rising reward) and train_dir/beta (12 summaries, a noisy one)."""
    written = {"alpha": fake_points(20, lambda i: -3.0 + 0.5 * i, lambda i: 1000.0 + 16 * i, 30.0),
               "beta": fake_points(12, lambda i: (i % 4) * 0.25, lambda i: 800.0 - 8 * (i % 5), 45.0)}
    for name, points in written.items():
        write_experiment(tmp_path / "train_dir" / name, points)
    return tmp_path / "train_dir", written


def naive_tensorboard_smoothing(values, weight):
    """The debiased EMA written out as what it is: point i is the mean of the finite points 0..i weighted by
    weight ** (distance back), counting finite points only; non-finite points pass through."""
    out = []
    finite = [(i, v) for i, v in enumerate(values) if math.isfinite(v)]
    for i, v in enumerate(values):
        if not math.isfinite(v):
            out.append(v)
            continue
        past = [u for j, u in finite if j <= i]
        ws = [weight ** (len(past) - 1 - k) for k in range(len(past))]
        out.append(sum(w * u for w, u in zip(ws, past)) / sum(ws))
    return np.array(out)


def run_plot_cli(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sf.plot", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def color_pixels(png: Path, rgb: tuple[int, int, int], tol: int = 12) -> int:
    img = np.asarray(Image.open(png).convert("RGB")).astype(int)
    return int((np.abs(img - np.array(rgb)).max(axis=2) <= tol).sum())


C0, C1 = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)  # matplotlib's first two colours: the first two experiments


# --- reading ---

def test_read_scalar_events_returns_what_was_written_in_file_order(fake_train_dir):
    train_dir, written = fake_train_dir
    for name, points in written.items():
        read = plot.read_scalar_events(train_dir / name)
        assert read == points  # steps, wall times and values exactly; the order as written
        assert read_event_scalars(train_dir / name) == {tag: [(s, v) for s, _, v in pts] for tag, pts in points.items()}


def test_read_survives_a_truncated_last_record(fake_train_dir):
    train_dir, written = fake_train_dir
    (f,) = plot.event_files(train_dir / "alpha")
    f.write_bytes(f.read_bytes()[:-5])  # a run still writing: its last record half on disk
    read = plot.read_scalar_events(train_dir / "alpha")
    last_tag = list(written["alpha"])[-1]  # written last: loses its last point, nothing else does
    assert read[last_tag] == written["alpha"][last_tag][:-1]
    assert all(read[t] == pts for t, pts in written["alpha"].items() if t != last_tag)


def test_resumed_run_reads_both_files_and_plots_without_orphans(tmp_path):
    exp = tmp_path / "resumed"
    first = [(s, WALL0 + s / 100, float(s)) for s in (1000, 2000, 3000, 4000, 5000)]
    second = [(s, WALL0 + 500 + s / 100, -float(s)) for s in (4000, 5000, 6000)]  # resumed from the 3000 checkpoint
    write_experiment(exp, {"reward/reward": first}, suffix=".1")
    write_experiment(exp, {"reward/reward": second}, suffix=".2")
    assert len(plot.event_files(exp)) == 2
    assert read_event_scalars(exp)["reward/reward"] == [(s, v) for s, _, v in first + second]  # file order, all
    series, _ = plot.panel_series({"resumed": plot.read_scalar_events(exp)}, ["reward"], 0.0)
    (s,) = series["reward"]
    assert s.x.tolist() == [1000, 2000, 3000, 4000, 5000, 6000]
    assert s.y.tolist() == [1000, 2000, 3000, -4000, -5000, -6000]  # 4000, 5000 of the first run: orphans


def test_drop_orphans_keeps_repeated_steps():
    pts = [(1, 0.0, 1.0), (2, 0.0, 2.0), (2, 0.0, 3.0), (3, 0.0, 4.0), (2, 0.0, 5.0), (4, 0.0, 6.0)]
    assert plot.drop_orphans(pts) == [(1, 0.0, 1.0), (2, 0.0, 5.0), (4, 0.0, 6.0)]
    assert plot.drop_orphans(pts[:4]) == pts[:4]


# --- the series each panel plots ---

def test_panel_series_are_the_written_values(fake_train_dir):
    train_dir, written = fake_train_dir
    runs = {name: plot.read_scalar_events(train_dir / name) for name in ("alpha", "beta")}
    series, unit = plot.panel_series(runs, list(plot.PANELS), 0.0)
    assert list(series) == ["reward", "reward_time", "fps", "lag"]
    assert unit == "min"  # beta spans 11 * 45 s = 8.25 min
    expect_tags = {"reward": ["reward/reward"], "reward_time": ["reward/reward"], "fps": ["perf/_fps"],
                   "lag": ["train/policy_lag_avg", "train/policy_lag_min", "train/policy_lag_max"]}
    for panel, curves in series.items():
        expected = [(e, t) for e in ("alpha", "beta") for t in expect_tags[panel]]
        assert [(s.experiment, s.tag) for s in curves] == expected
        for s in curves:
            pts = written[s.experiment][s.tag]
            if panel == "reward_time":
                assert np.allclose(s.x, [(w - WALL0) / 60 for _, w, _ in pts])
            else:
                assert s.x.tolist() == [step for step, _, _ in pts]
            assert s.y.tolist() == [v for _, _, v in pts]
            assert s.y_smooth.tolist() == s.y.tolist()  # --smooth 0: as written
    assert series["reward"][0].y[-1] == -3.0 + 0.5 * 19


def test_smoothing_is_tensorboards(fake_train_dir):
    values = [3.0, -1.0, 4.0, 1.0, 5.0, float("nan"), 9.0, 2.0, 6.0]
    for w in (0.0, 0.3, 0.6, 0.95):
        np.testing.assert_allclose(plot.ema(values, w), naive_tensorboard_smoothing(values, w), rtol=1e-12)
    assert plot.ema([7.0], 0.9).tolist() == [7.0]  # debiased: the first point is itself, not 0.7
    train_dir, _ = fake_train_dir
    runs = {name: plot.read_scalar_events(train_dir / name) for name in ("alpha", "beta")}
    series, _ = plot.panel_series(runs, ["reward", "lag"], 0.9)
    for s in series["reward"] + series["lag"]:
        np.testing.assert_allclose(s.y_smooth, naive_tensorboard_smoothing(s.y.tolist(), 0.9), rtol=1e-12)
        assert not np.array_equal(s.y_smooth, s.y)


def test_time_unit_and_labels():
    assert plot.time_unit(90) == ("s", 1.0) and plot.time_unit(3600) == ("min", 60.0)
    assert plot.time_unit(3 * 3600) == ("h", 3600.0)
    assert plot.experiment_labels([Path("train_dir/a"), Path("train_dir/b/")]) == ["a", "b"]
    assert plot.experiment_labels([Path("run_1/exp"), Path("run_2/exp")]) == ["run_1/exp", "run_2/exp"]


# --- the command line ---

@pytest.mark.e2e
def test_cli_writes_a_png_with_both_experiments(fake_train_dir, tmp_path):
    train_dir, _ = fake_train_dir
    out = tmp_path / "curves.png"
    res = run_plot_cli(train_dir / "alpha", train_dir / "beta", "--out", out, "--smooth", "0.5")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"Wrote {out}"
    assert res.stderr == ""  # no TensorFlow-not-installed or other warnings
    data = out.read_bytes()
    assert data[:8] == PNG_SIGNATURE and 20_000 < len(data) < 2_000_000
    with Image.open(out) as img:
        img.verify()
    with Image.open(out) as img:
        assert img.format == "PNG" and img.size == (1280, 880)  # 2 x 2 panels of 6.4 x 4.4 in at 100 dpi
    assert color_pixels(out, C0) > 500 and color_pixels(out, C1) > 500  # both experiments drawn
    assert not list(tmp_path.glob(".curves.png.*"))  # the temporary file is gone


def test_default_out_and_one_panel(fake_train_dir):
    train_dir, _ = fake_train_dir
    assert plot.main([str(train_dir / "beta"), "--panels", "reward", "--smooth", "0"]) == 0
    out = train_dir / "beta" / plot.DEFAULT_OUT_NAME
    with Image.open(out) as img:
        assert img.size == (640, 440)
    assert color_pixels(out, C0) > 200 and color_pixels(out, C1) == 0


def test_tags_missing_from_an_experiment_leave_its_panel_empty(tmp_path):
    write_experiment(tmp_path / "only_fps", {"perf/_fps": [(100, WALL0, 5.0), (200, WALL0 + 1, 6.0)]})
    series, _ = plot.panel_series({"only_fps": plot.read_scalar_events(tmp_path / "only_fps")}, list(plot.PANELS), 0.6)
    assert [len(series[p]) for p in plot.PANELS] == [0, 0, 1, 0]
    assert plot.main([str(tmp_path / "only_fps")]) == 0  # drawn with "no reward/reward in the event files"


@pytest.mark.parametrize("case", ["missing", "file", "empty", "train_dir", "twice", "out_dir", "out_suffix",
                                  "out_is_dir", "smooth_1", "smooth_nan", "smooth_text", "panels", "no_args",
                                  "unknown_flag"])
def test_bad_input_is_one_line_and_exit_2(fake_train_dir, tmp_path, capsys, case):
    train_dir, _ = fake_train_dir
    alpha = str(train_dir / "alpha")
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    argv, expect = {
        "missing": ([str(tmp_path / "nope")], [str(tmp_path / "nope"), "no such directory", "train_dir/<experiment>"]),
        "file": ([str(tmp_path / "file.txt")], [str(tmp_path / "file.txt"), "not a directory"]),
        "empty": ([str(tmp_path / "empty")], [str(tmp_path / "empty"), "no TensorBoard event files"]),
        "train_dir": ([str(train_dir)], ["no TensorBoard event files", alpha, str(train_dir / "beta")]),
        "twice": ([alpha, alpha + "/"], ["given twice"]),
        "out_dir": ([alpha, "--out", str(tmp_path / "no" / "x.png")], [str(tmp_path / "no"), "does not exist"]),
        "out_suffix": ([alpha, "--out", str(tmp_path / "x.jpg")], ["x.jpg", ".png"]),
        "out_is_dir": ([alpha, "--out", str(tmp_path / "empty.png")], None),
        "smooth_1": ([alpha, "--smooth", "1"], ["--smooth", "[0, 1)"]),
        "smooth_nan": ([alpha, "--smooth", "nan"], ["--smooth", "[0, 1)"]),
        "smooth_text": ([alpha, "--smooth", "abc"], ["--smooth", "abc"]),
        "panels": ([alpha, "--panels", "reward,bogus"], ["bogus", "reward, reward_time, fps, lag"]),
        "no_args": ([], ["EXPERIMENT_DIR"]),
        "unknown_flag": ([alpha, "--smoth", "0.5"], ["--smoth", "did you mean --smooth"]),
    }[case]
    if case == "out_is_dir":
        (tmp_path / "empty.png").mkdir()
        expect = [str(tmp_path / "empty.png"), "is a directory"]
    assert plot.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m sf.plot: error: "), err
    for word in expect:
        assert word in lines[0], (word, lines[0])
    assert not [p for p in tmp_path.rglob("*.png*") if p.is_file()]  # nothing written


@pytest.mark.parametrize("where", ["experiment", "out"])
def test_name_too_long_is_one_line_and_exit_1(fake_train_dir, tmp_path, capsys, where):
    """A name the filesystem refuses (over 255 bytes) is an I/O failure, as in training: one line, exit code 1."""
    train_dir, _ = fake_train_dir
    long = tmp_path / ("x" * 300)
    argv = [str(long)] if where == "experiment" else [str(train_dir / "alpha"), "--out", f"{long}.png"]
    assert plot.main(argv) == 1
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("python -m sf.plot: error: cannot "), err
    assert lines[0].endswith(": File name too long") and str(long) in lines[0]


@pytest.mark.e2e
def test_bad_input_from_the_real_command_line(tmp_path):
    res = run_plot_cli(tmp_path / "nope")
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and str(tmp_path / "nope") in res.stderr and "Traceback" not in res.stderr


@pytest.mark.e2e
def test_reading_is_imported_only_when_used():
    code = ("import sys, sf.runner.stats, sf.plot; "
            "print(sorted(m for m in ('tensorboard', 'matplotlib') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


# --- a real run ---

@pytest.mark.e2e
def test_plots_a_real_tiny_training_run(tmp_path, entry):
    small = ["--rollout", "8", "--recurrence", "8", "--batch_size", "64", "--rnn_size", "32", "--hidden_size", "32",
             "--encoder_mlp_layers", "32", "--num_envs_per_worker", "4", "--experiment_summaries_interval", "1",
             "--device", "cpu", "--num_workers", "1"]
    res = entry("train.py", "--env", "test_corridor", "--experiment", "tiny", "--train_dir", tmp_path, *small,
                "--train_for_env_steps", "3000", timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    exp = tmp_path / "tiny"
    scalars = read_event_scalars(exp)
    out = tmp_path / "tiny.png"
    res = run_plot_cli(exp, "--out", out, "--smooth", "0")
    assert res.returncode == 0 and res.stderr == "", res.stderr
    with Image.open(out) as img:
        assert img.size == (1280, 880)
    series, _ = plot.panel_series({"tiny": plot.read_scalar_events(exp)}, list(plot.PANELS), 0.0)
    for panel, tag in (("reward", "reward/reward"), ("fps", "perf/_fps"), ("lag", "train/policy_lag_avg")):
        (s,) = [s for s in series[panel] if s.tag == tag]
        assert list(zip(s.x.tolist(), s.y.tolist())) == [(float(st), v) for st, v in scalars[tag]], panel
        assert len(s.x) >= 1 and max(s.x) >= 3000  # steps are env frames, up to the budget
    assert color_pixels(out, C0) > 100  # drawn (markers too: a run this short may have few points per tag)
