"""Learner process (one per policy): batches -> APPO SGD steps -> weights published for the actors.

Its batcher takes finished trajectories off the policy's queue and copies training batches out of shared memory
(sf/learning/batcher.py). The learner owns its process loop (`run`); its batch schedule, chosen once from --sync_mode,
answers at each batch boundary: what a batch is, when the actors get new weights, whether the budget ends the run
(sf/learning/batch_schedule.py: async, hts, ppo).

The learner owns the model and optimizer, so it also writes the checkpoints (periodic, best, final).

Populations (--num_policies N): one learner per policy, each with its own queue, weights, counters (row `policy_id` of
SharedState.learner) and checkpoint_p{policy_id}. A slot may hold steps another policy acted (an agent changed policy at
an episode start inside the trajectory): they are masked out of the loss (policy_ids != policy_id). Before each training
batch the learner applies its policy's hyperparameters from SharedState.hyperparams and, when population-based training
asks it (SharedState.copy_requests, replace_from), copies another policy's published weights (its Adam moments are
reset: they were estimated for other weights); its version goes on counting up, so policy workers pick the copy up at
once. A copy whose source cannot be read whole is retried for PBT_COPY_WAIT_SEC, then abandoned with a warning
(apply_population_updates). Which hyperparameters are in force after a resume: sf/runner/population/control.py.

Self-healing: a learner that died is replaced (`replacement=True`). The replacement takes the weights of the last SGD
step its predecessor published (shared memory outlives it; the checkpoint's when the predecessor died writing them), the
optimizer state and random streams of the latest checkpoint, the frames trained from SharedState, and goes on numbering
versions above every version published so far (policy lag stays meaningful). Every slot it takes from its queue is
marked held in SharedState.slot_owner until it returns it to the free list: the runner queues a dead learner's held
slots again for its replacement. A batch copied out has left shared memory (its slots are free): the batches a dead
learner copied out and had not finished training (one training, one waiting: at most two) are lost, and counted
(SharedState.released - frames trained).

Data-parallel learners (torchrun, sf/learning/collectives.py): the learners of all ranks form one process group. At
start rank 0's weights are broadcast (a resumed run: every rank loaded the same checkpoint, checked exactly); every SGD
step averages the gradients over the ranks (APPO's grad_hook) and every normalizer update merges every rank's batch
moments, so every rank holds the same weights and statistics at every moment, whether or not a step ran; before each
training batch the learners agree (one small all-reduce) whether to go on and sum their frame counters, so they train
the same number of batches and stop at the same boundary. Only rank 0 writes: checkpoints, and files that fail
verification moved to rejected/ (the other ranks read the directory only). A collective that fails (a peer died) stops
the run, with a checkpoint from rank 0.
"""
from __future__ import annotations

import collections
import copy
import functools
import logging
import math
import time
from typing import TYPE_CHECKING

import torch

from sf.cfg.context import RunContext
from sf.cfg.shape import RunShape
from sf.learning import collectives
from sf.learning.appo import APPO, cfg_hyperparams
from sf.learning.batch_schedule import Boundary, schedule_class
from sf.learning.batcher import Batcher
from sf.learning.checkpoint import (check_compatible, load_into, make_checkpoint_state, model_signature,
                                    restore_rng_states, weights_sha256)
from sf.learning.checkpoint_store import CheckpointManager
from sf.learning.phase_timing import LAPS  # SF_PROFILE: phase times (benchmarks/profile_training.py)
from sf.model.actor_critic import create_actor_critic, run_precision
from sf.processes import ranks
from sf.processes.control import runner_alive, usable_cores
from sf.processes.pause_points import PAUSE_AT, pause
from sf.processes.shared_state import (COPIES_HANDLED, COPIES_REQUESTED, ENV_STEPS, FINISHED, HYPERPARAMS, VERSION,
                                      learner_name, shared_hyperparams)
from sf.processes.slot_ledger import SlotLedger
from sf.seeding import MODEL, deterministic_kernels, run_seed, stream_seed

if TYPE_CHECKING:
    from sf.cfg.config import Config

log = logging.getLogger("sf.learner")
# PBT weight copy from a source that has not published yet or is being written (its learner died writing): retried
# before each training batch and in the idle loop for this long, then abandoned (a publish takes well under a ms)
PBT_COPY_WAIT_SEC = 5.0


def checkpoint_meta(cfg: Config, obs_space, action_space, model) -> dict:
    """What a checkpoint must match to be loaded into this run (one-line error otherwise)."""
    return {"env": cfg.env, "observation_space": str(obs_space), "action_space": str(action_space),
            "model": model_signature(model), "model_options": model_options(cfg)}


# Model options added after checkpoints began to record model_options, each with the value that builds the model those
# checkpoints hold: recorded only when a run's value differs from it, so an older checkpoint (without the key) matches.
# (The initialization options are not model options: they pick starting weights that a checkpoint's replace.)
LATER_MODEL_OPTIONS = {"rnn_num_layers": 1, "actor_critic_share_weights": True, "adaptive_stddev": True,
                       "continuous_tanh_scale": 0.0, "obs_scale": 255.0, "obs_subtract_mean": 0.0}


def model_options(cfg: Config) -> dict:
    """The model settings that change what the weights compute without changing their shapes (the signature cannot
    tell them apart), and those that change its structure: resuming or watching with another would run the weights
    through another function (or fail on their names)."""
    options = {"nonlinearity": cfg.nonlinearity}
    options.update({k: getattr(cfg, k) for k, before in LATER_MODEL_OPTIONS.items() if getattr(cfg, k) != before})
    return options


class Learner:
    def __init__(self, cfg: Config, obs_space, action_space, buffers, queues, shared_weights, shared_state, device,
                 exp_dir, frameskip: int, shape: RunShape | None = None, policy_id: int = 0,
                 all_weights: list | None = None, replacement: bool = False, world: ranks.World | None = None):
        """frameskip: env frames per env step (the env's spec: the learner counts frames, it knows no env); shape: the
        run's sizes (sf/cfg/shape.py: agents, trajectories per batch), the runner's; None: those of a single-agent env.
        queues.learner: this policy's queue; all_weights: every policy's SharedWeights (PBT copies).
        replacement: this learner replaces one that died (see the module docstring). world: the data-parallel ranks
        (torchrun; default one rank)."""
        self.cfg, self.buffers, self.queues = cfg, buffers, queues
        self.policy_id, self.all_weights = policy_id, all_weights or [shared_weights]
        self.population, self.shape = cfg.num_policies > 1, shape or RunShape.of(cfg, agents_per_env=1)
        self.masks_steps = self.population or self.shape.agents_per_env > 1  # (see Batcher.collect)
        self.shared_weights, self.state, self.device = shared_weights, shared_state, torch.device(device)
        name = learner_name(policy_id, shared_state.num_policies)
        self.heartbeat = shared_state.heartbeat_slot(name)
        self.schedule = schedule_class(cfg)(self.shape)
        if cfg.mode.deterministic:  # (before the model is made)
            deterministic_kernels(self.device)
        torch.manual_seed(stream_seed(run_seed(cfg), MODEL, policy_id))  # initial weights
        self.model = create_actor_critic(cfg, obs_space, action_space).to(self.device)
        run_precision(cfg, self.model, self.device, cfg.mode.deterministic)
        if self.model.compute_dtype is not None and policy_id == 0:
            log.info("The observation encoder computes in bfloat16 "
                     "(--precision %s; float32 weights, RNN, heads and losses)", cfg.precision)
        self.world = world or ranks.World()
        # (a population under torchrun: this policy lives on this rank alone, its learner trains as on one machine)
        self.data_parallel = self.world.data_parallel(cfg.num_policies)
        grad_hook = None
        if self.data_parallel:
            collectives.init_learner_group(self.world, self.device, cfg.distributed_timeout_sec)
            collectives.abort_waits_on_stop(shared_state.stopping)  # (NCCL: a dead peer's collective never ends)
            grad_hook = collectives.GradientAllReduce(self.model.parameters())
            collectives.share_normalizer_statistics(self.model)  # the union batch's statistics on every rank
        self.grad_allreduce = grad_hook  # (its time, reported at the end: what the ranks' lockstep costs)
        self.appo = APPO(self.model, cfg, self.device, policy_id=policy_id, grad_hook=grad_hook,
                         frames_per_sample=frameskip * self.ranks_training,  # (the run's frames: linear decay)
                         shape=self.shape)
        self.meta = checkpoint_meta(cfg, obs_space, action_space, self.model)
        self.checkpoints = CheckpointManager(exp_dir, policy_id=policy_id, keep_checkpoints=cfg.keep_checkpoints,
                                             save_best_metric=cfg.save_best_metric,
                                             read_only=not self.writes,  # data-parallel: rank 0's directory
                                             # a save beats as its bytes go out: the runner waits for a final save
                                             # that moves, however slow the disk (sf/runner/health/stopping.py)
                                             progress=lambda: self.state.beat(self.heartbeat))
        self.frames_per_traj = cfg.rollout * frameskip
        self.trajs_per_batch = self.shape.trajs_per_batch
        self.version, self.env_steps = 0, 0
        self.budget_done = False  # the schedule ends the run at this batch boundary (hts/ppo: the budget reached)
        self.last_save = self.last_milestone = time.time()
        self.hyperparams = shared_hyperparams(cfg)
        self.copy_pending: tuple[int, float] | None = None  # PBT: (request number, time.monotonic() of its first try)
        self.copy_scratch: torch.nn.Module | None = None  # PBT: a copy lands here first (whole, or not at all)
        self.ledger = SlotLedger(shared_state, name, policy_id)  # (its moves of slots: the batcher's)
        self.batcher = Batcher(buffers, queues, self.ledger, self.device, policy_id, self.trajs_per_batch,
                               self.frames_per_traj, self.masks_steps, self.schedule, cfg.mode.frees_slots,
                               recycled=self._count_recycled if cfg.sampler_only else None,
                               copied=functools.partial(shared_state.batch_copied, policy_id))
        if replacement:
            self._take_over()
        elif self.data_parallel:
            self._join_ranks()
        else:
            self._load_checkpoint()
        self.state.learner[policy_id, ENV_STEPS] = self.env_steps
        self.ledger.start_released(self.env_steps)  # SharedState.released: none copied out and untrained yet
        # none out either (a predecessor's died with it): collection on
        self.state.batch_trained(policy_id, all_out=True)
        self.start_sha256 = weights_sha256(self.model)  # the final line says whether training changed them
        self.sgd_steps = self.skipped_steps = 0  # this process's optimizer steps, and those skipped (APPO.last_skipped)
        self.publish(self.version)

    @property
    def ranks_training(self) -> int:
        """Ranks whose samples train this policy's weights: all of them data-parallel, else this one."""
        return self.world.world_size if self.data_parallel else 1

    @property
    def writes(self) -> bool:
        """Whether this learner writes its policy's checkpoints: data-parallel, rank 0 alone; else always."""
        return not self.data_parallel or self.world.rank == 0

    # --- checkpoints ---
    def _load_checkpoint(self, always: bool = False) -> dict | None:
        """Resume from this policy's latest checkpoint on disk (--restart_behavior resume, or `always`); its state, or
        None when there is none."""
        if self.cfg.restart_behavior != "resume" and not always:
            return None
        state = self.checkpoints.load("latest", map_location=self.device)
        return None if state is None else self._resume_from(state)

    def _resume_from(self, state: dict) -> dict:
        """Take a checkpoint's state (weights, optimizer, schedules, random streams, counters); returns it."""
        check_compatible(state["meta"], self.meta, state.get("path", "latest checkpoint"))
        same_optimizer = self.appo.load_training_state(state)  # the learning-rate schedule's state, and its rate
        load_into(self.model, self.appo.optimizer if same_optimizer else None, state)
        if not same_optimizer:
            log.info("%s: optimizer state of --optimizer %s not loaded: this run uses --optimizer %s (fresh state)",
                     state.get("path", "latest checkpoint"), state.get("optimizer_kind", "adam"), self.cfg.optimizer)
        # the optimizer state brought the saving run's hyperparameters: this run's are in force
        # (sf/runner/population/control.py says which; a population's PBT values follow from SharedState before the
        # first batch)
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
        self.version = last + 1  # publish() below makes it the actors' version
        log.info("Replacement learner%s: weights of %s, optimizer state %s; policy version %d, %d env frames trained",
                 f" of policy {p}" if self.population else "",
                 f"the last SGD step (version {published})" if published >= 0 else
                 ("the latest checkpoint (the learner died writing its weights)" if state else "initialisation"),
                 f"of the latest checkpoint (version {int(state['policy_version'])})" if state else
                 "fresh (no checkpoint yet)",
                 self.version, self.env_steps)

    def _join_ranks(self) -> None:
        """Data-parallel: every rank starts from rank 0's checkpoint, sent through the process group (weights,
        optimizer, schedules, counters: a rank never reads another's files, so no shared filesystem is needed), then
        from rank 0's weights at the same version and trained frames (checked)."""
        state = self._load_checkpoint() if self.world.rank == 0 else None
        state = collectives.broadcast_object(state)
        if state is not None and self.world.rank > 0:
            self._resume_from(state)
        lo, hi = collectives.agree_range([self.version, self.env_steps])  # exact, whatever the magnitude
        if lo != hi:
            raise collectives.DistributedError(
                f"rank {self.world.rank} resumed from policy version {self.version} ({self.env_steps} env frames), the "
                f"ranks from versions {lo[0]}..{hi[0]} ({lo[1]}..{hi[1]} env frames)")
        collectives.broadcast_state(self.model)

    def save(self, final: bool = False) -> None:
        if not self.writes:  # data-parallel: rank 0 writes the checkpoints, every rank holds the same weights
            return
        saved = self.checkpoints.holds(self.version, self.env_steps)
        # nothing trained since it was written or loaded: nothing is rewritten, no best relabelled
        if saved is not None:
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
        metric, episodes = (float(self.state.best_metric[self.policy_id, 0]),
                            int(self.state.best_metric[self.policy_id, 1]))
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
            self.publish(self.version + 1)
            self.queues.report.put(("pbt_copied", p, source, copied, self.version))
        else:
            self.queues.report.put(("pbt_copy_abandoned", p, source, reason))
        self.state.copy_requests[p, COPIES_HANDLED] = requested
        self.copy_pending = None

    # --- weights ---
    def publish(self, version: int) -> None:
        self.version = version
        self.state.beat(self.heartbeat)  # after every SGD step: a long training batch is not a stall
        self.shared_weights.publish(self.model, version)
        self.state.learner[self.policy_id, VERSION] = version

    def _on_sgd_step(self, version: int) -> None:
        if PAUSE_AT and self.batcher.batch_waiting():  # (tests: two batches out of shared memory)
            pause("learner_two_batches_out")
        # (data-parallel: nothing to copy; the gradients were averaged and the normalizers merged every rank's moments)
        if self.schedule.publishes_each_sgd_step:
            self.publish(version)
        else:  # the actors' weights change at batch boundaries only
            self.version = version
            self.state.beat(self.heartbeat)

    def _cross(self, boundary: Boundary) -> None:
        """Do what the schedule said at a batch boundary."""
        if boundary.publish:
            self.publish(self.version)
        if boundary.release is not None:
            self.state.set_sync_ready(boundary.release)
        if boundary.collect:
            self.state.batch_trained(self.policy_id)

    # --- training ---
    def collect(self, timeout: float):
        """The batcher's next training batch (experience dict, storage layout, on the device) or None."""
        return self.batcher.collect(timeout)

    def _count_recycled(self, frames: int) -> None:
        """--sampler_only: frames of slots recycled untrained count as trained."""
        self.env_steps += frames
        self.state.learner[self.policy_id, ENV_STEPS] = self.env_steps

    def train(self, experience) -> None:
        """One training batch: the schedule's boundary before it, its SGD steps, the boundary after, the counters."""
        schedule = self.schedule
        if schedule.population_updates:
            self.apply_population_updates()
        self._cross(schedule.before_sgd(experience["policy_versions"], self.version))
        stats = self.sgd(experience)
        self._cross(schedule.after_sgd(stats, self.version))
        self.trained(stats)
        if schedule.ends_on_budget and self.env_steps >= self.cfg.train_for_env_steps:
            self.budget_done = True  # end at this batch boundary, whoever notices first

    def sgd(self, experience) -> list:
        """The SGD steps of one training batch; their stats."""
        return self.appo.train(experience, self.version, on_sgd_step=self._on_sgd_step,
                               env_frames=self.env_steps * self.ranks_training)

    def trained(self, stats: list) -> None:
        self.env_steps += self.trajs_per_batch * self.frames_per_traj
        self.state.learner[self.policy_id, ENV_STEPS] = self.env_steps
        skipped = self.appo.last_skipped
        self.sgd_steps, self.skipped_steps = self.sgd_steps + len(stats), self.skipped_steps + skipped
        self.queues.report.put(("train", stats, self.version, self.env_steps, self.policy_id, skipped))
        if time.time() - self.last_save > self.cfg.save_every_sec:
            self.save()
        LAPS.lap("report")
        LAPS.batch_done(self.trajs_per_batch * self.cfg.rollout, self.policy_id)

    def run_once(self, timeout: float = 0.0) -> bool:
        """Serial mode: collect without a thread and train when a batch is complete."""
        if self.budget_done:
            return False
        experience = self.collect(timeout)
        if experience is None:
            return False
        self.train(experience)
        return True

    def run(self) -> None:
        """Process mode: training batches until the runner asks to stop (or the schedule's budget is reached), then
        the final save. The batch comes from the batcher's thread when the schedule overlaps copying with training
        (async), else it is collected here. Data-parallel: the ranks agree at each batch boundary whether to go on."""
        threaded = self.schedule.batcher_thread
        if threaded:
            self.batcher.start_thread()
        self.state.set_started(self.heartbeat)
        try:
            while True:
                stopping = self.state.stopping() or not runner_alive() or self.budget_done
                if stopping and not self.data_parallel:
                    break
                self.state.beat(self.heartbeat)
                if self.population:  # also while no batch comes: a copy is visible to the actors at once
                    self.apply_population_updates()
                experience = self.batcher.next_batch(timeout=0.1) if threaded else self.collect(timeout=0.1)
                LAPS.lap("wait_batch")
                if self.data_parallel:
                    if experience is None and not stopping:
                        continue
                    if not self.ranks_go_on(stopping):  # every rank stops at this batch boundary
                        break
                if experience is not None:
                    self.train(experience)
        except collectives.DistributedError:
            self.save(final=True)  # rank 0: the weights of the last step every rank made
            raise
        finally:
            if threaded:
                self.batcher.stop_thread()
        self.finish()

    def ranks_go_on(self, stopping: bool) -> bool:
        """Data-parallel: before a training batch (or at a stop request), the ranks learn whether any of them stops,
        and their summed frame counters (the run's totals, which the runner reports and budgets on)."""
        collected = int(self.state.worker_frames.sum())
        stops, trained, collected = collectives.agree([int(stopping), self.env_steps, collected])
        self.state.beat(self.heartbeat)  # the wait for a slow peer ended: the next beat's wait starts from here
        self.state.world_frames[:] = torch.tensor([trained, collected], dtype=torch.float64)  # (exact below 2^53)
        return stops == 0

    def finish(self) -> None:
        """The final checkpoint (the runner waits for it while this learner beats: sf/runner/health/stopping.py), the
        final weights' digest, FINISHED."""
        self.state.beat(self.heartbeat)
        if PAUSE_AT:
            pause("learner_final_save")
        if self.population:  # the runner's last decisions: in force in the final checkpoint too
            self.apply_population_updates(last=True)
        self.save(final=True)
        LAPS.write(self.policy_id)
        hook = self.grad_allreduce
        if hook is not None and hook.calls:
            log.info("Gradient all-reduce: %d calls of %.0f KiB, %.1f ms each, %.1f s in all", hook.calls,
                     hook.nbytes / 1024, 1000 * hook.seconds_total / hook.calls, hook.seconds_total)
        self.queues.report.put(("final_weights", weights_sha256(self.model), self.version, self.env_steps,
                                self.policy_id, self.start_sha256, self.skipped_steps, self.sgd_steps))
        self.state.learner[self.policy_id, FINISHED] = 1.0


def learner_threads(cfg: Config) -> int:
    """--learner_torch_threads, or by default: half the cores (a population's learners: an equal share of that) in the
    modes where collection runs beside training (async, hts; in hts a number independent of the worker layout, so that
    every layout computes the same bits), every core in ppo mode (the actors wait while the learner trains).
    Why not every core beside the workers: an OpenMP thread of the learner that a worker preempts holds up its siblings
    at every barrier while they spin (measured on 2 cores, doom_battle 2 workers x 8 envs: 1 learner thread trained
    1.33x the frames/s of 2)."""
    cores = usable_cores()  # this rank's share of the machine (torchrun: sf.train sets it)
    if cfg.learner_torch_threads:
        return cfg.learner_torch_threads
    return schedule_class(cfg).torch_threads(cores, cfg)


def run_learner(run: RunContext, buffers, queues, shared_weights, shared_state, policy_id=0, all_weights=None,
                replacement=False) -> None:
    """Process entry: normal priority; uses the cores the (niced) rollout workers leave idle (a population's learners
    share them). run: the run's context (its configuration, shape, world, spaces, device: sf/cfg/context.py)."""
    from sf.processes.control import bind_device, limit_threads
    bind_device(run.device)
    limit_threads(learner_threads(run.cfg))
    learner = Learner(run.cfg, run.obs_space, run.action_space, buffers, queues, shared_weights, shared_state,
                      run.device, run.exp_dir, run.frameskip, run.shape, policy_id, all_weights, replacement, run.world)
    learner.run()
