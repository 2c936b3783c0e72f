"""Runner: the run's lifecycle, in the order of the data flow. Pre-flight (sf/runner/preflight.py) checks everything
before anything is written; build() allocates what the processes share (trajectory buffers, weights, counters, queues)
once; start_processes() starts every process; supervise() watches them until the budget, a signal or a failure;
stop_processes() stops them (always with a final checkpoint from the learner).

    rollout workers --(w, group)--> policy queue [p] --> policy workers of p --group--> worker queues
    rollout workers --slot--> learner queue [p] --> learner p --slot--> free queue --> rollout workers
    everyone --(kind, ...)--> report queue --> runner (episodes, train stats, checkpoints, errors)

With one policy (the default) there is one of each; a population (--num_policies N) has a learner, policy workers,
request queue, learner queue and weights per policy, and the rollout workers route each agent by its policy.

Supervision: the runner's step (reports, frames, population, console and TensorBoard) is the same in serial mode
(sf/runner/serial.py: every component in this process); the stall watchdog is sf/runner/watchdog.py.
Self-healing (--max_restarts_per_hour, asynchronous mode): a process that dies (a signal, an exception, or a stall the
watchdog ends) is replaced in place by one of the same name, index and core while the others go on (sf/runner/healing.py
makes whole what it left); errors a replacement could not mend (a checkpoint that cannot be written, an env failing
more than --max_env_restarts times) and deaths before the run started training stop the run, as does a crash loop.
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
from sf.cfg import ConfigError, RunError, experiment_dir, resolve_device, save_cfg
from sf.cfg.shape import RunShape
from sf.learning.appo import exploration_loss_problem
from sf.learning.learner import checkpoint_meta, run_learner
from sf.model.action_spaces import check_action_mask
from sf.model.actor_critic import create_actor_critic
from sf.processes import ranks
from sf.processes.control import StopRequests, add_leftover_hook, become_subreaper, bind_device, kill_tree
from sf.processes.fds import MAX_FDS_SENT, fds_sent
from sf.processes.shared_state import VERSION, SharedState, learner_name, policy_worker_name
from sf.runner import tracking
from sf.runner.experiment_lock import ExperimentLock, run_holding
from sf.runner.healing import Healer, audit_slots, exit_cause, memory_mib, process_kind
from sf.runner.population import PopulationControl, fill_shared, initial_hyperparams, record
from sf.runner.population_link import PopulationLink
from sf.runner.preflight import (already_trained, check_checkpoint, check_memory, data_parallel_world, follow_rank0,
                                 nothing_to_train, prepare_experiment_dir, probe_env, remove_leftovers,
                                 report_background_errors, setup_logging, telling_other_ranks)
from sf.runner.queues import close_queues, learner_queues, make_queues, policy_queues, worker_queues
from sf.runner.reports import ReportReader
from sf.runner.serial import run_serial
from sf.runner.stats import RunStats, format_duration, progress_bar
from sf.runner.stopping import checkpoint_note, sigterm_deadline, stop_processes
from sf.runner.supervision import TRACE_LOG, child_args, child_main, kill_adopted, worker_context
from sf.runner.watchdog import StallWatchdog
from sf.sampling.policy_worker import run_policy_worker
from sf.sampling.rollout_worker import run_rollout_worker
from sf_envs.registry import env_spec, process_leftover_files

if TYPE_CHECKING:
    from sf.cfg.config import Config

log = logging.getLogger("sf")


def run_training(cfg: Config) -> int:
    """train.py's body. Every check runs first (the env, the model, the checkpoint to resume, memory); then the
    experiment's lock is taken (another run of it: refused); only then is anything on disk touched: the experiment
    directory, config.json (atomically), the log, the run. A resumed experiment whose budget is reached already
    touches nothing at all."""
    early = setup_logging()  # the checks' warnings reach the console now and the log file once it exists
    report_background_errors()
    cfg, world = data_parallel_world(cfg)
    tracking.check(cfg)  # --with_wandb: wandb imports
    remove_leftovers()  # what killed runs left in /dev/shm (before the runner's memory check)
    if world.rank > 0:  # the experiment directory is rank 0's (a population: this rank's checkpoints; no log file)
        runner = Runner(cfg, world)
        logging.getLogger().removeHandler(early)
        code = follow_rank0(cfg, world, runner.resumed, runner.exp_dir)  # (its own files, else rank 0's verdict)
        return runner.run() if code is None else code
    with telling_other_ranks(world, cfg.distributed_timeout_sec):  # (whether the run starts; why not, if it fails)
        runner = Runner(cfg, world)
        # One run per experiment (sf/runner/experiment_lock.py): taken before anything of it is moved, deleted or
        # written, held until the run and its learners end; a second runner is refused in one line (exit code 2)
        runner.lock = ExperimentLock.acquire(cfg.train_dir, cfg.experiment)
        try:
            # (the checkpoints were read before the lock: a run that ended since only trained more)
            if already_trained(cfg, runner.resumed, world):
                return nothing_to_train(cfg, runner.resumed, world, runner.exp_dir)
            exp_dir = prepare_experiment_dir(cfg)
            save_cfg(cfg, exp_dir)
            try:
                setup_logging(exp_dir, early)
            except OSError as e:
                raise RunError(f"cannot write the log {exp_dir / 'sf_log.txt'}: {e.strerror or e}") from None
            ranks.publish_start(world, timeout_sec=cfg.distributed_timeout_sec)
            return runner.run()
        finally:  # (a process of the run that could not be killed still holds it: its file stays, locked)
            runner.lock.release(remove=not any(p.is_alive() for p in getattr(runner, "procs", {}).values()))


class Runner:
    stopping_note = "stopping (final checkpoint)"  # the console line of a first Ctrl-C / SIGTERM
    poll_sec = 0.1  # the supervision loop's period

    def __init__(self, cfg: Config, world: ranks.World | None = None):
        """Checks only (sf/runner/preflight.py): the env runs, then _check_policies (the model fits the checkpoint to
        resume, the run fits in memory). Nothing is written or allocated here (build() does that when the run starts).
        world: torchrun's ranks (one by default)."""
        self.cfg, self.exp_dir = cfg, experiment_dir(cfg)
        self.world = world or ranks.World()
        add_leftover_hook(process_leftover_files)  # what the engines of killed workers leave in /dev/shm
        self.device = resolve_device(cfg)
        self.spec = env_spec(cfg.env, cfg)
        self.obs_space, self.action_space, env_bytes, self.env_modules, self.shaping = probe_env(cfg)
        self.num_policies = cfg.num_policies
        # the policies that play here (learners, policy workers): all, or this rank's (torchrun: p on rank p mod size)
        self.policies = self.world.policies(self.num_policies)
        self.data_parallel = self.world.data_parallel(self.num_policies)
        # the experiment's lock (rank 0; run_training takes it): its learners hold it too
        self.lock: ExperimentLock | None = None
        self._check_policies(env_bytes)

    def _check_policies(self, env_bytes: int) -> None:
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
        # (under torchrun rank 0's decides for every rank's policies: sf/runner/population_link.py)
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
        self._log_layout()

    def _build_shared(self) -> list[dict]:
        """What every process shares: trajectory buffers, weights, counters, queues; the hyperparameters (returned)."""
        cfg, P = self.cfg, self.num_policies
        self.buffers = TrajectoryBuffers(self.shape.slots, cfg.rollout, self.obs_space, self.action_space,
                                         self.rnn_state_size)
        self.weights = self._shared_weights()
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

    def _shared_weights(self) -> list[SharedWeights]:
        """Each policy's weights in shared memory (its learner publishes them)."""
        return [SharedWeights(create_actor_critic(self.cfg, self.obs_space, self.action_space), self.device)
                for _ in range(self.num_policies)]

    def _build_supervision(self) -> None:
        """The supervisor's bookkeeping: processes, their reported deaths, the report reader, the stall watchdog, the
        healer."""
        cfg = self.cfg
        self.procs: dict[str, torch.multiprocessing.Process] = {}
        self.stack_files: dict[str, int] = {}  # process name -> descriptor of its stack-dump file (in that process)
        self.exit_code = 0
        self.stop_requests = StopRequests()  # SIGINT/SIGTERM requests counted (interrupts)
        self.sigterm_at: float | None = None  # time.monotonic() of the first SIGTERM: the stop fits its grace period
        self.reported: set[str] = set()  # processes whose death was already reported (one line each)
        self.causes: dict[str, str] = {}  # process -> how it failed (its exception, a stall), for its restart line
        self.reports = ReportReader(cfg, self.queues.report, self.stats, self.state, self.stack_files, self._crashed)
        self.watchdog = StallWatchdog(cfg, self.state, self.world, self.procs, self.stack_files, self.causes,
                                      self.reports.drain)
        self.healer = Healer(cfg, self.state, self.queues, self.spec.frameskip)
        self.healing = cfg.mode.heals
        if self.healing:
            self.stats.faults = self.healer.scalars()
        self.own_children: set[int] = set()
        self.learner_ready = False  # the learner loaded its checkpoint and published its first weights

    def _log_layout(self) -> None:
        """The run's first lines: the notes of the configuration, the experiment, the population, the mode."""
        cfg, P = self.cfg, self.num_policies
        for note in cfg._notes:
            log.info("%s", note)
        log.info("Experiment %s: env %s, device %s, %d rollout workers x %d envs, %d trajectory slots (%.0f MiB), "
                 "seed %d", self.exp_dir, cfg.env, self.device, cfg.num_workers, cfg.num_envs_per_worker,
                 self.shape.slots, self.buffer_bytes / 2**20, cfg.seed)
        playing = self.shape.agents  # agents in all, playing at once
        if P > 1 or self.shape.agents_per_env > 1:
            log.info("Population: %d policies (%s), %d agents per env (%d agents in all), policy mapping %s%s", P,
                     "population-based training" + (", resumed" if self.population and self.population.resumed else "")
                     if cfg.with_pbt else "independent", self.shape.agents_per_env, playing, cfg.policy_mapping,
                     f" (new draw every {cfg.policy_resample_episodes} episodes of an env)"
                     if cfg.policy_mapping != "fixed" and P > 1 else "")
        here = len(self.policies)  # (a population under torchrun: this rank's; its agents play only them)
        if here > playing:  # (--policy_mapping fixed is refused in preflight then)
            log.warning("Population: %d policies but %d agent(s) play at once: the others wait for a draw (each "
                        "rollout worker draws every policy once per %d draws, a draw every %d episodes of an env), "
                        "and the run ends when every policy has trained --train_for_env_steps", here, playing, here,
                        cfg.policy_resample_episodes)
        mode = cfg.mode.line.format(batch=self.shape.samples_per_batch,
                                    steps=cfg.mode.minibatches(cfg) * cfg.num_epochs)
        log.info("Mode: %s", mode)
        if self.stats.enabled:
            self.stats.writer.add_text("config/mode", mode)

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
        self._start_learners()
        for p in self.policies:
            for i in range(self.cfg.policy_workers_per_policy):
                self._start_policy_worker(p, i)
        for w in range(self.cfg.num_workers):  # they make their envs while the learner loads: start-up runs in parallel
            self._start_rollout_worker(w)

    def _start_learners(self) -> None:
        for p in self.policies:
            self._start_learner(p)

    def _start_learner(self, p: int, replacement: bool = False) -> str:
        name = learner_name(p, self.num_policies)
        # the learner writes the checkpoints: it holds the experiment's lock too (its descriptor, passed on), so the
        # lock outlives a killed runner until the learner is gone as well
        self._start(name, run_holding, self.lock, run_learner, self.cfg, self.obs_space, self.action_space,
                    self.buffers, learner_queues(self.queues, p), self.weights[p], self.state, self.device,
                    self.exp_dir, self.spec.frameskip, self.shape, p, self.weights, replacement)
        return name

    def _start_policy_worker(self, p: int, i: int) -> str:
        name = policy_worker_name(p, i, self.num_policies)
        self._start(name, run_policy_worker, self.cfg, i, self.obs_space, self.action_space, self.buffers,
                    self.env_slots, policy_queues(self.queues, p), self.weights[p], self.state, self.device, p,
                    self.shape)
        return name

    def _start_rollout_worker(self, w: int) -> str:
        name = f"rollout_worker_{w}"
        self._start(name, run_rollout_worker, self.cfg, w, self.buffers, self.env_slots, worker_queues(self.queues, w),
                    self.state, w, self.shape, unwind=True)
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
            if self.stats.enabled:  # W&B (--with_wandb); before the processes
                self.stats.tracker = tracking.start(self.cfg, self.exp_dir)
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
            self._finish(start)
        self._log_done(start)
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

    def _finish(self, start: float) -> None:
        """After the processes ended: the last reports and report line, the faults, the slot audit, PBT's state, the
        last summaries; the statistics and queues closed."""
        self.reports.drain()
        self._update_frames()
        self._log_progress(start)  # a final report line, however short the run
        if self.healing:
            log.info("Faults: %s", self.healer.summary())
        if self.cfg.mode.frees_slots and not self.cfg.mode.serial:
            self._audit_slots()
        if self.population is not None:
            self.population.save()
        self.stats.write_summaries()
        self.stats.close()
        if self.stats.tracker is not None:
            self.stats.tracker.finish(self.exit_code)
        self.close_queues()

    def _log_done(self, start: float) -> None:
        """The last line: the experiment's counters (a learner that never started leaves its checkpoint's), this run's
        time and rate, and the checkpoints on disk as they are (checkpoint_note: final, or the last one kept, or
        none)."""
        frames = sum(max(now, before) for now, (_, before) in zip(self.state.policy_env_steps(), self.resumed))
        versions = [max(p.version, int(self.state.learner[i, VERSION])) for i, p in enumerate(self.stats.policies)]
        wall = time.time() - start
        rate = (frames - self.stats.start_frames) / max(wall, 1e-9)
        board = f"TensorBoard: tensorboard --logdir {self.exp_dir.parent}"
        skipped = self.stats.skipped_note()
        saved = (f"{checkpoint_note(self.exp_dir, self.policies, self.reports.final_checkpoints)}; {board}"
                 if self.world.rank == 0 or not self.data_parallel else "(rank 0 writes the checkpoints)")
        if self.data_parallel:
            log.info("Done (rank %d of %d): %d env frames in %s (%.0f frames/s), policy version %d (%s); all ranks: %d "
                     "env frames trained. %s", self.world.rank, self.world.world_size, frames, format_duration(wall),
                     rate, versions[0], skipped, max(self.trained_frames(), self.world.world_size * frames), saved)
        elif self.num_policies == 1:
            log.info("Done: %d env frames in %s (%.0f frames/s), policy version %d (%s). %s", frames,
                     format_duration(wall), rate, versions[0], skipped, saved)
        else:  # (a population under torchrun: this rank's policies, in its own experiment directory)
            here = (f"rank {self.world.rank} of {self.world.world_size}: policies {', '.join(map(str, self.policies))}"
                    if self.world.distributed else "all policies")
            log.info("Done: %d env frames (%s) in %s (%.0f frames/s), policy versions %s (%s). %s", frames, here,
                     format_duration(wall), rate, ", ".join(str(versions[p]) for p in self.policies), skipped, saved)

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
            self._log_progress(start)
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

    def _check_processes(self) -> bool:
        """Replace a process that died (self-healing), or return False (and stop with exit code 1) where it cannot be:
        healing off, a death before training started, an error a replacement cannot mend, a crash loop. An error
        report comes first (the process exits at once): its line is the one report of that death."""
        for name, p in list(self.procs.items()):
            if p.exitcode is not None and name not in self.reported and not (p.exitcode == 0 and self.state.stopping()):
                self.reports.drain()
                if name in self.reported:  # its error stopped the run
                    continue
                # (a data-parallel learner is not replaced: a new one could not join the ranks' group)
                if self.healing and self.learner_ready and not self.state.stopping() and not (
                        self.data_parallel and process_kind(name) == "learner"):
                    self._replace(name, p)
                    continue
                log.error("%s %s; stopping the run", name, self.causes.pop(name, None) or
                          f"exited unexpectedly ({exit_cause(p.exitcode)})")
                self.reported.add(name)
                self.exit_code = 1
                self.state.request_stop()
        return not self.state.stopping()

    def _replace(self, name: str, proc) -> None:
        """Start a process in place of `name`, which died (Healer.replace), or stop the run (exit code 1) if that would
        be a crash loop."""
        cause = self.causes.pop(name, None) or exit_cause(proc.exitcode)
        starters = {"rollout_worker": self._start_rollout_worker, "policy_worker": self._start_policy_worker,
                    "learner": functools.partial(self._start_learner, replacement=True)}
        if not self.healer.replace(name, proc, cause, self.procs, self.env_slots, self.own_children, starters):
            self.reported.add(name)
            self.exit_code = 1
            self.state.request_stop()
            return
        self.stats.faults = self.healer.scalars()

    def _check_stalls(self) -> bool:
        """The stall watchdog's look (sf/runner/watchdog.py): False (and a stop with exit code 1) if a process is stuck
        and cannot be replaced, or if this rank's launcher (torchrun) died."""
        if self.watchdog.check(healing=self.healing and self.learner_ready) and not self.watchdog.launcher_gone():
            return True
        self.exit_code = 1
        return False

    def _crashed(self, name: str, tb: str, fatal: bool = True) -> None:
        """A process (or, in serial mode, a component) raised: one line on the console, the traceback in the log file.
        The run stops with exit code 1, unless the process is to be replaced (self-healing; not for a `fatal` error,
        which a replacement would meet again: a checkpoint that cannot be written, an env that keeps failing)."""
        last = tb.strip().splitlines()[-1] if tb.strip() else "(no message)"
        where = self.exp_dir / "sf_log.txt" if self.world.rank == 0 else "the lines below: this rank writes no files"
        log.error("%s crashed: %s (traceback in %s)", name, last, where)
        logging.getLogger(TRACE_LOG).error("%s crashed:\n%s", name, tb.rstrip())
        if not fatal and self.healing and self.learner_ready and not self.state.stopping():
            self.causes[name] = f"raised {last}"
            return
        self.reported.add(name)
        self.exit_code = 1
        self.state.request_stop()

    def _update_memory(self) -> None:
        self.stats.memory = memory_mib(self.procs)

    def _update_frames(self) -> None:
        self.stats.add_frames(int(self.state.worker_frames.sum()))

    def _log_progress(self, start: float) -> None:
        """The report line, with a progress bar and ETA toward whichever budget is closer to its end."""
        first = self.stats.start_frames // self.num_policies  # a resumed run counts from where it started
        log.info("%s%s", self.stats.report_line(), progress_bar(self.trained_frames() - first,
                                                                self.cfg.train_for_env_steps - first,
                                                                time.time() - start, self.cfg.train_for_seconds))
        if self.data_parallel and self.world.rank == 0:
            now, collected = time.time(), float(self.state.world_frames[1])
            then, before = self.world_report
            log.info("All %d ranks: %d env frames collected (%.1f frames/s), %d trained", self.world.world_size,
                     collected, (collected - before) / max(now - then, 1e-9), self.trained_frames())
            self.world_report = (now, collected)

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
        time; after a SIGTERM, everything within --sigterm_grace_sec (sf/runner/stopping.py)."""
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
