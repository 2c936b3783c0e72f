"""Which policy plays which agent (sf/sampling/policy_mapping.py): the paper's random mapping and its statistics, the
resampling period, --pbt_mix_policies_in_one_env False, the groups mapping (draws per inference group), the fixed
mapping."""
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
    with pytest.raises(ValueError, match="'random', 'groups', 'fixed'"):
        PolicyMapping(2, 1, mode="roundrobin")


def _workers(n, agents, workers, envs, envs_per_group, resample=10, mix=True, seed=5):
    """One PolicyMapping per rollout worker, as the rollout workers build them (the run's shared seed for all)."""
    return [PolicyMapping(n, agents, "groups", resample, mix, first_global_env=w * envs, seed=100 + w,
                          envs_per_group=envs_per_group, shared_seed=seed) for w in range(workers)]


def _episode(maps, envs, agents):
    """Every env of every worker starts one episode: policies [worker, env, agent]."""
    return np.array([[[m.policy_for(e, a) for a in range(agents)] for e in range(envs)] for m in maps])


def test_groups_mapping_gives_each_group_one_draw_and_the_groups_a_permutation():
    """4 policies, 2 workers x 2 groups of 4 single-agent envs: within a draw every env of a group plays the group's
    policy (one policy per inference request), and the 4 groups of the run play the 4 policies, one each."""
    maps = _workers(4, 1, workers=2, envs=8, envs_per_group=4)
    for _ in range(10):  # one draw lasts 10 episodes of each env
        policies = _episode(maps, 8, 1).reshape(4, 4)  # [global group, env of the group]
        assert (policies == policies[:, :1]).all()
        assert sorted(policies[:, 0]) == [0, 1, 2, 3]


def test_groups_mapping_changes_only_every_resample_period_and_is_uniform():
    """The draw changes after --policy_resample_episodes episodes of the group's envs, never inside; over many draws
    every policy plays each group within 5 standard deviations of 1/N (seeded: cannot flake)."""
    n, draws = 4, 4000
    maps = _workers(n, 1, workers=1, envs=2, envs_per_group=2, resample=3)
    firsts = []
    for _ in range(draws):
        period = {tuple(_episode(maps, 2, 1).ravel()) for _ in range(3)}
        assert len(period) == 1
        firsts.append(period.pop()[0])
    counts = np.bincount(firsts, minlength=n)
    p = 1 / n
    assert (abs(counts / draws - p) < 5 * np.sqrt(p * (1 - p) / draws)).all(), counts
    assert len({tuple(firsts[i:i + 4]) for i in range(0, 400, 4)}) > 50  # and the draws vary


def test_groups_mapping_in_multi_agent_envs():
    """2 agents per env, 4 policies: the two agents of an env are played by distinct policies (self-play between
    policies), every env of a group has the same matchup, and over the draws every pair of policies meets; without
    mixing, every agent of a group plays the group's one policy."""
    maps = _workers(4, 2, workers=1, envs=4, envs_per_group=2, resample=1)
    pairs = set()
    for _ in range(200):
        policies = _episode(maps, 4, 2)[0]  # [env, agent]
        assert (policies[:, 0] != policies[:, 1]).all()
        assert (policies[0] == policies[1]).all() and (policies[2] == policies[3]).all()
        pairs |= {frozenset(p) for p in policies.tolist()}
    assert len(pairs) == 6  # all 4 choose 2 matchups
    unmixed = _workers(4, 2, workers=1, envs=4, envs_per_group=2, resample=1, mix=False)
    for _ in range(20):
        policies = _episode(unmixed, 4, 2)[0]
        assert (policies[:2] == policies[0, 0]).all() and (policies[2:] == policies[2, 0]).all()


@pytest.mark.parametrize("agents,mix", [(1, True), (2, True), (3, False)])
def test_random_draws_cover_the_population_before_repeating(agents, mix):
    """8 policies, one env playing at a time: the draws are dealt from a shuffled deck, so every run of 8 consecutive
    draws (aligned to the deck) holds each policy once, and every policy plays within 8 draws of the start; the order
    still varies from deck to deck."""
    n = 8
    m = PolicyMapping(n, agents, resample_episodes=1, mix_in_one_env=mix, seed=11)
    draws = []
    for episode in range(40 * n):
        env = episode % 2
        policies = [m.policy_for(env, a) for a in range(agents)]
        draws += policies if mix else policies[:1]
    decks = [draws[i:i + n] for i in range(0, len(draws) - n + 1, n)]
    assert all(sorted(d) == list(range(n)) for d in decks), decks[:3]
    assert len({tuple(d) for d in decks}) > 1



@pytest.mark.parametrize("mode", ["random", "groups", "fixed"])
def test_a_ranks_mapping_plays_only_its_policies_by_the_rules_of_the_smaller_population(mode):
    """A population of 5 placed on 2 ranks (torchrun: policy p on rank p mod 2): rank 1's workers draw from policies 1
    and 3 alone, every agent of every env, and exactly as a population of 2 would, with its indices mapped onto them."""
    kw = dict(resample_episodes=1, first_global_env=3, seed=9, envs_per_group=2, shared_seed=4)
    placed, plain = PolicyMapping(5, 2, mode, policies=[1, 3], **kw), PolicyMapping(2, 2, mode, **kw)
    got = [(placed.policy_for(e % 6, a), plain.policy_for(e % 6, a)) for e in range(300) for a in range(2)]
    assert {g for g, _ in got} == {1, 3}
    assert all(g == [1, 3][i] for g, i in got)
    with pytest.raises(ValueError, match="non-empty subset of 0..4"):
        PolicyMapping(5, 2, mode, policies=[1, 5])
