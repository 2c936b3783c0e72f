"""Learner process (one per policy): batcher thread -> APPO SGD steps -> weights published after each.

The batcher thread takes full trajectory slots from the learner queue until it has one training batch
(`batch_size * num_batches_per_epoch / rollout` trajectories), copies them out of shared memory onto
the device and returns the slots to the free list at once. It hands batches to the training loop through
a one-element queue, and copies a batch out only while that queue is empty: while one batch trains and one
waits, the batcher stops taking slots, the free list runs dry and rollout workers pause (backpressure)
instead of memory growing or experience going stale. At most one batch trains, one waits and the spare
slots fill: policy lag stays within about three training batches' worth of SGD steps.

--sync_mode hts/ppo: no batcher thread. A training batch is one rollout interval k of every env (slots
(k % 2) * num_envs + env index, in that order: a fixed composition, whatever order they arrived in). hts: take batch
k, publish the weights trained on batch k-1, let interval k+1 start, train on batch k (collection of k+1 overlaps it;
policy lag exactly one batch after the first). ppo: take batch k, train, publish, let interval k+1 start (lag 0).
Weights change for the actors only at these batch boundaries, and a --train_for_env_steps budget ends the run right
after the batch that reaches it: the same seed and config give the same weights.

The learner owns the model and optimizer, so it also writes the checkpoints (periodic, best, final).

Populations (--num_policies N): one learner per policy, each with its own queue, weights, counters (row `policy_id` of
SharedState.learner) and checkpoint_p{policy_id}. A slot may hold steps another policy acted (an agent changed policy at
an episode start inside the trajectory): they are masked out of the loss (policy_ids != policy_id). Before each training
batch the learner applies its policy's hyperparameters from SharedState.hyperparams and, when population-based training
asks it (SharedState.copy_requests, replace_from), copies another policy's published weights (its Adam moments are reset:
they were estimated for other weights); its version goes on counting up, so policy workers pick the copy up at once. A copy
whose source cannot be read whole is retried for PBT_COPY_WAIT_SEC, then abandoned with a warning
(apply_population_updates). Which hyperparameters are in force after a resume: sf/runner/population.py.

Self-healing: a learner that died is replaced (`replacement=True`). The replacement takes the weights of the last SGD
step its predecessor published (shared memory outlives it; the checkpoint's when the predecessor died writing them), the
optimizer state and random streams of the latest checkpoint, the frames trained from SharedState, and goes on numbering
versions above every version published so far (policy lag stays meaningful). Every slot it takes from its queue is
marked held in SharedState.slot_owner until it returns it to the free list: the runner queues a dead learner's held
slots again for its replacement. A batch copied out has left shared memory (its slots are free): the batches a dead
learner copied out and had not finished training (one training, one waiting: at most two) are lost, and counted
(SharedState.released - frames trained).

Data-parallel learners (torchrun, sf/distributed.py): the learners of all ranks form one process group. At start rank
0's weights are broadcast (a resumed run: every rank loaded the same checkpoint, checked exactly); every SGD step
averages the gradients over the ranks (APPO's grad_hook) and every normalizer update merges every rank's batch moments,
so every rank holds the same weights and statistics at every moment, whether or not a step ran; before each training
batch the learners agree (one small all-reduce) whether to go on and sum their frame counters, so they train the same
number of batches and stop at the same boundary. Only rank 0 writes: checkpoints, and files that fail verification
moved to rejected/ (the other ranks read the directory only). A collective that fails (a peer died) stops the run, with
a checkpoint from rank 0.
"""
from __future__ import annotations

import collections
import copy
import logging
import math
import queue
import threading
import time

import torch

from sf import distributed
from sf.learning.appo import APPO, cfg_hyperparams
from sf.learning.checkpoint import (check_compatible, load_into, make_checkpoint_state, model_signature,
                                    restore_rng_states, weights_sha256)
from sf.learning.checkpoint_store import CheckpointManager
from sf.learning.phase_timing import LAPS  # SF_PROFILE: phase times (benchmarks/profile_training.py)
from sf.model.actor_critic import create_actor_critic, run_precision
from sf.processes.control import device_thread, usable_cores
from sf.processes.pause_points import PAUSE_AT, pause
from sf.processes.shared_state import (COPIES_HANDLED, COPIES_REQUESTED, ENV_STEPS, FINISHED, HYPERPARAMS, SLOT_FREE,
                                      VERSION, learner_name, slot_held)
from sf.seeding import MODEL, deterministic_kernels, run_seed, stream_seed

log = logging.getLogger("sf.learner")
# PBT weight copy from a source that has not published yet or is being written (its learner died writing): retried
# before each training batch and in the idle loop for this long, then abandoned (a publish takes well under a ms)
PBT_COPY_WAIT_SEC = 5.0


def checkpoint_meta(cfg, obs_space, action_space, model) -> dict:
    """What a checkpoint must match to be loaded into this run (one-line error otherwise)."""
    return {"env": cfg.env, "observation_space": str(obs_space), "action_space": str(action_space),
            "model": model_signature(model), "model_options": model_options(cfg)}


# Model options added after checkpoints began to record model_options, each with the value that builds the model those
# checkpoints hold: recorded only when a run's value differs from it, so an older checkpoint (without the key) matches.
# (The initialization options are not model options: they pick starting weights that a checkpoint's replace.)
LATER_MODEL_OPTIONS = {"rnn_num_layers": 1, "actor_critic_share_weights": True, "adaptive_stddev": True,
                       "continuous_tanh_scale": 0.0, "obs_scale": 255.0, "obs_subtract_mean": 0.0}


def model_options(cfg) -> dict:
    """The model settings that change what the weights compute without changing their shapes (the signature cannot
    tell them apart), and those that change its structure: resuming or watching with another would run the weights
    through another function (or fail on their names)."""
    options = {"nonlinearity": cfg.nonlinearity}
    options.update({k: getattr(cfg, k) for k, before in LATER_MODEL_OPTIONS.items() if getattr(cfg, k, before) != before})
    return options


class Learner:
    def __init__(self, cfg, obs_space, action_space, buffers, queues, shared_weights, shared_state, device, exp_dir,
                 frameskip: int, num_agents: int = 1, policy_id: int = 0, all_weights: list | None = None,
                 replacement: bool = False, world: distributed.World | None = None):
        """frameskip: env frames per env step, num_agents: agents per env (the env's spec: the learner counts frames,
        it knows no env). queues.learner: this policy's queue; all_weights: every policy's SharedWeights (PBT copies).
        replacement: this learner replaces one that died (see the module docstring). world: the data-parallel ranks
        (torchrun; default one rank)."""
        self.cfg, self.buffers, self.queues = cfg, buffers, queues
        self.policy_id, self.all_weights = policy_id, all_weights or [shared_weights]
        self.population = getattr(cfg, "num_policies", 1) > 1
        self.masks_steps = self.population or num_agents > 1  # (see collect)
        self.shared_weights, self.state, self.device = shared_weights, shared_state, torch.device(device)
        self.heartbeat = shared_state.heartbeat_slot(learner_name(policy_id, shared_state.num_policies))
        if getattr(cfg, "sync_mode", "async") != "async":
            deterministic_kernels(self.device)
        torch.manual_seed(stream_seed(run_seed(cfg), MODEL, policy_id))  # initial weights
        self.model = create_actor_critic(cfg, obs_space, action_space).to(self.device)
        run_precision(cfg, self.model, self.device)
        if self.model.compute_dtype is not None and policy_id == 0:
            log.info("The observation encoder computes in bfloat16 (--precision %s; float32 weights, RNN, heads and losses)",
                     cfg.precision)
        self.world = world or distributed.World()
        grad_hook = None
        if self.world.distributed:
            distributed.init_learner_group(self.world, self.device, cfg.distributed_timeout_sec)
            distributed.abort_waits_on_stop(shared_state.stopping)  # (NCCL: a dead peer's collective never ends)
            grad_hook = distributed.GradientAllReduce(self.model.parameters())
            distributed.share_normalizer_statistics(self.model)  # the union batch's statistics on every rank
        self.appo = APPO(self.model, cfg, self.device, policy_id=policy_id, grad_hook=grad_hook,
                         frames_per_sample=frameskip * self.world.world_size)  # (the run's frames: linear decay)
        self.meta = checkpoint_meta(cfg, obs_space, action_space, self.model)
        self.checkpoints = CheckpointManager(exp_dir, policy_id=policy_id, keep_checkpoints=cfg.keep_checkpoints,
                                             save_best_metric=cfg.save_best_metric,
                                             read_only=self.world.rank > 0)  # rank 0's directory: only it writes
        self.frames_per_traj = cfg.rollout * frameskip
        self.sync = cfg.sync_mode if getattr(cfg, "sync_mode", "async") != "async" else None
        self.num_envs = cfg.num_workers * cfg.num_envs_per_worker * num_agents  # agents: one trajectory stream each
        if self.sync:
            self.trajs_per_batch = self.num_envs
        else:
            self.trajs_per_batch = cfg.batch_size * cfg.num_batches_per_epoch // cfg.rollout
        self.version, self.env_steps = 0, 0
        self.pending: list[int] = []
        self.last_save = self.last_milestone = time.time()
        self.hyperparams = {k: float(getattr(cfg, k)) for k in HYPERPARAMS}
        self.batches: queue.Queue | None = None  # process mode: the batch copied out and waiting (run)
        self.copy_pending: tuple[int, float] | None = None  # PBT: (request number, time.monotonic() of its first try)
        self.copy_scratch: torch.nn.Module | None = None  # PBT: a copy lands here first (whole, or not at all)
        self.slot_owner, self.held = shared_state.slot_owner_np, slot_held(policy_id)
        self.moving, self.census = shared_state.moving_np, shared_state.census_np  # (moves of slots: _take, _release)
        if replacement:
            self._take_over()
        else:
            self._load_checkpoint()
        if self.world.distributed:
            self._join_ranks()
        self.state.learner[policy_id, ENV_STEPS] = self.env_steps
        self.released_frames = self.env_steps  # SharedState.released: none copied out and untrained yet
        shared_state.released_np[policy_id] = 2 * self.released_frames
        self.sync_batch = 0  # hts/ppo: the rollout interval whose batch comes next
        self.published = {}  # hts/ppo: batches trained on -> the policy version published after them
        self.budget_done = False
        self._publish(self.version)

    # --- checkpoints ---
    def _load_checkpoint(self, always: bool = False) -> dict | None:
        if self.cfg.restart_behavior != "resume" and not always:
            return None
        state = self.checkpoints.load("latest", map_location=self.device)
        if state is None:
            return None
        check_compatible(state["meta"], self.meta, state.get("path", "latest checkpoint"))
        same_optimizer = self.appo.load_training_state(state)  # the learning-rate schedule's state, and its rate
        load_into(self.model, self.appo.optimizer if same_optimizer else None, state)
        if not same_optimizer:
            log.info("%s: optimizer state of --optimizer %s not loaded: this run uses --optimizer %s (fresh state)",
                     state.get("path", "latest checkpoint"), state.get("optimizer_kind", "adam"), self.cfg.optimizer)
        # the optimizer state brought the saving run's hyperparameters: this run's are in force (sf/runner/population.py
        # says which; a population's PBT values follow from SharedState before the first batch)
        self.appo.set_hyperparams(**cfg_hyperparams(self.cfg))
        restore_rng_states(state)
        if torch.is_tensor(state.get("minibatch_rng")) and not self.appo.load_minibatch_rng(state["minibatch_rng"]):
            log.info("%s: the minibatch order's generator state is a CUDA generator's; the order goes on from a seed "
                     "taken from it", state.get("path", "latest checkpoint"))
        self.version, self.env_steps = int(state["policy_version"]), int(state["env_steps"])
        log.info("Resumed %sfrom checkpoint: policy version %d, %d env frames",
                 f"policy {self.policy_id} " if self.population else "", self.version, self.env_steps)
        return state

    def _take_over(self) -> None:
        """Replace a learner of this run that died (module docstring): the published weights of its last SGD step,
        the latest checkpoint's optimizer and random streams, the frames trained so far, versions going on."""
        p = self.policy_id
        state = self._load_checkpoint(always=True)  # weights, optimizer, streams, counters: overridden below if fresher
        published = self.shared_weights.load_into(self.model, -1)  # -1: its predecessor died writing them
        if published >= 0:
            self.env_steps = max(self.env_steps, int(self.state.learner[p, ENV_STEPS]))
        last = max(published, self.shared_weights.version, int(self.state.learner[p, VERSION]), self.version)
        self.version = last + 1  # _publish() below makes it the actors' version
        log.info("Replacement learner%s: weights of %s, optimizer state %s; policy version %d, %d env frames trained",
                 f" of policy {p}" if self.population else "",
                 f"the last SGD step (version {published})" if published >= 0 else
                 ("the latest checkpoint (the learner died writing its weights)" if state else "initialisation"),
                 f"of the latest checkpoint (version {int(state['policy_version'])})" if state else "fresh (no checkpoint yet)",
                 self.version, self.env_steps)
    def _join_ranks(self) -> None:
        """Every rank starts from rank 0's weights at the same version and trained frames; a resumed run needs every
        rank to have loaded the same checkpoint (its optimizer state is not broadcast)."""
        lo, hi = distributed.agree_range([self.version, self.env_steps])  # exact, whatever the magnitude
        if lo != hi:
            raise distributed.DistributedError(
                f"rank {self.world.rank} resumed from policy version {self.version} ({self.env_steps} env frames), the "
                f"ranks from versions {lo[0]}..{hi[0]} ({lo[1]}..{hi[1]} env frames): every rank needs the same "
                "experiment directory (one machine, or a shared file system) to resume")
        distributed.broadcast_state(self.model)

    def save(self, final: bool = False) -> None:
        if self.world.rank != 0:  # rank 0 writes the checkpoints: every rank holds the same weights
            return
        saved = self.checkpoints.holds(self.version, self.env_steps)
        if saved is not None:  # nothing trained since it was written or loaded: nothing is rewritten, no best relabelled
            if final:  # (it is the final checkpoint, on disk already)
                self.queues.report.put(("checkpoint", str(saved), final))
            self.last_save = time.time()
            return
        extra = {"minibatch_rng": self.appo.generator.get_state(), "policy_id": self.policy_id,
                 "hyperparams": dict(self.hyperparams), "world_size": self.world.world_size,
                 **self.appo.training_state()}
        state = make_checkpoint_state(self.model, self.appo.optimizer, self.version, self.env_steps, self.meta,
                                      extra=extra)
        path = self.checkpoints.save(state, self.version, self.env_steps)
        if 0 < self.cfg.save_milestones_sec <= time.time() - self.last_milestone:
            self.checkpoints.save_milestone(path)
            self.last_milestone = time.time()
        metric, episodes = float(self.state.best_metric[self.policy_id, 0]), int(self.state.best_metric[self.policy_id, 1])
        if episodes > 0 and self.env_steps >= self.cfg.save_best_after:
            self.checkpoints.save_best(state, self.version, self.env_steps, metric)
        self.queues.report.put(("checkpoint", str(path), final))
        self.last_save = time.time()

    # --- population-based training ---
    def apply_population_updates(self, last: bool = False) -> None:
        """Before a training batch (and, in process mode, while none comes): this policy's hyperparameters
        (SharedState.hyperparams, NaN: the configuration's) and a weight copy population-based training asked for
        (SharedState.copy_requests, replace_from).

        A copy lands whole or not at all: the source's published weights are read into a scratch model first. A source
        that has not published yet or is being written leaves the copy pending: retried at every call for
        PBT_COPY_WAIT_SEC (`last`: the run ends, no retry), then abandoned with a ("pbt_copy_abandoned", policy, source,
        reason) report: this policy's weights, Adam moments and version stay. A copy made resets Adam's moments (they
        were estimated for other weights), publishes the weights as this policy's next version (policy workers pick
        them up at once) and reports ("pbt_copied", policy, source, the source's version copied, the new version). A
        request made while one is pending replaces it: the latest decision's source is the one copied."""
        p = self.policy_id
        values = self.state.hyperparams[p].tolist()
        if not any(math.isnan(v) for v in values):
            wanted = dict(zip(HYPERPARAMS, values))
            in_force = self.appo.hyperparams()  # (the optimizer's own values: a loaded state may have changed them)
            if any(in_force[k] != v for k, v in wanted.items()):
                self.appo.set_hyperparams(**wanted)
            self.hyperparams = wanted
        requested = int(self.state.copy_requests[p, COPIES_REQUESTED])
        if requested > int(self.state.copy_requests[p, COPIES_HANDLED]):
            self._copy_weights(requested, last)

    def _copy_weights(self, requested: int, last: bool) -> None:
        """Try the pending weight copy (request number `requested`; see apply_population_updates)."""
        p, now = self.policy_id, time.monotonic()
        source = int(self.state.replace_from[p])  # read after the count: the runner writes it before counting
        if self.copy_pending is None or self.copy_pending[0] != requested:
            self.copy_pending = (requested, now)
        copied, reason = -1, f"policy {source} is not another policy of this run"
        if source != p and 0 <= source < len(self.all_weights):
            if self.copy_scratch is None:
                self.copy_scratch = copy.deepcopy(self.model)
            copied = self.all_weights[source].load_into(self.copy_scratch, -1)  # its latest weights, -1 if none whole
            if copied < 0:
                if not last and now - self.copy_pending[1] < PBT_COPY_WAIT_SEC:
                    return  # pending: tried again before the next batch
                reason = (f"its weights were being written for {now - self.copy_pending[1]:.1f} s (its learner died "
                          "writing them?)" if self.all_weights[source].version >= 0 else "it has published no weights")
        if copied >= 0:
            self.model.load_state_dict(self.copy_scratch.state_dict())
            self.appo.optimizer.state = collections.defaultdict(dict)  # moments of other weights: start afresh
            self._publish(self.version + 1)
            self.queues.report.put(("pbt_copied", p, source, copied, self.version))
        else:
            self.queues.report.put(("pbt_copy_abandoned", p, source, reason))
        self.state.copy_requests[p, COPIES_HANDLED] = requested
        self.copy_pending = None

    # --- weights ---
    def _publish(self, version: int) -> None:
        self.version = version
        self.state.beat(self.heartbeat)  # after every SGD step: a long training batch is not a stall
        self.shared_weights.publish(self.model, version)
        self.state.learner[self.policy_id, VERSION] = version

    def _on_sgd_step(self, version: int) -> None:
        if PAUSE_AT and self.batches is not None and self.batches.full():  # (tests: the batcher's batches)
            pause("learner_two_batches_out")
        # (data-parallel: nothing to copy; the gradients were averaged and the normalizers merged every rank's moments)
        if self.sync:  # the actors' weights change at batch boundaries only
            self.version = version
            self.state.beat(self.heartbeat)
        else:
            self._publish(version)

    # --- batcher ---
    def collect(self, timeout: float):
        """Take finished slots; once a training batch is complete, copy it out and free its slots.
        Returns the experience dict (storage layout, on the device) or None."""
        taken = self._take(timeout)
        LAPS.lap("wait_trajectories")  # (batcher: also its waits for room in the batch queue)
        if not taken:
            return None
        self.pending.extend(int(s) for s in taken)
        if self.cfg.sampler_only:  # benchmark: recycle the slots at once, count the frames, train nothing
            self._release(self.pending)
            self.env_steps += len(self.pending) * self.frames_per_traj
            self.state.learner[self.policy_id, ENV_STEPS] = self.env_steps
            self.pending = []
            return None
        if len(self.pending) < self.trajs_per_batch:
            return None
        if self.sync:  # one interval of every env, in env order
            self.pending.sort()
            expected = list(range((self.sync_batch % 2) * self.num_envs, (self.sync_batch % 2 + 1) * self.num_envs))
            if self.pending != expected:
                raise RuntimeError(f"--sync_mode {self.sync}: batch {self.sync_batch} got slots {self.pending[:8]}..., "
                                   f"expected {expected[0]}..{expected[-1]}")
        slots = torch.tensor(self.pending[: self.trajs_per_batch], dtype=torch.int64)
        self.pending = self.pending[self.trajs_per_batch:]
        experience = self.buffers.gather(slots, self.device)
        if self.masks_steps:  # masked: steps another policy acted (it took over the agent at
            # an episode start), or none did (policy id -1: the env said the agent was inactive, info["is_active"])
            experience["own"] = experience["policy_ids"] == self.policy_id
        # no wait for the device: gather returns once the slots were read on the host (CUDA: into pinned staging, whose
        # asynchronous copy to the device the batch's consumers wait for on the device; see GatherStaging)
        if not self.sync:  # (sync modes: slots are fixed; the rollout workers wait for sync_ready instead)
            self._release(slots.tolist())
        LAPS.lap("copy")
        return experience

    def _take(self, timeout: float) -> list:
        """Finished trajectories off this policy's queue (up to what the batch lacks; waiting up to `timeout`), marked
        held by this learner in one move (SharedState.moving): a replacement gets them again if this learner dies, and
        those it dies taking are found by the runner's census. None while the runner counts slots ([])."""
        row = self.heartbeat  # (its row of SharedState.moving too)
        self.moving[row] += 1
        try:
            if not self.census[0]:
                taken = self.queues.learner.get_many(timeout=timeout,
                                                     max_messages_to_get=self.trajs_per_batch - len(self.pending))
                self.slot_owner[taken] = self.held
                return taken
        except queue.Empty:
            return []
        finally:
            self.moving[row] += 1
        time.sleep(min(timeout, 0.002))  # the census takes milliseconds
        return []

    def _release(self, slots: list) -> None:
        """Return the slots of copied-out trajectories to the free list (marked FREE, then put), in one move opened by
        the store that counts their frames as copied out (SharedState.released): a learner killed at any point takes
        with it exactly the frames of the batches it copied out and did not train on."""
        p, frames = self.policy_id, self.released_frames + len(slots) * self.frames_per_traj
        while True:
            self.state.released_np[p] = 2 * frames + 1
            if not self.census[0]:
                break
            self.state.released_np[p] = 2 * self.released_frames  # the runner counts slots: not yet
            time.sleep(0.002)
        self.released_frames = frames
        self.slot_owner[slots] = SLOT_FREE
        self.queues.free.put_many(slots)
        self.state.released_np[p] = 2 * frames

    # --- training ---
    def train(self, experience) -> None:
        if self.sync:
            return self.train_sync(experience)
        self.apply_population_updates()
        stats = self.appo.train(experience, self.version, on_sgd_step=self._on_sgd_step,
                                env_frames=self.env_steps * self.world.world_size)
        self._trained(stats)

    def _trained(self, stats: list) -> None:
        self.env_steps += self.trajs_per_batch * self.frames_per_traj
        self.state.learner[self.policy_id, ENV_STEPS] = self.env_steps
        self.queues.report.put(("train", stats, self.version, self.env_steps, self.policy_id))
        if time.time() - self.last_save > self.cfg.save_every_sec:
            self.save()
        LAPS.lap("report")
        LAPS.batch_done(self.trajs_per_batch * self.cfg.rollout, self.policy_id)

    def train_sync(self, experience) -> None:
        """hts/ppo: one batch k = one rollout interval of every env (see the module docstring). No population updates:
        these modes train one policy (sf.cfg refuses --num_policies > 1 with them), whose hyperparameters are the
        configuration's (forced onto a loaded optimizer state in _load_checkpoint)."""
        k = self.sync_batch
        if k == 0:
            self.published[0] = self.version  # the initial (or resumed) weights, published at start
        if self.sync == "hts":
            behaviour = max(k - 1, 0)  # interval k ran on the weights trained on batches 0..k-2
            if k > 0:
                self._publish(self.version)  # trained on batches 0..k-1: interval k+1's weights
                self.published[k] = self.version
            self.state.set_sync_ready(k + 1)
        else:
            behaviour = k
        versions = experience["policy_versions"]
        lo, hi = int(versions.min()), int(versions.max())
        if lo != hi or lo != self.published[behaviour]:  # the mode's guarantee, checked on the data itself
            raise RuntimeError(f"--sync_mode {self.sync}: batch {k} holds samples of policy versions {lo}..{hi}, "
                               f"expected only {self.published[behaviour]}")
        stats = self.appo.train(experience, self.version, on_sgd_step=self._on_sgd_step,
                                env_frames=self.env_steps * self.world.world_size)
        for s in stats:
            s["policy_lag_batches"] = float(k - behaviour)
        if self.sync == "ppo":
            self._publish(self.version)
            self.published[k + 1] = self.version
            self.state.set_sync_ready(k + 1)
        self.published.pop(behaviour - 1, None)
        self.sync_batch = k + 1
        self._trained(stats)
        if self.env_steps >= self.cfg.train_for_env_steps:  # end at this batch boundary, whoever notices first
            self.budget_done = True

    def run_once(self, timeout: float = 0.0) -> bool:
        """Serial mode: collect without a thread and train when a batch is complete."""
        if self.budget_done:
            return False
        experience = self.collect(timeout)
        if experience is None:
            return False
        self.train(experience)
        return True

    def run_sync(self) -> None:
        """hts/ppo in process mode: batches in interval order, no batcher thread (nothing to overlap with)."""
        from sf.processes.control import runner_alive
        self.state.set_started(self.heartbeat)
        while not self.state.stopping() and runner_alive() and not self.budget_done:
            self.state.beat(self.heartbeat)
            self.run_once(timeout=0.1)
        self.finish()

    def run(self) -> None:
        """Process mode: batcher thread + training loop until the runner asks to stop; then the final save."""
        if self.sync:
            return self.run_sync()
        batches: queue.Queue = queue.Queue(maxsize=1)
        self.batches = batches
        stop = threading.Event()

        def batcher():
            while not stop.is_set():
                if batches.full():  # copy a batch out only when the trainer has room for it: fresher experience
                    time.sleep(0.005)
                    continue
                exp = self.collect(timeout=0.1)
                while exp is not None and not stop.is_set():
                    try:
                        batches.put(exp, timeout=0.1)
                        break
                    except queue.Full:
                        pass

        thread = device_thread(batcher, self.device, "batcher")  # (its gathers copy to the device on a side stream)
        thread.start()
        self.state.set_started(self.heartbeat)
        from sf.processes.control import runner_alive
        try:
            while True:
                stopping = self.state.stopping() or not runner_alive()
                if stopping and not self.world.distributed:
                    break
                self.state.beat(self.heartbeat)
                if self.population:  # also while no batch comes: a copy is visible to the actors at once
                    self.apply_population_updates()
                try:
                    experience = batches.get(timeout=0.1)
                except queue.Empty:
                    experience = None
                LAPS.lap("wait_batch")
                if self.world.distributed:
                    if experience is None and not stopping:
                        continue
                    if not self._ranks_go_on(stopping):  # every rank stops at this batch boundary
                        break
                if experience is not None:
                    self.train(experience)
        except distributed.DistributedError:
            self.save(final=True)  # rank 0: the weights of the last step every rank made
            raise
        finally:
            stop.set()
            thread.join(timeout=5)
        self.finish()

    def _ranks_go_on(self, stopping: bool) -> bool:
        """Data-parallel: before a training batch (or at a stop request), the ranks learn whether any of them stops,
        and their summed frame counters (the run's totals, which the runner reports and budgets on)."""
        collected = int(self.state.worker_frames.sum())
        stops, trained, collected = distributed.agree([int(stopping), self.env_steps, collected])
        self.state.beat(self.heartbeat)  # the wait for a slow peer ended: the next beat's wait starts from here
        self.state.world_frames[:] = torch.tensor([trained, collected], dtype=torch.float64)  # (exact below 2^53)
        return stops == 0

    def finish(self) -> None:
        if self.population:  # the runner's last decisions: in force in the final checkpoint too
            self.apply_population_updates(last=True)
        self.save(final=True)
        LAPS.write(self.policy_id)
        self.queues.report.put(("final_weights", weights_sha256(self.model), self.version, self.env_steps,
                                self.policy_id))
        self.state.learner[self.policy_id, FINISHED] = 1.0


def learner_threads(cfg) -> int:
    """--learner_torch_threads, or by default: half the cores (a population's learners: an equal share of that) in the
    modes where collection runs beside training (async, hts; in hts a number independent of the worker layout, so that
    every layout computes the same bits), every core in ppo mode (the actors wait while the learner trains).
    Why not every core beside the workers: an OpenMP thread of the learner that a worker preempts holds up its siblings
    at every barrier while they spin (measured on 2 cores, doom_battle 2 workers x 8 envs: 1 learner thread trained
    1.33x the frames/s of 2)."""
    cores = usable_cores()  # this rank's share of the machine (torchrun: sf.train sets it)
    if cfg.learner_torch_threads:
        return cfg.learner_torch_threads
    mode = getattr(cfg, "sync_mode", "async")
    if mode == "ppo":
        return cores
    if mode == "hts":
        return max(1, cores // 2)
    return max(1, cores // 2 // getattr(cfg, "num_policies", 1))  # a population's learners share the cores


def run_learner(cfg, obs_space, action_space, buffers, queues, shared_weights, shared_state, device, exp_dir,
                frameskip, num_agents=1, policy_id=0, all_weights=None, replacement=False) -> None:
    """Process entry: normal priority; uses the cores the (niced) rollout workers leave idle (a population's learners
    share them). Its data-parallel rank comes from torchrun's environment (inherited through the fork server)."""
    from sf.processes.control import bind_device, limit_threads
    bind_device(device)
    limit_threads(learner_threads(cfg))
    learner = Learner(cfg, obs_space, action_space, buffers, queues, shared_weights, shared_state, device, exp_dir,
                      frameskip, num_agents, policy_id, all_weights, replacement, distributed.world_from_env())
    learner.run()
