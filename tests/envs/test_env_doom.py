"""VizDoom envs for real: spaces, reward scaling and info["episode"], measurements and heads, bots, data."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

vizdoom = pytest.importorskip("vizdoom", reason="vizdoom is not installed (pip install vizdoom)")

from sf_envs.doom.fetch_scenarios import fetch, scenarios_dir  # noqa: E402
from sf_envs.doom.scenarios import MEASUREMENT_NAMES, SCENARIOS_BY_NAME  # noqa: E402
from sf_envs.errors import EnvUnavailableError  # noqa: E402
from sf_envs.params import env_cfg  # noqa: E402
from sf_envs.registry import env_spec, make_env  # noqa: E402

from e2e_helpers import ROOT  # noqa: E402
from env_test_helpers import cfg_for, check_contract, observation_trace  # noqa: E402

pytestmark = pytest.mark.doom

STANDARD = [n for n, s in SCENARIOS_BY_NAME.items() if not s.needs_fetch]
FETCHED = [n for n, s in SCENARIOS_BY_NAME.items() if s.needs_fetch]


@pytest.fixture(scope="session")
def doom_data(tmp_path_factory):
    """A directory with the Sample Factory scenario data: the configured one, else fetched now (needs PyPI)."""
    d = scenarios_dir()
    if (d / "battle.wad").is_file() and (d / "ssl2.wad").is_file():
        return str(d)
    d = tmp_path_factory.mktemp("doom_scenarios")
    try:
        fetch(d)
    except RuntimeError as e:
        pytest.skip(f"Doom scenario data not present and not fetchable here: {e}")
    return str(d)


def run_episode(env, policy=None, max_steps=100_000):
    rewards = []
    obs, _ = env.reset()
    for _ in range(max_steps):
        obs, r, term, trunc, info = env.step(env.action_space.sample() if policy is None else policy(obs))
        rewards.append(r)
        if term or trunc:
            return rewards, info, term, trunc
    raise AssertionError("episode did not end")


@pytest.mark.parametrize("name", STANDARD)
def test_standard_scenarios_contract(name):
    env = make_env(cfg_for(name))
    assert env.observation_space["obs"].shape == (3, 72, 128)
    assert "measurements" not in env.observation_space.spaces
    check_contract(env, steps=20)
    env.close()


@pytest.mark.parametrize("name", FETCHED)
def test_fetched_scenarios_contract(name, doom_data):
    kw = dict(doom_bots_timelimit=0.2) if "bots" in name else {}
    env = make_env(cfg_for(name, doom_data, **kw))
    assert env.observation_space["obs"].shape == (3, 72, 128)
    check_contract(env, steps=20)
    env.close()


def test_doom_basic_real_episode_reward_scaling():
    env = make_env(cfg_for("doom_basic"), render_mode="rgb_array")
    assert env.action_space.n == 4  # no-op, left, right, attack
    assert env_spec("doom_basic").frameskip == env.frameskip == 4
    frame = env.render()
    for _ in range(3):
        rewards, info, term, trunc = run_episode(env)
        ep = info["episode"]
        assert ep["length"] == 4 * len(rewards)
        assert ep["reward"] == pytest.approx(sum(rewards))  # the training reward: game reward x 0.01
        assert ep["reward"] == pytest.approx(0.01 * ep["score"])  # Sample Factory units vs the game's score
        # The score decomposes as +101 for the kill, -1 per frame lived, -5 per missed shot (at most one per
        # step); the frame count is off by a few around the kill, hence the slack of 5.
        shots_and_slack = ep["score"] - 101 * term + ep["length"]
        assert -5 * len(rewards) - 5 <= shots_and_slack <= 5, (term, ep)
        assert term or (trunc and ep["length"] == 300 and ep["score"] < 0)  # timeout: 300 frames, no kill
    assert env.render().shape == (120, 160, 3)  # the game frame as rendered (for videos)
    assert frame.shape == (120, 160, 3)
    env.close()


def test_doom_episode_report_naive_count_with_frameskip_and_restarts():
    """info["episode"] vs a naive count over episodes that span engine restarts, with a frameskip override: reward =
    the sum of step() rewards, length = steps x frameskip, score = reward / 0.01 (doom_basic's scale)."""
    env = make_env(cfg_for("doom_basic", env_frameskip=3, doom_restart_engine_steps=60))
    env.action_space.seed(1)
    for _ in range(4):
        rewards, info, _, _ = run_episode(env)
        ep = info["episode"]
        assert set(ep) == {"reward", "length", "score"}
        assert ep["length"] == 3 * len(rewards)
        assert ep["reward"] == pytest.approx(sum(rewards), abs=1e-9)
        assert ep["score"] == pytest.approx(100 * ep["reward"], abs=1e-6)
    assert env._engine_restarts >= 1
    env.close()


def test_doom_basic_policy_shoot_when_centered():
    """A scripted aimer: the episode ends with the kill and a positive score."""
    env = make_env(cfg_for("doom_basic"))

    def aim(obs):
        img = obs["obs"].astype(np.int32)
        red = (img[0] - img[1] - img[2]) > 60  # the monster's reddish pixels
        cols = np.nonzero(red[10:60].any(axis=0))[0]
        if len(cols) == 0:
            return 3
        c = cols.mean()
        return 3 if abs(c - 64) < 6 else (1 if c < 64 else 2)

    scores = [run_episode(env, aim, 200)[1]["episode"]["score"] for _ in range(3)]
    assert max(scores) > 50, scores
    env.close()


def test_full_variant_measurements_and_heads(doom_data):
    env = make_env(cfg_for("doom_battle", doom_data))
    assert list(env.action_space.nvec) == [3, 3, 2, 2, 11]  # move, strafe, attack, sprint, aim (battle's reduced set)
    assert env.observation_space["measurements"].shape == (len(MEASUREMENT_NAMES),) == (23,)
    env.reset()
    obs, *_ = env.step(np.zeros(5, np.int64))  # at the reset tic the pistol is not drawn yet
    m = obs["measurements"]
    assert m.dtype == np.float32
    assert m[MEASUREMENT_NAMES.index("health/30")] == pytest.approx(100 / 30)
    assert m[MEASUREMENT_NAMES.index("selected_weapon")] == 2  # the pistol
    assert m[MEASUREMENT_NAMES.index("weapon2_owned")] == 1
    assert m[MEASUREMENT_NAMES.index("ammo2/15")] > 0
    rewards, info, _, _ = run_episode(env)
    ep = info["episode"]
    assert ep["reward"] == pytest.approx(sum(rewards), abs=1e-6)
    assert ep["score"] == int(ep["score"]) >= 0  # kills
    env.close()

    env = make_env(cfg_for("doom_duel_bots", doom_data, doom_bots_timelimit=0.2))
    assert list(env.action_space.nvec) == [3, 3, 2, 2, 2, 8, 21]  # Table A.4: 12096 combinations
    assert int(np.prod(env.action_space.nvec)) == 12096
    assert env.action_heads == ["move", "strafe", "attack", "sprint", "use", "weapon", "aim"]
    env.close()


def test_action_conversion_table():
    env = make_env(cfg_for("doom_deadly_corridor"))  # heads: turn, move, strafe, attack
    b = env.buttons
    vec = env._convert_action(np.array([1, 2, 2, 1]))
    assert vec[b.index("TURN_LEFT")] == 1 and vec[b.index("MOVE_BACKWARD")] == 1 and vec[b.index("MOVE_RIGHT")] == 1
    assert vec[b.index("ATTACK")] == 1 and sum(vec) == 4
    assert sum(env._convert_action(np.array([0, 0, 0, 0]))) == 0
    from sf_envs.doom.scenarios import AIM_FULL
    deltas = [dict(opt).get("TURN_LEFT_RIGHT_DELTA", 0.0) for opt in AIM_FULL[1]]
    assert deltas[0] == -12.5 and deltas[-1] == 12.5 and deltas[10] == 0.0 and np.allclose(np.diff(deltas), 1.25)


def test_seeded_episodes_are_deterministic():
    def trace(seed):
        return observation_trace(make_env(cfg_for("doom_defend_the_center", seed=seed)), 60, stop_at_episode_end=True)
    a, b, c = trace(3), trace(3), trace(4)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert not np.array_equal(trace(None), trace(None))  # unseeded envs get fresh entropy, not one shared seed


@pytest.mark.e2e
def test_engine_restarts_between_episodes_and_stays_seeded():
    """--doom_restart_engine_steps: a fresh engine process at an episode end once the budget is spent, the old one
    gone (no orphan), episodes whole, and a seeded env's frames identical from run to run across restarts."""
    import psutil
    me = psutil.Process()

    def engines():
        return [p.pid for p in me.children() if p.name() == "vizdoom"]

    env = make_env(cfg_for("doom_basic", seed=5, doom_restart_engine_steps=40))
    env.action_space.seed(0)
    env.reset()
    pids, lengths, steps = {engines()[0]}, [], 0
    while len(lengths) < 12:
        _, _, term, trunc, info = env.step(env.action_space.sample())
        steps += 1
        if term or trunc:
            lengths.append(info["episode"]["length"])
            env.reset()
            alive = engines()
            assert len(alive) == 1, alive  # the replaced engine has exited
            pids.add(alive[0])
    env.close()
    assert len(pids) - 1 == env._engine_restarts >= 3
    assert all(0 < n <= 300 for n in lengths)  # doom_basic's 300-frame episodes, none cut by a restart
    trace = lambda: observation_trace(  # noqa: E731
        make_env(cfg_for("doom_basic", seed=5, doom_restart_engine_steps=40)), steps, stop_at_episode_end=False)
    assert np.array_equal(trace(), trace())


def test_engine_command_line_names_its_shared_memory():
    """engine_shm_files (what the runner removes after killing the engine of a SIGKILLed worker) names exactly the
    files a live game has in /dev/shm, and a closed game has removed them."""
    import psutil
    from sf_envs.doom.engine_shm import engine_shm_files
    env = make_env(cfg_for("doom_basic"))
    env.reset()
    try:
        engines = [c for c in psutil.Process().children(recursive=True) if c.name() == "vizdoom"]
        assert len(engines) == 1, engines
        files = engine_shm_files(engines[0].cmdline())
        assert len(files) == 3 and all(f.is_file() for f in files), files
        assert engine_shm_files([sys.executable, "-c", "pass"]) == []
    finally:
        env.close()
    assert not any(f.exists() for f in files)


def _fake_engine_files(instance_id: str, age: float) -> list:
    from sf_envs.doom.engine_shm import SEGMENT_PREFIXES, SHM_DIR
    files = [SHM_DIR / f"{prefix}{instance_id}" for prefix in SEGMENT_PREFIXES]
    for f in files:
        f.write_bytes(b"\0" * 4096)
        os.utime(f, (time.time() - age, time.time() - age))
    return files


@pytest.mark.serial  # a Doom run starting beside it would remove its stale files first (it removes stale files)
def test_stale_engine_files_only_those_nothing_uses(tmp_path):
    """stale_engine_files (removed at each run's start): engine files older than min_age that no live process names
    (an engine's +viz_instance_id) or has mapped (its host); young files (a game being created) are kept."""
    import uuid
    from sf_envs.doom.engine_shm import remove_stale_engine_files, stale_engine_files
    ids = {k: f"sftest{k}{uuid.uuid4().hex[:10]}" for k in ("stale", "young", "engine", "host")}
    files = {k: _fake_engine_files(i, 0.0 if k == "young" else 600.0) for k, i in ids.items()}
    engine = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdin.read()", "+viz_instance_id",
                               ids["engine"]], stdin=subprocess.PIPE)
    host = subprocess.Popen([sys.executable, "-c", "import mmap, sys\nf = open(sys.argv[1], 'r+b')\n"
                             "m = mmap.mmap(f.fileno(), 4096)\nf.close()\nprint('mapped', flush=True)\n"
                             "sys.stdin.read()", str(files["host"][0])], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert host.stdout.readline().strip() == b"mapped"
        # (the engine's command line is visible from its exec on; psutil reads it at the call)
        ours = [f for f in stale_engine_files(min_age=300.0) if f.name.endswith(tuple(ids.values()))]
        assert ours == sorted(files["stale"]), ours
        assert remove_stale_engine_files(min_age=300.0)[0] >= 3
        assert not any(f.exists() for f in files["stale"])
        assert all(f.exists() for k in ("young", "engine", "host") for f in files[k])
    finally:
        for p in (engine, host):
            p.stdin.close()
            p.wait(timeout=10)
        for f in (f for fs in files.values() for f in fs):
            f.unlink(missing_ok=True)


# removes every unused engine file, young ones too: a Doom game being made beside it would lose its own
@pytest.mark.serial
def test_engine_files_of_a_run_killed_at_once_are_removed_by_the_next(tmp_path):
    """Every process of a Doom env's host SIGKILLed at once (its engine too): nobody closes the game, its three files
    stay in /dev/shm; the next remove_stale_engine_files removes them (a live game's files stay)."""
    import psutil
    from sf_envs.doom.engine_shm import engine_shm_files, remove_stale_engine_files, stale_engine_files
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from env_test_helpers import cfg_for; "
            "from sf_envs.registry import make_env; env = make_env(cfg_for('doom_basic')); env.reset(); "
            "print('ready', flush=True); sys.stdin.read()")
    host = subprocess.Popen([sys.executable, "-c", code, str(ROOT / "tests" / "envs")], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, start_new_session=True)
    live = make_env(cfg_for("doom_basic"))
    live.reset()
    try:
        assert host.stdout.readline().strip() == b"ready"
        engines = [c for c in psutil.Process(host.pid).children(recursive=True) if c.name() == "vizdoom"]
        assert len(engines) == 1, engines
        files = engine_shm_files(engines[0].cmdline())
        assert all(f.is_file() for f in files)
        assert not set(files) & set(stale_engine_files(min_age=0.0))  # alive: in use
        os.killpg(host.pid, signal.SIGKILL)
        host.wait(timeout=10)
        psutil.wait_procs(engines, timeout=10)
        assert all(f.is_file() for f in files)  # left behind
        stale = stale_engine_files(min_age=0.0)
        assert set(files) <= set(stale)
        mine = [c for c in psutil.Process().children(recursive=True) if c.name() == "vizdoom"]
        assert len(mine) == 1 and not set(engine_shm_files(mine[0].cmdline())) & set(stale)  # the live game's
        remove_stale_engine_files(min_age=0.0)
        assert not any(f.exists() for f in files)
        assert all(f.exists() for f in engine_shm_files(mine[0].cmdline()))
    finally:
        live.close()
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
            host.wait()


def test_reward_shaping_coefficients_are_parameters(doom_data):
    """Health pickups/losses change the battle reward by exactly the configured coefficients."""
    from sf_envs.doom.doom_env import DoomRewardShaper
    idx = {"HEALTH": 0, "AMMO2": 1, "SELECTED_WEAPON": 2, "SELECTED_WEAPON_AMMO": 3, "DEAD": 4, "FRAGCOUNT": 5,
           "DEATHCOUNT": 6, "DAMAGECOUNT": 7}
    cfg = env_cfg("doom_duel_bots", doom_rew_health_gain=0.5, doom_rew_frag=3.0, doom_rew_weapon_hold=0.0)
    s = DoomRewardShaper(cfg, "deathmatch", idx)
    v = np.array([50, 20, 2, 20, 0, 0, 0, 0], float)
    s.reset(v)
    assert s.step(np.array([60, 20, 2, 20, 0, 0, 0, 0], float), False) == pytest.approx(10 * 0.5)
    assert s.step(np.array([60, 20, 2, 20, 0, 1, 0, 0], float), False) == pytest.approx(3.0)
    assert s.step(np.array([60, 18, 2, 18, 0, 1, 0, 0], float), False) == pytest.approx(-2 * 0.0001)  # ammo spent
    assert s.step(np.array([0, 18, 2, 18, 1, 1, 1, 0], float), False) == pytest.approx(-60 * 0.003 - 0.75)  # died
    assert s.step(np.array([100, 50, 2, 50, 0, 1, 1, 0], float), False) == 0.0  # respawn: no reward for the refill
    assert s.step(np.array([100, 50, 2, 50, 0, 1, 1, 500], float), False) == pytest.approx(200 * 0.003)  # capped
    assert s.step(np.array([90, 50, 2, 50, 0, 1, 1, 500], float), True) == 0.0  # nothing on the last step
    hold = DoomRewardShaper(env_cfg("doom_battle"), "battle", idx)
    hold.reset(v)
    got = [hold.step(v, False) for _ in range(6)]
    assert got[:3] == [0.0] * 3 and got[-1] == pytest.approx(0.0002)  # pistol held 5+ steps: bonus x preference 1


def test_bots_difficulty_and_count(doom_data):
    env = make_env(cfg_for("doom_deathmatch_bots", doom_data, doom_num_bots=2, doom_bots_difficulty=10,
                           doom_bots_timelimit=0.1))
    env.reset()
    for _ in range(5):
        obs, *_ = env.step(env.action_space.sample())
    assert obs["measurements"][MEASUREMENT_NAMES.index("player_count/5")] == pytest.approx(3 / 5)
    rewards, info, term, trunc = run_episode(env)
    assert term and not trunc and info["episode"]["length"] == 2 * len(rewards)  # the match ends at its time limit
    env.close()
    with pytest.raises(ValueError, match="0..100"):
        make_env(cfg_for("doom_duel_bots", doom_data, doom_bots_difficulty=101))


def test_missing_scenario_data_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("SF_DOOM_SCENARIOS", raising=False)
    cfg = cfg_for("doom_battle", str(tmp_path / "empty"))
    with pytest.raises(EnvUnavailableError) as e:
        make_env(cfg)
    msg = str(e.value)
    assert "\n" not in msg and "python -m sf_envs.doom.fetch_scenarios" in msg and "battle" in msg
    # the environment variable is the fallback when the flag is not set
    monkeypatch.setenv("SF_DOOM_SCENARIOS", str(tmp_path / "via_env"))
    with pytest.raises(EnvUnavailableError, match="via_env"):
        make_env(cfg_for("doom_two_colors_easy", None))


@pytest.mark.e2e
def test_train_py_reports_missing_data_in_one_line(tmp_path):
    env = dict(os.environ, SF_DOOM_SCENARIOS=str(tmp_path / "nothing_here"))
    res = subprocess.run([sys.executable, str(ROOT / "train.py"), "--env", "doom_battle", "--train_dir", str(tmp_path),
                          "--device", "cpu"], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert len(lines) == 1 and "fetch_scenarios" in lines[0], res.stderr


# --- scenario data verification (issue 14) ----------------------------------------------------------------
def copy_scenario(src, dest, *names):
    import shutil
    dest.mkdir(parents=True, exist_ok=True)
    for n in names:
        shutil.copy2(os.path.join(src, n), dest / n)
    return dest


def one_line_error(cfg):
    from sf_envs.doom.scenario_check import ScenarioDataError
    with pytest.raises(ScenarioDataError) as e:
        make_env(cfg)
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, EnvUnavailableError)  # a ValueError: probe_env's one-line type
    return msg


@pytest.mark.parametrize("tampered", ["battle.wad", "battle_continuous_turning.cfg"])
def test_fetched_file_modified_after_fetch_is_refused_at_load(doom_data, tmp_path, tampered):
    d = copy_scenario(doom_data, tmp_path / "data", "battle_continuous_turning.cfg", "battle.wad")
    env = make_env(cfg_for("doom_battle", str(d)))  # the pinned files load (and are now cached as verified)
    path = d / tampered
    data = bytearray(path.read_bytes())
    st = os.stat(path)
    data[-2] ^= 0x20  # same size; the mtime is restored below, so only the ctime tells the cache it changed
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    msg = one_line_error(cfg_for("doom_battle", str(d)))
    assert str(path) in msg and "pinned sha256" in msg and f"python -m sf_envs.doom.fetch_scenarios --dest {d}" in msg
    with pytest.raises(EnvUnavailableError, match=tampered):  # an env made before: refused at its engine start
        env.reset()
    env.close()


def test_fetched_cfg_naming_an_executable_is_refused(doom_data, tmp_path):
    d = copy_scenario(doom_data, tmp_path / "data", "ssl2.cfg", "ssl2.wad")
    with open(d / "ssl2.cfg", "a") as f:
        f.write("vizdoom_path = /bin/sh\n")
    msg = one_line_error(cfg_for("doom_duel_bots", str(d)))
    assert str(d / "ssl2.cfg") in msg and "key vizdoom_path is refused" in msg


@pytest.mark.parametrize("line, key", [("vizdoom_path = /bin/true", "vizdoom_path"),
                                       ("doom_scenario_path = ../../x", "doom_scenario_path")])
def test_builtin_cfg_with_refused_key(tmp_path, monkeypatch, line, key):
    """Any scenario cfg is checked, the vizdoom wheel's too (here a copy the package path points to)."""
    d = copy_scenario(vizdoom.scenarios_path, tmp_path / "vz", "basic.cfg", "basic.wad")
    make_env(cfg_for("doom_basic")).close()
    with open(d / "basic.cfg", "a") as f:
        f.write(line + "\n")
    monkeypatch.setattr(vizdoom, "scenarios_path", str(d))
    msg = one_line_error(cfg_for("doom_basic"))
    assert str(d / "basic.cfg") in msg and f"key {key}" in msg and "refused" in msg


@pytest.mark.e2e
def test_train_py_reports_tampered_data_in_one_line(doom_data, tmp_path):
    d = copy_scenario(doom_data, tmp_path / "data", "battle_continuous_turning.cfg", "battle.wad")
    with open(d / "battle.wad", "ab") as f:
        f.write(b"\0")
    env = dict(os.environ, SF_DOOM_SCENARIOS=str(d))
    res = subprocess.run([sys.executable, str(ROOT / "train.py"), "--env", "doom_battle", "--train_dir", str(tmp_path),
                          "--device", "cpu"], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert len(lines) == 1 and "battle.wad" in lines[0] and "fetch_scenarios" in lines[0], res.stderr


def test_engine_directory_made_before_any_engine_starts(tmp_path, monkeypatch):
    """Each VizDoom engine makes ./_vizdoom/ as it starts and dies when another engine made it in between, taking the
    Python process with it (SIGSEGV; CI lost an hts run to it). The env makes the directory before any engine starts."""
    monkeypatch.chdir(tmp_path)
    env = make_env(cfg_for("doom_basic"))
    try:
        game = env.unwrapped._new_game()  # configured, not started: no engine has run in this directory
        assert (tmp_path / "_vizdoom").is_dir()
        game.close()
    finally:
        env.close()
