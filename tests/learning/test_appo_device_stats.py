"""APPO.train's statistics read on the host once per batch, its CUDA path free of host reads inside SGD steps, and the
learner's gather of a batch: what can be checked on CPU (tests/gpu/test_learner_cuda.py checks the CUDA side).

The digests below were computed by tests/learning/appo_reference_cases.py on the code before the stats became device
tensors (the host read each step's stats with .tolist() and decided skips by bool()): the CPU path gives the same
stats and weights bit for bit."""
import traceback

import pytest
import torch
from gymnasium import spaces
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from appo_reference_cases import CASES, digest, run_case
from model_test_helpers import VECTOR_OBS
from sf.buffers.trajectory_buffers import TrajectoryBuffers

DIGESTS = {
    "default": "07eeb25a11662fd4062a03d9120214370618ebedbe31da4bb5c66d34e9924469",
    "lag": "aecde752ce3f01c5bca45f837e08920cb366f275ef9c5b06fbe4f477b3bddf66",
    "stale": "1171b2dfd285b214726dec090b1a71bb0e7798ebf4f35bc225d60f79c6d7bd26",
    # own, own_none: taken again when the input normalizer stopped learning other policies' steps (2026-11-26)
    "own": "4e2765e6f72af85200dfb4e444727bebdeb1a151860daec37ddfe5a0d895d890",
    "own_none": "39cc92da9ff7eaf801e12c53bbbd9ada277d10e3dfd8d5d2d53012bf0fb7fe35",
    "truncated": "f56251aebb58f86d5cb259d68c8e611c6b62b0ada4c4d85963790e6c3cab4a98",
    "gae_truncated": "8a76a67426ed5212b040c56ac8100c11f23aa44723080d611068456c8cc37d49",
    "nonfinite": "71c1d4745de22a8f853aa74b7022ff1bc08b3189404fe9681137ed091d471657",
    "normalize_returns": "58a778512f3a263aeb0bb64b0b68a0ef27068acac7e8de86c8196c2edb7c3b8f",
    "symmetric_kl_kl_penalty": "e703e0e7ac74f2f88efc5767d8ca0cb89eaa7d921f4d16c63133900adfd23f93",
    "kl_adaptive": "3f98d7b7cc022e451f8f82966cc7a9b1ba0cf95656a1ac15289b788e2353e8fd",
    "lamb": "60f60e9dfc38e298a4313744798be67f68da9eac55ef78e833c4a5ad3e59364e",
}


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # (the digests: one thread's reduction order)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("case", sorted(DIGESTS))
def test_cpu_stats_and_weights_are_those_of_the_per_step_host_reads(case):
    stats, model, appo = run_case(case)
    assert not appo._sync_free_steps()
    assert digest(stats, model) == DIGESTS[case]


# --- the sync-free path, forced on CPU: what it would read on the host on CUDA ------------------------------------

HOST_READS = {"__bool__", "__float__", "__int__", "__index__", "item", "tolist", "numpy", "cpu"}
# ops whose result (or shape) depends on tensor values: on CUDA the host waits for the device
DATA_DEPENDENT = {"aten.nonzero.default", "aten.masked_select.default", "aten._local_scalar_dense.default",
                  "aten.equal.default", "aten.is_nonzero.default", "aten.unique_dim.default",
                  "aten._unique2.default"}
# host reads outside the SGD step code of sf/learning/appo.py, known and left (see docs/benchmarks.md)
KNOWN = {"model/cores.py:sequence",  # the RNN's segments between episode ends (their positions)
         "model/normalization.py:update",  # --normalize_returns' valid targets, populations' own steps: selected
         "learning/losses.py:symmetric_kl_loss",  # --exploration_loss symmetric_kl: a non-finite mean is dropped
         "learning/appo.py:_schedule_kl"}  # kl_adaptive_* schedules: the step's KL decides the next rate


def _where() -> str:
    for frame in reversed(traceback.extract_stack()):  # the innermost frame of the project
        if "/sf/" in frame.filename:
            return f"{frame.filename.split('/sf/')[1]}:{frame.name}"
    return "?"


class _Reads(TorchFunctionMode):
    def __init__(self, log):
        super().__init__()
        self.log = log

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in HOST_READS:
            self.log.add(_where())
        return func(*args, **(kwargs or {}))


class _DataDependentOps(TorchDispatchMode):
    def __init__(self, log):
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name in DATA_DEPENDENT or (name == "aten.index.Tensor" and any(
                i is not None and i.dtype == torch.bool for i in args[1])):  # a mask index: nonzero inside
            self.log.add(_where())
        return func(*args, **(kwargs or {}))


def sync_free_recorded(appo):
    """Force the sync-free path on CPU and record where each SGD step reads a device value on the host."""
    appo.sync_free = True
    appo.reads = set()
    step = appo._sgd_step

    def recorded(*args, **kwargs):
        with _Reads(appo.reads), _DataDependentOps(appo.reads):
            return step(*args, **kwargs)
    appo._sgd_step = recorded


@pytest.mark.parametrize("case", [c for c in CASES if c != "lamb"])
def test_sync_free_steps_read_nothing_on_the_host(case):
    _, _, appo = run_case(case, configure=sync_free_recorded)
    assert appo.reads <= KNOWN, appo.reads - KNOWN
    if case == "feed_forward":  # no RNN, entropy bonus, constant rate: nothing at all
        assert appo.reads == set()


@pytest.mark.parametrize("case", ["default", "own_none", "feed_forward", "nonfinite", "stale"])
def test_sync_free_steps_skip_on_the_device_what_the_host_skips(case):
    """The forced sync-free path (fused Adam taking found_inf) against the host path: the same statistics up to the
    optimizers' rounding, steps without valid samples or with a non-finite gradient skipped (every step counted)."""
    ref, ref_model, _ = run_case(case)
    stats, model, appo = run_case(case, configure=lambda a: setattr(a, "sync_free", True))
    assert appo.optimizer.param_groups[0]["fused"] is True
    assert len(stats) == len(ref) and stats[-1]["policy_version"] == 4 + len(stats)  # every step counted
    ref_params = dict(ref_model.named_parameters())
    if case != "stale":  # (stale: the skipped steps' versions age the second batch differently)
        ahead = 0.0  # versions the sync-free path counted for skipped steps before this one: lags that much higher
        for s, r in zip(stats, ref):
            for k in ("masked_fraction", "num_masked", "lr"):
                assert s[k] == r[k], k
            assert s["lag_avg"] == r["lag_avg"] + ahead
            ahead = s["policy_version"] - r["policy_version"]
            for k in ("loss", "value_loss", "entropy", "grad_norm", "kl_divergence"):
                assert s[k] == pytest.approx(r[k], rel=1e-4, abs=1e-6, nan_ok=True), k
        for name, p in model.named_parameters():
            torch.testing.assert_close(p, ref_params[name], rtol=1e-4, atol=1e-6)
    else:  # the first batch's fully stale minibatches leave the weights exactly where they were
        assert [s["masked_fraction"] for s in stats[:3]] == [r["masked_fraction"] for r in ref[:3]] == [1.0, 0.0, 1.0]
        assert [s["grad_norm"] for s in stats[:3:2]] == [0.0, 0.0] and [s["loss"] for s in stats[:3:2]] == [0.0, 0.0]
        assert stats[1]["loss"] == pytest.approx(ref[1]["loss"], rel=1e-6)


def test_a_loaded_fused_state_goes_back_to_the_host_path():
    """A checkpoint from a CUDA run carries Adam's fused setting: the host path (CPU) sets its own before a step."""
    _, _, cuda_like = run_case("default", configure=lambda a: setattr(a, "sync_free", True))
    ref, ref_model, _ = run_case("default")
    stats, model, appo = run_case("default", configure=lambda a: a.optimizer.load_state_dict(
        _fresh_state_like(cuda_like.optimizer, a.optimizer)))
    assert appo.optimizer.param_groups[0]["fused"] is None
    assert digest(stats, model) == digest(ref, ref_model)


def _fresh_state_like(fused_optimizer, optimizer) -> dict:
    """`optimizer`'s (empty) state with the param groups' settings of `fused_optimizer` (fused: True)."""
    state = optimizer.state_dict()
    state["param_groups"][0]["fused"] = fused_optimizer.param_groups[0]["fused"]
    return state


# --- the learner's gather ------------------------------------------------------------------------------------------

def test_cpu_gather_is_the_staging_layout_filled_on_the_host():
    """On CPU the batch is gather_into's host tensors (the gather CUDA runs into pinned staging, then copies): the
    same layout and bits as gather_into a staging set, each trajectory that of its slot; action noise stays behind."""
    buffers = TrajectoryBuffers(6, 4, VECTOR_OBS, spaces.Discrete(3), 8)
    g = torch.Generator().manual_seed(0)
    for t in buffers.all_tensors():
        t.copy_(torch.randint(0, 100, t.shape, generator=g).to(t.dtype))
    slots = torch.tensor([4, 1, 5])
    batch = buffers.gather(slots, "cpu")
    staging = _tree_map(buffers.gather_into(torch.zeros(0, dtype=torch.int64)),
                        lambda t: torch.full((3, *t.shape[1:]), 7, dtype=t.dtype))
    filled = buffers.gather_into(slots, staging)
    assert "action_noise" not in batch and all(  # gathered in place: the staging set's own memory
        t.data_ptr() == _tree_items(staging)[k].data_ptr() for k, t in _tree_items(filled).items())
    assert _tree_items(batch).keys() == _tree_items(staging).keys()
    for key, tensor in _tree_items(batch).items():
        assert tensor.dtype == _tree_items(staging)[key].dtype and torch.equal(tensor, _tree_items(staging)[key]), key
        source = _tree_items({"obs": buffers.obs, "final_obs": buffers.final_obs, **buffers.step_tensors()})[key]
        for row, slot in enumerate(slots.tolist()):
            assert torch.equal(tensor[row], source[slot]), key
    buffers.poison()  # the slots are free once gather returned: the batch is a copy
    assert not torch.isnan(batch["rewards"]).any()
    assert "_staging" not in buffers.__getstate__()


def _tree_map(tree, fn):
    return {k: _tree_map(v, fn) if isinstance(v, dict) else fn(v) for k, v in tree.items()}


def _tree_items(tree, prefix="") -> dict:
    out = {}
    for k, v in tree.items():
        out.update(_tree_items(v, f"{prefix}{k}/") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


@pytest.mark.parametrize("case", ["default", "truncated"])
def test_host_dones_give_the_same_training(case):
    """A batch carrying its dones in host memory (DONES_HOST, as a CUDA learner's gather gives it), here on the CPU:
    one minibatch (truncated) trains to the same bits as without; two (default) cut each minibatch where any
    trajectory of the batch ended, the same function within rounding."""
    from appo_reference_cases import T, N, SMALL, _batch
    from model_test_helpers import make_cfg
    from sf.buffers.trajectory_buffers import DONES_HOST
    from sf.learning.appo import APPO
    from sf.model.actor_critic import create_actor_critic
    results = []
    for host in (False, True):
        torch.manual_seed(0)
        cfg = make_cfg(**SMALL, rollout=T, recurrence=T,
                       batch_size=N * T // CASES[case].get("num_batches_per_epoch", 1), **CASES[case])
        model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
        exp, version = _batch(case, cfg, model)
        assert exp["dones"].any()
        if host:
            exp[DONES_HOST] = exp["dones"].clone()
        stats = APPO(model, cfg, "cpu").train(exp, version)
        results.append((stats, dict(model.named_parameters())))
    (ref, ref_params), (got, params) = results
    for s, r in zip(got, ref):
        for k in ("loss", "value_loss", "entropy", "grad_norm", "kl_divergence"):
            if case == "truncated":
                assert s[k] == r[k] or (s[k] != s[k] and r[k] != r[k]), k
            else:
                assert s[k] == pytest.approx(r[k], rel=1e-4, abs=1e-6, nan_ok=True), k
    for name, p in params.items():
        torch.testing.assert_close(p, ref_params[name], rtol=0 if case == "truncated" else 1e-4,
                                   atol=0 if case == "truncated" else 1e-6)
