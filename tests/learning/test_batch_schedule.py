"""The batch schedules on their own (sf/learning/batch_schedule.py), driven as the learner drives them, against
HTS-RL's definitions: in hts, interval k acts with the weights trained on batches 0..k-2 (the initial ones for k < 2);
in ppo, with the weights trained on batches 0..k-1. A schedule sees versions and counts only, never a learner."""
import pytest
import torch

from sf.cfg.shape import RunShape
from sf.learning.batch_schedule import STAY, AsyncSchedule, Boundary, HtsSchedule, PpoSchedule

AGENTS, STEPS, START = 4, 3, 7  # agents, SGD steps per batch, the resumed run's first version


def shape(agents: int = AGENTS) -> RunShape:
    return RunShape(envs=agents, agents_per_env=1, agents=agents, agents_per_worker=agents, envs_per_group=agents,
                    agents_per_group=agents, groups=1, trajs_per_batch=agents, samples_per_batch=agents * 8,
                    slots=2 * agents)


def drive(schedule, batches: int, corrupt: int = -1):
    """The learner's side: batch k holds the version the actors had when interval k was released; SGD steps count the
    version up. Returns ({interval: the version it acted with}, [each batch's policy_lag_batches])."""
    version = published = START  # published at start
    acted = {0: START}
    lags = []

    def cross(b: Boundary):
        nonlocal published
        if b.publish:
            published = version
        if b.release is not None:
            acted[b.release] = published

    for k in range(batches):
        versions = torch.full((AGENTS, 8), acted[k])
        if k == corrupt:
            versions[1, 2] += 1  # one sample of another version
        cross(schedule.before_sgd(versions, version))
        version += STEPS
        stats = [{} for _ in range(STEPS)]
        cross(schedule.after_sgd(stats, version))
        lags.append(stats[0]["policy_lag_batches"])
    return acted, lags


def trained_on(batches: int) -> int:
    return START + STEPS * batches


def test_hts_interval_k_acts_with_the_weights_of_batches_before_k_minus_1():
    acted, lags = drive(HtsSchedule(shape()), 6)
    assert acted == {k: trained_on(max(k - 1, 0)) for k in range(7)}
    assert lags == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]


def test_ppo_interval_k_acts_with_the_weights_of_every_batch_before_it():
    acted, lags = drive(PpoSchedule(shape()), 6)
    assert acted == {k: trained_on(k) for k in range(7)}
    assert lags == [0.0] * 6


@pytest.mark.parametrize("schedule", [HtsSchedule, PpoSchedule])
def test_a_batch_with_a_sample_of_another_version_is_refused(schedule):
    with pytest.raises(RuntimeError, match="batch 3 holds samples of policy versions"):
        drive(schedule(shape()), 5, corrupt=3)


def test_interval_batches_are_one_interval_of_every_agent_in_order():
    s = HtsSchedule(shape())
    pending = [2, 0, 3, 1]
    s.order_batch(pending)
    assert pending == [0, 1, 2, 3]
    s.batch = 1  # the second storage
    with pytest.raises(RuntimeError, match="batch 1 got slots"):
        s.order_batch([0, 1, 2, 3])
    s.order_batch([7, 5, 6, 4])


def test_async_publishes_every_step_and_frees_collection_after_each_batch():
    s = AsyncSchedule(shape())
    assert s.batcher_thread and s.publishes_each_sgd_step and not s.ends_on_budget
    assert s.before_sgd(torch.zeros(2), 0) is STAY
    assert s.after_sgd([{}], 3) == Boundary(collect=True)
    pending = [3, 1, 2]
    s.order_batch(pending)
    assert pending == [3, 1, 2]  # the order they came in
