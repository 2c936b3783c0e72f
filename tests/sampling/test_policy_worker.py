"""Policy worker in-process: a request (worker, group) writes exactly that group's envs at their (slot, t), and the
reply goes to that worker's queue. Checked against poisoned buffers, for the network and the random-action path."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sf.buffers.shared_weights import SharedWeights
from sf.buffers.trajectory_buffers import TrajectoryBuffers
from sf.cfg import parse_cfg
from sf.ipc import Queue
from sf.model.actor_critic import create_actor_critic
from sf.sampling.policy_worker import PolicyWorker
from sf_envs.registry import make_env

WORKERS, ENVS, SPLITS = 3, 4, 2


@pytest.fixture(params=[False, True], ids=["forward", "random"])
def setup(request):
    cfg = parse_cfg(["--env", "test_corridor", "--num_workers", str(WORKERS), "--num_envs_per_worker", str(ENVS),
                     "--worker_num_splits", str(SPLITS), "--rollout", "8", "--recurrence", "8", "--rnn_size", "16",
                     "--hidden_size", "16", "--random_policy", str(request.param), "--device", "cpu"])
    env = make_env(cfg, 0)
    obs_space, action_space = env.observation_space, env.action_space
    env.close()
    model = create_actor_critic(cfg, obs_space, action_space)
    buffers = TrajectoryBuffers(WORKERS * ENVS + 4, cfg.rollout, obs_space, action_space, model.rnn_state_size)
    weights = SharedWeights(model)
    weights.publish(model, 7)
    rng = np.random.default_rng(0)
    # every env of every worker at a distinct slot and some step t < T
    slots = rng.permutation(buffers.num_slots)[:WORKERS * ENVS].reshape(WORKERS, ENVS)
    env_slots = torch.zeros((WORKERS, ENVS, 2), dtype=torch.int64).share_memory_()
    env_slots[:, :, 0] = torch.from_numpy(slots)
    env_slots[:, :, 1] = torch.from_numpy(rng.integers(0, cfg.rollout, size=(WORKERS, ENVS)))
    buffers.obs["obs"].uniform_()
    for s, t in env_slots.view(-1, 2).tolist():  # each env's current state; the rest stays poison (NaN)
        buffers.rnn_states[s, t] = torch.randn(model.rnn_state_size)
    queues = SimpleNamespace(policy=Queue(), workers=[Queue() for _ in range(WORKERS)])
    pw = PolicyWorker(cfg, obs_space, action_space, buffers, env_slots, queues, weights, "cpu")
    pw.wait_for_weights(lambda: False)
    yield pw, buffers, env_slots, queues
    for q in (queues.policy, *queues.workers):
        q.close()


def test_request_writes_exactly_its_group(setup):
    pw, buffers, env_slots, queues = setup
    requests = [(2, 1), (0, 0)]
    for r in requests:
        queues.policy.put(r)
    served = 0
    while served < len(requests) * ENVS // SPLITS:
        served += pw.run_once(timeout=1.0)
    group = ENVS // SPLITS
    expected = {(int(env_slots[w, e, 0]), int(env_slots[w, e, 1]))
                for w, g in requests for e in range(g * group, (g + 1) * group)}
    written = {(int(s), int(t)) for s, t in zip(*np.nonzero(buffers.policy_versions.numpy() >= 0))}
    assert written == expected  # nothing else touched: the rest is still poison (-1)
    for s, t in expected:
        assert int(buffers.policy_versions[s, t]) == 7
        assert 0 <= int(buffers.actions[s, t, 0]) < 3
        assert torch.isfinite(buffers.log_probs[s, t]) and torch.isfinite(buffers.values[s, t])
        assert torch.isfinite(buffers.rnn_states[s, t + 1]).all()  # the state the next step starts from
    assert queues.workers[2].get(timeout=1) == 1 and queues.workers[0].get(timeout=1) == 0
    assert queues.workers[1].empty()


def serve(cfg, obs_space, action_space, model_state, requests, seed=0):
    """Serve `requests` in one batch of a fresh policy worker over fresh buffers (same contents each call); returns
    the outputs written for worker 0's group 0."""
    torch.manual_seed(seed)
    model = create_actor_critic(cfg, obs_space, action_space)
    model.load_state_dict(model_state)
    workers, envs = cfg.num_workers, cfg.num_envs_per_worker
    buffers = TrajectoryBuffers(2 * workers * envs, cfg.rollout, obs_space, action_space, model.rnn_state_size)
    g = torch.Generator().manual_seed(1)
    buffers.obs["obs"].copy_(torch.randint(0, 256, buffers.obs["obs"].shape, generator=g, dtype=torch.uint8))
    buffers.rnn_states.normal_(generator=g)
    buffers.action_noise.uniform_(generator=g)
    env_slots = torch.zeros((workers, envs, 2), dtype=torch.int64).share_memory_()
    env_slots[:, :, 0] = torch.arange(workers * envs).view(workers, envs)
    env_slots[:, :, 1] = 3
    weights = SharedWeights(model)
    weights.publish(model, 1)
    queues = SimpleNamespace(policy=Queue(), workers=[Queue() for _ in range(workers)])
    pw = PolicyWorker(cfg, obs_space, action_space, buffers, env_slots, queues, weights, "cpu")
    pw.wait_for_weights(lambda: False)
    queues.policy.put_many(requests)
    served = 0
    while served < len(requests) * envs // cfg.worker_num_splits:
        served += pw.run_once(timeout=1.0)
    for q in (queues.policy, *queues.workers):
        q.close()
    rows = env_slots[0, : envs // cfg.worker_num_splits, 0]
    return [t[rows, 3].clone() for t in (buffers.actions, buffers.action_logits, buffers.log_probs, buffers.values,
                                           buffers.rnn_states)]


@pytest.mark.parametrize("mode", ["hts", "ppo"])
def test_sync_mode_outputs_do_not_depend_on_the_batch(mode):
    """In hts/ppo an observation's action, logits, value and next RNN state are the same bits whether it is served
    alone or beside others (chunks of --sync_inference_chunk rows, actions from its env's noise). The same comparison
    in async mode shows that the kernels here do give other bits for other batch sizes (what the chunks are for)."""
    results = {}
    for m in (mode, "async"):
        cfg = parse_cfg(["--env", "test_image", "--num_workers", "4", "--num_envs_per_worker", "6", "--rollout", "8",
                         "--recurrence", "8", "--device", "cpu", "--sync_mode", m, "--sync_inference_chunk", "4",
                         "--train_dir", "/tmp/unused"])
        env = make_env(cfg, 0)
        obs_space, action_space = env.observation_space, env.action_space
        env.close()
        state = create_actor_critic(cfg, obs_space, action_space).state_dict()
        alone = serve(cfg, obs_space, action_space, state, [(0, 0)])
        crowd = serve(cfg, obs_space, action_space, state, [(1, 1), (0, 0), (3, 0), (2, 1), (1, 0)])
        results[m] = [torch.equal(a, b) for a, b in zip(alone, crowd)]
    assert all(results[mode]), results
    assert not all(results["async"][1:]), "the kernels here are batch-invariant: this test cannot show the chunking"


@pytest.mark.parametrize("wait_ms", [0.0, 1000.0])
def test_waits_for_one_request_per_worker_before_its_forward(wait_ms):
    """--policy_worker_batch_wait_ms: a policy worker holding fewer requests than rollout workers waits (up to that
    long) for more, so that one forward serves them together; 0 serves what has arrived. The second request comes
    50 ms after the first, well inside the 1-s wait."""
    import threading
    cfg = parse_cfg(["--env", "test_image", "--num_workers", "2", "--num_envs_per_worker", "4", "--rollout", "8",
                     "--recurrence", "8", "--device", "cpu", "--train_dir", "/tmp/unused",
                     "--policy_worker_batch_wait_ms", str(wait_ms)])
    env = make_env(cfg, 0)
    obs_space, action_space = env.observation_space, env.action_space
    env.close()
    model = create_actor_critic(cfg, obs_space, action_space)
    buffers = TrajectoryBuffers(16, cfg.rollout, obs_space, action_space, model.rnn_state_size)
    env_slots = torch.zeros((2, 4, 2), dtype=torch.int64).share_memory_()
    env_slots[:, :, 0] = torch.arange(8).view(2, 4)
    weights = SharedWeights(model)
    weights.publish(model, 1)
    queues = SimpleNamespace(policy=Queue(), workers=[Queue() for _ in range(2)])
    pw = PolicyWorker(cfg, obs_space, action_space, buffers, env_slots, queues, weights, "cpu")
    pw.wait_for_weights(lambda: False)
    queues.policy.put((0, 0))
    late = threading.Timer(0.05, lambda: queues.policy.put((1, 1)))
    late.start()
    try:
        first = pw.run_once(timeout=1.0)
    finally:
        late.join()
    group = 4 // cfg.worker_num_splits
    assert first == (2 * group if wait_ms else group)  # both groups in one forward, or the first alone
    for q in (queues.policy, *queues.workers):
        q.close()
