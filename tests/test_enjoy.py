"""enjoy.py: a tiny real training run, then headless evaluation with a video read back; error cases.

Videos (issue 20): the .mp4 is read back with PyAV (codec h264, yuv420p, frame count, resolution, the frames
themselves), the GIF too; a bad --video_name is one line naming the directory before anything runs; a failed run
leaves no file behind; `python -m sf.enjoy` is the same program as enjoy.py."""
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from e2e_helpers import made_once

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--num_workers", "1", "--num_envs_per_worker", "2", "--batch_size", "64", "--rollout", "16",
         "--recurrence", "16", "--rnn_size", "32", "--hidden_size", "32", "--device", "cpu"]
TINY = ["--num_workers", "1", "--num_envs_per_worker", "2", "--rollout", "8", "--recurrence", "8", "--batch_size", "32",
        "--rnn_size", "16", "--hidden_size", "16", "--encoder_mlp_layers", "16", "--device", "cpu"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, entry):
    pytest.importorskip("vizdoom")

    def make(train_dir):
        res = entry("train.py", "--env", "doom_basic", "--experiment", "tiny", "--train_dir", train_dir, *SMALL,
                    "--train_for_env_steps", "1500", timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return made_once(tmp_path_factory, "enjoy", make)


@pytest.mark.e2e
@pytest.mark.doom
def test_enjoy_headless_video(trained, entry):
    res = entry("enjoy.py", "--env", "doom_basic", "--experiment", "tiny", "--train_dir", trained, "--no_render",
                "--save_video", "--video_frames", "40", "--max_num_frames", "400", "--video_name", "clip.mp4",
                timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    video = trained / "tiny" / "clip.mp4"
    assert f"Video: {video}" in res.stdout
    codec, pix_fmt, rate, frames = _decode(video)
    assert codec == "h264" and pix_fmt == "yuv420p" and len(frames) == 40
    assert rate == Fraction(35, 4)  # Doom's 35 fps over frameskip 4
    from sf.cfg import default_cfg
    from sf_envs.registry import make_env
    env = make_env(default_cfg(env="doom_basic"), render_mode="rgb_array")
    env.reset()
    assert frames[0].shape == env.render().shape  # the game as rendered, not the network's 128x72 input
    env.close()


@pytest.mark.e2e
@pytest.mark.doom
def test_enjoy_reports_episodes(trained, entry):
    res = entry("enjoy.py", "--env", "doom_basic", "--experiment", "tiny", "--train_dir", trained, "--no_render",
                "--max_num_episodes", "2", "--eval_deterministic", timeout=180)
    assert res.returncode == 0, res.stderr
    assert "Episode 1: reward" in res.stdout and "Episode 2: reward" in res.stdout
    assert "2 episodes: reward mean" in res.stdout


def _one_line_error(res, needle):
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr and needle in lines[0], res.stderr


@pytest.mark.e2e
@pytest.mark.doom
def test_enjoy_errors(trained, entry, tmp_path):
    _one_line_error(entry("enjoy.py", "--env", "doom_basic", "--experiment", "nope", "--train_dir", trained),
                    "does not exist")
    (tmp_path / "empty").mkdir()
    _one_line_error(entry("enjoy.py", "--env", "doom_basic", "--experiment", "empty", "--train_dir", tmp_path),
                    "no latest checkpoint")
    # --max_num_episodes 1: a mismatch that went unnoticed fails the assertion instead of playing on until the timeout
    _one_line_error(entry("enjoy.py", "--env", "doom_basic", "--experiment", "tiny", "--train_dir", trained,
                          "--hidden_size", "16", "--max_num_episodes", "1"), "checkpoint")
    _one_line_error(entry("enjoy.py", "--env", "doom_defend_the_center", "--experiment", "tiny", "--train_dir", trained,
                          "--max_num_episodes", "1"), "checkpoint")  # another env's action space
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(trained / "tiny", broken)
    for f in (broken / "checkpoint_p0").glob("*.pth"):
        f.write_bytes(b"not a checkpoint")
    _one_line_error(entry("enjoy.py", "--env", "doom_basic", "--experiment", "broken", "--train_dir", tmp_path),
                    "checkpoint")


# ------------------------------------------------------------------------------------------------------------------
# videos (issue 20): H.264 .mp4 that browsers play, optional GIF, checked paths, `python -m sf.enjoy`


def run_module(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m sf.enjoy args...` from the repository root."""
    return subprocess.run([sys.executable, "-m", "sf.enjoy", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"), cwd=ROOT)


@pytest.fixture(scope="module")
def corridor(tmp_path_factory, entry):
    """A tiny trained test_corridor experiment (no game needed; a few seconds): train_dir/corridor."""

    def make(train_dir):
        res = entry("train.py", "--env", "test_corridor", "--experiment", "corridor", "--train_dir", train_dir, *TINY,
                    "--train_for_env_steps", "600", timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return made_once(tmp_path_factory, "enjoy_corridor", make)


def _frames(shape, n):
    """n distinct RGB frames: a color gradient with a bright square that moves one step per frame."""
    h, w = shape
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), np.full((h, w), 90)], -1).astype(np.uint8)
    out = []
    for i in range(n):
        f = base.copy()
        y, x = (3 * i) % max(h - 8, 1), (5 * i) % max(w - 8, 1)
        f[y:y + 8, x:x + 8] = 255
        out.append(f)
    return out


def _decode(path):
    """(codec name, pix_fmt, average rate, frames as RGB arrays) of the first video stream, read back with PyAV."""
    import av
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(s)]
        return s.codec_context.name, s.codec_context.pix_fmt, s.average_rate, frames


@pytest.mark.parametrize("shape", [(120, 160), (45, 77)], ids=["even", "odd"])
def test_video_writer_h264_mp4_and_gif(tmp_path, shape):
    from sf.enjoy import VideoWriter
    frames = _frames(shape, 23)
    video = VideoWriter(tmp_path / "clip.mp4", 8.75, gif_path=tmp_path / "clip.gif")
    for f in frames:
        video.add(f)
    assert video.frames == 23
    assert not (tmp_path / "clip.mp4").exists() and not (tmp_path / "clip.gif").exists()  # temp names until close
    video.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.gif", "clip.mp4"]  # no temp file left

    h, w = shape
    even_h, even_w = h + h % 2, w + w % 2  # yuv420p: odd sizes padded by one pixel
    codec, pix_fmt, rate, decoded = _decode(tmp_path / "clip.mp4")
    assert codec == "h264" and pix_fmt == "yuv420p" and rate == Fraction(35, 4)
    assert len(decoded) == 23 and all(d.shape == (even_h, even_w, 3) for d in decoded)
    assert video.size == (even_w, even_h)
    for got, want in zip(decoded, frames):  # the frames themselves, in order (lossy: close, not equal)
        assert np.abs(got[:h, :w].astype(int) - want).mean() < 6
    data = (tmp_path / "clip.mp4").read_bytes()
    assert data.index(b"moov") < data.index(b"mdat")  # +faststart: browsers start playing before the end

    codec, _, _, decoded = _decode(tmp_path / "clip.gif")
    assert codec == "gif" and len(decoded) == 23 and all(d.shape == (h, w, 3) for d in decoded)  # GIF: rendered size
    for got, want in zip(decoded, frames):
        assert np.abs(got.astype(int) - want).mean() < 12


def test_video_writer_failure_leaves_nothing(tmp_path):
    from sf.cfg import RunError
    from sf.enjoy import VideoWriter
    (tmp_path / "clip.mp4").write_bytes(b"previous video")
    video = VideoWriter(tmp_path / "clip.mp4", 10, gif_path=tmp_path / "clip.gif")
    for f in _frames((32, 48), 5):
        video.add(f)
    with pytest.raises(RunError, match="frame changed"):
        video.add(np.zeros((16, 48, 3), np.uint8))
    video.close()  # after a failure: nothing to finish
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.mp4"]  # no temp file, no half-written GIF
    assert (tmp_path / "clip.mp4").read_bytes() == b"previous video"  # the final name untouched

    empty = VideoWriter(tmp_path / "none.mp4", 10)
    empty.close()  # no frame: no file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.mp4"]


@pytest.mark.e2e
def test_enjoy_module_video_and_gif(corridor):
    res = run_module("--env", "test_corridor", "--experiment", "corridor", "--train_dir", corridor, "--no_render",
                     "--device", "cpu", "--save_video", "--video_gif", "--video_frames", "30", "--max_num_frames", "80")
    assert res.returncode == 0, res.stdout + res.stderr
    mp4, gif = corridor / "corridor" / "replay_corridor.mp4", corridor / "corridor" / "replay_corridor.gif"
    assert f"Video: {mp4} (30 frames, 80x8, H.264" in res.stdout and f"GIF: {gif}" in res.stdout
    codec, pix_fmt, _, frames = _decode(mp4)
    assert codec == "h264" and pix_fmt == "yuv420p" and len(frames) == 30
    from sf.cfg import default_cfg
    from sf_envs.registry import make_env
    env = make_env(default_cfg(env="test_corridor"), render_mode="rgb_array")
    env.reset()
    rendered = env.render()
    env.close()
    assert frames[0].shape == rendered.shape == (8, 80, 3)  # the rendered resolution
    codec, _, _, frames = _decode(gif)
    assert codec == "gif" and len(frames) == 30 and frames[0].shape == rendered.shape
    assert not [p for p in (corridor / "corridor").iterdir() if p.name.endswith(".part")]


@pytest.mark.e2e
def test_enjoy_module_help():
    res = run_module("--help", timeout=60)
    assert res.returncode == 0, res.stderr
    assert (res.stdout.startswith("usage: python -m sf.enjoy") and "--save_video" in res.stdout
            and "--video_gif" in res.stdout)


def _bad_video_paths(tmp):
    (tmp / "adir").mkdir()
    (tmp / "afile").write_text("x")
    cases = [(tmp / "missing" / "clip.mp4", f"video directory {tmp / 'missing'} does not exist"),
             (tmp / "adir", f"--video_name {tmp / 'adir'} is a directory"),
             (tmp / "afile" / "clip.mp4", f"video directory {tmp / 'afile'} is not a directory"),
             (tmp / "clip.avi", "--video_name must end in .mp4")]
    if os.path.isdir("/proc/self"):  # a directory where nobody may create a file, even root
        cases.append((Path("/proc/clip.mp4"), "cannot write the video in directory /proc"))
    if os.geteuid() != 0:
        (tmp / "readonly").mkdir(mode=0o555)
        cases.append((tmp / "readonly" / "clip.mp4", f"cannot write the video in directory {tmp / 'readonly'}"))
    return cases


@pytest.mark.e2e
def test_enjoy_bad_video_path(tmp_path, entry):
    """One line naming the directory, exit 2, before the env starts: an experiment without a checkpoint would
    otherwise fail with 'no latest checkpoint'."""
    (tmp_path / "td" / "exp").mkdir(parents=True)
    for i, (name, needle) in enumerate(_bad_video_paths(tmp_path)):
        args = ["--env", "test_corridor", "--experiment", "exp", "--train_dir", tmp_path / "td", "--no_render",
                "--save_video", "--video_name", name, "--device", "cpu"]
        res = run_module(*args) if i == 0 else entry("enjoy.py", *args)  # both entry points, the same answer
        _one_line_error(res, needle)
        assert "Loaded" not in res.stdout
    assert not list((tmp_path / "td" / "exp").iterdir())


@pytest.mark.e2e
def test_enjoy_failed_run_leaves_no_video(tmp_path, entry):
    (tmp_path / "exp").mkdir()  # no checkpoint: fails after the video files were reserved
    res = entry("enjoy.py", "--env", "test_corridor", "--experiment", "exp", "--train_dir", tmp_path, "--no_render",
                "--save_video", "--video_gif", "--device", "cpu")
    _one_line_error(res, "no latest checkpoint")
    assert not list((tmp_path / "exp").iterdir())
