"""Population-based training's decision logic (sf/runner/population/pbt.py) on a fake population: who mutates, who
copies, the duel gap rule, the perturbation factors and bounds, the schedule, NaN objectives, N = 1, resume and
validation."""
import json
import math

import pytest

from sf.runner.population.pbt import HISTORY_LIMIT, PbtDecision, PopulationBasedTraining, ranking, top_count
from sf.runner.population.pbt_settings import HyperSpec, PbtSettings, default_hyper_specs

SHAPING = ("kill", "death", "armor_zero")
INITIAL = {"learning_rate": 1e-4, "exploration_loss_coeff": 3e-3, "adam_beta1": 0.9, "kill": 1.0, "death": -0.5,
           "armor_zero": 0.0, "gamma": 0.99}
PERIOD, START = 1000, 5000


def make(n=8, seed=0, **settings):
    s = PbtSettings(**{"period_env_steps": PERIOD, "start_mutation": START, **settings})
    return PopulationBasedTraining(n, s, INITIAL, default_hyper_specs(SHAPING), seed)


def spread(n):
    """Objectives far apart (no duel-gap refusals): policy p has objective 10 * (p + 1): the best is n - 1."""
    return [10.0 * (p + 1) for p in range(n)]


def sweep(pbt, objectives, start, steps, policies=None):
    """Every policy reports env_steps start, start + PERIOD, ... (steps times); all decisions, in order."""
    out = []
    for k in range(steps):
        for p in (range(pbt.num_policies) if policies is None else policies):
            out += pbt.update(p, start + k * PERIOD, objectives)
    return out


def test_ranking_and_group_sizes():
    assert ranking([0.1, 0.5, 0.5, -1.0]) == [1, 2, 0, 3]  # ties to the lower id
    assert [top_count(n, 0.3) for n in (2, 3, 4, 5, 8, 10)] == [1, 1, 1, 2, 2, 3]
    assert top_count(4, 0.0) == 1 and top_count(4, 1.0) == 4


def test_who_mutates_and_who_copies():
    n = 8  # n_top = round(2.4) = 2: top {7, 6}, worst {0, 1}, bottom {0..5}
    pbt = make(n, mutation_rate=0.5)
    objs = spread(n)
    decisions = sweep(pbt, objs, START, 30)
    by_policy = {p: [d for d in decisions if d.policy == p] for p in range(n)}
    assert not by_policy[7] and not by_policy[6]  # the top group is never touched
    for p in (0, 1):  # the worst group copies, always from the top group
        assert by_policy[p] and all(d.kind == "replace" for d in by_policy[p])
        assert all(d.source in (6, 7) for d in by_policy[p])
        assert {d.source for d in by_policy[p]} == {6, 7}  # uniform over the top group: both drawn in 30 tries
    for p in (2, 3, 4, 5):  # the rest of the bottom group mutates, one decision per boundary
        assert len(by_policy[p]) == 30 and all(d.kind == "mutate" and d.source is None for d in by_policy[p])
    assert any(d.changes for p in (2, 3, 4, 5) for d in by_policy[p])
    # top-group hyperparameters never change
    for p in (6, 7):
        assert pbt.hyperparams(p) == INITIAL


def test_copy_of_hyperparameters_is_exact_and_not_mutated_after():
    n = 4  # n_top = 1: top {3}, worst {0}
    pbt = make(n, mutation_rate=1.0, perturb_min=1.1, perturb_max=1.5)
    objs = spread(n)
    # policy 2 (bottom group, not the worst) mutates a few times, then becomes the best and the source of policy 0
    for k in range(5):
        pbt.update(2, START + k * PERIOD, objs)
    src_hyper = pbt.hyperparams(2)
    assert src_hyper != INITIAL
    objs = [1.0, 5.0, 100.0, 50.0]  # now 2 is the top, 0 the worst
    before = pbt.hyperparams(0)
    (d,) = pbt.update(0, START, objs)
    assert d.kind == "replace" and d.source == 2
    assert pbt.hyperparams(0) == src_hyper  # exact copy, no mutation on top (mutation_rate 1.0 would show)
    assert d.changes == {k: [before[k], src_hyper[k]] for k in INITIAL if before[k] != src_hyper[k]}
    assert "copies weights and hyperparameters of policy 2" in d.line() and "rank 4/4" in d.line()


def test_duel_gap_rule_keeps_close_policies_and_mutates_them():
    # relative gap 0.5 (the paper's duel: copy only when below half of the best's win rate)
    pbt = make(4, replace_reward_gap=0.5, mutation_rate=1.0)
    objs = [0.6, 0.7, 0.8, 1.0]  # worst 0: |1.0 - 0.6| = 0.4 <= 0.5 * 1.0 -> keep
    decisions = pbt.update(0, START, objs)
    assert [d.kind for d in decisions] == ["keep", "mutate"]
    keep, mutate = decisions
    assert keep.source == 3 and "too close" in keep.reason and "keeps its weights" in keep.line()
    assert mutate.changes  # mutation_rate 1: learning rate etc. changed
    objs = [0.4, 0.7, 0.8, 1.0]  # gap 0.6 > 0.5 -> copy
    (d,) = pbt.update(0, START + PERIOD, objs)
    assert d.kind == "replace" and d.source == 3


def test_absolute_gap_and_equal_objectives():
    pbt = make(3, replace_reward_gap=0.0, replace_reward_gap_absolute=0.05)
    assert [d.kind for d in pbt.update(0, START, [0.0, 0.02, 0.04])] == ["keep", "mutate"]
    pbt = make(3)  # all equal: never a copy (gap 0 <= 1e-6)
    assert [d.kind for d in pbt.update(2, START, [1.0, 1.0, 1.0])] == ["keep", "mutate"]


def test_every_change_is_a_factor_in_range_or_its_inverse_clipped_to_bounds():
    lo, hi = 1.1, 1.5
    specs = {s.name: s for s in default_hyper_specs(SHAPING)}
    changes = []
    for seed in range(20):
        pbt = make(4, seed=seed, mutation_rate=0.7, perturb_min=lo, perturb_max=hi)
        for d in sweep(pbt, spread(4), START, 60, policies=[1]):
            assert d.kind == "mutate"
            changes += list(d.changes.items())
        h = pbt.hyperparams(1)
        for name, spec in specs.items():
            assert spec.low <= h[name] <= spec.high
        assert h["adam_beta1"] < 1.0 and h["armor_zero"] == 0.0 and h["death"] < 0 and h["kill"] > 0
        assert h["gamma"] == INITIAL["gamma"]  # not mutable
    assert len(changes) > 1000
    up = down = clipped = 0
    for name, (old, new) in changes:
        spec = specs[name]
        assert spec.low <= new <= spec.high and new != old
        r = new / old if spec.kind == "scale" else (1 - new) / (1 - old)
        if lo - 1e-9 <= r <= hi + 1e-9:
            up += 1
        elif 1 / hi - 1e-9 <= r <= 1 / lo + 1e-9:
            down += 1
        else:  # only a clip to a bound gives another ratio, and then the unclipped value was beyond it
            assert new in (spec.low, spec.high), (name, old, new)
            clipped += 1
    assert up > 300 and down > 300 and clipped > 0  # both directions, and the bounds were hit


def test_beta1_one_minus_perturbation():
    spec = HyperSpec("adam_beta1", 0.5, 0.999, "one_minus")
    assert spec.perturb(0.9, 1.2) == pytest.approx(0.88)  # 1 - 0.1 * 1.2
    assert spec.perturb(0.9, 1 / 1.2) == pytest.approx(1 - 0.1 / 1.2)
    assert spec.perturb(0.9989, 1 / 1.2) == 0.999  # clipped below 1
    assert spec.perturb(0.55, 5.0) == 0.5
    assert HyperSpec("x", -1e3, 1e3).perturb(-2.0, 1.2) == pytest.approx(-2.4)


def test_mutation_frequency_matches_mutation_rate():
    rate, total = 0.15, 2000
    names = ("learning_rate", "exploration_loss_coeff", "adam_beta1", "kill", "death")
    per_param = {n: 0 for n in names}
    for seed in range(total):  # one decision from the initial values (far from the bounds: every draw is a change)
        pbt = make(4, seed=seed, mutation_rate=rate, perturb_min=1.1, perturb_max=1.3)
        (d,) = pbt.update(1, START, spread(4))
        assert "armor_zero" not in d.changes  # 0 stays 0: never a change
        for name in d.changes:
            per_param[name] += 1
    sigma = math.sqrt(rate * (1 - rate) / total)  # seeded: cannot flake; 5 sigma still catches a wrong rate
    for name, count in per_param.items():
        assert abs(count / total - rate) < 5 * sigma, (name, count / total)


def test_no_decision_before_start_mutation_then_one_per_crossing():
    pbt = make(4, mutation_rate=0.0)
    objs = spread(4)
    for steps in range(0, START, 250):  # many boundaries crossed, but before start_mutation
        assert pbt.update(1, steps, objs) == []
    assert pbt.next_update == [PERIOD] * 4  # nothing moved
    (d,) = pbt.update(1, START + 10, objs)  # first report past start_mutation: decides at once
    assert d.kind == "mutate" and d.changes == {} and d.env_steps == START + 10
    assert pbt.next_update[1] == START + PERIOD
    assert pbt.update(1, START + PERIOD - 1, objs) == []
    assert len(pbt.update(1, START + PERIOD, objs)) == 1  # on the boundary: due
    assert pbt.next_update[1] == START + 2 * PERIOD
    # a jump over several periods: one decision, the boundary moves to the next multiple above
    assert len(pbt.update(1, START + 7 * PERIOD + 3, objs)) == 1
    assert pbt.next_update[1] == START + 8 * PERIOD
    assert pbt.update(1, START + 7 * PERIOD + 500, objs) == []
    # per-policy schedules: the others did not move
    assert pbt.next_update[0] == pbt.next_update[2] == pbt.next_update[3] == PERIOD
    assert len(pbt.update(2, START, objs)) == 1 and pbt.next_update[2] == START + PERIOD
    # a top policy's boundary advances too, without any decision
    assert pbt.update(3, START, objs) == [] and pbt.next_update[3] == START + PERIOD
    assert pbt.update(3, START + 1, objs) == []


def test_start_mutation_below_the_first_period():
    pbt = make(3, start_mutation=0, mutation_rate=0.0)
    assert pbt.update(0, PERIOD - 1, spread(3)) == []
    assert len(pbt.update(0, PERIOD, spread(3))) == 1


def test_nan_objectives_skip_but_advance():
    pbt = make(4)
    objs = [1.0, math.nan, 3.0, math.nan]
    (d,) = pbt.update(0, START, objs)
    assert d.kind == "skip" and "policies 1, 3" in d.reason and "no objective yet" in d.reason
    assert "skips" in d.line()
    assert pbt.hyperparams(0) == INITIAL and pbt.next_update[0] == START + PERIOD
    assert pbt.update(0, START + 1, objs) == []  # the boundary moved
    (d,) = pbt.update(3, START, objs)  # even a would-be top policy gets the skip
    assert d.kind == "skip"
    json.dumps(pbt.state_dict(), allow_nan=False)  # NaN objectives are stored as null


def test_single_policy_never_decides():
    pbt = make(1, mutation_rate=1.0)
    for k in range(50):
        assert pbt.update(0, START + k * PERIOD, [float(k)]) == []
    assert pbt.hyperparams(0) == INITIAL and pbt.history == []


def test_resume_continues_the_same_stream():
    n = 6
    a = make(n, seed=7, mutation_rate=0.5)
    objs = spread(n)
    sweep(a, objs, START, 10)
    text = json.dumps(a.state_dict(), allow_nan=False)
    b = make(n, seed=999, mutation_rate=0.5)  # another seed: the state's generator must win
    b.load_state_dict(json.loads(text))
    assert [b.hyperparams(p) for p in range(n)] == [a.hyperparams(p) for p in range(n)]
    assert b.next_update == a.next_update and b.history == a.history
    objs2 = [objs[p] * (1 + 0.1 * ((p * 7) % 5)) for p in range(n)]
    da = sweep(a, objs2, START + 10 * PERIOD, 10)
    db = sweep(b, objs2, START + 10 * PERIOD, 10)
    assert da and [d.to_dict() for d in da] == [d.to_dict() for d in db]
    assert [b.hyperparams(p) for p in range(n)] == [a.hyperparams(p) for p in range(n)]
    assert any(d.kind == "replace" for d in da) and any(d.changes for d in da if d.kind == "mutate")


def test_history_is_capped_and_round_trips():
    pbt = make(3, mutation_rate=0.3)
    sweep(pbt, spread(3), START, HISTORY_LIMIT + 50, policies=[1])
    hist = pbt.history
    assert len(hist) == HISTORY_LIMIT and hist[-1]["env_steps"] == START + (HISTORY_LIMIT + 49) * PERIOD
    d = PbtDecision.from_dict(hist[-1])
    assert d.to_dict() == hist[-1]


def _state():
    pbt = make(3)
    sweep(pbt, spread(3), START, 3)
    return json.loads(json.dumps(pbt.state_dict()))


@pytest.mark.parametrize("breaks,expected", [
    (lambda s: s.pop("rng"), "lacks rng"),
    (lambda s: s.pop("hyperparams"), "lacks hyperparams"),
    (lambda s: s.update(num_policies=4), "is for 4 policies, this run has 3"),
    (lambda s: s["hyperparams"].pop(), "list of 3 dicts"),
    (lambda s: s["next_update"].append(5), "list of 3 integers"),
    (lambda s: s["next_update"].__setitem__(0, float("inf")), "next_update must hold integers"),
    (lambda s: s["hyperparams"][1].__setitem__("learning_rate", float("nan")), "not finite numbers: learning_rate"),
    (lambda s: s["hyperparams"][1].__setitem__("learning_rate", "fast"), "not finite numbers: learning_rate"),
    (lambda s: s["hyperparams"][2].pop("kill"), "missing ['kill']"),
    (lambda s: s.update(rng={"bit_generator": "MT19937"}), "rng is not a PCG64"),
    (lambda s: s.update(history={}), "history must be a list"),
    (lambda s: s["history"].append({"policy": 0}), "PBT decision lacks"),
    (lambda s: s.update(version=99), "version"),
])
def test_malformed_state_is_refused_in_one_line(breaks, expected):
    state = _state()
    breaks(state)
    pbt = make(3)
    before = (pbt.next_update, pbt.history, [pbt.hyperparams(p) for p in range(3)])
    with pytest.raises(ValueError) as info:
        pbt.load_state_dict(state)
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert (pbt.next_update, pbt.history, [pbt.hyperparams(p) for p in range(3)]) == before  # untouched
    with pytest.raises(ValueError, match="must be a dict"):
        pbt.load_state_dict([1, 2])


def test_population_size_change_is_refused():
    big = make(5)
    with pytest.raises(ValueError, match="cannot grow or shrink"):
        big.load_state_dict(_state())


@pytest.mark.parametrize("kwargs,field", [
    ({"replace_fraction": 1.5}, "replace_fraction"),
    ({"replace_fraction": -0.1}, "replace_fraction"),
    ({"mutation_rate": 2.0}, "mutation_rate"),
    ({"mutation_rate": float("nan")}, "mutation_rate"),
    ({"perturb_min": 0.9}, "perturb_min"),
    ({"perturb_min": 1.5, "perturb_max": 1.2}, "perturb_min"),
    ({"perturb_max": float("inf")}, "perturb_max"),
    ({"period_env_steps": 0}, "period_env_steps"),
    ({"period_env_steps": 1.5}, "period_env_steps"),
    ({"start_mutation": -1}, "start_mutation"),
    ({"replace_reward_gap": -0.1}, "replace_reward_gap"),
    ({"replace_reward_gap_absolute": float("nan")}, "replace_reward_gap_absolute"),
])
def test_settings_validation(kwargs, field):
    with pytest.raises(ValueError, match=field) as info:
        PbtSettings(**kwargs)
    assert "\n" not in str(info.value)


def test_defaults_and_construction_validation():
    s = PbtSettings()
    assert (s.period_env_steps, s.start_mutation, s.replace_fraction, s.mutation_rate, s.perturb_min, s.perturb_max,
            s.replace_reward_gap, s.replace_reward_gap_absolute) == (5_000_000, 20_000_000, 0.3, 0.15, 1.2, 1.2,
                                                                    0.1, 1e-6)
    specs = default_hyper_specs(["a"])
    assert [(x.name, x.kind) for x in specs] == [("learning_rate", "scale"), ("exploration_loss_coeff", "scale"),
                                                 ("adam_beta1", "one_minus"), ("a", "scale")]
    with pytest.raises(ValueError, match="below 1"):
        HyperSpec("adam_beta1", 0.5, 1.0, "one_minus")
    with pytest.raises(ValueError, match="kind"):
        HyperSpec("x", 0, 1, "add")
    with pytest.raises(ValueError, match="without an initial value: a"):
        PopulationBasedTraining(2, s, {"learning_rate": 1e-4, "exploration_loss_coeff": 0.003, "adam_beta1": 0.9},
                                specs, 0)
    pbt = make(3)
    assert [pbt.hyperparams(p) for p in range(3)] == [INITIAL] * 3  # everyone starts the same
    pbt.hyperparams(0)["learning_rate"] = 5.0  # a copy
    assert pbt.hyperparams(0) == INITIAL
    with pytest.raises(ValueError, match="3 objectives for 4"):
        make(4).update(0, START, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="policy must be in"):
        pbt.update(3, START, [1.0, 2.0, 3.0])
