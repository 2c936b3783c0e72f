"""--lr_schedule (sf.learning.lr_schedule) against Sample Factory's rules written out here: KL-adaptive per minibatch
and per epoch (down by 1.5 above 2x the threshold, up by 1.5 below half of it, clipped), linear decay to 0 at
--train_for_env_steps; what population-based training's base rate does to a schedule; the rate and the schedule's
state through a real checkpoint of a real learner (and an older checkpoint without them); the parameters' checks; and
one train.py run with every option of Sample Factory's this file and test_losses_sf.py cover."""
import json
import math

import pytest
import torch
from gymnasium import spaces

from model_test_helpers import VECTOR_OBS, make_cfg, random_experience
from sf.cfg import ConfigError, parse_cfg
from sf.learning.appo import APPO
from sf.learning.lr_schedule import LrSchedule
from sf.learning.optimizers import Lamb
from sf.model.actor_critic import create_actor_critic

SMALL = dict(rnn_size=16, hidden_size=16, encoder_mlp_layers=[32, 32])


def sf_rule(rate, kl, threshold, lo, hi):
    """Sample Factory's KlAdaptiveScheduler.update."""
    new = rate
    if kl > 2.0 * threshold:
        new = max(rate / 1.5, lo)
    if kl < 0.5 * threshold:
        new = min(rate * 1.5, hi)
    return new


def test_kl_adaptive_minibatch_moves_the_rate_down_and_up_within_bounds():
    s = LrSchedule("kl_adaptive_minibatch", kl_threshold=0.01, lr_min=1e-5, lr_max=4e-4)
    base, rates = 1e-4, []
    kls = [0.05, 0.05, 0.015, *[0.001] * 7, 0.005, 0.021, *[1.0] * 10]
    for kl in kls:
        s.after_minibatch(base, kl)
        s.after_epoch(base, [kl])  # (not this schedule's)
        rates.append(s.rate(base))
    want, rate = [], base
    for kl in kls:
        rate = sf_rule(rate, kl, 0.01, 1e-5, 4e-4)
        want.append(rate)
    assert rates == want  # exactly Sample Factory's arithmetic
    assert rates[:2] == [base / 1.5, base / 1.5 / 1.5] and rates[2] == rates[1]  # down; within [thr/2, 2 thr]: kept
    assert max(rates) == 4e-4 and min(rates) == 1e-5  # clipped both ways
    s.after_minibatch(base, None)  # a step that measured no KL changes nothing
    assert s.rate(base) == 1e-5


def test_kl_adaptive_epoch_adapts_to_the_mean_of_the_epoch():
    s = LrSchedule("kl_adaptive_epoch", kl_threshold=0.01, lr_min=1e-6, lr_max=1e-2)
    base = 1e-3
    s.after_minibatch(base, 1.0)  # (not this schedule's)
    assert s.rate(base) == base
    s.after_epoch(base, [0.001, 0.001, 0.05])  # mean 0.0173 < 0.02: kept, though one minibatch was above
    assert s.rate(base) == base
    s.after_epoch(base, [0.03, 0.03, 0.0])  # mean 0.02 is not above 2 x threshold
    assert s.rate(base) == base
    s.after_epoch(base, [0.03, 0.03, 0.001])
    assert s.rate(base) == base / 1.5
    s.after_epoch(base, [])  # no minibatch measured a KL
    assert s.rate(base) == base / 1.5
    s.after_epoch(base, [0.001, 0.002, 0.003])
    assert s.rate(base) == base / 1.5 * 1.5


def setup(n=12, t=8, seed=0, behaviour_seed=None, **overrides):
    torch.manual_seed(seed)
    kw = dict(SMALL, rollout=t, recurrence=t, batch_size=4 * t, use_rnn=False)
    kw.update(overrides)
    cfg = make_cfg(**kw)
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(4))
    actor = model
    if behaviour_seed is not None:  # a batch acted by another policy: a KL well above 0 from the first step
        torch.manual_seed(behaviour_seed)
        actor = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(4))
        with torch.no_grad():
            for p in actor.action_heads.parameters():
                p.normal_(0, 1.0)
    return cfg, model, random_experience(actor, VECTOR_OBS, spaces.Discrete(4), n, t, seed=seed)


@pytest.mark.parametrize("threshold, direction", [(1e-6, "down"), (1e3, "up")])
def test_appo_kl_adaptive_minibatch_follows_the_measured_kl(threshold, direction):
    """Each SGD step's rate is Sample Factory's rule applied to the previous step's rate and measured KL (the reported
    kl_divergence, KL(pi || mu) over the valid steps), clipped to [lr_adaptive_min, lr_adaptive_max]."""
    cfg, model, exp = setup(behaviour_seed=5, lr_schedule="kl_adaptive_minibatch", lr_schedule_kl_threshold=threshold,
                            lr_adaptive_min=2e-5, lr_adaptive_max=3e-4, num_batches_per_epoch=3, num_epochs=3,
                            learning_rate=1e-4)
    stats = APPO(model, cfg, "cpu").train(exp, policy_version=0)
    rates = [s["lr"] for s in stats]
    assert rates[0] == 1e-4
    for prev, cur in zip(stats, stats[1:]):
        assert cur["lr"] == sf_rule(prev["lr"], prev["kl_divergence"], threshold, 2e-5, 3e-4)
    if direction == "down":
        assert all(s["kl_divergence"] > 2e-6 for s in stats)
        assert rates[1] == pytest.approx(1e-4 / 1.5) and rates[-1] == 2e-5
    else:
        assert rates[1] == pytest.approx(1.5e-4) and rates[-1] == 3e-4


def test_appo_kl_adaptive_epoch_changes_the_rate_between_epochs_only():
    cfg, model, exp = setup(behaviour_seed=5, lr_schedule="kl_adaptive_epoch", lr_schedule_kl_threshold=1e-6,
                            num_batches_per_epoch=3, num_epochs=3, learning_rate=1e-4)
    stats = APPO(model, cfg, "cpu").train(exp, policy_version=0)
    rates = [s["lr"] for s in stats]
    assert rates == [1e-4] * 3 + [1e-4 / 1.5] * 3 + [1e-4 / 1.5 / 1.5] * 3


@pytest.mark.parametrize("frameskip", [1, 4])
def test_linear_decay_reaches_zero_at_the_frame_budget(frameskip):
    """rate = base (1 - frames / train_for_env_steps), frames advancing by each SGD step's share of its batch (each
    sample counts once over the epochs). With a sample of one frame that is Sample Factory's formula over its SGD
    steps, lr0 (1 - k / (train_for_env_steps // batch_size * num_epochs)); with frameskip 4 the budget is in frames."""
    budget = 960 * frameskip
    cfg, model, exp = setup(lr_schedule="linear_decay", train_for_env_steps=budget, num_batches_per_epoch=3,
                            num_epochs=2, learning_rate=1e-3)
    appo = APPO(model, cfg, "cpu", frames_per_sample=frameskip)
    sgd_steps = 960 // cfg.batch_size * cfg.num_epochs  # Sample Factory's num_updates for one frame per sample
    first = [s["lr"] for s in appo.train(exp, 0, env_frames=0)]
    assert first == pytest.approx([1e-3 * (1 - k / sgd_steps) for k in range(6)], rel=1e-12)
    # the learner's frame count after the batch (12 trajectories of 8 samples) continues the decay
    second = [s["lr"] for s in appo.train(exp, 6, env_frames=96 * frameskip)]
    assert second == pytest.approx([1e-3 * (1 - k / sgd_steps) for k in range(6, 12)], rel=1e-12)
    assert appo.lr_schedule.frames == pytest.approx(192 * frameskip)
    at_end = [s["lr"] for s in appo.train(exp, 12, env_frames=budget - 48 * frameskip)]
    assert at_end[:3] == pytest.approx([1e-3 * 48 / 960, 1e-3 * 32 / 960, 1e-3 * 16 / 960], rel=1e-9)
    assert at_end[3:] == [0.0, 0.0, 0.0]  # past the budget: 0, never negative


def test_population_based_training_scales_the_scheduled_rate():
    """PBT mutates the base rate: the schedule's rate follows it by the same factor (constant: the base itself), and
    hyperparams() reports the base, as PBT recorded it."""
    cfg, model, exp = setup(behaviour_seed=5, lr_schedule="kl_adaptive_minibatch", lr_schedule_kl_threshold=1e-6,
                            num_batches_per_epoch=3, learning_rate=1e-4)
    appo = APPO(model, cfg, "cpu")
    appo.train(exp, 0)
    adapted = appo.optimizer.param_groups[0]["lr"]
    assert adapted == pytest.approx(1e-4 / 1.5 ** 3)
    appo.set_hyperparams(learning_rate=3e-4)
    assert appo.hyperparams()["learning_rate"] == 3e-4
    assert appo.optimizer.param_groups[0]["lr"] == pytest.approx(3 * adapted, rel=1e-12)
    stats = appo.train(exp, 3)
    assert stats[0]["lr"] == pytest.approx(3 * adapted, rel=1e-12)
    decay = APPO(model, cfg.replace(lr_schedule="linear_decay", train_for_env_steps=384), "cpu")
    decay.train(exp, 0, env_frames=96)  # 192 of 384 frames trained after it: half the base
    decay.set_hyperparams(learning_rate=2e-4)
    assert decay.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)


# --- through a real checkpoint ------------------------------------------------------------------------------------
class LearnerRig:
    """A real Learner of a test_corridor run (shared buffers, weights, state and queues), made again to resume."""

    def __init__(self, tmp_path, *flags):
        from types import SimpleNamespace

        from sf.buffers.shared_weights import SharedWeights
        from sf.buffers.trajectory_buffers import TrajectoryBuffers
        from sf.ipc import Queue
        from sf.processes.shared_state import SharedState
        from sf.runner.population.control import fill_shared, initial_hyperparams
        from sf_envs.registry import make_env

        self.tmp_path = tmp_path
        self.cfg = self.parse(*flags)
        env = make_env(self.cfg, 0)
        self.obs_space, self.action_space = env.observation_space, env.action_space
        env.close()
        model = create_actor_critic(self.cfg, self.obs_space, self.action_space)
        self.buffers = TrajectoryBuffers(4, 8, self.obs_space, self.action_space, model.rnn_state_size)
        self.weights, self.state = SharedWeights(model), SharedState(1, 1, 1, num_slots=4)
        fill_shared(self.state, [initial_hyperparams(self.cfg, {})])
        self.queues = SimpleNamespace(learner=Queue(), free=Queue(), report=Queue(max_size_bytes=2**22))

    def parse(self, *flags):
        return parse_cfg(["--env", "test_corridor", "--experiment", "e", "--train_dir", str(self.tmp_path),
                          "--num_workers", "1", "--num_envs_per_worker", "2", "--rollout", "8", "--recurrence", "8",
                          "--batch_size", "16", "--hidden_size", "16", "--encoder_mlp_layers", "16", "--device", "cpu",
                          "--use_rnn", "False", *flags])

    def learner(self, cfg=None):
        from sf.learning.learner import Learner
        return Learner(cfg or self.cfg, self.obs_space, self.action_space, self.buffers, self.queues, self.weights,
                       self.state, "cpu", self.tmp_path / "e", frameskip=1)

    def train(self, learner, behaviour_seed=5):
        """One training batch acted by another policy (a KL well above the threshold), as Learner.train runs it."""
        torch.manual_seed(behaviour_seed)
        actor = create_actor_critic(learner.cfg, self.obs_space, self.action_space)
        with torch.no_grad():
            for p in actor.action_heads.parameters():
                p.normal_(0, 1.0)
        exp = random_experience(actor, self.obs_space, self.action_space, 2, 8, seed=behaviour_seed)
        exp["policy_versions"].fill_(learner.version)
        learner.train(exp)

    def close(self):
        for q in (self.queues.learner, self.queues.free, self.queues.report):
            q.close()


def checkpoint_files(tmp_path):
    return sorted((tmp_path / "e" / "checkpoint_p0").glob("checkpoint_*.pth"))


def test_the_scheduled_rate_is_saved_and_resumed_through_a_checkpoint(tmp_path):
    rig = LearnerRig(tmp_path, "--lr_schedule", "kl_adaptive_minibatch", "--lr_schedule_kl_threshold", "1e-6",
                     "--learning_rate", "1e-3", "--optimizer", "lamb")
    try:
        first = rig.learner()
        rig.train(first)
        adapted = first.appo.optimizer.param_groups[0]["lr"]
        assert adapted == pytest.approx(1e-3 / 1.5)  # one SGD step (16 samples), the KL above the threshold
        first.finish()
        state = torch.load(checkpoint_files(tmp_path)[-1], weights_only=True)
        assert state["lr"] == [adapted] and state["optimizer_kind"] == "lamb"
        assert state["lr_schedule"]["kind"] == "kl_adaptive_minibatch"
        resumed = rig.learner()
        assert resumed.appo.optimizer.param_groups[0]["lr"] == adapted
        assert isinstance(resumed.appo.optimizer, Lamb) and resumed.appo.optimizer.state  # LAMB's moments came back
        # resumed with a new --learning_rate: the adapted rate is scaled by it (the base the schedule scales)
        rebased = rig.learner(rig.parse("--lr_schedule", "kl_adaptive_epoch", "--learning_rate", "2e-3",
                                        "--optimizer", "lamb"))
        assert rebased.appo.optimizer.param_groups[0]["lr"] == pytest.approx(2 * adapted, rel=1e-12)
    finally:
        rig.close()


def test_older_checkpoints_resume_as_before(tmp_path):
    """A checkpoint without the schedule's state and the optimizer's kind (written before they were recorded): the
    run resumes at the base rate with Adam's state; one of another optimizer starts that optimizer's state afresh."""
    rig = LearnerRig(tmp_path, "--learning_rate", "1e-3")
    try:
        first = rig.learner()
        rig.train(first)
        first.finish()
        path = checkpoint_files(tmp_path)[-1]
        state = torch.load(path, weights_only=True)
        assert state["optimizer_kind"] == "adam" and "lr_schedule" in state
        del state["optimizer_kind"], state["lr_schedule"]
        torch.save(state, path)
        for schedule in ("constant", "kl_adaptive_minibatch", "linear_decay"):
            resumed = rig.learner(rig.parse("--learning_rate", "1e-3", "--lr_schedule", schedule,
                                            "--train_for_env_steps", "1000000"))
            rate = resumed.appo.optimizer.param_groups[0]["lr"]
            assert rate == 1e-3, schedule  # (linear decay: from the learner's frames at its first batch)
            assert resumed.appo.optimizer.state  # Adam's moments
        lamb = rig.learner(rig.parse("--learning_rate", "1e-3", "--optimizer", "lamb"))
        assert isinstance(lamb.appo.optimizer, Lamb) and not lamb.appo.optimizer.state
        rig.train(lamb)  # and it trains
        assert lamb.appo.optimizer.state
    finally:
        rig.close()


# --- the parameters -----------------------------------------------------------------------------------------------
def parse(tmp_path, *flags):
    return parse_cfg(["--env", "test_corridor", "--train_dir", str(tmp_path), *flags])


def test_defaults_are_sample_factorys_and_values_are_stored(tmp_path):
    cfg = parse(tmp_path)
    assert (cfg.lr_schedule, cfg.lr_schedule_kl_threshold, cfg.lr_adaptive_min, cfg.lr_adaptive_max, cfg.kl_loss_coeff,
            cfg.exploration_loss, cfg.optimizer) == ("constant", 0.008, 1e-6, 1e-2, 0.0, "entropy", "adam")
    assert cfg.value_bootstrap is True  # (Sample Factory's default is False: see docs/sf_flags.md)
    cfg = parse(tmp_path, "--lr_schedule=kl_adaptive_epoch", "--kl_loss_coeff=0.1", "--exploration_loss=symmetric_kl",
                "--optimizer=lamb", "--value_bootstrap=False", "--lr_adaptive_max=1e-3")
    assert [n for n in cfg._notes if not n.startswith(("--seed ", "--num_envs_per_worker "))] == []
    assert (cfg.lr_schedule, cfg.kl_loss_coeff, cfg.exploration_loss, cfg.optimizer, cfg.value_bootstrap) == \
        ("kl_adaptive_epoch", 0.1, "symmetric_kl", "lamb", False)


@pytest.mark.parametrize("flags, needle", [
    (["--lr_schedule", "cosine"], "--lr_schedule must be one of constant, linear_decay, kl_adaptive_minibatch, "
                                  "kl_adaptive_epoch"),
    (["--optimizer", "sgd"], "--optimizer must be one of adam, lamb"),
    (["--exploration_loss", "max_entropy"], "--exploration_loss must be one of entropy, symmetric_kl"),
    (["--kl_loss_coeff", "-0.1"], "--kl_loss_coeff must be in [0, 100]"),
    (["--lr_schedule_kl_threshold", "0"], "--lr_schedule_kl_threshold must be in (0, "),
    (["--lr_adaptive_max", "2"], "--lr_adaptive_max must be in (0, 1]"),
    (["--lr_adaptive_min", "0.1", "--lr_adaptive_max", "0.01"], "--lr_adaptive_min (0.1) must be at most "
                                                                "--lr_adaptive_max (0.01)"),
    (["--value_bootstrap", "maybe"], "--value_bootstrap"),
])
def test_bad_values_are_one_line(tmp_path, flags, needle):
    with pytest.raises(ConfigError) as e:
        parse(tmp_path, *flags)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


# --- end to end ---------------------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_sample_factory_schedule_and_losses_train_end_to_end(entry, tmp_path):
    """train.py on test_image (two categorical heads) with Sample Factory's KL-adaptive rate, KL penalty,
    symmetric-KL exploration loss and LAMB: the run finishes, and TensorBoard has the rate in force (train/lr) and the
    two loss terms; the checkpoint records LAMB and the schedule."""
    from e2e_helpers import train_args
    from sf.runner.stats import read_event_scalars

    res = entry("train.py", *train_args(tmp_path, "test_image", "--num_workers", "1", "--train_for_env_steps", "1024",
                                        "--lr_schedule", "kl_adaptive_minibatch", "--kl_loss_coeff", "0.1",
                                        "--exploration_loss", "symmetric_kl", "--optimizer", "lamb",
                                        "--num_batches_per_epoch", "2", "--learning_rate", "1e-3"), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    scalars = read_event_scalars(tmp_path / "e2e")
    for tag in ("train/lr", "train/kl_loss", "train/exploration_loss", "train/kl_divergence"):
        assert scalars.get(tag), (tag, sorted(scalars))
    rates = [v for _, v in scalars["train/lr"]]
    assert all(1e-6 <= r <= 1e-2 and math.isfinite(r) for r in rates), rates
    assert all(v > 0 for _, v in scalars["train/exploration_loss"])  # coeff x symmetric KL from uniform
    saved = json.loads((tmp_path / "e2e" / "config.json").read_text())
    assert (saved["lr_schedule"], saved["optimizer"], saved["exploration_loss"], saved["kl_loss_coeff"]) == \
        ("kl_adaptive_minibatch", "lamb", "symmetric_kl", 0.1)
    state = torch.load(sorted((tmp_path / "e2e" / "checkpoint_p0").glob("checkpoint_*.pth"))[-1], weights_only=True)
    assert state["optimizer_kind"] == "lamb" and state["lr_schedule"]["kind"] == "kl_adaptive_minibatch"


@pytest.mark.e2e
def test_symmetric_kl_with_continuous_actions_is_refused_in_one_line(entry, tmp_path):
    res = entry("train.py", "--env", "test_box", "--train_dir", str(tmp_path), "--exploration_loss", "symmetric_kl",
                "--device", "cpu")
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "--exploration_loss symmetric_kl needs discrete actions" in lines[0] and "entropy" in lines[0]
    assert not list(tmp_path.iterdir())  # nothing written
