"""A run resumes on either device: the minibatch order's generator lives on the host whatever the learner's device (a
CUDA generator's 16-byte state cannot be loaded into a CPU one, nor a CPU one's 5,056 bytes into a CUDA one: resuming a
CUDA run on the CPU, or any CPU checkpoint on CUDA, crashed the learner), a checkpoint that holds a CUDA generator's
state still resumes, and the optimizer state a CUDA run saves (fused Adam, step counts as float32 tensors) resumes on
the host path. On CPU: nothing here needs a GPU (tests/gpu/test_gpu_path.py resumes CUDA -> CPU -> CUDA for real)."""
import logging

import pytest
import torch

from sf.learning.appo import APPO
from model_test_helpers import random_experience
from test_appo import setup
from test_learner_population import ROLLOUT, Population, pop  # noqa: F401  (pop: the fixture)


def test_the_minibatch_order_is_drawn_on_the_host_for_every_device():
    """APPO for a CUDA learner is built without touching CUDA (this machine has none) and draws its order from a host
    generator in the very state a CPU learner's has: its checkpoints hold that state on either device."""
    cfg, model, _ = setup(n=8, t=4)
    on_cpu, for_cuda = APPO(model, cfg, "cpu"), APPO(model, cfg, "cuda")
    assert for_cuda.generator.device.type == "cpu"
    assert torch.equal(for_cuda.generator.get_state(), on_cpu.generator.get_state())
    assert on_cpu.generator.get_state().numel() == 5056  # the state checkpoints hold


def test_the_permutation_is_the_one_torch_draws_from_the_generator():
    """The order itself is unchanged on the CPU (the digests of earlier runs hold): torch.randperm from the
    generator."""
    cfg, model, _ = setup(n=8, t=4)
    appo = APPO(model, cfg, "cpu")
    reference = torch.Generator().manual_seed(123)
    appo.generator.manual_seed(123)
    for n in (1, 7, 64):
        assert torch.equal(appo._permutation(n, torch.device("cpu")), torch.randperm(n, generator=reference))


def _cuda_generator_state() -> torch.Tensor:
    """What a CUDA generator's get_state() returns: 16 bytes, its seed and its offset (int64 each)."""
    return torch.tensor([42, 0], dtype=torch.int64).view(torch.uint8)


def test_a_cuda_generators_state_seeds_the_host_generator_deterministically():
    cfg, model, _ = setup(n=8, t=4)
    a, b = APPO(model, cfg, "cpu"), APPO(model, cfg, "cpu")
    assert a.load_minibatch_rng(_cuda_generator_state()) is False
    assert b.load_minibatch_rng(_cuda_generator_state()) is False
    assert torch.equal(torch.randperm(32, generator=a.generator), torch.randperm(32, generator=b.generator))
    saved = a.generator.get_state()
    assert b.load_minibatch_rng(saved) is True and torch.equal(b.generator.get_state(), saved)


def _batch(pop, model, version: int = 0) -> dict:  # noqa: F811  (pop: the fixture's value)
    """4 trajectories of the corridor acted by `model` (storage layout)."""
    return random_experience(model, pop.obs_space, pop.action_space, 4, ROLLOUT, policy_version=version)


@pytest.mark.parametrize("fused", [False, True], ids=["adam", "fused_adam"])
def test_a_checkpoint_of_a_cuda_run_resumes_on_the_host(pop, caplog, fused):  # noqa: F811
    """A checkpoint as a CUDA run writes it (a CUDA generator's state; with sync-free steps, fused Adam's float32 step
    counts and param groups saying fused) resumes on this CPU learner: it loads, says so in one line, and trains."""
    first = pop(policies=1)
    learner = first.learners[0]
    appo = learner.appo
    if fused:  # what a CUDA learner's steps leave in the optimizer (APPO._sync_free_steps)
        appo.sync_free = True
    appo.train(_batch(first, learner.model), policy_version=0)
    if fused:
        assert appo.optimizer.param_groups[0]["fused"] is True
    learner.save()
    path = sorted((first.exp_dir / "checkpoint_p0").glob("checkpoint_*.pth"))[-1]
    state = torch.load(path, weights_only=True)
    state["minibatch_rng"] = _cuda_generator_state()
    torch.save(state, path)

    with caplog.at_level(logging.INFO, logger="sf.learner"):
        resumed_pop = Population(first.exp_dir.parent, "--restart_behavior", "resume", policies=1)
    try:
        resumed = resumed_pop.learners[0]
        assert resumed.version == learner.version
        assert "the minibatch order's generator state is a CUDA generator's" in caplog.text
        stats = resumed.appo.train(_batch(resumed_pop, resumed.model, resumed.version), policy_version=resumed.version)
        assert len(stats) >= 1 and all(torch.isfinite(p).all() for p in resumed.model.parameters())
        for group in resumed.appo.optimizer.param_groups:  # the host path's Adam: step counts on the host
            assert group.get("fused") is None
            for p in group["params"]:
                step = resumed.appo.optimizer.state[p]["step"]
                assert step.device.type == "cpu" and step.dtype == torch.float32
    finally:
        resumed_pop.close()
