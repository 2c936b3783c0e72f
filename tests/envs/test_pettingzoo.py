"""PettingZoo envs (sf_envs/pettingzoo): names, agents and policies, an agent that is done before the others, turn-based
games, action masks, bad input, and train.py on a real PettingZoo env. Real PettingZoo envs (MPE simple_spread,
butterfly knights_archers_zombies, classic connect_four) and, where the test needs exact control, a small PettingZoo
ParallelEnv of its own; the sampling stage (rollout worker, policy worker, learner) over real shared buffers."""
import json
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gymnasium.spaces import Box, Discrete
from pettingzoo import ParallelEnv

import sf_envs.pettingzoo.pettingzoo_env as pz
from e2e_helpers import train_args
from sf.buffers.shared_weights import SharedWeights
from sf.buffers.trajectory_buffers import TrajectoryBuffers
from sf.cfg import parse_cfg
from sf.cfg.shape import RunShape
from sf.ipc import Queue
from sf.learning.learner import Learner
from sf.model.actor_critic import create_actor_critic
from sf.processes.shared_state import SharedState
from sf.runner.stats import read_event_scalars
from sf.sampling.policy_worker import PolicyWorker
from sf.sampling.rollout_worker import RolloutWorker
from sf_envs.errors import EnvUnavailableError, UnknownEnvError
from sf_envs.params import env_cfg
from sf_envs.registry import env_spec, make_env

KAZ = "pettingzoo_knights_archers_zombies_v11"


def test_names_map_to_the_pettingzoo_modules_and_agents_to_the_contract():
    assert pz.find_env("simple_spread_v3") == ("mpe", "mpe2.simple_spread_v3")  # MPE: the module of package mpe2
    assert pz.find_env("pistonball_v6") == ("butterfly", "butterfly/pistonball-v6")  # PettingZoo's registry ids
    assert pz.find_env("pursuit_v5") == ("sisl", "sisl/pursuit-v5")
    assert pz.find_env("connect_four_v3") == ("classic", "classic/connect_four-v3")
    assert pz.find_env("utils") is None and pz.find_env("all_modules") is None  # not envs
    spec = env_spec("pettingzoo_simple_spread_v3")
    assert (spec.family, spec.frameskip, spec.num_agents) == ("pettingzoo", 1, 3)
    cfg = env_cfg("pettingzoo_simple_spread_v3", seed=1, pettingzoo_kwargs='{"N": 2, "max_cycles": 7}')
    assert env_spec(cfg.env, cfg).num_agents == 2  # the constructor's kwargs decide the agents
    env = make_env(cfg)
    assert env.agent_ids == ["agent_0", "agent_1"] and env.num_agents == 2 and env.is_multiagent
    assert env.metadata["render_fps"] == 10  # the game's own (enjoy --save_video's rate), MPE's
    assert set(env.observation_space.spaces) == {"obs"} and env.observation_space["obs"].shape == (12,)
    obs, infos = env.reset()
    assert len(obs) == 2 and all(o["obs"].dtype == np.float32 for o in obs) and all(i["is_active"] for i in infos)
    for step in range(7):  # every agent truncated together at max_cycles, each with its report and final observation
        obs, rewards, terminated, truncated, infos = env.step([1, 2])
    assert truncated == [True, True] and terminated == [False, False]
    assert all(i["episode"]["length"] == 7 and "final_obs" in i and i["is_active"] for i in infos)
    env.close()


def test_an_env_with_one_agent_is_a_single_agent_env():
    """simple_v3: no lists, and the caller resets: the step that ends the episode returns its last observation (the
    rollout worker bootstraps a truncated episode from it)."""
    cfg = env_cfg("pettingzoo_simple_v3", seed=2, pettingzoo_kwargs='{"max_cycles": 5}')
    assert env_spec(cfg.env, cfg).num_agents == 1
    env = make_env(cfg)
    assert env.num_agents == 1 and not env.is_multiagent
    obs, info = env.reset()
    assert obs["obs"].shape == (4,) and info["is_active"]
    for _ in range(5):
        last = obs
        obs, reward, terminated, truncated, info = env.step(1)
        assert isinstance(reward, float)
    assert truncated and not terminated and info["episode"]["length"] == 5 and "final_obs" not in info
    assert not np.array_equal(obs["obs"], last["obs"]) and obs["obs"][2:].any()  # moved; not a zero placeholder
    first, _ = env.reset()
    assert not np.array_equal(first["obs"], obs["obs"])
    env.close()


def test_unknown_names_say_how_names_are_formed():
    with pytest.raises(UnknownEnvError, match=r"names are pettingzoo_<env> with <env> an env of PettingZoo "):
        env_spec("pettingzoo_no_such_env_v1")
    with pytest.raises(UnknownEnvError, match=r"did you mean pettingzoo_simple_spread_v3[,?]"):
        env_spec("pettingzoo_simple_spred_v3")
    with pytest.raises(EnvUnavailableError, match=r"cannot be made with --pettingzoo_kwargs \{\"no_such_arg\": 1\}"):
        make_env(env_cfg("pettingzoo_simple_v3", pettingzoo_kwargs='{"no_such_arg": 1}'))


def test_an_agent_done_before_the_others_sits_out_until_the_env_episode_ends():
    """knights_archers_zombies with line_death: archer_0 walks into the bottom wall at its 4th step and PettingZoo
    removes it; it is terminated once, with its report, then gets zero observations, reward 0 and is_active False
    until the others are truncated at max_cycles; the env then resets and archer_0 starts afresh (terminated, no
    report: a fresh recurrent state)."""
    cfg = env_cfg(KAZ, pettingzoo_kwargs=json.dumps({"line_death": True, "max_cycles": 12, "spawn_delay": 1000}))
    env = make_env(cfg)
    assert env.agent_ids == ["archer_0", "archer_1", "knight_0", "knight_1"]
    obs, infos = env.reset(seed=0)
    down, stay = 1, 5
    log = [env.step([down, stay, stay, stay]) for _ in range(12)]
    obs, rewards, terminated, truncated, infos = log[3]
    assert terminated == [True, False, False, False] and infos[0]["episode"] == {"reward": 0.0, "length": 4}
    assert not infos[0]["is_active"] and all(i["is_active"] for i in infos[1:])
    for obs, rewards, terminated, truncated, infos in log[4:11]:  # archer_0 sits out
        assert not obs[0]["obs"].any() and rewards[0] == 0.0 and not terminated[0] and not truncated[0]
        assert not infos[0]["is_active"] and "episode" not in infos[0]
        assert all(o["obs"].any() for o in obs[1:]) and all(i["is_active"] for i in infos[1:])
    obs, rewards, terminated, truncated, infos = log[11]  # max_cycles: the others are done, the env resets
    assert truncated == [False, True, True, True] and all(i["episode"]["length"] == 12 for i in infos[1:])
    assert terminated[0] and "episode" not in infos[0] and infos[0]["is_active"]
    assert all(o["obs"].any() for o in obs) and all(i["is_active"] for i in infos)  # the next episode's first
    env.close()


def test_turn_based_game_gives_the_action_mask_and_only_the_player_to_move_acts():
    env = make_env(env_cfg("pettingzoo_connect_four_v3", seed=3))
    assert env.observation_space["action_mask"] == Box(0.0, 1.0, (7,), np.float32)
    assert env.observation_space["obs"].shape == (84,) and env.action_space == Discrete(7)
    obs, infos = env.reset()
    assert [i["is_active"] for i in infos] == [True, False]
    for move in range(6):  # fill column 0; the waiting player's action (6) is ignored
        mover = move % 2
        obs, rewards, terminated, truncated, infos = env.step([0, 6] if mover == 0 else [6, 0])
        assert [i["is_active"] for i in infos] == [mover == 1, mover == 0]
    assert obs[0]["action_mask"].tolist() == [0, 1, 1, 1, 1, 1, 1]  # column 0 is full: illegal for the player to move
    assert obs[1]["action_mask"].tolist() == [1] * 7  # a waiting player: all ones (its action is drawn, then ignored)
    env.close()


class EarlyEnv(ParallelEnv):
    """Agents "a" and "b": "b" is terminated at its 2nd step, "a" truncated at the 5th (both removed from agents, as
    PettingZoo does); the action mask in the infos allows "a" actions 0 and 2 only. Refuses actions of agents that are
    not in its episode."""

    metadata = {"name": "early_v0"}

    def __init__(self, render_mode=None):
        self.possible_agents = ["a", "b"]
        self.agents, self.k, self.actions = [], 0, []

    def observation_space(self, agent):
        return Box(0.0, 10.0, (2,), np.float32)

    def action_space(self, agent):
        return Discrete(3)

    def _out(self):
        obs = {a: np.array([self.k + 1, a == "b"], np.float32) for a in self.agents}
        masks = {"a": np.array([1, 0, 1], np.int8), "b": np.ones(3, np.int8)}
        return obs, {a: {"action_mask": masks[a]} for a in self.agents}

    def reset(self, seed=None, options=None):
        self.agents, self.k = list(self.possible_agents), 0
        return self._out()

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.actions.append(dict(actions))
        self.k += 1
        obs, infos = self._out()
        rewards = {a: 1.0 for a in self.agents}
        terminated = {a: a == "b" and self.k == 2 for a in self.agents}
        truncated = {a: a == "a" and self.k == 5 for a in self.agents}
        self.agents = [a for a in self.agents if not (terminated[a] or truncated[a])]
        return obs, rewards, terminated, truncated, infos


@pytest.fixture
def early_env(monkeypatch):
    """pettingzoo_early_v0: EarlyEnv, as if PettingZoo had an env module early_v0."""
    module = types.ModuleType("sf_test_early_v0")
    module.parallel_env = EarlyEnv
    monkeypatch.setitem(sys.modules, module.__name__, module)
    find = pz.find_env
    monkeypatch.setattr(pz, "find_env", lambda env: ("test", module.__name__) if env == "early_v0" else find(env))
    return "pettingzoo_early_v0"


def test_action_mask_from_the_infos_and_actions_only_for_agents_in_the_episode(early_env):
    env = make_env(env_cfg(early_env, seed=1))
    assert env.observation_space["action_mask"] == Box(0.0, 1.0, (3,), np.float32)
    obs, infos = env.reset()
    assert obs[0]["action_mask"].tolist() == [1, 0, 1] and obs[1]["action_mask"].tolist() == [1, 1, 1]
    for _ in range(4):  # (EarlyEnv refuses actions for "b" once it is done)
        obs, rewards, terminated, truncated, infos = env.step([2, 1])
    assert env.par.actions[2] == {"a": 2} and obs[1]["action_mask"].tolist() == [1, 1, 1] and not obs[1]["obs"].any()


class Sampling:
    """One rollout worker with one multi-agent env, one policy worker and the learner of the policy, over real shared
    buffers, queues and weights, stepped in this process."""

    def __init__(self, tmp_path, env, rollout):
        self.cfg = cfg = parse_cfg(["--env", env, "--num_workers", "1", "--num_envs_per_worker", "1",
                                    "--worker_num_splits", "1", "--rollout", str(rollout), "--recurrence", str(rollout),
                                    "--use_rnn", "False", "--hidden_size", "16", "--encoder_mlp_layers", "16",
                                    "--batch_size", str(2 * rollout), "--device", "cpu", "--train_dir", str(tmp_path),
                                    "--seed", "3"])
        probe = make_env(cfg, 0)
        self.obs_space, self.action_space, agents = probe.observation_space, probe.action_space, probe.num_agents
        probe.close()
        model = create_actor_critic(cfg, self.obs_space, self.action_space)
        n = 4 * agents
        self.buffers = TrajectoryBuffers(n, rollout, self.obs_space, self.action_space, model.rnn_state_size)
        self.weights = SharedWeights(model)
        self.weights.publish(model, 0)
        self.state = SharedState(1, 1, 1, num_slots=n)
        self.env_slots = torch.zeros((1, agents, 3), dtype=torch.int64).share_memory_()
        q = self.queues = SimpleNamespace(policy=Queue(), worker=Queue(), learner=Queue(), free=Queue(),
                                          report=Queue(max_size_bytes=2**22))
        q.free.put_many(list(range(n)))
        self.policy = PolicyWorker(cfg, self.obs_space, self.action_space, self.buffers, self.env_slots,
                                   SimpleNamespace(policy=q.policy, workers=[q.worker]), self.weights, "cpu",
                                   shared_state=self.state)
        self.policy.wait_for_weights(lambda: False)
        self.worker = RolloutWorker(cfg, 0, self.buffers, self.env_slots, SimpleNamespace(
            policy=q.policy, worker=q.worker, learner=q.learner, free=q.free, report=q.report), self.state)
        self.learner = Learner(cfg, self.obs_space, self.action_space, self.buffers, SimpleNamespace(
            learner=q.learner, free=q.free, report=q.report), self.weights, self.state, "cpu", tmp_path / "exp",
            frameskip=1, shape=RunShape.of(cfg, agents))
        self.worker.start()

    def batch(self):
        """Step until the learner has a training batch; returns it (the storage layout)."""
        for _ in range(2000):
            self.policy.run_once(timeout=0.01)
            self.worker.run_once(timeout=0.01)
            experience = self.learner.collect(timeout=0.0)
            if experience is not None:
                return experience
        raise AssertionError("no training batch")

    def close(self):
        self.worker.close()
        for q in vars(self.queues).values():
            q.close()


def test_steps_of_an_agent_that_sits_out_are_not_trained_on(tmp_path, early_env):
    """Through the rollout worker and the learner: "b" acts at steps 0-1 of every 5-step episode of its env and sits
    out at 2-4: those steps are recorded as acted by no policy (policy id -1) and the learner masks them (own False);
    "a" is never masked and, its action mask honoured, never plays action 1."""
    run = Sampling(tmp_path, early_env, rollout=10)
    try:
        exp = run.batch()  # 2 trajectories of 10 steps: one per agent
    finally:
        run.close()
    ids, own, dones = exp["policy_ids"].tolist(), exp["own"].tolist(), exp["dones"].tolist()
    is_b = exp["obs"]["obs"][:, 0, 1].tolist()  # (EarlyEnv's observation [k, 1 for "b"])
    a, b = is_b.index(0.0), is_b.index(1.0)
    assert ids[b] == [0, 0, -1, -1, -1] * 2 and own[b] == [True, True, False, False, False] * 2
    assert dones[b] == [0, 1, 0, 0, 1] * 2  # its own end, then the fresh start when its env's episode ends
    assert ids[a] == [0] * 10 and all(own[a]) and dones[a] == [0, 0, 0, 0, 1] * 2
    actions_a = exp["actions"][a].reshape(-1).tolist()
    assert 1 not in actions_a and set(actions_a) <= {0, 2}


def test_turn_based_waiting_steps_are_not_trained_on_from_the_first_move(tmp_path):
    """connect_four: player_1 waits at the first move (is_active False from reset()), then the players alternate;
    no game ends within 4 moves."""
    run = Sampling(tmp_path, "pettingzoo_connect_four_v3", rollout=4)
    try:
        exp = run.batch()  # one trajectory per player
    finally:
        run.close()
    assert sorted(exp["policy_ids"].tolist()) == [[-1, 0, -1, 0], [0, -1, 0, -1]]
    assert sorted(exp["own"].tolist()) == [[False, True, False, True], [True, False, True, False]]


@pytest.mark.e2e
def test_train_py_trains_a_pettingzoo_env_with_two_policies(tmp_path, entry):
    """MPE simple_spread (3 agents per env) with 2 policies, agents mapped by --policy_mapping fixed: both learners
    train and checkpoint."""
    res = entry("train.py", *train_args(tmp_path, "pettingzoo_simple_spread_v3", "--num_workers", "1",
                                        "--use_rnn", "False", "--num_policies", "2", "--policy_mapping", "fixed",
                                        "--train_for_env_steps", "3000"), timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert ("Population: 2 policies (independent), 3 agents per env (12 agents in all), policy mapping fixed"
            in res.stdout)
    for p in (0, 1):
        assert sorted((tmp_path / "e2e" / f"checkpoint_p{p}").glob("checkpoint_*.pth")), f"policy {p}: no checkpoint"


@pytest.mark.e2e
@pytest.mark.parametrize("flags, message", [
    (["--env", "pettingzoo_no_such_env_v1"], "unknown PettingZoo env 'pettingzoo_no_such_env_v1': names are"),
    (["--env", "pettingzoo_simple_v3", "--pettingzoo_kwargs", "[1]"], "--pettingzoo_kwargs must be a JSON object"),
    (["--env", "pettingzoo_simple_v3", "--pettingzoo_kwargs", '{"no_such_arg": 1}'], "cannot be made with"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, entry, flags, message):
    train_dir = tmp_path / "td"
    res = entry("train.py", *flags, "--experiment", "bad", "--train_dir", train_dir, timeout=120)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert not train_dir.exists()


@pytest.mark.e2e
@pytest.mark.slow
def test_train_py_learns_mpe_simple(tmp_path, entry):
    """MPE simple_v3 with the preset: a random policy averages about -42 per episode; 200k env frames reach -15."""
    env = make_env(env_cfg("pettingzoo_simple_v3", seed=1))
    env.action_space.seed(1)
    random_returns = []
    env.reset()
    while len(random_returns) < 200:
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            random_returns.append(info["episode"]["reward"])
            env.reset()
    assert np.mean(random_returns) < -30
    res = entry("train.py", "--env", "pettingzoo_simple_v3", "--experiment", "learn", "--train_dir", tmp_path,
                "--num_workers", "2", "--train_for_env_steps", "200000", "--experiment_summaries_interval", "2",
                "--device", "cpu", "--seed", "1", timeout=900)
    assert res.returncode == 0, res.stdout[-3000:]
    rewards = [r for _, r in read_event_scalars(tmp_path / "learn")["reward/reward"]]
    assert max(rewards[-3:]) >= -15, rewards
