"""Runner: builds buffers and queues once, starts and supervises every process, gathers statistics,
stops on budget or signal (always with a final checkpoint from the learner).

    rollout workers --(w, group)--> policy queue [p] --> policy workers of p --group--> worker queues
    rollout workers --slot--> learner queue [p] --> learner p --slot--> free queue --> rollout workers
    everyone --(kind, ...)--> report queue --> runner (episodes, train stats, checkpoints, errors)

With one policy (the default) there is one of each; a population (--num_policies N) has a learner, policy workers,
request queue, learner queue and weights per policy, and the rollout workers route each agent by its policy.

Self-healing (--max_restarts_per_hour, asynchronous mode): a process that dies (a signal, an exception, or a stall the
watchdog ends) is replaced in place by one of the same name, index and core while the others go on (sf/runner/healing.py
makes whole what it left); errors a replacement could not mend (a checkpoint that cannot be written, an env failing
more than --max_env_restarts times) and deaths before the run started training stop the run, as does a crash loop.
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from queue import Empty
from types import SimpleNamespace

import psutil
import torch

from sf import distributed
from sf.buffers.shared_weights import SharedWeights
from sf.buffers.trajectory_buffers import TrajectoryBuffers, shm_available_bytes, shm_used_bytes
from sf.cfg import ConfigError, RunError, experiment_dir, resolve_device, save_cfg, sync_minibatches
from sf.ipc import Queue
from sf.learning.checkpoint import CheckpointError, CheckpointManager, check_compatible
from sf.learning.learner import Learner, checkpoint_meta, learner_threads, run_learner
from sf.model.actor_critic import create_actor_critic
from sf.processes.control import add_leftover_hook, become_subreaper, kill_tree, limit_threads
from sf.processes.fds import MAX_FDS_SENT, fds_sent
from sf.processes.shared_state import FINISHED, VERSION, SharedState, learner_name, policy_worker_name
from sf.runner import tracking
from sf.runner.experiment_lock import ExperimentLock, run_holding
from sf.runner.healing import Healer, Reclaimed, audit_slots, exit_cause, process_kind
from sf.runner.population import PopulationControl, fill_shared, initial_hyperparams
from sf.runner.stats import RunStats, format_duration, progress_bar
from sf.runner.supervision import (LOG_DATEFMT, LOG_FORMAT, TRACE_LOG, Silence, child_main, kill_adopted, read_stack,
                                   worker_context)
from sf.sampling.policy_worker import PolicyWorker, run_policy_worker
from sf.sampling.rollout_worker import RolloutWorker, run_rollout_worker
from sf.seeding import rank_seed
from sf_envs.registry import env_spec, make_env, process_leftover_files

log = logging.getLogger("sf")
MODE_LINES = {
    "async": "async (asynchronous APPO: policy lag varies, samples older than --max_policy_lag are masked)",
    "hts": "hts (HTS-RL batch-synchronous: training batches of {batch} samples, one rollout of every env, "
           "{steps} SGD steps each; policy lag exactly 1 batch after the first; same seed and config => same weights)",
    "ppo": "ppo (synchronous PPO: collect {batch} samples, one rollout of every env, then {steps} SGD steps; "
           "policy lag 0 batches; same seed and config => same weights)",
}
# A process still starting (making and resetting its envs: a VizDoom engine took > 5 s to start on a loaded 2-core VM)
# is stuck only after this long, even with a shorter --stall_timeout_sec
STARTUP_STALL_SEC = 60.0
# A silent process found runnable in this share of the looks at it is not stuck (supervision.Silence): one that ran
# (computing without a beat: a long step, or a loop that never ends) gets up to BUSY_GRACE x the timeout; one that
# did not run (starved by other work) is left alone, with a warning: killing it would not give it a CPU
BUSY_SHARE, BUSY_GRACE = 0.25, 6.0
# A data-parallel learner blocked in a collective waits for a slow peer up to --distributed_timeout_sec (at start, in the
# rendezvous, up to twice that: its store client retries once); then the collective raises and the learner stops the run
# itself. It is stuck only this long after that
PEER_WAIT_GRACE_SEC = 30.0
STOP_TIMEOUT_SEC = 8.0  # the learner's final save included; stragglers are killed after it (budget: 10 s)


def run_training(cfg) -> int:
    """train.py's body. Every check runs first (the env, the model, the checkpoint to resume, memory); then the
    experiment's lock is taken (another run of it: refused); only then is anything on disk touched: the experiment
    directory, config.json (atomically), the log, the run. A resumed experiment whose budget is reached already
    touches nothing at all."""
    early = setup_logging()  # the checks' warnings reach the console now and the log file once it exists
    report_background_errors()
    world = data_parallel_world(cfg)
    runner = Runner(cfg, world)
    if world.rank > 0:  # the experiment directory is rank 0's: this rank logs to the console only
        logging.getLogger().removeHandler(early)
        return runner.nothing_to_train() if runner.already_trained() else runner.run()
    # One run per experiment (sf/runner/experiment_lock.py): taken before anything of it is moved, deleted or written,
    # held until the run and its learners end; a second runner is refused in one line (exit code 2)
    runner.lock = ExperimentLock.acquire(cfg.train_dir, cfg.experiment)
    try:
        if runner.already_trained():  # (read before the lock: a run that ended since only trained more)
            return runner.nothing_to_train()
        exp_dir = prepare_experiment_dir(cfg)
        save_cfg(cfg, exp_dir)
        try:
            setup_logging(exp_dir, early)
        except OSError as e:
            raise RunError(f"cannot write the log {exp_dir / 'sf_log.txt'}: {e.strerror or e}") from None
        return runner.run()
    finally:  # (a process of the run that could not be killed still holds it: its file stays, locked)
        runner.lock.release(remove=not any(p.is_alive() for p in getattr(runner, "procs", {}).values()))


def data_parallel_world(cfg) -> distributed.World:
    """This process's rank when torchrun started it (sf/distributed.py: the learners of all ranks average their
    gradients); one rank otherwise. Refuses what data-parallel runs do not support, gives the rank its share of the
    machine's cores (ranks of one machine split them) and, past rank 0, streams of its own for envs, actions and
    minibatches (the weights are rank 0's, broadcast at start)."""
    try:
        world = distributed.world_from_env()
    except ValueError as e:
        raise ConfigError(f"torchrun's environment: {e}") from None
    if not world.distributed:
        return world
    for refused, why in ((cfg.sync_mode != "async", f"--sync_mode {cfg.sync_mode}"),
                         (cfg.num_policies > 1, f"--num_policies {cfg.num_policies}"), (cfg.serial_mode, "--serial_mode")):
        if refused:
            raise ConfigError(f"{why}: data-parallel runs (torchrun) support one policy trained asynchronously only")
    cores = sorted(os.sched_getaffinity(0))
    if world.local_world_size > 1 and len(cores) >= world.local_world_size:
        os.sched_setaffinity(0, cores[world.local_rank::world.local_world_size])  # inherited by every process started
    cfg.seed = rank_seed(cfg.seed, world.rank)  # past rank 0, streams of its own (sf.seeding)
    log.info("Data-parallel rank %d of %d (local rank %d of %d, cores %s), learners' group at %s:%d; --batch_size %d "
             "per rank", world.rank, world.world_size, world.local_rank, world.local_world_size,
             ",".join(map(str, sorted(os.sched_getaffinity(0)))), world.master_addr, world.master_port, cfg.batch_size)
    return world


def report_background_errors() -> None:
    """An exception in a background thread or an atexit callback of this process (tensorboardX's writer thread when the
    disk is full, say) is one warning line on the console, its traceback in the log file, instead of a traceback on the
    console; a log file that cannot be written any more is not reported by logging with tracebacks of its own."""
    def thread_hook(args) -> None:
        where = args.thread.name if args.thread is not None else "a thread"
        log.warning("error in background thread %s: %s: %s", where, args.exc_type.__name__, args.exc_value)
        logging.getLogger(TRACE_LOG).warning("in thread %s", where, exc_info=(args.exc_type, args.exc_value,
                                                                             args.exc_traceback))

    def unraisable_hook(unraisable) -> None:
        exc = unraisable.exc_value
        log.warning("error %s: %s: %s", unraisable.err_msg or "ignored", type(exc).__name__, exc)
        logging.getLogger(TRACE_LOG).warning("%s", unraisable.err_msg, exc_info=(unraisable.exc_type, exc,
                                                                                unraisable.exc_traceback))

    threading.excepthook = thread_hook
    sys.unraisablehook = unraisable_hook
    logging.raiseExceptions = False


def prepare_experiment_dir(cfg) -> Path:
    """--restart_behavior: resume keeps the directory, restart moves it aside, overwrite deletes it. Restart and
    overwrite act only on a real directory (not a link) inside the train dir that holds an experiment of ours (its
    config.json): anything else is refused in one line, so that nothing outside the experiment is ever touched."""
    exp_dir = experiment_dir(cfg)
    try:
        if cfg.restart_behavior in ("restart", "overwrite") and (exp_dir.exists() or exp_dir.is_symlink()):
            if exp_dir.is_symlink() or not exp_dir.is_dir() or not (exp_dir / "config.json").is_file():
                raise ConfigError(f"--restart_behavior {cfg.restart_behavior}: {exp_dir} is not an experiment directory "
                                  "(no config.json in it); refusing to move or delete it")
            if cfg.restart_behavior == "restart":
                stamp, n = time.strftime("%Y%m%d_%H%M%S"), 0
                aside = exp_dir.with_name(f"{exp_dir.name}_old_{stamp}")
                while aside.exists():  # two restarts within a second
                    n += 1
                    aside = exp_dir.with_name(f"{exp_dir.name}_old_{stamp}_{n}")
                exp_dir.rename(aside)
                print(f"Moved the old experiment directory to {aside}")
            else:
                shutil.rmtree(exp_dir)
        exp_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunError(f"cannot prepare the experiment directory {exp_dir}: {e.strerror or e}") from None
    return exp_dir


def setup_logging(exp_dir: Path | None = None, early: logging.handlers.MemoryHandler | None = None):
    """Without exp_dir: the console, plus a buffer of what is logged before the experiment directory may be written
    (returned). With exp_dir: also exp_dir/sf_log.txt, which first receives that buffer. Tracebacks of crashed processes
    go to the file only (TRACE_LOG): the console gets one line per crash, naming the file."""
    fmt = logging.Formatter(LOG_FORMAT, LOG_DATEFMT)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    if exp_dir is None:
        for h in list(root.handlers):
            root.removeHandler(h)
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(fmt)
        early = logging.handlers.MemoryHandler(capacity=10_000, flushLevel=logging.CRITICAL + 1)
        for h in (console, early):
            root.addHandler(h)
        return early
    file_handler = logging.FileHandler(exp_dir / "sf_log.txt")
    file_handler.setFormatter(fmt)
    if early is not None:
        early.setTarget(file_handler)
        early.close()  # flushes into the file
        root.removeHandler(early)
    root.addHandler(file_handler)
    trace = logging.getLogger(TRACE_LOG)
    trace.propagate = False
    for h in list(trace.handlers):
        trace.removeHandler(h)
    trace.addHandler(file_handler)
    return None


def probe_env(cfg):
    """Make one env in the runner to read its spaces (and fail early, in one line, if it cannot run). Also returns
    what one env costs in memory (bytes: the processes it starts, e.g. a VizDoom engine, plus what it allocates here),
    the modules making it imported (the fork server imports them once for every worker) and its reward-shaping
    coefficients (name -> value; {} for envs without: population-based training mutates them)."""
    modules_before = set(sys.modules)
    me = psutil.Process()
    children_before = {c.pid for c in me.children(recursive=True)}
    uss_before, shm_before = _uss(me), shm_used_bytes()
    try:
        env = make_env(cfg, env_index=0)
    except (ImportError, FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e).splitlines()[0] if str(e) else repr(e)) from None
    try:
        env_bytes = max(0, _uss(me) - uss_before) + max(0, shm_used_bytes() - shm_before)  # VizDoom: screen buffers in /dev/shm
        env_bytes += sum(_uss(c) for c in me.children(recursive=True) if c.pid not in children_before)
        obs_space, action_space = env.observation_space, env.action_space
        shaping = dict(sorted(env.reward_shaping_defaults().items())) if hasattr(env, "reward_shaping_defaults") else {}
    finally:
        env.close()
    modules = sorted({m.split(".")[0] for m in set(sys.modules) - modules_before if not m.startswith("_")})
    return obs_space, action_space, env_bytes, modules, shaping


def _uss(process) -> int:
    """Memory private to `process` (bytes; RSS where USS cannot be read)."""
    try:
        return process.memory_full_info().uss
    except (psutil.Error, AttributeError):
        try:
            return process.memory_info().rss
        except psutil.Error:
            return 0


# Private memory of one worker process forked from the fork server (torch and the envs' modules are shared with it),
# with a margin: measured on the 2-core VM with doom_battle, a rollout worker 13 MiB (USS; 43 MiB PSS), a policy worker
# 41 MiB. The learner's activations and batches come on top, in proportion to the samples of an SGD step (~1 GiB
# measured with the paper's model and batch 2048: a population of small models is not refused for 1 GiB per learner).
WORKER_PROCESS_BYTES = 80 * 2**20
LEARNER_WORKSPACE_BYTES, LEARNER_WORKSPACE_BATCH = 2**30, 2048
# Copies of the model's parameters the learner holds: the model, its gradients, Adam's two moments, the shared copy
# the policy workers read (each policy worker holds one more).
LEARNER_MODEL_COPIES = 5


def check_memory(cfg, buffer_bytes: int, model_bytes: int, env_bytes: int) -> None:
    """Refuse, in one line with the estimate, a run that cannot fit in this machine's memory, before anything of it is
    allocated or started. env_bytes: what one env was measured to take (probe_env)."""
    num_envs = cfg.num_workers * cfg.num_envs_per_worker
    policies = cfg.num_policies
    processes = cfg.num_workers + policies * (cfg.policy_workers_per_policy + 1)
    parts = {
        "trajectory buffers": buffer_bytes,
        f"{num_envs} envs": num_envs * env_bytes,
        f"{processes} processes": processes * WORKER_PROCESS_BYTES
        + policies * LEARNER_WORKSPACE_BYTES * cfg.batch_size // LEARNER_WORKSPACE_BATCH,
        "model copies": model_bytes * policies * (LEARNER_MODEL_COPIES + cfg.policy_workers_per_policy),
    }
    need, have = sum(parts.values()), psutil.virtual_memory().available
    shm_need, shm_have = buffer_bytes + model_bytes * policies, shm_available_bytes()
    gib = lambda b: f"{b / 2**30:.1f} GiB"  # noqa: E731
    detail = ", ".join(f"{k} {gib(v)}" for k, v in parts.items())
    if need > 0.9 * have:
        raise ConfigError(f"this configuration needs about {gib(need)} of memory ({detail}) but {gib(have)} is available; "
                          "lower --num_workers, --num_envs_per_worker, --num_policies, --batch_size or the model size")
    if shm_need > 0.9 * shm_have:
        raise ConfigError(f"not enough shared memory: trajectory buffers and weights need {gib(shm_need)}, /dev/shm has "
                          f"{gib(shm_have)} free; lower --num_envs_per_worker/--batch_size or enlarge /dev/shm")


class Runner:
    def __init__(self, cfg, world: distributed.World | None = None):
        """Checks only: the env runs, the model fits the checkpoint to resume, the run fits in memory. Nothing is
        written or allocated here (build() does that when the run starts). world: torchrun's ranks (one by default)."""
        self.cfg, self.exp_dir = cfg, experiment_dir(cfg)
        self.world = world or distributed.World()
        tracking.check(cfg)  # --with_wandb: wandb imports
        add_leftover_hook(process_leftover_files)  # what the engines of killed workers leave in /dev/shm
        self.device = resolve_device(cfg)
        self.spec = env_spec(cfg.env, cfg)
        self.obs_space, self.action_space, env_bytes, self.env_modules, self.shaping = probe_env(cfg)
        self.num_policies, self.num_agents = cfg.num_policies, self.spec.num_agents
        with torch.device("meta"):  # shapes only: a model of absurd size is refused below before it is allocated
            model = create_actor_critic(cfg, self.obs_space, self.action_space)
        self.meta = checkpoint_meta(cfg, self.obs_space, self.action_space, model)
        self.rnn_state_size = model.rnn_state_size
        self.trajs_per_batch = cfg.batch_size * cfg.num_batches_per_epoch // cfg.rollout
        # one trajectory stream per agent; every learner holds up to two training batches
        num_agents = cfg.num_workers * cfg.num_envs_per_worker * self.num_agents
        if cfg.policy_mapping == "fixed" and self.num_policies > num_agents:
            raise ConfigError(f"--policy_mapping fixed: {self.num_policies} policies but {num_agents} agents "
                              f"(num_workers x num_envs_per_worker x {self.num_agents} agents per env): policies "
                              f"{num_agents}-{self.num_policies - 1} would never play; use more envs or --policy_mapping "
                              "random")
        batches = self.num_policies * self.trajs_per_batch
        self.num_slots = cfg.num_traj_buffers or num_agents + 2 * batches
        if cfg.sync_mode != "async":  # two storages of one slot per env (HTS-RL); --num_traj_buffers does not apply
            self.trajs_per_batch, self.num_slots = num_agents, 2 * num_agents
        elif self.num_slots < num_agents + batches:
            raise ConfigError(f"--num_traj_buffers {self.num_slots} is too small: need at least num_workers*num_envs_per_worker"
                              f"*agents_per_env + num_policies*batch_size*num_batches_per_epoch/rollout = "
                              f"{num_agents + batches}")
        self.buffer_bytes = TrajectoryBuffers.bytes_needed(self.num_slots, cfg.rollout, self.obs_space, self.action_space,
                                                           self.rnn_state_size)
        model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        check_memory(cfg, self.buffer_bytes, model_bytes, env_bytes)
        self.resumed: list[tuple[int, int]] = [(0, 0)] * self.num_policies  # each policy's checkpoint: (version, frames)
        self.check_checkpoint()
        self.lock = None  # the experiment's lock (rank 0; run_training takes it): its learners hold it too
        # PBT's state: a resumed run's pbt_state.json is read (and checked) here, written only once the run started
        self.population = PopulationControl(cfg, self.exp_dir, self.shaping) if self._with_pbt() else None

    def check_checkpoint(self) -> None:
        """Before anything is written: the checkpoint to resume from must fit this env and model."""
        if self.cfg.restart_behavior != "resume":
            return
        try:
            for p in range(self.num_policies):
                manager = CheckpointManager(self.exp_dir, policy_id=p, keep_checkpoints=self.cfg.keep_checkpoints)
                state = manager.load("latest")
                if state is not None:
                    check_compatible(state["meta"], self.meta, state.get("path", self.exp_dir / f"checkpoint_p{p}"))
                    self.resumed[p] = (int(state["policy_version"]), int(state["env_steps"]))
                    ranks = int(state.get("world_size", 1))
                    if ranks != self.world.world_size:
                        raise CheckpointError(
                            f"{state.get('path', self.exp_dir)} was trained by {ranks} data-parallel rank(s), this run "
                            f"has {self.world.world_size}: resume with the same number (torchrun --nnodes x "
                            f"--nproc-per-node = {ranks}), or start a new experiment")
        except CheckpointError as e:
            raise ConfigError(str(e)) from None

    def already_trained(self) -> bool:
        """A resumed experiment whose checkpoints reached --train_for_env_steps already (every policy's; with torchrun,
        all ranks' frames together, each rank having trained as many as rank 0's checkpoint records)."""
        trained = self.world.world_size * min(steps for _, steps in self.resumed)
        return self.cfg.restart_behavior == "resume" and trained >= self.cfg.train_for_env_steps

    def nothing_to_train(self) -> int:
        """A finished experiment resumed with the same budget: start nothing, write nothing (no checkpoint re-saved, no
        best relabelled, no config.json, log or event file); say so with the experiment's counters. Exit code 0."""
        if self.num_policies > 1:
            counters = (f"policy versions {', '.join(str(v) for v, _ in self.resumed)}; env frames "
                        f"{', '.join(str(f) for _, f in self.resumed)}")
        else:
            version, frames = self.resumed[0]
            counters = f"policy version {version}, {frames} env frames" + (
                f" per rank, {self.world.world_size} ranks" if self.world.distributed else "")
        log.info("Done: nothing to train: the experiment reached --train_for_env_steps %d already (%s); raise "
                 "--train_for_env_steps to train on. Nothing was written. Checkpoints: %s", self.cfg.train_for_env_steps,
                 counters, self.exp_dir / ("checkpoint_p*" if self.num_policies > 1 else "checkpoint_p0"))
        return 0

    def _with_pbt(self) -> bool:
        return bool(self.cfg.with_pbt) and self.num_policies > 1

    def build(self) -> None:
        """Allocate what every process shares: trajectory buffers, weights, counters, queues; and the statistics."""
        cfg = self.cfg
        self.buffers = TrajectoryBuffers(self.num_slots, cfg.rollout, self.obs_space, self.action_space, self.rnn_state_size)
        P = self.num_policies
        self.weights = [SharedWeights(create_actor_critic(cfg, self.obs_space, self.action_space), self.device)
                        for _ in range(P)]
        self.state = SharedState(cfg.num_workers, cfg.policy_workers_per_policy, P, tuple(self.shaping), self.num_slots)
        # [W, agents per worker, (slot, t, policy)]
        self.env_slots = torch.zeros((cfg.num_workers, cfg.num_envs_per_worker * self.num_agents, 3),
                                     dtype=torch.int64).share_memory_()
        msg_bytes, num_slots = 64, self.num_slots  # a small int tuple; capacities hold every message in flight at once,
        requests = 2 * cfg.num_workers * cfg.worker_num_splits  # twice over: voided ones beside those asked again
        self.queues = SimpleNamespace(
            policy=[Queue(maxsize=requests + 1, max_size_bytes=max(2**16, msg_bytes * requests * 2)) for _ in range(P)],
            workers=[Queue(maxsize=2 * cfg.worker_num_splits * P + 1, max_size_bytes=2**13 * P)
                     for _ in range(cfg.num_workers)],
            learner=[Queue(maxsize=num_slots + 1, max_size_bytes=max(2**16, msg_bytes * num_slots * 2)) for _ in range(P)],
            free=Queue(maxsize=num_slots + 1, max_size_bytes=max(2**16, msg_bytes * num_slots * 2)),
            report=Queue(max_size_bytes=2**25),
        )
        if cfg.sync_mode == "async":  # (hts/ppo: fixed slots, no free list)
            self.queues.free.put_many(list(range(num_slots)))
        self.stats = RunStats(self.exp_dir, cfg.stats_avg, self.spec.frameskip, sync_mode=cfg.sync_mode, num_policies=P,
                              resumed=self.resumed)
        self.stats.enabled = self.world.rank == 0  # rank 0 writes TensorBoard
        self.world_report = (time.time(), 0.0)  # data-parallel: (time, collected frames of all ranks) at the last report
        hyper = self.population.hyperparams() if self.population else [initial_hyperparams(cfg, self.shaping)] * P
        fill_shared(self.state, hyper)
        if self.population:
            self.population.record(self.stats, hyper)
        self.procs: dict[str, torch.multiprocessing.Process] = {}
        self.stack_files: dict[str, int] = {}  # process name -> descriptor of its stack-dump file (in that process)
        self.last_watch = time.monotonic()  # the stall watchdog's last look
        self.exit_code = 0
        self.interrupts = 0
        self.reported: set[str] = set()  # processes whose death was already reported (one line each)
        self.causes: dict[str, str] = {}  # process -> how it failed (its exception, a stall), for its restart line
        self.silence: dict[str, Silence] = {}  # processes silent for half their stall limit
        self.starved_warned: set[str] = set()  # processes found waiting for a CPU past their limit (warned once)
        self.healer = Healer(cfg, self.state, self.queues, self.spec.frameskip)
        self.healing = cfg.max_restarts_per_hour > 0 and cfg.sync_mode == "async" and not cfg.serial_mode
        if self.healing:
            self.stats.faults = self.healer.scalars()
        self.own_children: set[int] = set()
        self.learner_ready = False  # the learner loaded its checkpoint and published its first weights
        for note in getattr(cfg, "_notes", []):
            log.info("%s", note)
        log.info("Experiment %s: env %s, device %s, %d rollout workers x %d envs, %d trajectory slots (%.0f MiB), "
                 "seed %d", self.exp_dir, cfg.env, self.device, cfg.num_workers, cfg.num_envs_per_worker, num_slots,
                 self.buffer_bytes / 2**20, cfg.seed)
        if P > 1 or self.num_agents > 1:
            log.info("Population: %d policies (%s), %d agents per env (%d agents in all), policy mapping %s%s", P,
                     "population-based training" + (", resumed" if self.population.resumed else "")
                     if self.population else "independent", self.num_agents,
                     cfg.num_workers * cfg.num_envs_per_worker * self.num_agents, cfg.policy_mapping,
                     f" (new draw every {cfg.policy_resample_episodes} episodes of an env)"
                     if cfg.policy_mapping != "fixed" and P > 1 else "")
        mode = MODE_LINES[cfg.sync_mode].format(batch=self.trajs_per_batch * cfg.rollout,
                                                steps=sync_minibatches(cfg) * cfg.num_epochs)
        log.info("Mode: %s", mode)
        if self.stats.enabled:
            self.stats.writer.add_text("config/mode", mode)

    def worker_queues(self, w: int):
        """A rollout worker's: every policy's request and learner queue, its own reply queue."""
        q = self.queues
        return SimpleNamespace(policy=q.policy, worker=q.workers[w], learner=q.learner, free=q.free, report=q.report)

    def policy_queues(self, p: int):
        """A policy worker's: its policy's request queue, every rollout worker's reply queue."""
        return SimpleNamespace(policy=self.queues.policy[p], workers=self.queues.workers)

    def learner_queues(self, p: int):
        """A learner's: its policy's queue of full trajectories, the free list, the report queue."""
        q = self.queues
        return SimpleNamespace(learner=q.learner[p], free=q.free, report=q.report)

    # --- processes ---
    def _start(self, name: str, target, *args, unwind: bool = False) -> None:
        """Start process `name` from the fork server. A start the system refuses (the fork server's limit on file
        descriptors, no memory or process slot left for a fork, the fork server gone) raises RunError, one line; run()
        then stops what was started."""
        args = (name, self.queues.report, os.getpid(), unwind, target, *args)
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
        self.own_children = {c.pid for c in psutil.Process().children()}  # the fork server and multiprocessing's helpers
        for p in range(self.num_policies):
            self._start_learner(p)
        for p in range(self.num_policies):
            for i in range(self.cfg.policy_workers_per_policy):
                self._start_policy_worker(p, i)
        for w in range(self.cfg.num_workers):  # they make their envs while the learner loads: start-up runs in parallel
            self._start_rollout_worker(w)

    def _start_learner(self, p: int, replacement: bool = False) -> str:
        name = learner_name(p, self.num_policies)
        # the learner writes the checkpoints: it holds the experiment's lock too (its descriptor, passed on), so the
        # lock outlives a killed runner until the learner is gone as well
        self._start(name, run_holding, self.lock, run_learner, self.cfg, self.obs_space, self.action_space, self.buffers,
                    self.learner_queues(p), self.weights[p], self.state, self.device, self.exp_dir, self.spec.frameskip,
                    self.num_agents, p, self.weights, replacement)
        return name

    def _start_policy_worker(self, p: int, i: int) -> str:
        name = policy_worker_name(p, i, self.num_policies)
        self._start(name, run_policy_worker, self.cfg, i, self.obs_space, self.action_space, self.buffers, self.env_slots,
                    self.policy_queues(p), self.weights[p], self.state, self.device, p)
        return name

    def _start_rollout_worker(self, w: int) -> str:
        name = f"rollout_worker_{w}"
        self._start(name, run_rollout_worker, self.cfg, w, self.buffers, self.env_slots, self.worker_queues(w),
                    self.state, w, unwind=True)
        return name

    def _check_processes(self) -> bool:
        """Replace a process that died (self-healing), or return False (and stop with exit code 1) where it cannot be:
        healing off, a death before training started, an error a replacement cannot mend, a crash loop. An error
        report comes first (the process exits at once): its line is the one report of that death."""
        for name, p in list(self.procs.items()):
            if p.exitcode is not None and name not in self.reported and not (p.exitcode == 0 and self.state.stopping()):
                self._drain_reports()
                if name in self.reported:  # its error stopped the run
                    continue
                # (a data-parallel learner is not replaced: a new one could not join the ranks' group)
                if self.healing and self.learner_ready and not self.state.stopping() and not (
                        self.world.distributed and process_kind(name) == "learner"):
                    self._replace(name, p)
                    continue
                log.error("%s %s; stopping the run", name, self.causes.pop(name, None) or
                          f"exited unexpectedly ({exit_cause(p.exitcode)})")
                self.reported.add(name)
                self.exit_code = 1
                self.state.request_stop()
        return not self.state.stopping()

    def _replace(self, name: str, proc) -> None:
        """Start a process in place of `name`, which died, once what it left is made whole (sf/runner/healing.py)."""
        kind, heal = process_kind(name), self.healer
        cause = self.causes.pop(name, None) or exit_cause(proc.exitcode)
        if not heal.allowed(kind):
            log.error("%s %s: %d %ss died within the last hour (--max_restarts_per_hour %d), a crash loop; stopping "
                      "the run", name, cause, heal.max_per_hour, kind.replace("_", " "), heal.max_per_hour)
            self.reported.add(name)
            self.exit_code = 1
            self.state.request_stop()
            return
        proc.join(timeout=1.0)
        slots, W = Reclaimed(), self.cfg.num_workers
        alive = lambda: {n for n, q in self.procs.items() if q.is_alive()}  # noqa: E731
        serving = lambda: [self.state.serving_index(*self._policy_worker_of(n))  # noqa: E731
                           for n, q in self.procs.items() if process_kind(n) == "policy_worker" and q.is_alive()]
        if kind == "rollout_worker":
            w = int(name.rsplit("_", 1)[1])
            kill_adopted(self.own_children)  # its env engines (adopted by the runner) and their shared memory
            heal.void_requests([w])
            if not heal.wait_for_policy_workers(serving()):
                log.warning("a policy worker is still serving requests of %s; reusing its slots anyway", name)
            heal.drop_replies(w)
            slots = heal.reclaim_worker_slots(w, self.env_slots[w].numpy(), self.cfg.rollout, alive)
            heal.release([w])
            new = self._start_rollout_worker(w)
        elif kind == "policy_worker":
            p, i = self._policy_worker_of(name)
            workers = list(range(W))
            heal.void_requests(workers)  # it may have taken requests it never answered: every worker asks again
            if not heal.wait_for_policy_workers(serving()):
                log.warning("a policy worker is still serving requests voided at the death of %s", name)
            heal.release(workers)
            new = self._start_policy_worker(p, i)
        else:
            p = int(name[len("learner_p"):]) if name.startswith("learner_p") else 0
            slots = heal.reclaim_learner_slots(p, name, alive)
            new = self._start_learner(p, replacement=True)
        count = heal.record(kind, slots.lost_frames)
        log.warning("Restarted %s (pid %d) after it %s: restart %d of %ss this hour (--max_restarts_per_hour %d); %s%d "
                    "env frames lost", new, self.procs[new].pid, cause, count, kind.replace("_", " "), heal.max_per_hour,
                    slots.describe(), slots.lost_frames)
        self.stats.faults = self.healer.scalars()

    def _policy_worker_of(self, name: str) -> tuple[int, int]:
        """policy_worker_3 -> (0, 3); policy_worker_p1_0 -> (1, 0)."""
        parts = name[len("policy_worker_"):].split("_")
        return (int(parts[0][1:]), int(parts[1])) if len(parts) == 2 else (0, int(parts[0]))

    def _check_stalls(self) -> bool:
        """A process that gave no sign of life for --stall_timeout_sec is alive but stuck in a call that never returns
        (an env engine that hangs, say): its Python stack goes to the log, then it is killed (with its engines) and
        replaced (self-healing); without healing, False and a stop with exit code 1 (the stop kills it after the others
        have stopped and the learner saved a final checkpoint)."""
        timeout = self.cfg.stall_timeout_sec
        if timeout <= 0 or self.state.stopping():
            return True
        now = time.monotonic()
        if now - self.last_watch > 5.0:  # the runner itself was stopped (Ctrl-Z, then fg) or starved: all silence so far
            self.state.beat_all()         # is nobody's fault
        self.last_watch = now
        for name, p in self.procs.items():
            idle = self.state.seconds_since_beat(name)
            if idle < timeout / 2:
                self.silence.pop(name, None)
                continue
            silence = self.silence.get(name)
            if silence is None:  # half-way: from here on, its state tells stuck from busy or starved
                self.silence[name] = Silence(p.pid, idle)
                continue
            silence.sample()
            # a process still starting gets longer, unless it is stopped: no start-up is that slow
            limit = timeout if self.state.has_started(name) or silence.stopped else max(timeout, STARTUP_STALL_SEC)
            allowed = "starting"
            if self.world.distributed and process_kind(name) == "learner" and not silence.stopped:
                waits = 1 if self.state.has_started(name) else 2
                peers = self.cfg.distributed_timeout_sec * waits + PEER_WAIT_GRACE_SEC
                if peers > limit:
                    limit, allowed = peers, "a data-parallel learner waiting for the other ranks"
            if idle > limit and p.is_alive():
                runnable, ran = silence.shares(idle)
                if runnable > BUSY_SHARE and ran < BUSY_SHARE and not silence.stopped:
                    if name not in self.starved_warned:
                        self.starved_warned.add(name)
                        log.warning("%s gave no sign of life for %.0f s but is waiting for a CPU, not stuck: the machine "
                                    "is oversubscribed (other runs or jobs?); not repeated for this process. %s", name,
                                    idle, silence.describe(idle))
                    continue
                busy = (runnable > BUSY_SHARE or ran > BUSY_SHARE) and not silence.stopped
                if busy and idle < BUSY_GRACE * limit:
                    continue  # computing without a beat: a long step, maybe
                self._drain_reports()  # the stack file of a process that only just started
                healing = self.healing and self.learner_ready
                why = f"--stall_timeout_sec {timeout:g}" if limit == timeout else f"{allowed}: {limit:g} s allowed"
                if busy:
                    why += f", {BUSY_GRACE:g}x for a process that computes"
                log.error("%s gave no sign of life for %.0f s (%s): it is stuck; %s. %s. Its stack:\n%s", name, idle,
                          why, "killing and replacing it" if healing else "stopping the run", silence.describe(idle),
                          read_stack(p.pid, self.stack_files.get(name)))
                if healing:
                    self.causes[name] = f"gave no sign of life for {idle:.0f} s ({why})"
                    kill_tree(p)
                    p.join(timeout=5.0)
                    continue
                self.exit_code = 1
                self.state.request_stop()
                return False
        return True

    # --- reports ---
    def _drain_reports(self) -> None:
        while True:
            try:
                msgs = self.queues.report.get_many(timeout=0.0, max_messages_to_get=1000)
            except Empty:
                return
            for msg in msgs:
                kind = msg[0]
                if kind == "episodes":
                    for p in self.stats.add_episodes(msg[2]):
                        metric = self.stats.mean(self.cfg.save_best_metric, p)
                        if metric == metric:
                            self.state.best_metric[p, 0] = metric
                            self.state.best_metric[p, 1] = self.stats.policies[p].num_episodes
                elif kind == "train":
                    self.stats.add_train(msg[1], msg[2], msg[3], msg[4])
                elif kind == "stack_file":
                    self.stack_files[msg[1]] = msg[2]
                elif kind == "checkpoint":
                    log.info("Saved %scheckpoint %s", "final " if msg[2] else "", msg[1])
                elif kind == "final_weights":
                    who = f"policy {msg[4]}, " if self.num_policies > 1 else "policy "
                    log.info("Final weights sha256: %s (%sversion %d, %d env frames)", msg[1], who, msg[2], msg[3])
                elif kind == "pbt_copied":  # (policy, source, the source's version copied, the policy's new version)
                    log.info("PBT: policy %d now plays with the weights of policy %d (its version %d), as policy "
                             "version %d", *msg[1:5])
                elif kind == "pbt_copy_abandoned":  # (policy, source, why)
                    line = (f"PBT: policy {msg[1]} could not copy the weights of policy {msg[2]}: {msg[3]}; it keeps its "
                            "own weights, with the hyperparameters PBT gave it")
                    log.warning("%s", line)
                    self.stats.texts.append(("pbt/decisions", line))
                elif kind == "error":
                    self._crashed(msg[1], msg[2], fatal=msg[3] if len(msg) > 3 else True)

    def _crashed(self, name: str, tb: str, fatal: bool = True) -> None:
        """A process (or, in serial mode, a component) raised: one line on the console, the traceback in the log file.
        The run stops with exit code 1, unless the process is to be replaced (self-healing; not for a `fatal` error,
        which a replacement would meet again: a checkpoint that cannot be written, an env that keeps failing)."""
        last = tb.strip().splitlines()[-1] if tb.strip() else "(no message)"
        log.error("%s crashed: %s (traceback in %s)", name, last, self.exp_dir / "sf_log.txt")
        logging.getLogger(TRACE_LOG).error("%s crashed:\n%s", name, tb.rstrip())
        if not fatal and self.healing and self.learner_ready and not self.state.stopping():
            self.causes[name] = f"raised {last}"
            return
        self.reported.add(name)
        self.exit_code = 1
        self.state.request_stop()

    def _update_memory(self) -> None:
        groups: dict[str, float] = {"runner": psutil.Process().memory_info().rss}
        for name, p in self.procs.items():
            try:
                rss = psutil.Process(p.pid).memory_info().rss
            except (psutil.Error, TypeError):
                continue
            kind = process_kind(name)  # rollout_worker_3, policy_worker_p1_0, learner_p2
            key = kind + "s" if kind != name else name  # -> rollout_workers, policy_workers, learners; learner
            groups[key] = groups.get(key, 0) + rss
        self.stats.memory = {k: v / 2**20 for k, v in groups.items()}

    # --- signals ---
    def _on_signal(self, signum, frame) -> None:
        self.interrupts += 1
        if self.interrupts > 1:  # second Ctrl-C: exit at once
            for p in self.procs.values():
                if p.is_alive():
                    kill_tree(p)
            os._exit(130)
        log.info("%s received: stopping (final checkpoint); press Ctrl-C again to exit at once", signal.Signals(signum).name)
        self.state.request_stop()

    # --- main loop ---
    def trained_frames(self) -> int:
        """Env frames every policy has trained on (the least of them: the frame budget holds for each policy); in a
        data-parallel run, all ranks together (the budget is the run's)."""
        if self.world.distributed:
            return int(self.state.world_frames[0])
        return min(self.state.policy_env_steps())

    def budget_reached(self, start: float) -> bool:
        return self.trained_frames() >= self.cfg.train_for_env_steps or time.time() - start >= self.cfg.train_for_seconds

    def run(self) -> int:
        """The run, in the order of the data flow (docs/architecture.md): build() allocates what the stages share
        (trajectory buffers, weights, queues); start_processes() starts the learner (batches -> weights), the policy
        workers (observations -> actions) and the rollout workers (actions -> env steps -> trajectories); supervise()
        watches them until the budget, a signal or a failure; stop_processes() ends them, the learner's final
        checkpoint first. Returns the exit code."""
        try:
            self.build()
        except (OSError, RuntimeError) as e:  # /dev/shm or memory exhausted by something else meanwhile
            raise RunError(f"cannot allocate the run's shared memory: {e}") from None
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        start = time.time()
        try:
            if self.stats.enabled:  # W&B (--with_wandb); before the processes
                self.stats.tracker = tracking.start(self.cfg, self.exp_dir)
            if self.cfg.serial_mode:
                try:
                    self.run_serial(start)
                except Exception:  # noqa: B902 — reported like a crashed process
                    self._crashed("serial run", traceback.format_exc())
            else:
                become_subreaper()
                try:
                    self.start_processes()
                    self.supervise(start)
                finally:  # whatever happened here (a bug of the runner's own included), no child outlives the run
                    self.stop_processes()
                    kill_adopted(self.own_children)  # engines of a worker that died without closing them
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self._drain_reports()
            self._update_frames()
            self._log_progress(start)  # a final report line, however short the run
            if self.healing:
                log.info("Faults: %s", self.healer.summary())
            if not self.cfg.serial_mode and self.cfg.sync_mode == "async":
                self._audit_slots()
            if self.population is not None:
                self.population.save()
            self.stats.write_summaries()
            self.stats.close()
            if self.stats.tracker is not None:
                self.stats.tracker.finish(self.exit_code)
            self.close_queues()
        # the experiment's counters (a learner that never started leaves its checkpoint's), this run's time and rate
        frames = sum(max(now, before) for now, (_, before) in zip(self.state.policy_env_steps(), self.resumed))
        versions = [max(p.version, int(self.state.learner[i, VERSION])) for i, p in enumerate(self.stats.policies)]
        wall = time.time() - start
        rate = (frames - self.stats.start_frames) / max(wall, 1e-9)
        if self.world.distributed:
            log.info("Done (rank %d of %d): %d env frames in %s (%.0f frames/s), policy version %d; all ranks: %d env "
                     "frames trained. %s", self.world.rank, self.world.world_size, frames, format_duration(wall), rate,
                     versions[0], max(self.trained_frames(), self.world.world_size * frames),
                     f"Checkpoints: {self.exp_dir / 'checkpoint_p0'}; TensorBoard: tensorboard --logdir "
                     f"{self.exp_dir.parent}" if self.world.rank == 0 else "(rank 0 writes the checkpoints)")
        elif self.num_policies == 1:
            log.info("Done: %d env frames in %s (%.0f frames/s), policy version %d. Checkpoints: %s; TensorBoard: "
                     "tensorboard --logdir %s", frames, format_duration(wall), rate, versions[0],
                     self.exp_dir / "checkpoint_p0", self.exp_dir.parent)
        else:
            log.info("Done: %d env frames (all policies) in %s (%.0f frames/s), policy versions %s. Checkpoints: %s; "
                     "TensorBoard: tensorboard --logdir %s", frames, format_duration(wall), rate,
                     ", ".join(map(str, versions)),
                     self.exp_dir / "checkpoint_p*", self.exp_dir.parent)
        return self.exit_code

    def supervise(self, start: float) -> None:
        """The runner's loop while the processes work: reports, deaths, stalls, budget, console and TensorBoard."""
        last_report = last_summary = start
        while not self.state.stopping():
            self._drain_reports()
            # the budget first: in hts/ppo the learner ends the run itself at the batch reaching it, and exits
            if self.budget_reached(start) or not self._check_processes() or not self._check_stalls():
                break
            if not self.learner_ready and all(w.version >= 0 for w in self.weights):
                self.learner_ready = True  # frames count from where the checkpoint left them (no jump in the FPS)
                self.stats.start_frames = sum(self.state.policy_env_steps())
            if self.learner_ready:
                self._update_frames()
            if self.population is not None:
                self.population.step(self.state, self.stats)
            now = time.time()
            if now - last_report >= self.cfg.report_interval_sec:
                self._update_memory()
                self._log_progress(start)
                last_report = now
            if now - last_summary >= self.cfg.experiment_summaries_interval:
                self.stats.write_summaries()
                last_summary = now
            time.sleep(0.1)

    def _update_frames(self) -> None:
        self.stats.add_frames(int(self.state.worker_frames.sum()))

    def _log_progress(self, start: float) -> None:
        """The report line, with a progress bar and ETA toward whichever budget is closer to its end."""
        first = self.stats.start_frames // self.num_policies  # a resumed run counts from where it started
        log.info("%s%s", self.stats.report_line(), progress_bar(self.trained_frames() - first,
                                                                self.cfg.train_for_env_steps - first,
                                                                time.time() - start, self.cfg.train_for_seconds))
        if self.world.distributed and self.world.rank == 0:
            now, collected = time.time(), float(self.state.world_frames[1])
            then, before = self.world_report
            log.info("All %d ranks: %d env frames collected (%.1f frames/s), %d trained", self.world.world_size,
                     collected, (collected - before) / max(now - then, 1e-9), self.trained_frames())
            self.world_report = (now, collected)

    def stop_processes(self) -> None:
        """Ask everyone to stop, let the learner write its final checkpoint, then reap every process."""
        self.state.request_stop()
        deadline = time.time() + STOP_TIMEOUT_SEC
        learners = [(p, self.procs.get(learner_name(p, self.num_policies))) for p in range(self.num_policies)]
        while time.time() < deadline and any(proc is not None and proc.is_alive() and self.state.learner[p, FINISHED] == 0
                                             for p, proc in learners):
            self._drain_reports()
            time.sleep(0.05)
        for p in self.procs.values():
            p.join(timeout=max(0.1, deadline - time.time()))
        for name, p in self.procs.items():
            if p.is_alive():
                log.warning("%s did not stop in time; killing it", name)
                kill_tree(p)
                p.join(timeout=2)

    def _audit_slots(self) -> None:
        if any(p.is_alive() for p in self.procs.values()):
            return  # a process that could not be killed (uninterruptible I/O): the queues are not ours to read
        verdict = audit_slots(self.state, self.queues, self.num_slots)
        (log.info if verdict.endswith("exactly once") else log.warning)("%s", verdict)

    def close_queues(self) -> None:
        q = self.queues
        for queue in [*q.policy, *q.learner, q.free, q.report, *q.workers]:
            queue.close()

    # --- serial mode ---
    def run_serial(self, start: float) -> None:
        """Every component in this process, stepped round-robin (for debugging). Any layout of the parallel mode works:
        a rollout worker that finds no free slot runs the learners (which free them) instead of waiting for them."""
        cfg, P = self.cfg, self.num_policies
        limit_threads(learner_threads(cfg))  # the learner's threads, as in its own process: the same bits
        learners = [Learner(cfg, self.obs_space, self.action_space, self.buffers, self.learner_queues(p), self.weights[p],
                            self.state, self.device, self.exp_dir, self.spec.frameskip, self.num_agents, p, self.weights)
                    for p in range(P)]
        self.stats.start_frames = sum(learner.env_steps for learner in learners)
        policies = [PolicyWorker(cfg, self.obs_space, self.action_space, self.buffers, self.env_slots,
                                 self.policy_queues(p), self.weights[p], self.device, policy_id=p) for p in range(P)]
        for policy in policies:
            policy.wait_for_weights(self.state.stopping)
        last_report = time.time()

        def periodic() -> None:  # the runner's periodic work, also while a worker waits for a slot
            nonlocal last_report
            self._drain_reports()
            self._update_frames()
            if self.population is not None:
                self.population.step(self.state, self.stats)
            if time.time() - last_report >= cfg.report_interval_sec:
                self._log_progress(start)
                last_report = time.time()
            if self.budget_reached(start):
                self.state.request_stop()

        def train() -> None:
            for learner in learners:  # (each applies its PBT updates before training a batch)
                learner.run_once(timeout=0.0)

        def starved() -> None:
            train()
            periodic()

        workers = []
        try:
            for w in range(cfg.num_workers):
                workers.append(RolloutWorker(cfg, w, self.buffers, self.env_slots, self.worker_queues(w), self.state,
                                             on_starved=starved))
                workers[-1].start()
            while not self.state.stopping():
                for policy in policies:
                    policy.run_once(timeout=0.0)
                for w in workers:
                    w.run_once(timeout=0.0)
                train()
                periodic()
        except StopIteration:  # a worker waiting for a slot saw the stop request
            pass
        finally:
            for learner in learners:
                learner.finish()
            self._drain_reports()
            for w in workers:
                w.close()
