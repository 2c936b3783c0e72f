"""Small shared-memory state every process of a run can read without messages. P = --num_policies. Every tensor field
is a view of one shared storage (sf.utils.packed), so that a process receiving the state gets one file descriptor.

    stop            [1]     int64   1 once the runner asked everyone to stop
    worker_frames   [W]     int64   env frames collected by each rollout worker, every agent's steps (FPS is read off
                                    these)
    learner         [P, 3]  float64 per policy: env frames trained on, policy version, 1.0 when its learner finished its
                                    final save
    sync_ready      [1]     int64   hts/ppo modes: training batches whose data the learner took (and, after it,
                                    published the weights the next rollout uses); rollout interval j starts once it
                                    is >= j
    best_metric     [P, 2]  float64 per policy: running average of the best-checkpoint metric and its number of episodes
    hyperparams     [P, 3]  float64 per policy: learning rate, entropy coefficient, Adam beta1 (HYPERPARAMS): the
                                    learner applies them before each training batch (population-based training changes
                                    them; without PBT they stay the configuration's)
    replace_from    [P]     int64   per policy: the policy whose weights its learner should copy (PBT): the source of
                                    the latest copy request (-1 before any); written by the runner only
    copy_requests   [P, 2]  int64   per policy: weight copies the runner asked for, and those its learner dealt with
                                    (copied, or abandoned with a warning); requested > handled: a copy is pending (the
                                    runner writes replace_from before it counts the request: a later request while one
                                    is pending replaces it, none is lost)
    shaping         [P, K]  float64 per policy: reward-shaping coefficients of the env (K = len(shaping_keys); 0 for
                                    envs without shaping), which rollout workers pass to an agent's env at its episode
                                    start
    batches_out     [P, 2]  int64   per policy: training batches its learner copied out of shared memory, and those
                                    it trained on (async): while copied - trained reaches --num_batches_to_accumulate,
                                    its policy workers serve no request (collection paced by the learner, as Sample
                                    Factory's stop_experience_collection): experience is not gathered far ahead of the
                                    weights that will train on it (policy lag)
    world_frames    [2]     float64 data-parallel runs (torchrun): env frames trained and collected by all ranks, as the
                                    learners last agreed (sf/learning/collectives.py); zeros otherwise
    heartbeats      [X]     float64 time.monotonic() of each process's last sign of life (learners, policy workers,
                                    rollout workers): the runner's watchdog for a process stuck in a call that never
                                    returns (an env engine that hangs), which no exception or exit code reveals
    started         [X]     int8    1 once the process finished its start-up (envs made and reset, first weights): a
                                    process still starting gets a longer stall timeout (engines start slowly on a
                                    loaded machine)

Self-healing (a dead process is replaced in place; sf/runner/health/healing.py):
    epoch           [W]     int64   per rollout worker: requests for actions carry the epoch they were sent in; policy
                                    workers serve only requests of the current epoch. The runner bumps it to void every
                                    request in flight (the worker died, or a policy worker that had taken some did)
    epoch_go        [W]     int64   the epoch the rollout worker should work in: set by the runner once no policy worker
                                    is still serving a voided request; the worker then re-sends the requests it awaits
    serving         [Y]     int64   per policy worker: batches begun + batches finished (odd while it serves one)
    slot_owner      [N]     int32   where each trajectory slot is (the codes below): with a rollout worker, on the free
                                    list, on learner p's queue, or with learner p; the runner reclaims a dead process's
                                    slots from it
    moving          [X]     int64   per process: odd while it moves slots, i.e. between taking slots off a queue and
                                    marking them its own, or between marking them for a queue and putting them there
                                    (the only moments a slot's mark and its place disagree); a process opens a move only
                                    while `census` is 0, and checks it after opening
    census          [1]     int64   1 while the runner counts the slots (after a death): no process opens a move, so
                                    once no live one is inside one, every slot is where its mark says or with a dead
                                    process
    released        [P]     int64   per policy: 2 x the env frames of the trajectories its learner copied out of their
                                    slots and returned to the free list, + 1 while it returns a batch's slots (that
                                    store opens the move). Minus the frames trained (learner[p, ENV_STEPS]): the frames
                                    a dead learner took with it
"""
from __future__ import annotations

import time

import torch

from sf.utils.packed import PackedTensors

ENV_STEPS, VERSION, FINISHED = 0, 1, 2
COPIES_REQUESTED, COPIES_HANDLED = 0, 1  # columns of copy_requests
HYPERPARAMS = ("learning_rate", "exploration_loss_coeff", "adam_beta1")


def shared_hyperparams(cfg) -> dict[str, float]:
    """The configuration's values of the HYPERPARAMS (a policy's starting point; PBT mutates them)."""
    return {k: float(getattr(cfg, k)) for k in HYPERPARAMS}


# slot_owner codes: >= 0 with that rollout worker (filling it, or full and not yet marked for a learner); FREE on the
# free list; queued(p) on learner p's queue; held(p) with learner p (its pending trajectories and the batch it copies
# out). Who writes them: a rollout worker marks a slot its own after taking it off the free list and queued(p) before
# putting it on the queue; learner p marks held(p) after taking slots off its queue and FREE before putting them back on
# the free list. Both inside a move (`moving`): a process killed in one leaves a slot off its queue with the queue's
# mark, which the runner's census finds (sf/runner/health/healing.py)
SLOT_FREE = -1


def slot_queued(policy: int) -> int:
    return -10 - policy


def slot_held(policy: int) -> int:
    return -100 - policy


def learner_name(policy: int, num_policies: int = 1) -> str:
    """The learner process of `policy`: 'learner' in a one-policy run (as always), 'learner_p{policy}' in a
    population."""
    return "learner" if num_policies == 1 else f"learner_p{policy}"


def policy_worker_name(policy: int, index: int, num_policies: int = 1) -> str:
    """'policy_worker_{index}' in a one-policy run, 'policy_worker_p{policy}_{index}' in a population."""
    return f"policy_worker_{index}" if num_policies == 1 else f"policy_worker_p{policy}_{index}"


class SharedState:
    def __init__(self, num_workers: int, num_policy_workers: int = 1, num_policies: int = 1,
                 shaping_keys: tuple = (), num_slots: int = 0):
        """num_policy_workers: per policy (--policy_workers_per_policy); num_slots: trajectory slots."""
        names = [learner_name(p, num_policies) for p in range(num_policies)]
        names += [policy_worker_name(p, i, num_policies) for p in range(num_policies)
                  for i in range(num_policy_workers)]
        names += [f"rollout_worker_{w}" for w in range(num_workers)]
        self.num_policies, self.shaping_keys = num_policies, tuple(shaping_keys)
        self.num_policy_workers = num_policy_workers
        self._heartbeat_slots = {name: i for i, name in enumerate(names)}
        self.heartbeats = torch.full((len(names),), time.monotonic(), dtype=torch.float64)
        self.started = torch.zeros(len(names), dtype=torch.int8)
        self.stop = torch.zeros(1, dtype=torch.int64)
        self.worker_frames = torch.zeros(num_workers, dtype=torch.int64)
        self.learner = torch.zeros((num_policies, 3), dtype=torch.float64)
        self.world_frames = torch.zeros(2, dtype=torch.float64)
        self.batches_out = torch.zeros((num_policies, 2), dtype=torch.int64)
        self.best_metric = torch.zeros((num_policies, 2), dtype=torch.float64)
        self.sync_ready = torch.zeros(1, dtype=torch.int64)
        self.hyperparams = torch.full((num_policies, len(HYPERPARAMS)), float("nan"), dtype=torch.float64)
        self.replace_from = torch.full((num_policies,), -1, dtype=torch.int64)
        self.copy_requests = torch.zeros((num_policies, 2), dtype=torch.int64)
        self.shaping = torch.zeros((num_policies, len(self.shaping_keys)), dtype=torch.float64)
        self.epoch = torch.zeros(num_workers, dtype=torch.int64)
        self.epoch_go = torch.zeros(num_workers, dtype=torch.int64)
        self.serving = torch.zeros(num_policies * num_policy_workers, dtype=torch.int64)
        self.slot_owner = torch.full((num_slots,), SLOT_FREE, dtype=torch.int32)
        self.moving = torch.zeros(len(names), dtype=torch.int64)
        self.census = torch.zeros(1, dtype=torch.int64)
        self.released = torch.zeros(num_policies, dtype=torch.int64)
        # every tensor field above, whatever it was allocated as, moves into one shared storage: a process receiving the
        # state gets one file descriptor however many fields there are (the fork server sends a new process at most
        # sf.processes.fds.MAX_FDS_SENT)
        self._packed = PackedTensors({k: v for k, v in vars(self).items() if isinstance(v, torch.Tensor)})
        self._views()

    def _views(self) -> None:
        self.__dict__.update(self._packed.views)  # the tensor fields: views of the packed storage
        # numpy views for the per-step reads and writes of workers: ~0.1 us instead of ~5-10 us of torch indexing
        self._stop_np, self._worker_frames_np = self.stop.numpy(), self.worker_frames.numpy()
        self._heartbeats_np, self._sync_ready_np = self.heartbeats.numpy(), self.sync_ready.numpy()
        self.started_np = self.started.numpy()
        self.shaping_np = self.shaping.numpy()
        self.epoch_np, self.epoch_go_np = self.epoch.numpy(), self.epoch_go.numpy()
        self.serving_np, self.slot_owner_np = self.serving.numpy(), self.slot_owner.numpy()
        self.moving_np, self.census_np, self.released_np = (self.moving.numpy(), self.census.numpy(),
                                                            self.released.numpy())
        self.batches_out_np = self.batches_out.numpy()

    def __getstate__(self) -> dict:  # views are rebuilt in the receiving process (pickled, numpy's would be copies)
        return {k: v for k, v in self.__dict__.items() if not k.endswith("_np") and k not in self._packed.views}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._views()

    def stopping(self) -> bool:
        return bool(self._stop_np[0])

    def sync_ready_batches(self) -> int:
        return int(self._sync_ready_np[0])

    def set_sync_ready(self, batches: int) -> None:
        self._sync_ready_np[0] = batches

    def set_worker_frames(self, worker: int, frames: int) -> None:
        self._worker_frames_np[worker] = frames

    def policy_env_steps(self) -> list[int]:
        """Env frames each policy's learner has trained on."""
        return [int(x) for x in self.learner[:, ENV_STEPS].tolist()]

    def serving_index(self, policy: int, index: int) -> int:
        """Row of policy worker `index` of `policy` in `serving`."""
        return policy * self.num_policy_workers + index

    def heartbeat_slot(self, name: str) -> int:
        return self._heartbeat_slots[name]

    def heartbeat_names(self) -> list[str]:
        return list(self._heartbeat_slots)

    def beat(self, slot: int) -> None:
        """A sign of life of the process owning `slot` (heartbeat_slot(its name)); cheap enough for a step loop."""
        self._heartbeats_np[slot] = time.monotonic()

    def set_started(self, slot: int, started: bool = True) -> None:
        """The process owning heartbeat `slot` finished (or, False: begins) its start-up."""
        self.started_np[slot] = int(started)
        self.beat(slot)

    def has_started(self, name: str) -> bool:
        return bool(self.started_np[self._heartbeat_slots[name]])

    def beat_all(self) -> None:
        self._heartbeats_np[:] = time.monotonic()

    def seconds_since_beat(self, name: str) -> float:
        return time.monotonic() - float(self._heartbeats_np[self._heartbeat_slots[name]])

    def batch_copied(self, policy: int) -> None:
        """Policy `policy`'s learner copied a training batch out (its batcher thread: the only writer of this count)."""
        self.batches_out_np[policy, 0] += 1

    def batch_trained(self, policy: int, all_out: bool = False) -> None:
        """Policy `policy`'s learner trained on a batch (its training thread: the only writer of this count); all_out:
        none is out any more (a replacement learner: what its predecessor copied out died with it)."""
        self.batches_out_np[policy, 1] = (self.batches_out_np[policy, 0] if all_out
                                          else self.batches_out_np[policy, 1] + 1)

    def collection_paused(self, policy: int, limit: int) -> bool:
        """Whether policy `policy`'s learner has `limit` training batches out (copied, not yet trained on)."""
        return int(self.batches_out_np[policy, 0] - self.batches_out_np[policy, 1]) >= limit

    def request_stop(self) -> None:
        self.stop[0] = 1
