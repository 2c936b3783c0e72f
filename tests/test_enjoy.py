"""enjoy.py: a tiny real training run, then headless evaluation with a video read back; error cases."""
import pytest

SMALL = ["--num_workers", "1", "--num_envs_per_worker", "2", "--batch_size", "64", "--rollout", "16", "--recurrence", "16",
         "--rnn_size", "32", "--hidden_size", "32", "--device", "cpu"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, entry):
    pytest.importorskip("vizdoom")
    train_dir = tmp_path_factory.mktemp("enjoy")
    res = entry("train.py", "--env", "doom_basic", "--experiment", "tiny", "--train_dir", train_dir, *SMALL,
                    "--train_for_env_steps", "1500", timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return train_dir


@pytest.mark.doom
def test_enjoy_headless_video(trained, entry):
    import cv2
    res = entry("enjoy.py", "--env", "doom_basic", "--experiment", "tiny", "--train_dir", trained, "--no_render",
                "--save_video", "--video_frames", "40", "--max_num_frames", "400", "--video_name", "clip.mp4", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    video = trained / "tiny" / "clip.mp4"
    assert f"Video: {video}" in res.stdout
    cap = cv2.VideoCapture(str(video))
    frames = 0
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames += 1
        shape = frame.shape
    assert frames == 40
    from sf.cfg import default_cfg
    from sf_envs.registry import make_env
    env = make_env(default_cfg(env="doom_basic"), render_mode="rgb_array")
    env.reset()
    assert shape == env.render().shape  # the game as rendered, not the network's 128x72 input
    env.close()


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


@pytest.mark.doom
def test_enjoy_errors(trained, entry, tmp_path):
    _one_line_error(entry("enjoy.py", "--env", "doom_basic", "--experiment", "nope", "--train_dir", trained), "does not exist")
    (tmp_path / "empty").mkdir()
    _one_line_error(entry("enjoy.py", "--env", "doom_basic", "--experiment", "empty", "--train_dir", tmp_path), "no latest checkpoint")
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
    _one_line_error(entry("enjoy.py", "--env", "doom_basic", "--experiment", "broken", "--train_dir", tmp_path), "checkpoint")
