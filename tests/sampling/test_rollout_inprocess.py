"""Rollout worker, policy worker and learner in this process over real shared buffers and queues: final observations of
truncated episodes, the fixed slots and the batch barrier of hts mode, and the learner's check of each batch's lag."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sampling_helpers import Run
from sf.ipc import Queue
from sf.learning.learner import Learner


def test_truncated_episodes_keep_their_final_observation(tmp_path):
    """test_corridor truncates after 50 steps; rollout 8. For every trajectory: truncated steps are done steps; the
    first one's final observation is the cell the action led to (the corridor's dynamics), the next observation is the
    reset cell, and final_rnn is the policy worker's next RNN state for that step."""
    run = Run(tmp_path, envs=4, rollout=8)
    b = run.buffers
    checked = 0
    try:
        while checked < 6:
            run.step()
            for slot in run.finished_slots():
                trunc, dones = b.truncated[slot].numpy(), b.dones[slot].numpy()
                assert set(np.unique(trunc)) <= {0.0, 1.0} and (dones[trunc > 0] == 1).all()
                steps = np.nonzero(trunc)[0]
                final_t = int(b.final_t[slot])
                if len(steps) == 0:
                    assert final_t == -1
                else:
                    t = int(steps[0])
                    assert final_t == t
                    pos = int(b.obs["obs"][slot, t].argmax())
                    expected = min(max(pos + int(b.actions[slot, t, 0]) - 1, 0), 9)
                    assert (int(b.final_obs["obs"][slot].argmax()) == expected
                            and float(b.final_obs["obs"][slot].sum()) == 1.0)
                    assert int(b.obs["obs"][slot, t + 1].argmax()) == 0  # the reset observation
                    with torch.no_grad():
                        out = run.model.forward_step({"obs": b.obs["obs"][slot, t:t + 1]}, b.rnn_states[slot, t:t + 1])
                    torch.testing.assert_close(b.final_rnn[slot], out.new_rnn_states[0])
                    assert float(b.rnn_states[slot, t + 1].abs().sum()) == 0.0  # the next episode starts afresh
                    checked += 1
                b.final_t[slot] = 123  # a stale value: the worker must reset it when it takes the slot again
                run.queues.free.put(slot)
    finally:
        run.close()


def test_hts_slots_are_fixed_and_intervals_wait_for_the_learner(tmp_path):
    """Worker 0 of 2 (4 envs each, 2 groups): interval k fills slots (k % 2) * 8 + 0..3; a group that finished its
    interval asks for no action until sync_ready allows the next one; each observation's noise comes from its env's
    own stream (the same for global env 1 whatever the layout)."""
    from sf.model.action_spaces import draw_action_noise
    from sf.seeding import action_noise_rng
    run = Run(tmp_path, "--sync_mode", "hts", workers=2, envs=4, rollout=8)
    try:
        first = run.worker.slot.tolist()
        assert first == [0, 1, 2, 3]
        slots = []
        for _ in range(200):
            run.step()
            slots += run.finished_slots()
            if len(run.worker.sink.waiting) == 2:
                break
        assert sorted(slots) == [0, 1, 2, 3] and run.worker.sink.waiting == {0: 1, 1: 1}
        assert run.worker.slot.tolist() == [8, 9, 10, 11] and run.worker.t.tolist() == [0] * 4
        for _ in range(20):  # nothing moves before the learner's go
            run.step()
        assert run.policy.run_once(timeout=0.05) == 0 and run.finished_slots() == []
        run.state.set_sync_ready(1)
        for _ in range(200):
            run.step()
            slots += run.finished_slots()
            if len(run.worker.sink.waiting) == 2:
                break
        assert sorted(slots[4:]) == [8, 9, 10, 11] and run.worker.sink.waiting == {0: 2, 1: 2}
        rng = action_noise_rng(3, 1)  # env 1 of worker 0: its first 8 noise draws fill slot 1, steps 0..7
        expected = np.empty((8, 1), np.float32)
        for row in expected:
            draw_action_noise(run.action_space, rng, row)
        np.testing.assert_array_equal(run.buffers.action_noise[1].numpy(), expected)
    finally:
        run.close()


def test_learner_refuses_a_batch_of_other_policy_versions(tmp_path):
    """The learner checks each hts batch against the mode's guarantee: one policy version, the one published for it."""
    run = Run(tmp_path, "--sync_mode", "hts", workers=1, envs=4, rollout=8)
    run.close()
    b = run.buffers
    queues = SimpleNamespace(learner=Queue(), free=Queue(), report=Queue(max_size_bytes=2**22))
    learner = Learner(run.cfg, run.obs_space, run.action_space, b, queues, run.weights, run.state, "cpu",
                      tmp_path / "exp", frameskip=1)
    for tensor in b.all_tensors():  # a plausible batch 0 in slots 0..3 (acted on policy version 0)
        if tensor.dtype.is_floating_point:
            tensor.uniform_(0, 1)
    b.actions.fill_(1)
    b.policy_versions.fill_(0)
    b.final_t.fill_(-1)
    b.dones.fill_(0)
    b.truncated.fill_(0)
    queues.learner.put_many([3, 1, 0, 2])
    assert learner.run_once(timeout=1.0) and learner.schedule.batch == 1 and run.state.sync_ready_batches() == 1
    b.policy_versions[4:8] = learner.schedule.published[0]
    b.policy_versions[6, 5] = learner.schedule.published[0] + 1  # one sample of another policy in batch 1
    queues.learner.put_many([4, 5, 6, 7])
    with pytest.raises(RuntimeError, match="policy versions"):
        learner.run_once(timeout=1.0)
    for q in vars(queues).values():
        q.close()


def test_reward_scale_and_clip_apply_to_training_rewards_only(tmp_path):
    """--reward_scale 3 --reward_clip 0.02 on test_corridor (-0.01 per step, +1 at the goal): stored rewards are
    -0.02 or 0.02; the episode reports keep the env's own returns."""
    run = Run(tmp_path, "--reward_scale", "3", "--reward_clip", "0.02", envs=4, rollout=8)
    try:
        seen = set()
        for _ in range(300):
            run.step()
            for slot in run.finished_slots():
                seen |= set(run.buffers.rewards[slot].tolist())
                run.queues.free.put(slot)
            if run.worker.outbox.episodes:
                break
        assert seen and seen <= {float(np.float32(-0.02)), float(np.float32(0.02))}, seen
        episode = run.worker.outbox.episodes[0]
        assert episode["reward"] < -0.05 or episode["reward"] > 0.5  # (50 steps x -0.01, or reaching the goal)
    finally:
        run.close()
