"""Populations in process: rollout workers route each agent's requests to its policy's workers and each finished
trajectory to its policy's learner; learners mask the steps another policy acted; multi-agent envs (test_race) get one
trajectory stream per agent. Real shared buffers, queues and weights; the components stepped by hand."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sf.buffers.shared_weights import SharedWeights
from sf.buffers.trajectory_buffers import TrajectoryBuffers
from sf.cfg import parse_cfg
from sf.ipc import Queue
from sf.model.actor_critic import create_actor_critic
from sf.processes.shared_state import SharedState
from sf.sampling.policy_worker import PolicyWorker
from sf.sampling.rollout_worker import RolloutWorker
from sf_envs.registry import env_spec, make_env

VERSION_MARK = 1000  # policy p publishes its weights as version (p + 1) * 1000: a sample's version names its policy


class Population:
    """W rollout workers (worker 0 stepped here), one policy worker per policy, shared buffers; every learner queue
    drained by the test."""

    def __init__(self, tmp_path, env="test_corridor", policies=2, envs=4, rollout=8, *flags, shaping_keys=()):
        self.cfg = cfg = parse_cfg(["--env", env, "--num_workers", "1", "--num_envs_per_worker", str(envs),
                                    "--rollout", str(rollout), "--recurrence", str(rollout), "--use_rnn", "False",
                                    "--hidden_size", "16", "--encoder_mlp_layers", "16",
                                    "--batch_size", str(rollout * 2), "--device", "cpu", "--train_dir", str(tmp_path),
                                    "--seed", "3", "--num_policies", str(policies), *flags])
        probe = make_env(cfg, 0)
        self.obs_space, self.action_space = probe.observation_space, probe.action_space
        probe.close()
        self.agents = envs * env_spec(env).num_agents
        self.model = create_actor_critic(cfg, self.obs_space, self.action_space)
        n = 2 * self.agents  # every agent can take its next slot before the test returns the finished ones
        self.buffers = TrajectoryBuffers(n, rollout, self.obs_space, self.action_space, self.model.rnn_state_size)
        self.weights = [SharedWeights(self.model) for _ in range(policies)]
        for p, w in enumerate(self.weights):
            w.publish(self.model, (p + 1) * VERSION_MARK)
        self.state = SharedState(1, 1, policies, shaping_keys, num_slots=n)
        for p in range(policies):  # policy p's reward-shaping coefficients: p + 1 (PBT would mutate them)
            self.state.shaping[p] = float(p + 1)
        self.env_slots = torch.zeros((1, self.agents, 3), dtype=torch.int64).share_memory_()
        q = self.queues = SimpleNamespace(policy=[Queue() for _ in range(policies)], workers=[Queue()],
                                          learner=[Queue() for _ in range(policies)], free=Queue(),
                                          report=Queue(max_size_bytes=2**22))
        q.free.put_many(list(range(n)))
        self.policy_workers = []
        for p in range(policies):
            pw = PolicyWorker(cfg, self.obs_space, self.action_space, self.buffers, self.env_slots,
                              SimpleNamespace(policy=q.policy[p], workers=q.workers), self.weights[p], "cpu",
                              policy_id=p)
            pw.wait_for_weights(lambda: False)
            self.policy_workers.append(pw)
        self.worker = RolloutWorker(cfg, 0, self.buffers, self.env_slots, SimpleNamespace(
            policy=q.policy, worker=q.workers[0], learner=q.learner, free=q.free, report=q.report), self.state)
        self.worker.start()

    def step(self):
        for pw in self.policy_workers:
            pw.run_once(timeout=0.01)
        self.worker.run_once(timeout=0.01)

    def finished(self, p):
        """Slots the worker sent to policy p's learner; they are copied out by the test and returned to the free
        list."""
        try:
            slots = [int(s) for s in self.queues.learner[p].get_many(timeout=0.0)]
        except Exception:
            return []
        return slots

    def close(self):
        self.worker.close()
        q = self.queues
        for queue in (*q.policy, *q.learner, q.free, q.report, *q.workers):
            queue.close()


def check_slot(b, slot: int, owner: int) -> int:
    """Invariants of a trajectory that reached policy `owner`'s learner; returns its number of foreign steps."""
    ids, versions, dones = b.policy_ids[slot].numpy(), b.policy_versions[slot].numpy(), b.dones[slot].numpy()
    assert ids[0] == owner  # a slot belongs to the policy that started it
    assert (versions == (ids.astype(np.int64) + 1) * VERSION_MARK).all()  # each step acted by the policy it names
    foreign = np.nonzero(ids != owner)[0]
    if len(foreign):  # another policy took the agent over at an episode start inside the trajectory, never before
        first = foreign[0]
        assert first > 0 and dones[first - 1] == 1, (ids, dones)
    return len(foreign)


@pytest.mark.parametrize("mapping", ["random", "groups"])
@pytest.mark.parametrize("env", ["test_corridor", "test_race"])
def test_each_learner_receives_its_policys_trajectories(tmp_path, env, mapping):
    """Policies drawn afresh at every episode (--policy_resample_episodes 1), per env or per group: every trajectory
    goes to the learner of the policy that started it, its steps are marked with the policy that acted, and a change of
    policy inside it follows an episode end. Both policies get trajectories; every agent is covered."""
    pop = Population(tmp_path, env, 2, 4, 8, "--policy_resample_episodes", "1", "--policy_mapping", mapping)
    b = pop.buffers
    received = {0: 0, 1: 0}
    foreign = 0
    try:
        for _ in range(4000):
            pop.step()
            for p in (0, 1):
                for slot in pop.finished(p):
                    foreign += check_slot(b, slot, p)
                    received[p] += 1
                    pop.queues.free.put(slot)
            if min(received.values()) >= 30 and foreign:
                break
    finally:
        pop.close()
    assert min(received.values()) >= 30, received
    assert foreign > 0  # policy changes inside trajectories happened (and were checked above)


def test_fixed_mapping_routes_agents_by_index(tmp_path):
    """--policy_mapping fixed on the 2-agent race: agent 0 of every env is policy 0, agent 1 policy 1; no trajectory
    ever holds a foreign step."""
    pop = Population(tmp_path, "test_race", 2, 2, 8, "--policy_mapping", "fixed")
    b = pop.buffers
    got = {0: 0, 1: 0}
    try:
        assert pop.env_slots[0, :, 2].tolist() == [0, 1, 0, 1]
        for _ in range(2000):
            pop.step()
            for p in (0, 1):
                for slot in pop.finished(p):
                    assert check_slot(b, slot, p) == 0
                    got[p] += 1
                    pop.queues.free.put(slot)
            if min(got.values()) >= 10:
                break
    finally:
        pop.close()
    assert min(got.values()) >= 10, got


def test_multiagent_env_keeps_each_agents_final_observation(tmp_path):
    """test_race truncates an agent after 50 steps (the policies here rarely reach the goal at first): the truncated
    agent's final observation (its cell 0-9 one-hot, then the other agent's) is kept in final_obs, and the next
    observation of its slot is its fresh start (cell 0)."""
    pop = Population(tmp_path, "test_race", 1, 2, 8)
    b = pop.buffers
    checked = 0
    try:
        for _ in range(3000):
            pop.step()
            for slot in pop.finished(0):
                t = int(b.final_t[slot])
                if t >= 0:
                    assert b.truncated[slot, t] == 1 and b.dones[slot, t] == 1
                    final = b.final_obs["obs"][slot].numpy()
                    assert final[:10].sum() == 1 and final[10:].sum() == 1  # a real observation, not poison
                    assert b.obs["obs"][slot, t + 1, 0] == 1  # the next episode starts at cell 0
                    checked += 1
                pop.queues.free.put(slot)
            if checked >= 3:
                break
    finally:
        pop.close()
    assert checked >= 3


def test_episode_reports_name_their_policy(tmp_path):
    pop = Population(tmp_path, "test_race", 2, 4, 8, "--policy_resample_episodes", "1")
    reports = []
    try:
        for _ in range(3000):
            pop.step()
            for p in (0, 1):
                pop.queues.free.put_many(pop.finished(p) or [0][:0])
            pop.worker._maybe_report(force=True)
            try:
                for msg in pop.queues.report.get_many(timeout=0.0):
                    reports += msg[2]
            except Exception:
                pass
            if len({r["policy"] for r in reports}) == 2 and len(reports) >= 20:
                break
    finally:
        pop.close()
    assert {r["policy"] for r in reports} == {0.0, 1.0}
    assert all({"reward", "length", "win"} <= set(r) for r in reports)


def test_each_agents_env_gets_its_policys_reward_shaping(tmp_path, monkeypatch):
    """PBT's shaping coefficients live per policy in SharedState.shaping; at every episode start the rollout worker
    gives an agent's env those of the policy that plays the agent's new episode (test_race given the methods Doom envs
    have)."""
    from sf_envs.test_envs import TestRace
    calls = []
    monkeypatch.setattr(TestRace, "reward_shaping_defaults", lambda self: {"coeff": 0.0}, raising=False)
    monkeypatch.setattr(TestRace, "set_reward_shaping",
                        lambda self, coeffs, agent=0: calls.append((id(self), agent, coeffs["coeff"])), raising=False)
    pop = Population(tmp_path, "test_race", 2, 2, 8, "--policy_resample_episodes", "1", shaping_keys=("coeff",))
    w = pop.worker
    try:
        given = {}  # (env, agent) -> the coefficient its env holds now
        ever = set()  # every coefficient given (which policies play at the end is the seed's draw)
        envs = {id(e): i for i, e in enumerate(w.envs)}
        for _ in range(1500):
            pop.step()
            for p in (0, 1):
                pop.queues.free.put_many(pop.finished(p) or [0][:0])
            for env_id, agent, coeff in calls:
                given[(envs[env_id], agent)] = coeff
                ever.add(coeff)
            calls.clear()
            for i in range(w.num_agents):  # every agent's env holds its current policy's coefficients
                assert given.get((i // 2, i % 2)) == float(w.policy[i] + 1), (i, given, w.policy)
    finally:
        pop.close()
    assert ever == {1.0, 2.0}
