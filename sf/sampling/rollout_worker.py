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
"""
from __future__ import annotations

import logging
import time
import traceback
from queue import Empty

import numpy as np
import torch

from typing import Callable, Optional

from sf.model.action_spaces import draw_action_noise
from sf.seeding import action_noise_rng, run_seed
from sf_envs.registry import env_spec, make_env

EPISODE_REPORT_SEC = 1.0
log = logging.getLogger(__name__)


class RolloutWorker:
    def __init__(self, cfg, worker_idx: int, buffers, env_slots: torch.Tensor, queues, shared_state,
                 on_starved: Optional[Callable[[], None]] = None):
        """on_starved: called while no free slot is available instead of waiting for one (serial mode: the learner,
        which frees slots, runs in this same thread)."""
        self.cfg, self.w = cfg, worker_idx
        self.on_starved = on_starved
        self.finished: list[int] = []  # full trajectory slots of the group being stepped, not yet sent to the learner
        self.buffers, self.env_slots, self.q, self.state = buffers, env_slots, queues, shared_state
        self.num_envs = cfg.num_envs_per_worker
        self.group_size = self.num_envs // cfg.worker_num_splits
        self.frameskip = env_spec(cfg.env, cfg).frameskip
        self.T = cfg.rollout
        # training rewards: scaled and clipped (Sample Factory's --reward_scale, --reward_clip); episode statistics,
        # from the env's info["episode"], stay in the env's own units
        self.reward_scale, self.reward_clip = getattr(cfg, "reward_scale", 1.0), getattr(cfg, "reward_clip", float("inf"))
        # numpy views of the shared tensors: the env-step loop is plain numpy, no torch dispatch per step.
        self.obs_np = {k: v.numpy() for k, v in buffers.obs.items()}
        self.actions_np = buffers.actions.numpy()
        self.rewards_np, self.dones_np = buffers.rewards.numpy(), buffers.dones.numpy()
        self.truncated_np, self.noise_np = buffers.truncated.numpy(), buffers.action_noise.numpy()
        self.final_obs_np = {k: v.numpy() for k, v in buffers.final_obs.items()}
        self.final_rnn_np, self.final_t_np = buffers.final_rnn.numpy(), buffers.final_t.numpy()
        self.rnn_np = buffers.rnn_states.numpy()
        # hts/ppo: the group's rollout interval, and the groups waiting for the learner before their next interval
        self.sync = getattr(cfg, "sync_mode", "async") != "async"
        self.total_envs = cfg.num_workers * self.num_envs
        self.interval = np.zeros(cfg.worker_num_splits, dtype=np.int64)
        self.waiting: dict[int, int] = {}
        self.env_slots_np = env_slots.numpy()
        self.heartbeat = shared_state.heartbeat_slot(f"rollout_worker_{worker_idx}")
        self.envs = []
        try:
            for e in range(self.num_envs):
                shared_state.beat(self.heartbeat)
                self.envs.append(make_env(cfg, env_index=worker_idx * self.num_envs + e))
        except BaseException:  # an env that fails to start, or a stop meanwhile: close the ones already running
            self._close_envs()
            raise
        self.noise_rngs = [action_noise_rng(run_seed(cfg), worker_idx * self.num_envs + e) for e in range(self.num_envs)]
        self.discrete = self.actions_np.dtype == np.int64
        self.scalar_action = [self._is_scalar(env.action_space) for env in self.envs]
        self.slot = np.zeros(self.num_envs, dtype=np.int64)
        self.t = np.zeros(self.num_envs, dtype=np.int64)
        self.env_restarts = 0
        self.episodes: list[dict] = []
        self.last_report = time.time()
        self.frames = 0

    @staticmethod
    def _is_scalar(space) -> bool:
        return space.shape == () or space.__class__.__name__ == "Discrete"

    def _env_seed(self, e: int) -> int | None:
        if self.cfg.seed is None:
            return None
        return self.cfg.seed * 10_000 + self.w * self.num_envs + e + 1_000_003 * self.env_restarts

    def _replace_env(self, e: int, ex: Exception) -> dict:
        """A fresh env in place of env e, which raised `ex`; returns its first observation. One crashing game
        (VizDoom engines do crash after many thousand episodes) must not end a run of days; a persistent
        fault still stops it after --max_env_restarts replacements, as the traceback below says."""
        where = f"env {e} ({self.cfg.env}) of rollout worker {self.w}"
        if self.env_restarts >= self.cfg.max_env_restarts:
            raise RuntimeError(f"{where} raised: {ex!r} (after {self.env_restarts} replacements of failed envs in "
                               f"this worker; --max_env_restarts {self.cfg.max_env_restarts})") from ex
        self.env_restarts += 1
        log.warning("%s raised; replacing it with a fresh env (%d of --max_env_restarts %d):\n%s", where,
                    self.env_restarts, self.cfg.max_env_restarts, traceback.format_exc().rstrip())
        try:
            self.envs[e].close()
        except Exception:  # a broken env may fail to close too; its replacement matters, not its farewell
            pass
        self.envs[e] = make_env(self.cfg, env_index=self.w * self.num_envs + e)
        obs, _ = self.envs[e].reset(seed=self._env_seed(e))
        return obs

    # --- start ---
    def start(self) -> None:
        """Reset every env, take a slot for each, and request actions for every group."""
        for e, env in enumerate(self.envs):
            self.state.beat(self.heartbeat)
            obs, _ = env.reset(seed=self._env_seed(e))
            self.slot[e] = self._next_slot(e, interval=0)
            self.t[e] = 0
            self._write_obs(e, obs, self.slot[e], 0)
            self.rnn_np[self.slot[e], 0] = 0.0
        self.env_slots_np[self.w, :, 0] = self.slot
        self.env_slots_np[self.w, :, 1] = self.t
        for g in range(self.cfg.worker_num_splits):
            self._request_actions(g)

    def _next_slot(self, e: int, interval: int) -> int:
        """The slot env e fills next: fixed in hts/ppo modes, any free one otherwise. Marks it as holding no final
        observation yet."""
        if self.sync:
            slot = (interval % 2) * self.total_envs + self.w * self.num_envs + e
        else:
            slot = self._take_free_slot()
        self.final_t_np[slot] = -1
        return slot

    def _request_actions(self, g: int) -> None:
        """Ask the policy workers for group g's actions at its current steps (hts/ppo: with each env's noise)."""
        lo, hi = g * self.group_size, (g + 1) * self.group_size
        if self.sync:
            for e in range(lo, hi):
                draw_action_noise(self.envs[e].action_space, self.noise_rngs[e], self.noise_np[self.slot[e], self.t[e]])
        self.q.policy.put((self.w, g))

    def _release_waiting(self) -> None:
        """hts/ppo: groups whose next interval the learner has allowed go on."""
        ready = self.state.sync_ready_batches()
        for g, interval in list(self.waiting.items()):
            if ready >= interval:
                del self.waiting[g]
                self._request_actions(g)

    def _take_free_slot(self) -> int:
        try:
            return int(self.q.free.get_nowait())
        except Empty:  # the learner is behind (backpressure): it may need the trajectories finished so far
            self._send_finished()
        while True:
            if self.on_starved is not None:
                self.on_starved()
            try:
                return int(self.q.free.get(timeout=0.0 if self.on_starved is not None else 0.5))
            except Empty:  # keep checking for a stop request
                self.state.beat(self.heartbeat)
                if self.state.stopping():
                    raise StopIteration from None

    def _send_finished(self) -> None:
        if self.finished:
            self.q.learner.put_many(self.finished)
            self.finished = []

    def _write_obs(self, e: int, obs: dict, slot: int, t: int) -> None:
        for k, v in obs.items():
            self.obs_np[k][slot, t] = v

    # --- main loop ---
    def run_once(self, timeout: float = 0.1) -> bool:
        """Step every group whose actions are ready. Returns False when nothing arrived within timeout."""
        self.state.beat(self.heartbeat)
        if self.waiting:
            self._release_waiting()
            timeout = min(timeout, 0.002)  # a batch boundary: keep an eye on the learner
        try:
            groups = self.q.worker.get_many(timeout=timeout)
        except Empty:
            return False
        for g in groups:
            self._step_group(int(g))
        self._maybe_report()
        return True

    def _step_group(self, g: int) -> None:
        T = self.T
        lo, hi = g * self.group_size, (g + 1) * self.group_size
        slots, ts = self.slot[lo:hi].tolist(), self.t[lo:hi].tolist()
        # the group's actions in one fancy-index read (one copy instead of a view per env)
        actions = self.actions_np[slots, ts]
        for i, e in enumerate(range(lo, hi)):
            slot, t = slots[i], ts[i]
            action = actions[i]
            if self.scalar_action[e]:
                action = action[0] if self.discrete else action
            try:
                obs, reward, terminated, truncated, info = self.envs[e].step(action)
                done = terminated or truncated
                cut = truncated and not terminated  # a time limit: the learner bootstraps from the final observation
                if done:
                    if "episode" in info:  # a real episode end (an Atari life loss is done without one)
                        self.episodes.append({k: float(v) for k, v in info["episode"].items()})
                    if cut:
                        self._keep_final(slot, t, obs)
                    obs, _ = self.envs[e].reset()
            except Exception as ex:
                obs, reward, done, cut = self._replace_env(e, ex), 0.0, True, False
            self.rewards_np[slot, t] = min(max(reward * self.reward_scale, -self.reward_clip), self.reward_clip)
            self.dones_np[slot, t] = float(done)
            self.truncated_np[slot, t] = float(cut)
            t += 1
            self._write_obs(e, obs, slot, t)
            if done:
                self.rnn_np[slot, t] = 0.0  # the next step starts a new episode: fresh recurrent state
            if t == T:
                new_slot = self._next_slot(e, interval=self.interval[g] + 1)
                for k in self.obs_np:
                    self.obs_np[k][new_slot, 0] = self.obs_np[k][slot, T]
                self.rnn_np[new_slot, 0] = self.rnn_np[slot, T]
                self.finished.append(slot)
                slot, t = new_slot, 0
            slots[i], ts[i] = slot, t
        self.slot[lo:hi], self.t[lo:hi] = slots, ts
        self.env_slots_np[self.w, lo:hi, 0] = slots
        self.env_slots_np[self.w, lo:hi, 1] = ts
        self.frames += self.group_size * self.frameskip
        self._send_finished()
        if self.sync and ts[0] == 0:  # the group finished its interval (its envs step in lockstep)
            self.interval[g] += 1
            if self.state.sync_ready_batches() < self.interval[g]:
                self.waiting[g] = int(self.interval[g])
                return
        self._request_actions(g)

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
        self.state.set_worker_frames(self.w, self.frames)
        if self.episodes and (force or now - self.last_report > EPISODE_REPORT_SEC):
            self.q.report.put(("episodes", self.w, self.episodes))
            self.episodes = []
            self.last_report = now

    def close(self) -> None:
        self._maybe_report(force=True)
        self._close_envs()

    def _close_envs(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:
                pass


def run_rollout_worker(cfg, worker_idx, buffers, env_slots, queues, shared_state, core) -> None:
    """Process entry: lower priority than policy workers and learner, pinned to one core, one thread. Its envs may be
    processes of their own (VizDoom engines): however this worker ends, they end with it."""
    from sf.processes.control import add_leftover_hook, kill_descendants, limit_threads, runner_alive, set_affinity
    from sf_envs.registry import process_leftover_files
    add_leftover_hook(process_leftover_files)  # its engines' shared memory goes with them if they must be killed
    limit_threads(1)
    set_affinity(core if cfg.set_workers_cpu_affinity else None, nice=5)
    worker = None
    try:
        worker = RolloutWorker(cfg, worker_idx, buffers, env_slots, queues, shared_state)
        worker.start()
        while not shared_state.stopping() and runner_alive():
            worker.run_once(timeout=0.1)
    except StopIteration:
        pass
    finally:
        if worker is not None:
            worker.close()  # closes the games: engines exit and remove their shared memory
        kill_descendants()  # engines that did not close (a hung game, or envs still being made)
