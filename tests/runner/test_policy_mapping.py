"""Which policy plays which agent (sf/sampling/policy_mapping.py): the paper's random mapping and its statistics, the
resampling period, --pbt_mix_policies_in_one_env False, the fixed mapping."""
import numpy as np
import pytest

from sf.sampling.policy_mapping import PolicyMapping


def test_one_policy_is_always_policy_0():
    m = PolicyMapping(1, 2, seed=0)
    assert {m.policy_for(e, a) for e in range(10) for a in range(2) for _ in range(30)} == {0}


def test_random_mapping_is_uniform_over_the_population():
    """Each env draws afresh every episode here (resample 1): over 20,000 draws every policy's share is within 5
    standard deviations of 1/N (seeded: cannot flake)."""
    n, draws = 4, 20_000
    m = PolicyMapping(n, 1, resample_episodes=1, seed=7)
    counts = np.bincount([m.policy_for(e % 50, 0) for e in range(draws)], minlength=n)
    p = 1 / n
    assert (abs(counts / draws - p) < 5 * np.sqrt(p * (1 - p) / draws)).all(), counts


def test_policy_is_kept_for_resample_episodes_then_drawn_again():
    """An env keeps its agents' policies for 10 episodes (counted per agent episode start / agents), then draws new
    ones; with 8 policies a new draw differs often, and never inside a period."""
    m = PolicyMapping(8, 2, resample_episodes=10, seed=3)
    periods = []
    for _ in range(30):
        period = {(m.policy_for(0, 0), m.policy_for(0, 1)) for _ in range(10)}
        assert len(period) == 1  # the same pair throughout one period
        periods.append(period.pop())
    assert len(set(periods)) > 10  # and new draws across periods


def test_mix_in_one_env_false_gives_every_agent_of_an_env_the_same_policy():
    m = PolicyMapping(4, 3, resample_episodes=1, mix_in_one_env=False, seed=1)
    for e in range(200):
        assert len({m.policy_for(e, a) for a in range(3)}) == 1
    mixed = PolicyMapping(4, 3, resample_episodes=1, mix_in_one_env=True, seed=1)
    assert any(len({mixed.policy_for(e, a) for a in range(3)}) > 1 for e in range(200))


def test_fixed_mapping_round_robin_over_global_agents():
    """Agent a of global env g: (g * A + a) % N, whatever the order of calls; worker 1's env 0 is global env 5 here."""
    m = PolicyMapping(3, 2, mode="fixed", first_global_env=5, seed=0)
    for e in range(4):
        for a in range(2):
            assert m.policy_for(e, a) == ((5 + e) * 2 + a) % 3
            assert m.policy_for(e, a) == ((5 + e) * 2 + a) % 3  # forever


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="random' or 'fixed"):
        PolicyMapping(2, 1, mode="roundrobin")
