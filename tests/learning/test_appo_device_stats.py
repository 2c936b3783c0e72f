"""APPO.train's statistics read on the host once per batch, its CUDA path free of host reads inside SGD steps, and the
learner's gather of a batch: what can be checked on CPU (tests/gpu/test_learner_cuda.py checks the CUDA side).

The reference values (tests/learning/appo_reference_values.json, written by tests/learning/appo_reference_cases.py)
were first taken as digests of the code before the stats became device tensors (the host read each step's stats with
.tolist() and decided skips by bool()); the CPU path gave the same stats and weights bit for bit. They are compared
within rounding: another CPU's float32 kernels give other bits (see appo_reference_cases.py)."""
import json
import traceback

import pytest
import torch
from gymnasium import spaces
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from appo_reference_cases import CASES, REFERENCE_FILE, digest, reference_values, run_case
from model_test_helpers import VECTOR_OBS
from sf.buffers.trajectory_buffers import TrajectoryBuffers

REFERENCES = json.loads(REFERENCE_FILE.read_text())


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # (the references: one thread's reduction order)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("case", sorted(REFERENCES))
def test_cpu_stats_and_weights_are_those_of_the_per_step_host_reads(case):
    stats, model, appo = run_case(case)
    assert not appo._sync_free_steps()
    got, want = reference_values(stats, model), REFERENCES[case]
    assert len(got["stats"]) == len(want["stats"])
    for step, (g, w) in enumerate(zip(got["stats"], want["stats"])):
        assert g == pytest.approx(w, rel=1e-4, abs=1e-6, nan_ok=True), f"step {step}"
    assert got["weights"].keys() == want["weights"].keys()
    for name, w in want["weights"].items():
        assert got["weights"][name] == pytest.approx(w, rel=1e-4, abs=1e-6), name


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


@pytest.mark.parametrize("case", ["default", "own_none", "feed_forward", "nonfinite", "stale", "samples"])
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
