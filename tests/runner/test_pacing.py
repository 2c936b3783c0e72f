"""Collection paced by the learner (--num_batches_to_accumulate; sf/sampling/policy_worker.py, SharedState.batches_out),
end to end: a learner made the bottleneck (32 SGD steps per batch of a tiny model) trains on experience at most about
N + 1 batches' SGD steps old, where unpaced collection fills every spare slot ahead of it and trains on older."""
import statistics

import pytest
from e2e_helpers import SMALL, start_train, wait_for

from sf.processes.shared_state import SharedState
from sf.runner.stats import read_event_scalars

STEPS = 32  # SGD steps per training batch: 8 epochs x 4 minibatches


def lags(tmp_path, accumulate: int) -> tuple[list[float], list[float]]:
    """The run's (policy_lag_max, policy_lag_avg) series, one point per training report."""
    log = tmp_path / f"acc{accumulate}.txt"
    args = ["--env", "test_corridor", "--experiment", f"acc{accumulate}", "--train_dir", str(tmp_path), *SMALL,
            "--num_workers", "2", "--num_epochs", "8", "--num_batches_per_epoch", "4", "--train_for_env_steps", "12000",
            "--num_batches_to_accumulate", str(accumulate), "--seed", "1"]
    p = start_train(args, log)
    try:
        wait_for(lambda: p.poll() is not None, 600, "the run to end", log)
    finally:
        p.kill()
    assert p.returncode == 0, log.read_text()[-3000:]
    series = read_event_scalars(tmp_path / f"acc{accumulate}")
    return ([v for _, v in series["train/policy_lag_max"]], [v for _, v in series["train/policy_lag_avg"]])


@pytest.mark.e2e
def test_policy_lag_is_bounded_by_the_batches_the_learner_may_hold(tmp_path):
    """N = 1: a sample is acted while no batch is out, so at worst the batch being copied trains first and the sample's
    own batch next: lag <= 2 x 32 - 1 SGD steps, plus one batch of requests a policy worker may serve as the count
    reaches N (it looks before each batch): bound 3 x 32, in the typical report (the median of the reports' maxima).
    Not in every report: pacing bounds how far collection as a whole runs ahead of the learner, not how evenly the OS
    runs the rollout workers. One starved beside a CPU hog finishes its trajectory late, after the other's filled
    batches, and that trajectory's first steps are older (seen: 2 reports of 44 at 127 and 157 beside 4 busy
    processes, none of them a torn-weights -1). Unpaced (N = 1000), the typical report is past the bound (else this
    test could not fail)."""
    paced_max, paced_avg = lags(tmp_path, 1)
    assert statistics.median(paced_max) <= 3 * STEPS, paced_max
    unpaced_max, unpaced_avg = lags(tmp_path, 1000)
    assert statistics.median(unpaced_max) > 3 * STEPS, unpaced_max
    assert statistics.median(paced_avg) < statistics.median(unpaced_avg), (paced_avg, unpaced_avg)


def test_collection_pauses_while_the_learner_holds_n_batches():
    """The counts behind the pause: copied (the batcher thread's) minus trained (the training loop's), per policy; a
    replacement learner starts with none out."""
    state = SharedState(num_workers=1, num_policies=2)
    assert not state.collection_paused(0, 1)
    state.batch_copied(0)
    assert state.collection_paused(0, 1) and not state.collection_paused(0, 2) and not state.collection_paused(1, 1)
    state.batch_copied(0)
    assert state.collection_paused(0, 2)
    state.batch_trained(0)
    assert not state.collection_paused(0, 2) and state.collection_paused(0, 1)
    state.batch_trained(0, all_out=True)  # (a replacement learner: its predecessor's batches died with it)
    assert not state.collection_paused(0, 1)
