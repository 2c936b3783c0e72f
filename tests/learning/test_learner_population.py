"""A population's learners in this process, with the runner's side of population-based training: real learners, real
shared weights and shared state, the runner's PopulationControl and TensorBoard writer. A weight copy lands whole or
not at all, is retried while its source cannot be read whole, is abandoned with a report after a bounded time, and a
second request is never lost; the hyperparameters in force (the optimizer's) are the ones recorded (SharedState,
pbt_state.json, TensorBoard), and a resumed learner takes the configuration's, not the checkpoint's."""
import copy
import json
import threading
import time
from types import SimpleNamespace

import pytest
import torch

import sf.learning.learner as learner_module
from sf.buffers.shared_weights import SharedWeights
from sf.buffers.trajectory_buffers import TrajectoryBuffers
from sf.cfg import parse_cfg
from sf.ipc import Queue
from sf.learning.learner import Learner
from sf.model.actor_critic import create_actor_critic
from sf.processes.shared_state import ENV_STEPS, SharedState
from sf.runner.population.control import PopulationControl, fill_shared, initial_hyperparams, record, request_copy
from sf.runner.stats import RunStats, read_event_scalars
from sf_envs.registry import make_env

ROLLOUT = 8


def make_cfg(tmp_path, *flags, policies=3):
    return parse_cfg(["--env", "test_corridor", "--experiment", "pop", "--train_dir", str(tmp_path), "--num_workers",
                      "1", "--num_envs_per_worker", "2", "--rollout", str(ROLLOUT), "--recurrence", str(ROLLOUT),
                      "--use_rnn", "False", "--hidden_size", "16", "--encoder_mlp_layers", "16", "--batch_size",
                      str(ROLLOUT * 2), "--device", "cpu", "--seed", "5", "--num_policies", str(policies), *flags])


class Population:
    """P learners (policy p's own seed: different initial weights) over shared weights and one SharedState, as the
    runner builds them; nothing else runs."""

    def __init__(self, tmp_path, *flags, policies=3, learners=None):
        self.cfg = cfg = make_cfg(tmp_path, *flags, policies=policies)
        self.exp_dir = tmp_path / "pop"
        env = make_env(cfg, 0)
        self.obs_space, self.action_space = env.observation_space, env.action_space
        env.close()
        model = create_actor_critic(cfg, self.obs_space, self.action_space)
        self.buffers = TrajectoryBuffers(4 * policies, ROLLOUT, self.obs_space, self.action_space, model.rnn_state_size)
        self.weights = [SharedWeights(model) for _ in range(policies)]
        self.state = SharedState(1, 1, policies, num_slots=4 * policies)
        fill_shared(self.state, [initial_hyperparams(cfg, {})] * policies)  # as the runner does before any learner
        self.report = Queue(max_size_bytes=2**22)
        self.queues = [SimpleNamespace(learner=Queue(), free=Queue(), report=self.report) for _ in range(policies)]
        self.learners = {p: self.learner(p) for p in (range(policies) if learners is None else learners)}

    def learner(self, p):
        return Learner(self.cfg, self.obs_space, self.action_space, self.buffers, self.queues[p], self.weights[p],
                       self.state, "cpu", self.exp_dir, frameskip=1, policy_id=p, all_weights=self.weights)

    def reports(self):
        try:
            return [tuple(m) for m in self.report.get_many(timeout=0.0)]
        except Exception:  # empty
            return []

    def close(self):
        for q in self.queues:
            q.learner.close()
            q.free.close()
        self.report.close()


@pytest.fixture
def pop(tmp_path):
    made = []

    def build(*flags, **kw):
        made.append(Population(tmp_path, *flags, **kw))
        return made[-1]

    yield build
    for p in made:
        p.close()


def published(weights: SharedWeights, like: torch.nn.Module) -> dict:
    """The state_dict `weights` holds now (read through its public API into a copy of `like`)."""
    probe = copy.deepcopy(like)
    assert weights.load_into(probe, -1) >= 0
    return {k: v.clone() for k, v in probe.state_dict().items()}


def assert_bitwise_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def adam_step(learner):
    """One optimizer step, so that Adam holds moments (a copy must reset them, an abandoned copy must not)."""
    opt = learner.appo.optimizer
    opt.zero_grad()
    sum(p.sum() for p in learner.appo.params).backward()
    opt.step()
    assert opt.state


def adam_moments(learner) -> dict:
    return {i: {k: v.clone() for k, v in s.items()} for i, s in learner.appo.optimizer.state_dict()["state"].items()}


class HeldPublish:
    """A publish of `weights` in progress: begun (the sequence lock is odd) and held until release() (a learner that
    stalls or died while writing, seen from the readers)."""

    def __init__(self, weights: SharedWeights, model: torch.nn.Module, version: int):
        self.go = threading.Event()
        outer = self

        class Held(torch.nn.Module):  # publish() reads the model's state_dict after it marked the copy as begun
            def __init__(self):
                super().__init__()
                self.inner = model

            def state_dict(self, *a, **kw):
                outer.go.wait(30)
                return self.inner.state_dict(*a, **kw)

        self.thread = threading.Thread(target=weights.publish, args=(Held(), version), daemon=True)
        self.thread.start()
        probe = copy.deepcopy(model)
        deadline = time.monotonic() + 10
        while weights.load_into(probe, -1) >= 0:  # the reader sees a publish in progress: nothing whole to read
            assert time.monotonic() < deadline, "the held publish never began"

    def release(self):
        self.go.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


def test_copy_from_a_source_that_never_published_is_abandoned_without_touching_the_target(pop, monkeypatch):
    """(a) The source has published nothing: the copy stays pending (retried), then is abandoned with a report: no Adam
    reset, no version bump, the target's published weights unchanged, the request counted as handled."""
    monkeypatch.setattr(learner_module, "PBT_COPY_WAIT_SEC", 0.3)
    pop = pop(policies=2, learners=[0])  # policy 1 has no learner: it never publishes
    target = pop.learners[0]
    adam_step(target)
    moments = adam_moments(target)
    version, before = target.version, published(pop.weights[0], target.model)
    request_copy(pop.state, 0, 1)
    target.apply_population_updates()
    assert pop.reports() == [] and target.copy_pending is not None  # pending: tried again later
    deadline = time.monotonic() + 10
    while target.copy_pending is not None:
        assert time.monotonic() < deadline
        target.apply_population_updates()
    assert pop.reports() == [("pbt_copy_abandoned", 0, 1, "it has published no weights")]
    assert target.version == version == pop.weights[0].version
    assert_bitwise_equal(published(pop.weights[0], target.model), before)
    after = adam_moments(target)
    assert after.keys() == moments.keys()
    for i, s in after.items():
        assert s.keys() == moments[i].keys() and all(torch.equal(v, moments[i][k]) for k, v in s.items())
    assert pop.state.copy_requests[0].tolist() == [1, 1]


def test_copy_from_a_source_mid_publish_waits_then_lands_whole(pop):
    """(b, c) The source is writing its weights (longer than a reader waits for it): the copy stays pending, nothing of
    the target changes; once the publish completes, the next try copies: the target publishes, as its next version,
    weights bitwise equal to the source's at the version reported, with fresh Adam moments."""
    pop = pop(policies=2)
    target, source = pop.learners[0], pop.learners[1]
    adam_step(target)
    torch.manual_seed(123)
    newer = copy.deepcopy(source.model)
    for p in newer.parameters():
        p.data.normal_()
    held = HeldPublish(pop.weights[1], newer, 7)
    try:
        version, before = target.version, published(pop.weights[0], target.model)
        request_copy(pop.state, 0, 1)
        target.apply_population_updates()
        target.apply_population_updates()
        assert pop.reports() == [] and target.version == version and target.appo.optimizer.state
        assert_bitwise_equal(published(pop.weights[0], target.model), before)  # (nothing torn got in)
    finally:
        held.release()
    target.apply_population_updates()
    assert pop.reports() == [("pbt_copied", 0, 1, 7, version + 1)]
    assert pop.weights[0].version == target.version == version + 1
    assert_bitwise_equal(published(pop.weights[0], target.model), published(pop.weights[1], source.model))
    assert_bitwise_equal(published(pop.weights[1], source.model), newer.state_dict())
    assert not target.appo.optimizer.state
    assert pop.state.copy_requests[0].tolist() == [1, 1] and target.copy_pending is None


def test_two_copy_requests_back_to_back_the_later_wins(pop):
    """(e) A second decision for the same policy while the first is pending (its source mid-publish) is not lost: the
    later decision's source is copied, once; a request after that is copied again."""
    pop = pop(policies=3)
    target = pop.learners[0]
    version = target.version
    held = HeldPublish(pop.weights[1], pop.learners[1].model, 50)
    try:
        request_copy(pop.state, 0, 1)
        target.apply_population_updates()  # pending: policy 1 is writing
        request_copy(pop.state, 0, 2)
        target.apply_population_updates()
    finally:
        held.release()
    assert pop.reports() == [("pbt_copied", 0, 2, pop.weights[2].version, version + 1)]
    assert_bitwise_equal(published(pop.weights[0], target.model), published(pop.weights[2], target.model))
    assert pop.state.copy_requests[0].tolist() == [2, 2]
    target.apply_population_updates()
    assert pop.reports() == []  # handled: policy 1's finished publish does not bring the first request back

    request_copy(pop.state, 0, 2)  # both decided before the learner looks: the later wins as well
    request_copy(pop.state, 0, 1)
    target.apply_population_updates()
    assert pop.reports() == [("pbt_copied", 0, 1, 50, version + 2)]
    assert_bitwise_equal(published(pop.weights[0], target.model), published(pop.weights[1], target.model))
    assert pop.state.copy_requests[0].tolist() == [4, 4]


def test_hyperparameters_in_force_are_the_recorded_ones(pop, tmp_path):
    """(d) The runner's PBT decides (policy 1 mutates every hyperparameter, policy 2 copies policy 0): after the
    learners applied the decisions, each optimizer's learning rate and Adam beta1 and each entropy coefficient equal
    SharedState.hyperparams, pbt_state.json and the p{i}/pbt/ TensorBoard scalars; policy 2 holds policy 0's weights."""
    pop = pop("--with_pbt", "True", "--pbt_period_env_steps", "100", "--pbt_start_mutation", "100",
              "--pbt_mutation_rate", "1.0", "--pbt_replace_reward_gap", "0.0", "--pbt_perturb_min", "1.5",
              "--pbt_perturb_max", "1.5", policies=3)
    control = PopulationControl(pop.cfg, pop.exp_dir, {})
    stats = RunStats(pop.exp_dir, 10, 1, num_policies=3)
    fill_shared(pop.state, control.hyperparams())
    record(stats, control.hyperparams())
    stats.add_episodes([{"policy": p, "reward": 1.0 - 0.5 * p} for p in range(3)])  # 0 best, 2 worst
    for p in range(3):
        pop.state.learner[p, ENV_STEPS] = 100
    control.step(pop.state, stats)
    kinds = [d["kind"] for d in control.pbt.history]
    assert sorted(kinds) == ["mutate", "replace"], kinds
    for learner in pop.learners.values():
        learner.apply_population_updates()
    assert pop.reports() == [("pbt_copied", 2, 0, pop.weights[0].version, 1)]
    assert_bitwise_equal(published(pop.weights[2], pop.learners[2].model),
                         published(pop.weights[0], pop.learners[0].model))
    stats.write_summaries()
    stats.close()
    scalars = read_event_scalars(pop.exp_dir)
    saved = json.loads((pop.exp_dir / "pbt_state.json").read_text())["hyperparams"]
    for p, learner in pop.learners.items():
        group = learner.appo.optimizer.param_groups[0]
        in_force = {"learning_rate": group["lr"], "exploration_loss_coeff": learner.appo.exploration_loss_coeff,
                    "adam_beta1": group["betas"][0]}
        assert list(in_force.values()) == pop.state.hyperparams[p].tolist()
        assert in_force == control.pbt.hyperparams(p) == saved[p]
        for k, v in in_force.items():  # (TensorBoard stores float32)
            assert scalars[f"p{p}/pbt/{k}"][-1][1] == pytest.approx(v, rel=1e-6)
        assert group["betas"][1] == pop.cfg.adam_beta2 and group["eps"] == pop.cfg.adam_eps
    assert control.pbt.hyperparams(1)["learning_rate"] != pop.cfg.learning_rate  # policy 1 did mutate


def train_one_batch(learner, buffers):
    """One training batch of plausible data through the learner's own path (collect + train)."""
    for t in buffers.all_tensors():
        if t.dtype.is_floating_point:
            t.uniform_(0, 1)
    buffers.actions.fill_(1)
    buffers.policy_versions.fill_(learner.version)
    buffers.policy_ids.fill_(learner.policy_id)
    buffers.final_t.fill_(-1)
    buffers.dones.fill_(0)
    buffers.truncated.fill_(0)
    learner.queues.learner.put_many(list(range(learner.trajs_per_batch)))
    assert learner.run_once(timeout=5.0)


@pytest.mark.parametrize("mode", ["async", "hts"])
def test_resumed_learner_trains_with_the_configurations_hyperparameters(tmp_path, mode):
    """A checkpoint saved with one learning rate, Adam betas and eps; the run resumed with others (what parse_cfg
    resolved from the flags): the optimizer holds the new values, before and after a training batch, and so does the
    next checkpoint."""
    from sf.learning.checkpoint_store import CheckpointManager
    flags = ["--sync_mode", mode]
    first = Population(tmp_path, "--learning_rate", "1e-3", "--adam_beta1", "0.9", "--adam_eps", "1e-6", *flags,
                       policies=1)
    try:
        train_one_batch(first.learners[0], first.buffers)
        first.learners[0].save()
    finally:
        first.close()
    resumed = Population(tmp_path, "--learning_rate", "5e-4", "--adam_beta1", "0.8", "--adam_beta2", "0.99",
                         "--adam_eps", "1e-7", "--exploration_loss_coeff", "0.01", *flags, policies=1)
    try:
        learner = resumed.learners[0]
        assert learner.version > 0  # resumed
        wanted = {"learning_rate": 5e-4, "adam_beta1": 0.8, "adam_beta2": 0.99, "adam_eps": 1e-7,
                  "exploration_loss_coeff": 0.01}
        assert learner.appo.hyperparams() == wanted
        train_one_batch(learner, resumed.buffers)
        assert learner.appo.hyperparams() == wanted
        learner.save()
        state = CheckpointManager(resumed.exp_dir, policy_id=0).load("latest")
        assert int(state["policy_version"]) == learner.version
        for group in state["optimizer"]["param_groups"]:
            assert (group["lr"], tuple(group["betas"]), group["eps"]) == (5e-4, (0.8, 0.99), 1e-7)
    finally:
        resumed.close()


def write_pbt_state(tmp_path, values: list[dict]):
    """A pbt_state.json whose policies hold `values` (a run that mutated them), and its config.json."""
    from sf.cfg import save_cfg
    from sf.runner.population.pbt import PopulationBasedTraining
    from sf.runner.population.pbt_settings import PbtSettings, default_hyper_specs
    cfg = make_cfg(tmp_path, "--with_pbt", "True", policies=len(values))
    pbt = PopulationBasedTraining(len(values), PbtSettings(), values[0], default_hyper_specs(), 1)
    state = pbt.state_dict()
    state["hyperparams"] = values
    exp = tmp_path / "pop"
    save_cfg(cfg, exp)
    (exp / "pbt_state.json").write_text(json.dumps(state))
    return exp


def test_resumed_pbt_keeps_its_values_unless_a_flag_is_given(tmp_path):
    """A resumed PBT run: each policy's mutated values from pbt_state.json; a flag on the command line sets that
    hyperparameter of every policy (the others stay pbt_state.json's)."""
    values = [{"learning_rate": 1e-4 * (p + 1), "exploration_loss_coeff": 0.003 * (p + 1), "adam_beta1": 0.9 - 0.1 * p}
              for p in range(2)]
    exp = write_pbt_state(tmp_path, values)
    control = PopulationControl(make_cfg(tmp_path, policies=2), exp, {})
    assert control.resumed and control.hyperparams() == values
    control = PopulationControl(make_cfg(tmp_path, "--learning_rate", "5e-4", policies=2), exp, {})
    assert control.hyperparams() == [{**v, "learning_rate": 5e-4} for v in values]
    control.save()
    assert json.loads((exp / "pbt_state.json").read_text())["hyperparams"] == control.hyperparams()


def test_resumed_pbt_learners_train_with_pbt_state_and_flag_values(tmp_path):
    """A PBT run whose policies' learning rates were mutated (pbt_state.json and their checkpoints hold them), resumed
    with --learning_rate and --adam_eps: every optimizer holds the flags' values, and each policy keeps pbt_state.json's
    other values."""
    values = [{"learning_rate": 1e-4 * (p + 2), "exploration_loss_coeff": 0.003, "adam_beta1": 0.9} for p in range(2)]
    first = Population(tmp_path, "--with_pbt", "True", policies=2)
    try:
        fill_shared(first.state, values)
        for learner in first.learners.values():
            learner.apply_population_updates()
            assert learner.appo.optimizer.param_groups[0]["lr"] == values[learner.policy_id]["learning_rate"]
            learner.save()
    finally:
        first.close()
    write_pbt_state(tmp_path, values)
    resumed = Population(tmp_path, "--learning_rate", "5e-4", "--adam_eps", "1e-7", policies=2)
    try:
        control = PopulationControl(resumed.cfg, resumed.exp_dir, {})
        fill_shared(resumed.state, control.hyperparams())  # (the runner, before the learners start)
        for p, learner in resumed.learners.items():
            learner.apply_population_updates()
            assert learner.appo.hyperparams() == {**values[p], "learning_rate": 5e-4, "adam_beta2": 0.999,
                                                  "adam_eps": 1e-7}
    finally:
        resumed.close()
