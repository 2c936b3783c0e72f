"""Runner: the run's lifecycle, in the order of the data flow. Pre-flight (sf/runner/startup/preflight.py) checks
everything before anything is written; build() allocates what the processes share (trajectory buffers, weights,
counters, queues) once; start_processes() starts every process; supervise() watches them until the budget, a signal or
a failure; stop_processes() stops them (always with a final checkpoint from the learner).

    rollout workers --(w, group)--> policy queue [p] --> policy workers of p --group--> worker queues
    rollout workers --slot--> learner queue [p] --> learner p --slot--> free queue --> rollout workers
    everyone --(kind, ...)--> report queue --> runner (episodes, train stats, checkpoints, errors)

With one policy (the default) there is one of each; a population (--num_policies N) has a learner, policy workers,
request queue, learner queue and weights per policy, and the rollout workers route each agent by its policy.

Supervision: the runner's step (reports, frames, population, console and TensorBoard) is the same in serial mode
(sf/runner/serial.py: every component in this process); the stall watchdog is sf/runner/health/watchdog.py.
Self-healing (--max_restarts_per_hour, asynchronous mode): a process that dies (a signal, an exception, or a stall the
watchdog ends) is replaced in place by one of the same name, index and core while the others go on
(sf/runner/health/healing.py makes whole what it left); errors a replacement could not mend (a checkpoint that cannot
be written, an env failing more than --max_env_restarts times) and deaths before the run started training stop the run,
as does a crash loop. Those judgments are ProcessHealth's (sf/runner/health/deaths.py, a base of Runner); the console's
lines are sf/runner/run_log.py's; train.py's body, which makes a Runner, is sf/runner/startup/entry.py.
"""
from __future__ import annotations

import functools
import logging
import os
import signal
import time
import traceback
from typing import TYPE_CHECKING

import psutil
import torch

from sf.buffers.shared_weights import SharedWeights
from sf.buffers.trajectory_buffers import TrajectoryBuffers
from sf.cfg import ConfigError, RunError, experiment_dir, resolve_device
from sf.cfg.context import RunContext
from sf.cfg.shape import RunShape
from sf.learning.appo import exploration_loss_problem
from sf.learning.learner import checkpoint_meta, run_learner
from sf.model.action_spaces import check_action_mask
from sf.model.actor_critic import create_actor_critic
from sf.processes import ranks
from sf.processes.control import add_leftover_hook, become_subreaper, bind_device, kill_tree
from sf.processes.fds import MAX_FDS_SENT, fds_sent
from sf.processes.shared_state import SharedState, learner_name, policy_worker_name
from sf.runner import run_log, tracking
from sf.runner.health.deaths import ProcessHealth
from sf.runner.health.healing import audit_slots, memory_mib
from sf.runner.health.stopping import sigterm_deadline, stop_processes, time_left_to_exit
from sf.runner.population.control import PopulationControl, fill_shared, initial_hyperparams, record
from sf.runner.population.link import PopulationLink
from sf.runner.queues import close_queues, learner_queues, make_queues, policy_queues, worker_queues
from sf.runner.serial import run_serial
from sf.runner.startup.experiment_lock import ExperimentLock, run_holding
from sf.runner.startup.preflight import check_checkpoint, check_memory, probe_env
from sf.runner.startup.supervision import child_args, child_main, kill_adopted, worker_context
from sf.runner.stats import RunStats
from sf.sampling.policy_worker import run_policy_worker
from sf.sampling.rollout_worker import run_rollout_worker
from sf_envs.registry import env_spec, process_leftover_files

if TYPE_CHECKING:
    from sf.cfg.config import Config

log = logging.getLogger("sf")


class Runner(ProcessHealth):
    """A run's lifecycle (run()): the checks (__init__: check_policies), the shared memory (build: shared_weights), the
    processes (start_processes: start_learners; start_tracking), their supervision until the budget (supervise:
    budget_reached, step), their stop (stop_processes), then finish() and conclude() (the exit code). Those hooks are
    what a kind of run fills in: training here, sf.eval's evaluation in sf/runner/evaluator.py."""
    stopping_note = "stopping (final checkpoint)"  # the console line of a first Ctrl-C / SIGTERM
    poll_sec = 0.1  # the supervision loop's period

    def __init__(self, cfg: Config, world: ranks.World | None = None):
        """Checks only (sf/runner/startup/preflight.py): the env runs, then check_policies (the model fits the
        checkpoint to resume, the run fits in memory). Nothing is written or allocated here (build() does that when the
        run starts). world: torchrun's ranks (one by default)."""
        self.cfg, self.exp_dir = cfg, experiment_dir(cfg)
        self.world = world or ranks.World()
        add_leftover_hook(process_leftover_files)  # what the engines of killed workers leave in /dev/shm
        self.device = resolve_device(cfg)
        # (probe_env first: an env that cannot run here, or an engine that cannot step it, is its one-line error)
        self.obs_space, self.action_space, env_bytes, self.env_modules, self.shaping = probe_env(cfg)
        self.spec = env_spec(cfg.env, cfg)
        self.num_policies = cfg.num_policies
        # the policies that play here (learners, policy workers): all, or this rank's (torchrun: p on rank p mod size)
        self.policies = self.world.policies(self.num_policies)
        self.data_parallel = self.world.data_parallel(self.num_policies)
        # the experiment's lock (rank 0; run_training takes it): its learners hold it too
        self.lock: ExperimentLock | None = None
        self.check_policies(env_bytes)
        # what every process is told about the run at its start (sf/cfg/context.py)
        self.run_context = RunContext(cfg, self.shape, self.world, tuple(self.policies), self.obs_space,
                                      self.action_space, self.device, self.exp_dir, self.spec.frameskip)

    def check_policies(self, env_bytes: int) -> None:
        """The checks once the env is known (env_bytes: the memory one env takes): the exploration loss and the action
        mask fit its action space, the model fits the checkpoint to resume, the run fits in memory; PBT's state."""
        cfg = self.cfg
        problem = exploration_loss_problem(cfg, self.action_space)  # (the action space is known from here on)
        if problem:
            raise ConfigError(problem)
        try:  # an env's "action_mask" that cannot mask its actions: one line, before anything is written
            check_action_mask(self.obs_space, self.action_space)
        except ValueError as e:
            raise ConfigError(f"env {cfg.env}: {e}") from None
        with torch.device("meta"):  # shapes only: a model of absurd size is refused below before it is allocated
            model = create_actor_critic(cfg, self.obs_space, self.action_space)
        self.meta = checkpoint_meta(cfg, self.obs_space, self.action_space, model)
        self.shape = RunShape.of(cfg, self.spec.num_agents)  # the run's sizes, computed once, handed down
        # the runner's CUDA work (the GPU's memory below, the shared weights) on the run's GPU (a rank >= 1: not GPU 0)
        bind_device(self.device)
        self._check_memory(model, env_bytes, self.device, self.shape.trajs_per_batch, self.obs_space,
                           model.rnn_state_size)
        # each policy's checkpoint: (version, frames)
        self.resumed: list[tuple[int, int]] = check_checkpoint(cfg, self.exp_dir, self.meta, self.world)
        # PBT's state: a resumed run's pbt_state.json is read (and checked) here, written only once the run started
        # (under torchrun rank 0's decides for every rank's policies: sf/runner/population/link.py)
        self.population = (PopulationControl(cfg, self.exp_dir, self.shaping)
                           if cfg.with_pbt and self.num_policies > 1 and self.world.rank == 0 else None)

    def _check_memory(self, model, env_bytes: int, *gpu) -> None:
        """buffer_bytes (the shape's slots, `model`'s recurrent state); a run that does not fit in this machine's memory
        refused (check_memory; gpu: its device, batch_trajs, obs_space, rnn_state_size: a learner's batch on a GPU)."""
        self.rnn_state_size = model.rnn_state_size
        self.buffer_bytes = TrajectoryBuffers.bytes_needed(self.shape.slots, self.cfg.rollout, self.obs_space,
                                                           self.action_space, self.rnn_state_size)
        model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        check_memory(self.cfg, self.buffer_bytes, model_bytes, env_bytes, *gpu)

    # --- build ---
    def build(self) -> None:
        """Allocate what every process shares (_build_shared); the statistics, the supervisor's bookkeeping."""
        hyper = self._build_shared()
        self.stats = RunStats(self.exp_dir, self.cfg.stats_avg, self.spec.frameskip, mode=self.cfg.mode,
                              num_policies=self.num_policies, resumed=self.resumed)
        self.stats.enabled = self.world.rank == 0 or not self.data_parallel  # data-parallel: rank 0 writes TensorBoard
        if self.world.distributed and not self.data_parallel:  # each rank its policies' (a shared directory: no clash)
            self.stats.shown, self.stats.file_suffix = self.policies, f".rank{self.world.rank}"
        # data-parallel: (time, collected frames of all ranks) at the last report
        self.world_report = (time.time(), 0.0)
        if self.cfg.with_pbt and self.num_policies > 1:
            record(self.stats, hyper)
        self._build_supervision()
        run_log.log_layout(self)

    def _build_shared(self) -> list[dict]:
        """What every process shares: trajectory buffers, weights, counters, queues; the hyperparameters (returned)."""
        cfg, P = self.cfg, self.num_policies
        self.buffers = TrajectoryBuffers(self.shape.slots, cfg.rollout, self.obs_space, self.action_space,
                                         self.rnn_state_size)
        self.weights = self.shared_weights()
        self.state = SharedState(cfg.num_workers, cfg.policy_workers_per_policy, P, tuple(self.shaping),
                                 self.shape.slots)
        # [W, agents per worker, (slot, t, policy)]
        self.env_slots = torch.zeros((cfg.num_workers, self.shape.agents_per_worker, 3),
                                     dtype=torch.int64).share_memory_()
        self.queues = make_queues(cfg, P, self.shape)
        hyper = self.population.hyperparams() if self.population else [initial_hyperparams(cfg, self.shaping)] * P
        fill_shared(self.state, hyper)
        self.pbt_link = (PopulationLink(self.world, P, self.weights, functools.partial(  # (PBT across torchrun's ranks)
            create_actor_critic, cfg, self.obs_space, self.action_space), cfg.distributed_timeout_sec, self.state,
            self.population) if cfg.with_pbt and self.world.distributed else None)
        return self.pbt_link.hyper or hyper if self.pbt_link else hyper

    def shared_weights(self) -> list[SharedWeights]:
        """Each policy's weights in shared memory (its learner publishes them)."""
        return [SharedWeights(create_actor_critic(self.cfg, self.obs_space, self.action_space), self.device)
                for _ in range(self.num_policies)]

    # --- start ---
    def _start(self, name: str, target, *args, unwind: bool = False) -> None:
        """Start process `name` from the fork server. A start the system refuses (the fork server's limit on file
        descriptors, no memory or process slot left for a fork, the fork server gone) raises RunError, one line; run()
        then stops what was started."""
        args = child_args(name, self.queues.report, os.getpid(), unwind, target, *args)
        p = self.context.Process(target=child_main, args=args, name=name, daemon=False)
        self.state.set_started(self.state.heartbeat_slot(name), False)  # its start-up counts toward a (longer) stall
        try:
            p.start()
        except (OSError, ValueError, EOFError) as e:  # EOFError: the fork server died (its fork failed)
            fds = fds_sent(args)
            cause = (f"its arguments carry {fds} file descriptors, the fork server passes at most {MAX_FDS_SENT}"
                     if fds > MAX_FDS_SENT else str(e) or type(e).__name__)
            raise RunError(f"cannot start {name}: {cause}") from None
        self.procs[name] = p
        log.info("Started %s (pid %d)", name, p.pid)

    def start_processes(self, context=None) -> None:
        """Start the learners, the policy workers, the rollout workers; from `context`, a multiprocessing context
        (default: the fork server's, worker_context)."""
        self.context = context or worker_context(self.env_modules)
        # the fork server and multiprocessing's helpers
        self.own_children = {c.pid for c in psutil.Process().children()}
        self.start_learners()
        for p in self.policies:
            for i in range(self.cfg.policy_workers_per_policy):
                self._start_policy_worker(p, i)
        for w in range(self.cfg.num_workers):  # they make their envs while the learner loads: start-up runs in parallel
            self._start_rollout_worker(w)

    def start_learners(self) -> None:
        for p in self.policies:
            self._start_learner(p)

    def _start_learner(self, p: int, replacement: bool = False) -> str:
        name = learner_name(p, self.num_policies)
        # the learner writes the checkpoints: it holds the experiment's lock too (its descriptor, passed on), so the
        # lock outlives a killed runner until the learner is gone as well
        self._start(name, run_holding, self.lock, run_learner, self.run_context, self.buffers,
                    learner_queues(self.queues, p), self.weights[p], self.state, p, self.weights, replacement)
        return name

    def _start_policy_worker(self, p: int, i: int) -> str:
        name = policy_worker_name(p, i, self.num_policies)
        self._start(name, run_policy_worker, self.run_context, i, self.buffers, self.env_slots,
                    policy_queues(self.queues, p), self.weights[p], self.state, p)
        return name

    def _start_rollout_worker(self, w: int) -> str:
        name = f"rollout_worker_{w}"
        self._start(name, run_rollout_worker, self.run_context, w, self.buffers, self.env_slots,
                    worker_queues(self.queues, w), self.state, w, unwind=True)
        return name

    # --- run ---
    def run(self) -> int:
        """The run, in the order of the data flow (docs/architecture.md): build() allocates what the stages share
        (trajectory buffers, weights, queues); start_processes() starts the learner (batches -> weights), the policy
        workers (observations -> actions) and the rollout workers (actions -> env steps -> trajectories); supervise()
        watches them until the budget, a signal or a failure; stop_processes() ends them, the learner's final
        checkpoint first. Returns the exit code."""
        old = self._begin()
        start = time.time()
        try:
            self.start_tracking()
            if self.cfg.mode.serial:
                try:
                    run_serial(self, start)
                except Exception:  # noqa: B902 — reported like a crashed process
                    self._crashed("serial run", traceback.format_exc())
            else:
                self._run_processes(start)
        finally:
            for s, h in old.items():
                # once a stop was asked, a repeated SIGTERM (a batch system's, or timeout(1)'s second one) that comes
                # after the run stopped in order must not kill the process on its way out (exit code -15)
                signal.signal(s, signal.SIG_IGN if s == signal.SIGTERM and self.stop_requests.count else h)
            self.finish(start)
        return self.conclude(start)

    def start_tracking(self) -> None:
        """W&B (--with_wandb), before the processes."""
        if self.stats.enabled:
            self.stats.tracker = tracking.start(self.cfg, self.exp_dir)

    def conclude(self, start: float) -> int:
        """The Done line; the exit code."""
        run_log.log_done(self, start)
        return self.exit_code

    def _begin(self) -> dict:
        """build() (a failure: one line); then SIGINT and SIGTERM go to _on_signal (returns their former handlers)."""
        try:
            self.build()
        except (OSError, RuntimeError) as e:  # /dev/shm or memory exhausted by something else meanwhile
            raise RunError(f"cannot allocate the run's shared memory: {e}") from None
        return {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def _run_processes(self, start: float) -> None:
        """start_processes(), supervise(); then, whatever happened (a bug of the runner's own too), stop_processes()."""
        become_subreaper()
        try:
            self.start_processes()
            self.supervise(start)
        finally:
            self.stop_processes()
            kill_adopted(self.own_children)  # engines of a worker that died without closing them

    def finish(self, start: float) -> None:
        """After the processes ended: the last reports and report line, the faults, the slot audit, PBT's state, the
        last summaries; the statistics and queues closed."""
        self.reports.drain()
        self._update_frames()
        run_log.log_progress(self, start)  # a final report line, however short the run
        if self.healing:
            log.info("Faults: %s", self.healer.summary())
        if self.cfg.mode.frees_slots and not self.cfg.mode.serial:
            self._audit_slots()
        if self.population is not None:
            self.population.save()
        self.stats.write_summaries()
        self.stats.close(time_left_to_exit(self.sigterm_at, self.cfg.sigterm_grace_sec, cap=5.0))
        if self.stats.tracker is not None:
            self.stats.tracker.finish(self.exit_code)
        self.close_queues()

    # --- supervise ---
    def supervise(self, start: float) -> None:
        """The runner's loop while the processes work: reports, deaths, stalls, budget, then the supervision step."""
        self.last_report = self.last_summary = start
        while not self.state.stopping():
            self.reports.drain()
            # the budget first: in hts/ppo the learner ends the run itself at the batch reaching it, and exits
            if self.budget_reached(start) or not self._check_processes() or not self._check_stalls():
                break
            self.step(start)
            time.sleep(self.poll_sec)

    def step(self, start: float) -> None:
        """The runner's periodic work once the reports are read, in the parallel loop and in serial mode alike: frames,
        the population's step, the report line (every --report_interval_sec) and TensorBoard's summaries (every
        --experiment_summaries_interval; last_report and last_summary: when they were last written)."""
        if not self.learner_ready and all(self.weights[p].version >= 0 for p in self.policies):
            self.learner_ready = True  # frames count from where the checkpoint left them (no jump in the FPS)
            self.stats.start_frames = sum(self.state.policy_env_steps())
        if self.learner_ready:
            self._update_frames()
        if self.pbt_link is not None:  # (population-based training across torchrun's ranks)
            self.pbt_link.step(self.state, self.stats, self.population)
        elif self.population is not None:
            self.population.step(self.state, self.stats)
        now = time.time()
        if now - self.last_report >= self.cfg.report_interval_sec:
            self._update_memory()
            run_log.log_progress(self, start)
            self.last_report = now
        if now - self.last_summary >= self.cfg.experiment_summaries_interval:
            self.stats.write_summaries()
            self.last_summary = now

    def trained_frames(self) -> int:
        """Env frames every policy has trained on (the least of them: the frame budget holds for each policy); in a
        data-parallel run, all ranks together (the budget is the run's); a population under torchrun: this rank's
        policies."""
        if self.data_parallel:
            return int(self.state.world_frames[0])
        trained = self.state.policy_env_steps()
        return min(trained[p] for p in self.policies)

    def budget_reached(self, start: float) -> bool:
        return (self.trained_frames() >= self.cfg.train_for_env_steps
                or time.time() - start >= self.cfg.train_for_seconds)

    def _update_memory(self) -> None:
        self.stats.memory = memory_mib(self.procs)

    def _update_frames(self) -> None:
        self.stats.add_frames(int(self.state.worker_frames.sum()))

    @property
    def interrupts(self) -> int:
        """Stop requests received so far (a signal repeated at once counts once: StopRequests)."""
        return self.stop_requests.count

    def _on_signal(self, signum, frame) -> None:
        if signum == signal.SIGTERM and self.sigterm_at is None:  # a scheduler's: its SIGKILL follows after a grace
            self.sigterm_at = time.monotonic()                     # period, the stop's deadline (a repeat included)
        if not self.stop_requests.receive(signum):  # the same request again (timeout: to the process and its group)
            return
        if self.interrupts > 1:  # second Ctrl-C: exit at once
            for p in self.procs.values():
                if p.is_alive():
                    kill_tree(p)
            os._exit(130)
        log.info("%s received: %s; press Ctrl-C again to exit at once", signal.Signals(signum).name, self.stopping_note)
        self.state.request_stop()

    # --- stop ---
    def stop_processes(self) -> None:
        """Ask everyone to stop; wait for each learner's final checkpoint while it progresses, the others a bounded
        time; after a SIGTERM, everything within --sigterm_grace_sec (sf/runner/health/stopping.py)."""
        learners = {learner_name(p, self.num_policies): p for p in self.policies}
        if stop_processes(self.procs, self.state, learners, self.reports.drain, self.watchdog.stuck_in_stop,
                          lambda: sigterm_deadline(self.sigterm_at, self.cfg.sigterm_grace_sec)):
            self.exit_code = 1  # a learner killed before its final checkpoint: the Done line names the one kept

    def _audit_slots(self) -> None:
        if any(p.is_alive() for p in self.procs.values()):
            return  # a process that could not be killed (uninterruptible I/O): the queues are not ours to read
        verdict = audit_slots(self.state, self.queues, self.shape.slots)
        (log.info if verdict.endswith("exactly once") else log.warning)("%s", verdict)

    def close_queues(self) -> None:
        close_queues(self.queues)
