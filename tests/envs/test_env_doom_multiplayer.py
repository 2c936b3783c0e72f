"""Multi-agent VizDoom for real (doom_duel, doom_deathmatch_full): the multi-agent contract, match reports and win
flags, port leases, a match whose engine was killed or hung, and no engine or shared memory left behind."""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest

vizdoom = pytest.importorskip("vizdoom", reason="vizdoom is not installed (pip install vizdoom)")

from sf_envs.doom.doom_env import SHAPING_PARAMS, DoomRewardShaper  # noqa: E402
from sf_envs.doom.doom_multiplayer import match_wins  # noqa: E402
from sf_envs.doom.engine_shm import engine_shm_files  # noqa: E402
from sf_envs.doom.fetch_scenarios import scenarios_dir  # noqa: E402
from sf_envs.doom.ports import lease_port, try_lock  # noqa: E402
from sf_envs.doom.scenarios import MEASUREMENT_NAMES  # noqa: E402
from sf_envs.params import env_cfg  # noqa: E402
from sf_envs.registry import env_spec, make_env  # noqa: E402

from e2e_helpers import ROOT  # noqa: E402
from env_test_helpers import cfg_for  # noqa: E402

pytestmark = [pytest.mark.doom, pytest.mark.e2e]

TEST_PORTS = (30500, 30539)  # the unit tests' own range, away from the envs' default 25000-29999


@pytest.fixture(scope="module")
def data():
    d = scenarios_dir()
    if not all((d / f).is_file() for f in ("ssl2.cfg", "ssl2.wad", "freedm.cfg", "freedm.wad")):
        pytest.skip(f"Doom scenario data missing in {d} (python -m sf_envs.doom.fetch_scenarios)")
    return str(d)


def match_cfg(name, data, **kw):
    kw.setdefault("doom_multiplayer_timelimit", 0.05)  # 3 s of game time: 52 steps at frameskip 2
    return cfg_for(name, data, **kw)


def engines():
    return [c for c in psutil.Process().children() if c.name() == "vizdoom"]


def match_shm_files(env):
    """The /dev/shm files of this env's VizDoom engines, named by their command lines."""
    return [f for e in env.engines for f in engine_shm_files(e.cmdline())]


def random_actions(env):
    return [env.action_space.sample() for _ in range(env.num_agents)]


def assert_gone(files):
    assert not engines(), engines()
    assert files and not any(f.exists() for f in files), [f for f in files if f.exists()]


def test_spaces_and_specs(data):
    for name, agents in (("doom_duel", 2), ("doom_deathmatch_full", 4)):
        spec = env_spec(name)
        assert (spec.num_agents, spec.frameskip, spec.gamma) == (agents, 2, 0.995)
        env = make_env(match_cfg(name, data))  # lazy: no engine until reset()
        assert env.num_agents == agents and env.is_multiagent and not engines()
        assert list(env.action_space.nvec) == [3, 3, 2, 2, 2, 8, 21]  # Table A.4
        assert env.observation_space["obs"].shape == (3, 72, 128)
        assert env.observation_space["measurements"].shape == (len(MEASUREMENT_NAMES),)
        assert set(env.reward_shaping_defaults()) == set(SHAPING_PARAMS["deathmatch"])
        env.close()
    assert make_env(match_cfg("doom_deathmatch_full", data)).num_players == 8  # 4 agents + 4 bots


def test_duel_contract_reports_render_and_close(data):
    env = make_env(match_cfg("doom_duel", data, doom_restart_engine_steps=60))  # new engines after the 2nd match
    env.action_space.seed(0)
    obs, infos = env.reset()
    assert len(obs) == len(infos) == 2 and all(i == {} for i in infos)
    eng = engines()
    assert len(eng) == 2 and all(e.ppid() == os.getpid() for e in eng)
    assert all(e.cmdline()[e.cmdline().index("-port") + 1] == str(env.lease.port) for e in eng)
    first_files = match_shm_files(env)
    assert len(first_files) == 6 and all(f.exists() for f in first_files)
    env.set_reward_shaping({"doom_rew_frag": 3.0}, agent=1)
    assert env.players[1].shaper.coeffs["doom_rew_frag"] == 3.0 and env.players[0].shaper.coeffs["doom_rew_frag"] == 1.0
    with pytest.raises(KeyError):
        env.set_reward_shaping({"doom_rew_gathering_health": 1.0}, agent=0)

    sums, steps, reports = np.zeros(2), 0, []
    while len(reports) < 2:
        obs, rewards, term, trunc, infos = env.step(random_actions(env))
        steps += 1
        assert len(obs) == 2 and all(isinstance(r, float) for r in rewards)
        assert all(isinstance(x, bool) for x in term + trunc)
        for o in obs:
            for k, space in env.observation_space.spaces.items():
                assert o[k].shape == space.shape and o[k].dtype == space.dtype
        sums += rewards
        if term[0] or trunc[0]:
            assert term == [True, True] and trunc == [False, False]  # the match ends for both at its time limit
            eps = [i["episode"] for i in infos]
            assert all(set(e) == {"reward", "length", "score", "win"} for e in eps)
            assert all(e["length"] == 2 * steps for e in eps)  # env frames: steps x frameskip 2
            assert [e["reward"] for e in eps] == pytest.approx(list(sums), abs=1e-6)
            assert [e["win"] for e in eps] == match_wins([e["score"] for e in eps], [])
            assert all("final_obs" not in i for i in infos)
            health = [o["measurements"][MEASUREMENT_NAMES.index("health/30")] for o in obs]
            assert health == pytest.approx([100 / 30] * 2)  # already the next match's first observations
            reports.append(eps)
            sums, steps = np.zeros(2), 0
    assert 50 <= reports[0][0]["length"] // 2 <= 54  # 0.05 min = 105 tics
    assert env.matches == 3 and env.aborted_matches == 0
    assert env.engine_starts == 2 and not any(e.is_running() for e in eng)  # restarted: the old engines closed
    assert not any(f.exists() for f in first_files)

    env.reset(seed=5)  # a new match at once (the cut one is not reported)
    env.step(random_actions(env))
    frame = env.render()
    assert frame.shape == (120, 320, 3) and frame.dtype == np.uint8
    files = match_shm_files(env)
    env.close()
    env.close()  # twice is fine
    assert_gone(files)


def test_killed_or_hung_engine_restarts_the_match(data):
    """SIGKILL a joiner's engine, then SIGSTOP the host's: each time the step returns at once (kill) or after the
    timeout (hang), every agent truncated with reward 0 and its final observation, and a new match runs on."""
    env = make_env(match_cfg("doom_duel", data, doom_multiplayer_timeout_sec=3.0))
    env.reset()
    all_files = []
    for how, victim in (("kill", 1), ("stop", 0)):
        for _ in range(5):
            last, *_ = env.step(random_actions(env))
        old = list(env.engines)
        all_files += match_shm_files(env)
        target = next(e for e in old if ("-host" in e.cmdline()) == (victim == 0))
        target.kill() if how == "kill" else target.suspend()
        t0 = time.monotonic()
        obs, rewards, term, trunc, infos = env.step(random_actions(env))
        took = time.monotonic() - t0
        assert rewards == [0.0, 0.0] and term == [False, False] and trunc == [True, True]
        assert all("episode" not in i and i["match_aborted"] for i in infos)
        for i in range(2):  # each agent's latest observation: the last one returned, or the one after its action
            assert infos[i]["final_obs"]["obs"].shape == (3, 72, 128)  # when its engine still made that step
        assert np.array_equal(infos[victim]["final_obs"]["obs"], last[victim]["obs"])
        reason = infos[0]["match_aborted"]
        if how == "kill":  # the killed engine's own call fails at once
            assert f"agent {victim}: ViZDoom" in reason, reason
        else:  # a hung engine: every call waits, up to the timeout
            assert took >= 3.0 and "no answer" in reason and "within 3 s" in reason, (took, reason)
        assert not any(e.is_running() and e.status() != psutil.STATUS_ZOMBIE for e in old)
        assert len(engines()) == 2 and all(e.pid not in {o.pid for o in old} for e in engines())
        for _ in range(10):
            obs, rewards, term, trunc, infos = env.step(random_actions(env))
            assert not any(trunc)
    assert env.aborted_matches == 2
    all_files += match_shm_files(env)
    env.close()
    assert_gone(all_files)


def test_concurrent_envs_get_distinct_ports(data):
    envs = [make_env(match_cfg("doom_duel", data), env_index=i) for i in range(3)]
    errors = []

    def start(env):
        try:
            env.reset()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=start, args=(env,)) for env in envs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        ports = [env.lease.port for env in envs]
        assert len(set(ports)) == 3, ports
        assert sorted(int(e.cmdline()[e.cmdline().index("-port") + 1]) for e in engines()) == sorted(ports * 2)
        for _ in range(5):
            for env in envs:
                env.step(random_actions(env))
        # another process cannot take a port held by a match
        code = (f"from sf_envs.doom.ports import try_lock, lease_port\nassert try_lock({ports[0]}) is None\n"
                f"try:\n    lease_port({ports[0]}, {ports[0]})\nexcept RuntimeError:\n    print('refused')")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert res.stdout.strip() == "refused", res.stderr
    finally:
        files = [f for env in envs for f in match_shm_files(env)]
        for env in envs:
            env.close()
    assert_gone(files)


def test_env_left_open_at_exit_leaves_no_engine(data, tmp_path):
    """An env never closed (a crashed script): its engines die with the interpreter, their shared memory removed."""
    code = (f"from sf_envs.params import env_cfg\nfrom sf_envs.registry import make_env\n"
            f"env = make_env(env_cfg('doom_duel', doom_scenarios_dir={data!r}))\nenv.reset()\n"
            f"env.step([env.action_space.sample()] * 2)\nprint('PIDS', *[e.pid for e in env.engines])\n"
            f"print('IDS', *[e.cmdline()[e.cmdline().index('+viz_instance_id') + 1] for e in env.engines])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    lines = {ln.split()[0]: ln.split()[1:] for ln in res.stdout.splitlines() if ln.startswith(("PIDS", "IDS"))}
    assert res.returncode == 0 and len(lines.get("PIDS", [])) == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert not [p for p in map(int, lines["PIDS"]) if psutil.pid_exists(p) and "vizdoom" in psutil.Process(p).name()]
    assert not [f for f in os.listdir("/dev/shm") if any(i in f for i in lines["IDS"])]


def test_port_leases_are_exclusive():
    lo, hi = TEST_PORTS
    import socket
    busy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    busy.bind(("", lo))  # in use by another program: skipped by the bind test
    leases, errors = [], []

    def take():
        try:
            leases.append(lease_port(lo, hi))
        except RuntimeError as e:
            errors.append(e)

    threads = [threading.Thread(target=take) for _ in range(hi - lo + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ports = [x.port for x in leases]
    assert len(ports) == len(set(ports)) == hi - lo and lo not in ports and len(errors) == 1
    assert "no free UDP port" in str(errors[0]) and "\n" not in str(errors[0])
    assert try_lock(lo + 1) is None  # held by a lease of this process: a second lock on it fails too
    leases[0].release()
    again = lease_port(lo, hi)
    assert again.port == leases[0].port
    for x in leases[1:] + [again]:
        x.release()
    busy.close()


def test_match_wins():
    assert match_wins([2, 1], []) == [1.0, 0.0]
    assert match_wins([1, 1], []) == [0.0, 0.0]  # a tie is no win
    assert match_wins([0, -1], []) == [1.0, 0.0]  # a suicide loses a frag
    assert match_wins([3, 1, 0, 0], [2, 5]) == [0.0] * 4  # a bot won
    assert match_wins([3, 1, 0, 0], [2, 3]) == [0.0] * 4
    assert match_wins([3, 1, 0, 0], [2, 1, 0, 0]) == [1.0, 0.0, 0.0, 0.0]


def test_deathmatch_full_agents_and_bots(data):
    env = make_env(match_cfg("doom_deathmatch_full", data, doom_multiplayer_timelimit=0.02, doom_bots_difficulty=10))
    obs, _ = env.reset()
    assert len(obs) == 4 and len(engines()) == 4
    reports = None
    for _ in range(200):
        obs, rewards, term, trunc, infos = env.step(random_actions(env))
        if term[0]:
            reports = [i["episode"] for i in infos]
            break
        count = obs[0]["measurements"][MEASUREMENT_NAMES.index("player_count/5")]
    assert count == pytest.approx(8 / 5)  # 4 agents + 4 bots
    assert reports is not None and all(r["length"] == reports[0]["length"] for r in reports)
    scores = [r["score"] for r in reports]
    for i, r in enumerate(reports):  # the bots' scores also count: a win needs more than every other agent
        assert r["win"] in (0.0, 1.0) and (not r["win"] or scores[i] > max(scores[:i] + scores[i + 1:]))
    files = match_shm_files(env)
    env.close()
    assert_gone(files)


def test_single_player_reward_shaping_methods(data):
    env = make_env(match_cfg("doom_battle", data, doom_rew_health_gain=0.5))
    defaults = env.reward_shaping_defaults()
    assert set(defaults) == set(SHAPING_PARAMS["battle"]) and defaults["doom_rew_health_gain"] == 0.5
    env.set_reward_shaping({"doom_rew_health_gain": 2.0}, agent=7)  # one agent: the agent argument is ignored
    assert env.shaper.coeffs["doom_rew_health_gain"] == 2.0 and env.reward_shaping_defaults() == defaults
    with pytest.raises(KeyError, match="doom_rew_gathering_health"):
        env.set_reward_shaping({"doom_rew_gathering_health": 1.0})
    basic = make_env(env_cfg("doom_basic"))
    assert basic.reward_shaping_defaults() == {}
    basic.set_reward_shaping({})
    with pytest.raises(KeyError):
        basic.set_reward_shaping({"doom_rew_frag": 1.0})
    # a shaper made from a dict: missing coefficients at their defaults; a change applies from the next step
    s = DoomRewardShaper({"doom_rew_frag": 2.0}, "deathmatch", {"FRAGCOUNT": 0})
    s.reset(np.array([0.0]))
    assert s.step(np.array([1.0]), False) == pytest.approx(2.0)
    s.set_coeffs({"doom_rew_frag": 5.0})
    assert s.step(np.array([2.0]), False) == pytest.approx(5.0)
    assert s.coeffs["doom_rew_death"] == 0.75


def test_malformed_action_is_an_error_not_a_match_failure(data):
    env = make_env(match_cfg("doom_duel", data))
    env.reset()
    try:
        with pytest.raises(IndexError):
            env.step([env.action_space.sample(), np.array([9, 9, 9, 9, 9, 99, 99])])  # out of the heads' ranges
        assert env.aborted_matches == 0
    finally:
        files = match_shm_files(env)
        env.close()  # agent 0's call still waits for agent 1's engine: closing kills the match
    assert_gone(files)
