"""The learner's CUDA path (tests/gpu/conftest.py skips these, with the reason, where torch sees no CUDA device): SGD
steps that never wait for the device on the host (torch.cuda.set_sync_debug_mode("error") around each), their results
against the CPU's, and the batch's way from shared memory to the device (pinned staging, asynchronous copy) against a
copy still in flight. The CPU side of the same code: tests/learning/test_appo_device_stats.py."""
import pytest
import torch
from gymnasium import spaces

from appo_reference_cases import run_case  # tests/learning
from model_test_helpers import VECTOR_OBS
from sf.buffers.trajectory_buffers import DONES_HOST, GatherStaging, TrajectoryBuffers

pytestmark = pytest.mark.gpu


def no_sync_in_steps(appo):
    """After a first batch (Adam creates its state then, copying step counters from the host), every SGD step runs
    with synchronising CUDA calls turned into errors."""
    step = appo._sgd_step
    appo.checked = 0

    def checked(*args, **kwargs):
        if appo.optimizer.state:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            appo.checked += 1
        try:
            return step(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    appo._sgd_step = checked


@pytest.mark.parametrize("case, rnn", [("feed_forward", False), ("own_none", False), ("stale", False),
                                       ("nonfinite", False), ("default", False), ("default", True),
                                       ("truncated", True)])
def test_sgd_steps_on_cuda_never_synchronise(case, rnn):
    """feed_forward: minibatches over epochs and the truncation bootstrap; own_none, stale, nonfinite: a population's
    lag stats and the steps skipped on the device; default and truncated with the RNN: its episode cuts come from the
    batch's dones in host memory (DONES_HOST, as the learner's gather provides them), 2 minibatches and 1."""
    from appo_reference_cases import CASES
    before = dict(CASES[case])
    CASES[case]["use_rnn"] = rnn
    try:
        stats, _, appo = run_case(case, "cuda", configure=no_sync_in_steps)
    finally:
        CASES[case].clear()
        CASES[case].update(before)
    assert appo._sync_free_steps() and appo.checked >= 2 and all(isinstance(s["loss"], float) for s in stats)


@pytest.mark.parametrize("case", ["default", "feed_forward", "truncated", "own", "nonfinite"])
def test_cuda_training_matches_the_cpu(case):
    """Fused Adam on the device vs torch's default Adam on CPU, float32 kernels of either: the same statistics and
    weights within rounding (TF32 off for the comparison)."""
    allow = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        ref, ref_model, _ = run_case(case, "cpu")
        stats, model, appo = run_case(case, "cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = allow
    assert appo.optimizer.param_groups[0]["fused"] is True
    ahead = 0.0  # versions CUDA counted for steps it skipped on the device (nonfinite): its lags that much higher
    for s, r in zip(stats, ref):
        for k in ("masked_fraction", "num_samples"):
            assert s[k] == r[k], k
        assert s["lag_avg"] == r["lag_avg"] + ahead
        ahead = s["policy_version"] - r["policy_version"]
        for k in ("loss", "value_loss", "entropy", "grad_norm", "kl_divergence", "clip_fraction"):
            assert s[k] == pytest.approx(r[k], rel=1e-3, abs=1e-5, nan_ok=True), k
    ref_params = dict(ref_model.named_parameters())
    for name, p in model.cpu().named_parameters():
        torch.testing.assert_close(p, ref_params[name], rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("case", ["own", "own_none"])
def test_input_normalizer_of_own_steps_on_cuda(case):
    """A population's batch on the device: the input normalizer learns the steps this policy acted (selected by the
    own mask on the GPU), the CPU's statistics within rounding."""
    _, ref_model, _ = run_case(case, "cpu")
    _, model, _ = run_case(case, "cuda")
    ref_buffers = dict(ref_model.named_buffers())
    normalizer = {name: b for name, b in model.cpu().named_buffers() if "obs_normalizer" in name}
    assert normalizer and float(normalizer[next(n for n in normalizer if n.endswith("count"))]) > 0
    for name, b in normalizer.items():
        torch.testing.assert_close(b, ref_buffers[name], rtol=1e-5, atol=1e-6)


def _filled_buffers(num_slots=6, rollout=4):
    buffers = TrajectoryBuffers(num_slots, rollout, VECTOR_OBS, spaces.Discrete(3), 8)
    g = torch.Generator().manual_seed(0)
    for t in buffers.all_tensors():
        t.copy_(torch.randint(0, 100, t.shape, generator=g).to(t.dtype))
    return buffers


def _assert_equal_trees(a, b):
    """a (a CUDA batch, with its host dones) against b (the same trajectories gathered on the host)."""
    if DONES_HOST in a:
        assert a[DONES_HOST].device.type == "cpu" and torch.equal(a[DONES_HOST], b["dones"].cpu())
    for k, v in a.items():
        if k == DONES_HOST:
            continue
        if isinstance(v, dict):
            _assert_equal_trees(v, b[k])
        else:
            assert torch.equal(v.cpu(), b[k].cpu()), k


def test_gather_on_cuda_frees_the_slots_at_return_and_reuses_staging_only_after_its_copy():
    """The copy to the device is held back on the side stream (a sleeping kernel) while the host goes on: the slots
    are overwritten at once (collect releases them without waiting for the device) and the same staging set is filled
    again (depth 1): the batch on the device is still the slots' contents at gather time."""
    buffers = _filled_buffers()
    first, second = torch.tensor([4, 1, 5]), torch.tensor([0, 2, 3])
    expected = buffers.gather_into(first)
    staging = GatherStaging(buffers, 3, torch.device("cuda"), depth=1)
    with torch.cuda.stream(staging.stream):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of device time before the copy may start
    batch = staging.to_device(buffers.gather_into(first, staging.acquire()))
    buffers.poison()  # the slots are reused at once
    again = staging.to_device(buffers.gather_into(second, staging.acquire()))  # waits for the first copy
    _assert_equal_trees(batch, expected)
    assert torch.isnan(again["rewards"]).all()  # the poisoned slots


def test_learner_gather_on_cuda_is_the_cpu_gather():
    buffers = _filled_buffers()
    slots = torch.tensor([3, 0, 5, 2])
    for _ in range(3):  # the staging sets in turn
        batch = buffers.gather(slots, "cuda")
        assert batch["rewards"].is_cuda and buffers._staging.sets[0]["rewards"].is_pinned()
        _assert_equal_trees(batch, buffers.gather(slots, "cpu"))
