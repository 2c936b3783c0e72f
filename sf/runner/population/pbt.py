"""Population-based training (PBT): the decision logic alone (Sample Factory 1.x's PBT and the paper, section 4 and
appendix A.3.1). Pure: numpy and the standard library, no processes, no torch, no files. The runner wires it in:

    pbt = PopulationBasedTraining(num_policies, settings, initial, specs, seed)
    ...whenever the learner of policy i reports progress:
    for d in pbt.update(i, env_steps_of_i, objectives_of_all_policies):
        log d.line() (console) and the decision (TensorBoard)
        if d.changes: write pbt.hyperparams(d.policy) to the shared memory of learners and rollout workers
        if d.kind == "replace": ask the learner of d.policy to copy the weights of policy d.source
    checkpoints: json.dumps(pbt.state_dict()); on resume pbt.load_state_dict(json.loads(...))

Semantics
- Every policy starts from the same hyperparameters `initial` (Sample Factory does the same); the mutable ones are
  those of `specs` (HyperSpec: bounds and how to perturb), the others are carried along (and copied on replace).
- Schedule, per policy: nothing before the policy has trained on `start_mutation` env frames (its boundary does not move
  either: the first update at or past start_mutation decides at once if a boundary was crossed). Past it, a decision
  is taken when env_steps >= next_update[i] (first boundary: period_env_steps); next_update[i] then moves to the next
  multiple of the period strictly above env_steps: one decision per crossing, however many periods the step jumped.
- If any objective is non-finite (NaN: a policy without episodes yet), the boundary advances and the only decision is
  a "skip" with the reason.
- Ranking: higher objective first, ties to the lower policy id. n_top = max(1, round-half-up(replace_fraction * N)).
  Top group: the first n_top (never touched, no decision recorded). Worst group: the last n_top. Bottom group: all but
  the top. If the groups overlap (replace_fraction > 0.5) the top group wins.
- A policy of the worst group draws a source uniformly from the top group. If |obj_src - obj_i| <=
  max(replace_reward_gap * |obj_src|, replace_reward_gap_absolute) it keeps its weights (a "keep" decision with the
  reason) and is mutated like the rest of the bottom group (a "mutate" decision follows the "keep" in the same returned
  list); otherwise it copies weights and all hyperparameters of the source ("replace"; changes = every hyperparameter
  that differed) and is not mutated.
- Mutation (bottom group, no copy): each mutable hyperparameter, independently with probability mutation_rate, is
  multiplied or divided (50/50) by a factor drawn uniformly in [perturb_min, perturb_max] ("one_minus": applied to
  1 - value, for Adam beta1), then clipped to its bounds. A mutation that changed nothing (no hyperparameter drawn, a
  zero coefficient, a value stuck at its bound) is still recorded as a "mutate" decision with empty changes, so every
  decision boundary of a bottom-group policy leaves a trace in the log.
- N = 1: update() never decides anything.
- Randomness: one numpy Generator (PCG64) from `seed`; its state is in state_dict(), so a resumed run draws the same
  stream as an uninterrupted one.
- Resume: the hyperparameters, boundaries, generator and history come from the state; the settings are the current
  run's (the stored ones are informational). The state must have the same number of policies and the same
  hyperparameter names, otherwise ValueError (one line).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from sf.runner.population.pbt_settings import HyperSpec, PbtSettings, is_int, is_number

KINDS = ("mutate", "replace", "keep", "skip")
HISTORY_LIMIT = 1000
STATE_VERSION = 1


def ranking(objectives: Sequence[float]) -> list[int]:
    """Policy ids, best first (higher objective first, ties to the lower id)."""
    return sorted(range(len(objectives)), key=lambda p: (-objectives[p], p))


def top_count(num_policies: int, replace_fraction: float) -> int:
    """n_top = max(1, replace_fraction * N rounded half up)."""
    return max(1, int(math.floor(replace_fraction * num_policies + 0.5)))


def _fmt(x) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4g}"


@dataclass
class PbtDecision:
    """One PBT decision about `policy` at `env_steps` (its trained env frames). changes: name -> [old, new];
    objectives: every policy's objective when decided (NaN for none)."""
    policy: int
    kind: str
    env_steps: int
    source: int | None = None
    changes: dict = field(default_factory=dict)
    objectives: list = field(default_factory=list)
    reason: str = ""

    def _who(self) -> str:
        objs = self.objectives
        if self.kind == "skip" or not objs or not all(math.isfinite(o) for o in objs):
            return f"policy {self.policy} ({self.env_steps} frames)"
        rank = ranking(objs).index(self.policy) + 1
        return (f"policy {self.policy} (objective {_fmt(objs[self.policy])}, rank {rank}/{len(objs)}, "
                f"{self.env_steps} frames)")

    def _changes(self) -> str:
        return ", ".join(f"{k} {_fmt(o)} -> {_fmt(n)}" for k, (o, n) in self.changes.items())

    def line(self) -> str:
        """One human-readable console line."""
        who = self._who()
        if self.kind == "replace":
            src = f"policy {self.source} (objective {_fmt(self.objectives[self.source])})"
            return (f"PBT: {who} copies weights and hyperparameters of {src}: "
                    f"{self._changes() or 'hyperparameters identical'}")
        if self.kind == "mutate":
            return f"PBT: {who} mutates: {self._changes() or 'nothing changed'}"
        if self.kind == "keep":
            return f"PBT: {who} keeps its weights: {self.reason}"
        return f"PBT: {who} skips this update: {self.reason}"

    def to_dict(self) -> dict:
        """JSON-serialisable (strict JSON: NaN objectives become None)."""
        return {"policy": int(self.policy), "kind": self.kind, "env_steps": int(self.env_steps),
                "source": None if self.source is None else int(self.source),
                "changes": {k: [float(o), float(n)] for k, (o, n) in self.changes.items()},
                "objectives": [None if not math.isfinite(o) else float(o) for o in self.objectives],
                "reason": self.reason}

    @classmethod
    def from_dict(cls, d) -> PbtDecision:
        """The inverse of to_dict (None objectives back to NaN); ValueError (one line) for a malformed dict."""
        _require_keys(d, "PBT decision", ("policy", "kind", "env_steps", "source", "changes", "objectives", "reason"))
        if not is_int(d["policy"]) or d["kind"] not in KINDS or not is_int(d["env_steps"]):
            raise ValueError(f"PBT decision has a bad policy, kind or env_steps: {d['policy']!r}, {d['kind']!r}, "
                             f"{d['env_steps']!r}")
        if d["source"] is not None and not is_int(d["source"]):
            raise ValueError(f"PBT decision has a bad source: {d['source']!r}")
        if not isinstance(d["changes"], dict) or not all(
                isinstance(v, (list, tuple)) and len(v) == 2 and all(is_number(x) for x in v)
                for v in d["changes"].values()):
            raise ValueError("PBT decision has malformed changes (expected name -> [old, new])")
        if not isinstance(d["objectives"], list) or not all(o is None or is_number(o) for o in d["objectives"]):
            raise ValueError("PBT decision has malformed objectives (expected a list of numbers or null)")
        return cls(policy=int(d["policy"]), kind=d["kind"], env_steps=int(d["env_steps"]),
                   source=None if d["source"] is None else int(d["source"]),
                   changes={k: [float(o), float(n)] for k, (o, n) in d["changes"].items()},
                   objectives=[math.nan if o is None else float(o) for o in d["objectives"]], reason=str(d["reason"]))


class PopulationBasedTraining:
    """The PBT state of a population of `num_policies` policies (see the module's docstring for the semantics)."""

    def __init__(self, num_policies: int, settings: PbtSettings, initial: Mapping[str, float],
                 specs: Sequence[HyperSpec], seed: int | None):
        if not is_int(num_policies) or num_policies < 1:
            raise ValueError(f"PBT: num_policies must be an integer >= 1, got {num_policies!r}")
        if not isinstance(settings, PbtSettings):
            raise ValueError(f"PBT: settings must be a PbtSettings, got {type(settings).__name__}")
        for k, v in initial.items():
            if not isinstance(k, str) or not is_number(v) or not math.isfinite(v):
                raise ValueError(f"PBT: initial hyperparameter {k!r} must be a finite number, got {v!r}")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"PBT: hyperparameter specs name the same hyperparameter twice: {names}")
        absent = [n for n in names if n not in initial]
        if absent:
            raise ValueError(f"PBT: mutable hyperparameters without an initial value: {', '.join(absent)}")
        self.num_policies, self.settings, self.specs = int(num_policies), settings, tuple(specs)
        self._names = tuple(initial)
        self._hyper = [{k: float(v) for k, v in initial.items()} for _ in range(self.num_policies)]
        self._next_update = [settings.period_env_steps] * self.num_policies
        self._rng = np.random.default_rng(seed)
        self._history: list[dict] = []

    # ---- queries
    def hyperparams(self, policy: int) -> dict[str, float]:
        """A copy of `policy`'s current hyperparameters."""
        return dict(self._hyper[self._check_policy(policy)])

    @property
    def next_update(self) -> list[int]:
        """Per policy: the env frames at which its next decision falls due (once past start_mutation)."""
        return list(self._next_update)

    @property
    def history(self) -> list[dict]:
        """The last HISTORY_LIMIT decisions, oldest first, as PbtDecision.to_dict() dicts."""
        return [dict(d) for d in self._history]

    def _check_policy(self, policy) -> int:
        if not is_int(policy) or not 0 <= policy < self.num_policies:
            raise ValueError(f"PBT: policy must be in [0, {self.num_policies}), got {policy!r}")
        return int(policy)

    def set_all(self, name: str, value: float) -> list[float]:
        """Give every policy `value` for hyperparameter `name` (a value the user set on resume); returns the old
        ones."""
        if name not in self._names or not is_number(value) or not math.isfinite(value):
            raise ValueError(f"PBT: cannot set hyperparameter {name!r} to {value!r}")
        old = [h[name] for h in self._hyper]
        for h in self._hyper:
            h[name] = float(value)
        return old

    # ---- decisions
    def update(self, policy_id: int, env_steps: int, objectives: Sequence[float]) -> list[PbtDecision]:
        """Policy `policy_id` has trained on `env_steps` env frames; `objectives`: every policy's current objective
        (NaN where none yet). Returns the decisions taken now (empty when none is due); the caller applies them."""
        i = self._check_policy(policy_id)
        if not is_int(env_steps) or env_steps < 0:
            raise ValueError(f"PBT: env_steps must be an integer >= 0, got {env_steps!r}")
        if len(objectives) != self.num_policies:
            raise ValueError(f"PBT: {len(objectives)} objectives for {self.num_policies} policies")
        if not all(is_number(o) for o in objectives):
            raise ValueError(f"PBT: objectives must be numbers, got {list(objectives)!r}")
        objs = [float(o) for o in objectives]
        s = self.settings
        if self.num_policies < 2 or env_steps < s.start_mutation or env_steps < self._next_update[i]:
            return []
        self._next_update[i] = (env_steps // s.period_env_steps + 1) * s.period_env_steps
        decisions = self._decide(i, int(env_steps), objs)
        self._history.extend(d.to_dict() for d in decisions)
        del self._history[:-HISTORY_LIMIT]
        return decisions

    def _decide(self, i: int, env_steps: int, objs: list[float]) -> list[PbtDecision]:
        s = self.settings
        missing = [p for p, o in enumerate(objs) if not math.isfinite(o)]
        if missing:
            what = "no objective yet" if all(math.isnan(objs[p]) for p in missing) else "a non-finite objective"
            return [PbtDecision(i, "skip", env_steps, objectives=objs,
                                reason=f"{what} for polic{'y' if len(missing) == 1 else 'ies'} "
                                       f"{', '.join(map(str, missing))}")]
        order = ranking(objs)
        n_top = top_count(self.num_policies, s.replace_fraction)
        top, worst = order[:n_top], order[-n_top:]
        if i in top:
            return []
        decisions = []
        if i in worst:
            src = top[int(self._rng.integers(len(top)))]
            gap, limit = abs(objs[src] - objs[i]), max(s.replace_reward_gap * abs(objs[src]),
                                                       s.replace_reward_gap_absolute)
            if gap > limit:
                old, new = self._hyper[i], dict(self._hyper[src])
                changes = {k: [old[k], new[k]] for k in self._names if old[k] != new[k]}
                self._hyper[i] = new
                return [PbtDecision(i, "replace", env_steps, source=src, changes=changes, objectives=objs,
                                    reason=f"objective gap {_fmt(gap)} > {_fmt(limit)}")]
            decisions.append(PbtDecision(
                i, "keep", env_steps, source=src, objectives=objs,
                reason=f"policy {src} (objective {_fmt(objs[src])}) is too close: gap {_fmt(gap)} <= {_fmt(limit)} "
                       f"(keeps diversity; mutated instead)"))
        decisions.append(PbtDecision(i, "mutate", env_steps, changes=self._mutate(i), objectives=objs,
                                     reason="bottom of the population"))
        return decisions

    def _mutate(self, i: int) -> dict:
        s, hyper, changes = self.settings, self._hyper[i], {}
        for spec in self.specs:
            if self._rng.random() >= s.mutation_rate:
                continue
            factor = float(self._rng.uniform(s.perturb_min, s.perturb_max))
            if self._rng.random() < 0.5:
                factor = 1.0 / factor
            old = hyper[spec.name]
            new = spec.perturb(old, factor)
            if new != old:
                hyper[spec.name] = new
                changes[spec.name] = [old, new]
        return changes

    # ---- checkpoints
    def state_dict(self) -> dict:
        """A JSON-serialisable dict (strict JSON: no NaN) of the whole state."""
        return {"version": STATE_VERSION, "num_policies": self.num_policies,
                "settings": dataclasses.asdict(self.settings),
                "hyperparams": [dict(h) for h in self._hyper], "next_update": list(self._next_update),
                "rng": _jsonable(self._rng.bit_generator.state), "history": self.history}

    def load_state_dict(self, d) -> None:
        """Restore a state_dict() (after a JSON round trip); ValueError (one line) for a malformed or foreign state.
        The current settings stay (the stored ones are not used); nothing changes unless the whole state is valid."""
        _require_keys(d, "PBT state", ("version", "num_policies", "settings", "hyperparams", "next_update", "rng",
                                       "history"))
        if d["version"] != STATE_VERSION:
            raise ValueError(f"PBT state has version {d['version']!r}, expected {STATE_VERSION}")
        n = d["num_policies"]
        if not is_int(n):
            raise ValueError(f"PBT state: num_policies must be an integer, got {n!r}")
        if n != self.num_policies:
            raise ValueError(f"PBT state is for {n} policies, this run has {self.num_policies} "
                             f"(a population cannot grow or shrink on resume)")
        hyper, nxt = d["hyperparams"], d["next_update"]
        if not isinstance(hyper, list) or len(hyper) != n:
            raise ValueError(f"PBT state: hyperparams must be a list of {n} dicts")
        if not isinstance(nxt, list) or len(nxt) != n:
            raise ValueError(f"PBT state: next_update must be a list of {n} integers")
        new_hyper = []
        for p, h in enumerate(hyper):
            if not isinstance(h, dict):
                raise ValueError(f"PBT state: hyperparams of policy {p} must be a dict, got {type(h).__name__}")
            if set(h) != set(self._names):
                lack, extra = sorted(set(self._names) - set(h)), sorted(set(h) - set(self._names))
                raise ValueError(f"PBT state: hyperparams of policy {p} differ from this run's (missing {lack}, "
                                 f"unknown {extra})")
            bad = [k for k, v in h.items() if not is_number(v) or not math.isfinite(v)]
            if bad:
                raise ValueError(f"PBT state: hyperparams of policy {p} are not finite numbers: {', '.join(bad)}")
            new_hyper.append({k: float(h[k]) for k in self._names})
        if not all(is_int(x) and x >= 1 for x in nxt):
            raise ValueError(f"PBT state: next_update must hold integers >= 1, got {nxt!r}")
        if not isinstance(d["settings"], dict):
            raise ValueError("PBT state: settings must be a dict")
        rng = np.random.default_rng(0)
        try:
            rng.bit_generator.state = d["rng"]
        except Exception as e:  # numpy raises TypeError/ValueError/KeyError for a foreign state
            raise ValueError(f"PBT state: rng is not a PCG64 generator state ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from None
        if not isinstance(d["history"], list):
            raise ValueError("PBT state: history must be a list")
        history = [PbtDecision.from_dict(x).to_dict() for x in d["history"]][-HISTORY_LIMIT:]
        self._hyper, self._next_update, self._rng, self._history = new_hyper, [int(x) for x in nxt], rng, history


def _require_keys(d, what: str, keys: Sequence[str]) -> None:
    """ValueError (one line) unless `d` is a dict holding every key."""
    if not isinstance(d, dict):
        raise ValueError(f"{what} must be a dict, got {type(d).__name__}")
    missing = [k for k in keys if k not in d]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(missing)}")


def _jsonable(x):
    """numpy's generator state as plain JSON values (Python ints stay exact, however large)."""
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    return x
