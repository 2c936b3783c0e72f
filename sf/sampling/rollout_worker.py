"""Rollout worker: steps `--num_envs_per_worker` envs in `--worker_num_splits` alternating groups.

It holds no copy of the policy. For each env it owns one trajectory slot at a time and a step index t;
`env_slots[w, e] = (slot, t)` tells policy workers where env e's current observation lives.

Protocol (double-buffered sampling, paper section 3.2), per group g of envs:
  1. the worker writes obs[slot, t] for every env of g and sends `(w, g)` to the policy queue;
  2. a policy worker writes actions[slot, t] (and rnn_states[slot, t+1], ...) and replies `g` on this
     worker's queue; meanwhile the worker steps the other group;
  3. the worker steps g's envs with those actions, writes rewards/dones and obs[slot, t+1]; when t+1 == T
     the slot goes to the learner queue and a fresh one comes from the free list (blocking there is the
     system's backpressure when the learner falls behind). Before it waits there, the worker hands the learner
     the trajectories it finished earlier in the same group: held back, they could be the very ones the learner
     needs to complete a batch and free slots (with many workers, enough of them to deadlock the run).

--sync_mode hts/ppo (HTS-RL): slots are fixed, two storages of one slot per env: env i's trajectory of rollout interval
k is slot (k % 2) * num_envs + i. A group that finished interval k asks for actions of interval k+1 only once the
learner took batch k (SharedState.sync_ready): batch synchronization every --rollout steps. Each env draws the noise
of its actions from its own stream (sf.seeding), so actions do not depend on which policy worker or batch serves them.
An episode cut by a time limit keeps its final observation (final_obs) for the learner's bootstrap.

Agents and policies (Sample Factory paper, section 3.5). An env may host several agents (spec.num_agents = A; the
multi-agent contract of docs/architecture.md: lists in and out, per-agent dones, auto-reset). The worker's unit is the
agent: agent i = e * A + a has its own slot, step and `env_slots[w, i] = (slot, t, policy)`; group g holds the agents of
its envs. The worker stays policy-agnostic: at each agent's episode start it asks the PolicyMapping which policy plays
it, writes that into env_slots, and sends a group's request `(w, g)` to the queue of every policy that plays one of its
agents (each policy worker serves only its policy's agents); the group steps once every one of them replied. A slot
belongs to the policy that started it: when an agent changes policy at an episode start inside a trajectory, the slot
still goes to the old policy's learner, which masks the steps the new policy acted (buffers.policy_ids), and the agent's
next slot goes to the new policy.

Self-healing (sf/runner/health/healing.py): a request carries the worker's epoch (message (w, epoch * splits + g), the
reply the same code); the runner voids the requests in flight by bumping SharedState.epoch (this worker died, or a
policy worker that may have taken some did) and, once no policy worker still serves one, sets epoch_go: the worker then
works in the new epoch, ignores replies of older ones and re-sends the requests it still awaits. Every slot it takes or
hands to a learner is marked in SharedState.slot_owner, inside a move (SharedState.moving), and each agent's (slot, t)
in env_slots is published at every step, so that the runner can reclaim a dead worker's slots and count exactly the
frames they held (a slot of this worker that no agent's entry names is full). A replacement worker goes on counting this
worker's frames.

Modes: where the slots come from and the trajectories and episodes go (async and hts/ppo training, sf.eval's evaluation
with no learner) is the worker's episode sink, chosen once when it is made (sf/sampling/episode_sink.py): the step loop
below is the same in every mode.
"""
from __future__ import annotations

import logging
import time
import traceback
from queue import Empty

import numpy as np
import torch

from typing import TYPE_CHECKING, Callable, Optional, Sequence

from sf.cfg.context import RunContext
from sf.cfg.shape import RunShape
from sf.model.action_spaces import draw_action_noise
from sf.sampling.episode_sink import AgentTable, Outbox, SinkPort, episode_sink
from sf.processes.pause_points import PAUSE_AT, pause
from sf.processes.shared_state import slot_queued
from sf.processes.slot_ledger import CENSUS_PAUSE_SEC, SlotLedger
from sf.seeding import ENV, action_noise_rng, run_seed, stream_seed
from sf_envs.registry import env_spec, make_env

if TYPE_CHECKING:
    from sf.cfg.config import Config

log = logging.getLogger(__name__)


class EnvRestartLimit(RuntimeError):
    """Envs of a worker failed more than --max_env_restarts times: a persistent fault, which stops the run."""
    stops_the_run = True  # self-healing: a replacement worker would make the same envs


class RolloutWorker:
    def __init__(self, cfg: Config, worker_idx: int, buffers, env_slots: torch.Tensor, queues, shared_state,
                 on_starved: Optional[Callable[[], None]] = None, shape: Optional[RunShape] = None,
                 policies: Optional[Sequence[int]] = None):
        """queues.policy / queues.learner: one queue per policy (a single queue: a one-policy run). env_slots
        [W, E * A, 3] (slot, t, policy) or [W, E * A, 2] (one policy). on_starved: called while no free slot is
        available instead of waiting for one (serial mode: the learner, which frees slots, runs in this same thread).
        shape: the run's (the runner's, computed once); None: this configuration's on its env (in-process tests).
        policies: the policies that play on this rank (the runner's, from torchrun's world); None: every policy."""
        self.cfg, self.worker_idx = cfg, worker_idx
        self.on_starved = on_starved
        self.buffers, self.env_slots, self.queues, self.state = buffers, env_slots, queues, shared_state
        self.policy_queues = queues.policy if isinstance(queues.policy, (list, tuple)) else [queues.policy]
        self.learner_queues = queues.learner if isinstance(queues.learner, (list, tuple)) else [queues.learner]
        self.num_policies = len(self.policy_queues)
        spec = env_spec(cfg.env, cfg)
        self.shape = shape or RunShape.of(cfg, spec.num_agents)
        self.frameskip, self.A = spec.frameskip, self.shape.agents_per_env
        self.num_envs = cfg.num_envs_per_worker
        self.num_agents = self.shape.agents_per_worker  # this worker's agents: agent i = env i // A, its agent i % A
        self.envs_per_group = self.shape.envs_per_group
        self.group_size = self.shape.agents_per_group
        self.T = cfg.rollout
        # training rewards: scaled and clipped (Sample Factory's --reward_scale, --reward_clip); episode statistics,
        # from the env's info["episode"], stay in the env's own units
        self.reward_scale, self.reward_clip = cfg.reward_scale, cfg.reward_clip
        self._bind_buffers(buffers)
        self._bind_shared_state(cfg, shared_state, env_slots)
        self._init_agent_policies(shared_state)
        self._make_envs(cfg, shared_state)
        self.noise_rngs = [action_noise_rng(run_seed(cfg), worker_idx * self.num_agents + i)
                           for i in range(self.num_agents)]
        # full trajectories for the learners, episode reports for the runner
        self.outbox = Outbox(self.num_policies, queues.report, worker_idx)
        # the mode (async or hts/ppo training, sf.eval): where slots come from, trajectories and episodes go; it is
        # given what it may use of this worker, not the worker (sf/sampling/episode_sink.py)
        self.sink = episode_sink(SinkPort(cfg, worker_idx, self.shape, self.num_policies, policies, self.agents,
                                          self.outbox, self._take_free_slot, self._draw_own_noise, self._env_seed,
                                          shared_state.sync_ready_batches))
        self.mapping = self.sink.mapping  # which policy plays each agent's episodes
        self.discrete = self.actions_np.dtype == np.int64
        self.scalar_action = [self._is_scalar(env.action_space) for env in self.envs]
        # whether each agent acts in its next step: an env may say info["is_active"] = False (a dead agent waiting for
        # its env's episode to end, a player waiting for its turn); that step is then recorded as acted by no policy
        self.active = np.ones(self.num_agents, dtype=bool)
        self.env_restarts = 0
        self.frames = int(shared_state.worker_frames[worker_idx])  # a replacement goes on counting

    def _bind_buffers(self, buffers) -> None:
        """Numpy views of the shared trajectory tensors: the env-step loop is plain numpy, no torch dispatch per
        step."""
        self.obs_np = {k: v.numpy() for k, v in buffers.obs.items()}
        self.actions_np = buffers.actions.numpy()
        self.rewards_np, self.dones_np = buffers.rewards.numpy(), buffers.dones.numpy()
        self.truncated_np, self.noise_np = buffers.truncated.numpy(), buffers.action_noise.numpy()
        self.final_obs_np = {k: v.numpy() for k, v in buffers.final_obs.items()}
        self.final_rnn_np, self.final_t_np = buffers.final_rnn.numpy(), buffers.final_t.numpy()
        self.rnn_np = buffers.rnn_states.numpy()
        self.policy_ids_np = buffers.policy_ids.numpy()

    def _bind_shared_state(self, cfg: Config, shared_state, env_slots: torch.Tensor) -> None:
        """The replies each group awaits, the request epoch, this worker's slot bookkeeping in SharedState, its row of
        env_slots (its agents' table) and its heartbeat."""
        worker_idx = self.worker_idx
        self.awaiting = np.zeros(cfg.worker_num_splits, dtype=np.int64)  # replies a group still waits for
        self.splits = cfg.worker_num_splits
        self.epoch = int(shared_state.epoch_go_np[worker_idx])  # a replacement starts in the epoch the runner set
        self.ledger = SlotLedger(shared_state, f"rollout_worker_{worker_idx}")  # (its moves of slots)
        self.env_slots_np = env_slots.numpy()
        self.agent_slots = self.env_slots_np[worker_idx]  # [E * A, C] this worker's row: (slot, t, ...) per agent
        # each agent's slot, step and policies (agent i = env i // A, its agent i % A), published in agent_slots
        self.agents = AgentTable.of(self.agent_slots)
        self.slot, self.t = self.agents.slot, self.agents.t
        self.has_policy_column = self.env_slots_np.shape[-1] > 2
        # also its row of SharedState.moving
        self.heartbeat = shared_state.heartbeat_slot(f"rollout_worker_{worker_idx}")

    def _init_agent_policies(self, shared_state) -> None:
        """The policy playing each agent (and the one whose learner gets its slot: AgentTable's columns), and the reward
        shaping last given to it."""
        self.policy, self.slot_policy = self.agents.policy, self.agents.slot_policy
        self.shaping_keys = tuple(getattr(shared_state, "shaping_keys", ()))
        self.agent_shaping: list = [None] * self.num_agents  # coefficients last given to each agent's env

    def _make_envs(self, cfg: Config, shared_state) -> None:
        """Make this worker's envs (a heartbeat before each: a game may take long to start)."""
        self.envs = []
        try:
            for e in range(self.num_envs):
                shared_state.beat(self.heartbeat)
                self.envs.append(make_env(cfg, env_index=self.worker_idx * self.num_envs + e))
        except BaseException:  # an env that fails to start, or a stop meanwhile: close the ones already running
            self._close_envs()
            raise

    @staticmethod
    def _is_scalar(space) -> bool:
        return space.shape == () or space.__class__.__name__ == "Discrete"

    def _env_seed(self, e: int) -> int | None:
        if self.cfg.seed is None:
            return None
        # a replacement worker (a later epoch) or env must not replay its predecessor's episodes
        return stream_seed(self.cfg.seed, ENV, self.worker_idx * self.num_envs + e, self.epoch, self.env_restarts)

    def _replace_env(self, e: int, ex: Exception) -> dict:
        """A fresh env in place of env e, which raised `ex`; returns its first observation (a list of them for a
        multi-agent env: every agent's episode ends). One crashing game
        (VizDoom engines do crash after many thousand episodes) must not end a run of days; a persistent
        fault still stops it after --max_env_restarts replacements, as the traceback below says."""
        where = f"env {e} ({self.cfg.env}) of rollout worker {self.worker_idx}"
        if self.env_restarts >= self.cfg.max_env_restarts:
            raise EnvRestartLimit(f"{where} raised: {ex!r} (after {self.env_restarts} replacements of failed envs in "
                                  f"this worker; --max_env_restarts {self.cfg.max_env_restarts})") from ex
        self.env_restarts += 1
        log.warning("%s raised; replacing it with a fresh env (%d of --max_env_restarts %d):\n%s", where,
                    self.env_restarts, self.cfg.max_env_restarts, traceback.format_exc().rstrip())
        try:
            self.envs[e].close()
        except Exception:  # a broken env may fail to close too; its replacement matters, not its farewell
            pass
        self.envs[e] = make_env(self.cfg, env_index=self.worker_idx * self.num_envs + e)
        self.agent_shaping[e * self.A:(e + 1) * self.A] = [None] * self.A  # a fresh env has its default shaping
        obs, _ = self.envs[e].reset(seed=self._env_seed(e))
        return obs

    # --- start ---
    def start(self) -> None:
        """Reset every env, choose each agent's policy, take a slot for each agent, and request actions for every
        group."""
        for e, env in enumerate(self.envs):
            self.state.beat(self.heartbeat)
            obs, infos = env.reset(seed=self._env_seed(e))
            for a, agent_obs in enumerate(obs if self.A > 1 else [obs]):
                i = e * self.A + a
                self.active[i] = (infos[a] if self.A > 1 else infos).get("is_active", True)
                self._episode_start(i)
                self.slot[i] = self._next_slot(i, first=True)
                self.slot_policy[i] = self.policy[i]
                self.t[i] = 0
                self._write_obs(agent_obs, self.slot[i], 0)
                self.rnn_np[self.slot[i], 0] = 0.0
        self.env_slots_np[self.worker_idx, :, 0] = self.slot
        self.env_slots_np[self.worker_idx, :, 1] = self.t
        for g in range(self.cfg.worker_num_splits):
            self._request_actions(g)

    def _episode_start(self, i: int) -> None:
        """Agent i starts an episode: the policy that plays it (routing from its next request on), and that policy's
        reward-shaping coefficients for its env (population-based training changes them)."""
        if self.num_policies > 1:
            p = self.mapping.policy_for(i // self.A, i % self.A)
            self.policy[i] = p
            if self.has_policy_column:
                self.env_slots_np[self.worker_idx, i, 2] = p
        if self.shaping_keys:
            coeffs = tuple(self.state.shaping_np[self.policy[i]].tolist())
            set_shaping = getattr(self.envs[i // self.A], "set_reward_shaping", None)
            if coeffs != self.agent_shaping[i] and set_shaping is not None:
                set_shaping(dict(zip(self.shaping_keys, coeffs)), agent=i % self.A)
                self.agent_shaping[i] = coeffs

    def _next_slot(self, i: int, first: bool = False) -> int:
        """The slot agent i fills next (first: its first trajectory), published as its current slot at step 0
        (env_slots): fixed in hts/ppo modes, any free one otherwise (sf.eval: the agent's own, reused): the sink's.
        Marks it as holding no final observation yet."""
        slot = self.sink.next_slot(i, first)
        self.final_t_np[slot] = -1
        return slot

    def _request_actions(self, g: int) -> None:
        """Ask the policy workers of every policy playing an agent of group g for its actions at the agents' current
        steps (hts/ppo and sf.eval: with each agent's noise)."""
        lo, hi = g * self.group_size, (g + 1) * self.group_size
        self.sink.draw_noise(lo, hi)
        code = self.epoch * self.splits + g
        if self.num_policies == 1:
            self.awaiting[g] = 1
            self.policy_queues[0].put((self.worker_idx, code))
            return
        policies = np.unique(self.policy[lo:hi]).tolist()
        self.awaiting[g] = len(policies)
        for p in policies:
            self.policy_queues[p].put((self.worker_idx, code))

    def _adopt_epoch(self, epoch: int) -> None:
        """The runner voided the requests in flight (a process died) and no policy worker serves them any more: work in
        `epoch` from now on and ask again for every group still waiting for actions."""
        self.epoch = epoch
        for g in range(self.splits):
            if self.awaiting[g] > 0:
                self._request_actions(g)

    def _draw_own_noise(self, lo: int, hi: int) -> None:
        """Agents lo..hi-1's action noise at their current steps, each from its own stream (hts/ppo, sf.eval)."""
        for i in range(lo, hi):
            draw_action_noise(self.envs[i // self.A].action_space, self.noise_rngs[i],
                              self.noise_np[self.slot[i], self.t[i]])

    def _take_free_slot(self, i: int) -> int:
        """A slot off the free list for agent i: published as the agent's current slot at step 0, then marked this
        worker's, in one move (SharedState.moving). Before it is marked, a kill leaves it off the free list marked FREE
        (the runner's census finds it); once marked, the agent's previous slot, no longer published, counts as full."""
        slot = self._move_free_slot(i, None)
        if slot is not None:
            return slot
        while True:  # the learner is behind (backpressure): it may need the trajectories finished so far
            self._send_finished()
            # waiting for the learner is a sign of life: every agent of a group may wait for a slot in turn (they end
            # their trajectories at the same step), each until the learner frees a batch
            self.state.beat(self.heartbeat)
            if self.on_starved is not None:
                self.on_starved()
            # (a short wait: the runner's census waits for a move to end, and this one spans the wait)
            slot = self._move_free_slot(i, 0.0 if self.on_starved is not None else 0.1)
            if slot is not None:
                return slot
            if self.state.stopping():  # keep checking for a stop request
                raise StopIteration

    def _move_free_slot(self, i: int, timeout: float | None) -> int | None:
        """Take a free slot for agent i (waiting up to `timeout`; None: not at all) inside a move; None if none came or
        the runner counts slots (SharedState.census)."""
        with self.ledger.move(wait=CENSUS_PAUSE_SEC) as ok:
            if ok:
                free = self.queues.free
                try:
                    slot = int(free.get_nowait() if timeout is None else free.get(timeout=timeout))
                except Empty:
                    return None
                self.agent_slots[i, 0] = slot  # (slot, then step: (slot, 0) never names the previous, full slot)
                self.agent_slots[i, 1] = 0
                self.ledger.owner[slot] = self.worker_idx
                return slot
        return None

    def _send_finished(self) -> None:
        """Hand the full trajectories (the outbox's) to their policies' learners: marked queued, then put on the queues,
        in one move (none while the runner counts slots: they go with the next call)."""
        finished = self.outbox.finished
        if not any(finished):
            return
        with self.ledger.move() as ok:
            if not ok:
                return
            for p, slots in enumerate(finished):
                if slots:
                    self.ledger.owner[slots] = slot_queued(p)
                    if PAUSE_AT:
                        pause("rollout_worker_queued")
                    self.learner_queues[p].put_many(slots)
                    finished[p] = []

    def _write_obs(self, obs: dict, slot: int, t: int) -> None:
        for k, v in obs.items():
            self.obs_np[k][slot, t] = v

    # --- main loop ---
    def run_once(self, timeout: float = 0.1) -> bool:
        """Step every group whose actions are ready. Returns False when nothing arrived within timeout."""
        self.state.beat(self.heartbeat)
        if self.state.epoch_go_np[self.worker_idx] != self.epoch:
            self._adopt_epoch(int(self.state.epoch_go_np[self.worker_idx]))
        if self.sink.waiting:  # hts/ppo: groups whose next interval the learner has allowed go on
            for g in self.sink.released():
                self._request_actions(g)
            timeout = min(timeout, 0.002)  # a batch boundary: keep an eye on the learner
        try:
            groups = self.queues.worker.get_many(timeout=timeout)
        except Empty:
            return False
        for code in groups:
            epoch, g = divmod(int(code), self.splits)
            if epoch != self.epoch:  # a voided request's reply (its group was asked again)
                continue
            self.awaiting[g] -= 1
            if self.awaiting[g] == 0:  # every policy playing one of its agents has written their actions
                self._step_group(g)
        self._maybe_report()
        return True

    def _step_group(self, g: int) -> None:
        lo, hi = g * self.group_size, (g + 1) * self.group_size
        slots, ts = self.slot[lo:hi].tolist(), self.t[lo:hi].tolist()
        # the group's actions in one fancy-index read (one copy instead of a view per env)
        actions = self.actions_np[slots, ts]
        envs = self.sink.envs_to_step(g)  # (sf.eval: not an env whose agents met their quotas)
        if self.A == 1:
            for e in envs:
                i = e - lo
                slots[i], ts[i] = self._step_env(e, actions[i], slots[i], ts[i])
        else:
            for e in envs:
                k = (e - g * self.envs_per_group) * self.A
                slots[k:k + self.A], ts[k:k + self.A] = self._step_multiagent_env(e, actions[k:k + self.A],
                                                                                  slots[k:k + self.A], ts[k:k + self.A])
        self.slot[lo:hi], self.t[lo:hi] = slots, ts  # (env_slots: published by _record, step by step)
        self.frames += self.group_size * self.frameskip
        self._send_finished()
        if self.sink.goes_on(g, interval_done=ts[0] == 0):  # (its envs step in lockstep)
            self._request_actions(g)

    def _step_env(self, e: int, action, slot: int, t: int) -> tuple[int, int]:
        """One step of single-agent env e (agent e); returns the agent's (slot, t) after it."""
        if self.scalar_action[e]:
            action = action[0] if self.discrete else action
        final = None
        info: dict = {}
        try:
            obs, reward, terminated, truncated, info = self.envs[e].step(action)
            done = terminated or truncated
            # a time limit, not the episode's end: the learner bootstraps from the final observation
            by_time_limit = truncated and not terminated
            if done:
                if by_time_limit:
                    final = obs
                obs, _ = self.envs[e].reset()
        except Exception as ex:
            obs, reward, done, by_time_limit, info = self._replace_env(e, ex), 0.0, True, False, {}
        return self._record(e, slot, t, obs, reward, done, by_time_limit, info, final)

    def _step_multiagent_env(self, e: int, actions, slots: list, ts: list) -> tuple[list, list]:
        """One step of multi-agent env e (all its agents act together; it resets itself); returns its agents' new
        (slots, ts)."""
        if self.scalar_action[e]:
            actions = [a[0] if self.discrete else a for a in actions]
        try:
            obs, rewards, terminated, truncated, infos = self.envs[e].step(list(actions))
        except Exception as ex:
            obs, rewards = self._replace_env(e, ex), [0.0] * self.A
            terminated, truncated, infos = [True] * self.A, [False] * self.A, [{}] * self.A
        out_slots, out_ts = list(slots), list(ts)
        for a in range(self.A):
            by_time_limit = bool(truncated[a]) and not terminated[a]
            final = infos[a].get("final_obs") if by_time_limit else None
            out_slots[a], out_ts[a] = self._record(e * self.A + a, slots[a], ts[a], obs[a], rewards[a],
                                                   bool(terminated[a] or truncated[a]), by_time_limit, infos[a], final)
        return out_slots, out_ts

    def _record(self, i: int, slot: int, t: int, obs: dict, reward: float, done: bool, truncated: bool, info: dict,
                final) -> tuple[int, int]:
        """Write agent i's step t (reward, done) and its next observation; at an episode end its report and its next
        episode's policy; at the trajectory's end hand the slot to its policy's learner and take the next one.
        obs: the observation after the step (after the reset when done); truncated: the episode was cut by a time limit
        (not terminated); final: the last observation of such an episode (None otherwise). Returns agent i's (slot, t)
        after the step."""
        if not self.active[i]:  # no policy acted (Sample Factory's is_active): learners mask it (policy id -1)
            self.policy_ids_np[slot, t] = -1
        self.active[i] = info.get("is_active", True)
        if done and "episode" in info:  # a real episode end (an Atari life loss is done without one)
            self.sink.episode_end(i, info["episode"])
        if truncated and final is not None:
            self._keep_final(slot, t, final)
        self.rewards_np[slot, t] = min(max(reward * self.reward_scale, -self.reward_clip), self.reward_clip)
        self.dones_np[slot, t] = float(done)
        self.truncated_np[slot, t] = float(truncated)
        t += 1
        self._write_obs(obs, slot, t)
        self.agent_slots[i, 1] = t  # the step is recorded: a dead worker's lost frames count it
        if done:
            self.rnn_np[slot, t] = 0.0  # the next step starts a new episode: fresh recurrent state
            self._episode_start(i)
        if t == self.T:
            new_slot = self._next_slot(i)
            if PAUSE_AT:
                pause("rollout_worker_trajectory_end")
            for k in self.obs_np:
                self.obs_np[k][new_slot, 0] = self.obs_np[k][slot, self.T]
            self.rnn_np[new_slot, 0] = self.rnn_np[slot, self.T]
            self.sink.trajectory_end(i, slot)
            self.slot_policy[i] = self.policy[i]
            slot, t = new_slot, 0
        return slot, t

    def _keep_final(self, slot: int, t: int, obs: dict) -> None:
        """The last observation of an episode cut at step t, and the RNN state that follows it (written by the policy
        worker into rnn_states[slot, t+1] before this step): the first such episode of the trajectory only."""
        if self.final_t_np[slot] >= 0:
            return
        self.final_t_np[slot] = t
        for k, v in obs.items():
            self.final_obs_np[k][slot] = v
        self.final_rnn_np[slot] = self.rnn_np[slot, t + 1]

    def _maybe_report(self, force: bool = False) -> None:
        now = time.time()
        self.state.set_worker_frames(self.worker_idx, self.frames)
        self.sink.report(now, force)

    def close(self) -> None:
        self._maybe_report(force=True)
        self._close_envs()

    def _close_envs(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:
                pass


def run_rollout_worker(run: RunContext, worker_idx, buffers, env_slots, queues, shared_state, core) -> None:
    """Process entry (run: the run's context, sf/cfg/context.py): lower priority than policy workers and learner,
    pinned to one core, one thread. Its envs may be processes of their own (VizDoom engines): however this worker
    ends, they end with it."""
    from sf.processes.control import add_leftover_hook, kill_descendants, limit_threads, runner_alive, set_affinity
    from sf_envs.registry import process_leftover_files
    add_leftover_hook(process_leftover_files)  # its engines' shared memory goes with them if they must be killed
    limit_threads(1)
    cfg = run.cfg
    set_affinity(core if cfg.set_workers_cpu_affinity else None, nice=5)
    worker = None
    try:
        worker = RolloutWorker(cfg, worker_idx, buffers, env_slots, queues, shared_state, shape=run.shape,
                               policies=list(run.policies))
        worker.start()
        shared_state.set_started(worker.heartbeat)
        while not shared_state.stopping() and runner_alive():
            worker.run_once(timeout=0.1)
    except StopIteration:
        pass
    finally:
        if worker is not None:
            worker.close()  # closes the games: engines exit and remove their shared memory
        kill_descendants()  # engines that did not close (a hung game, or envs still being made)
