"""The runner's side of population-based training (--with_pbt, --num_policies N >= 2; decisions in
sf/runner/population/pbt.py).

    objectives   each policy's average over --stats_avg episodes of --pbt_target_objective (true_objective: the win
                 rate where the env reports wins, i.e. self-play, else the game score where reported, else the reward)
    decisions    taken when a policy's learner crossed its next --pbt_period_env_steps boundary; applied through shared
                 memory: hyperparameters -> SharedState.hyperparams (learners) and .shaping (rollout workers, at each
                 agent's next episode start); a weight copy -> SharedState.replace_from and one more request counted
                 in .copy_requests (the learner copies the source's published weights before its next training batch,
                 retries while they cannot be read whole, reports the copy or, after a few seconds, abandons it with a
                 warning; a second copy decided for the same policy while one is pending replaces it)
    records      every decision is a console line, a TensorBoard text (pbt/decisions) and p{i}/pbt/<name> scalars, and
                 the whole state (hyperparameters, schedule, random generator, history) is written atomically to
                 train_dir/EXPERIMENT/pbt_state.json after each decision and at the end: a resumed run continues it

Hyperparameters in force (the one rule, for every mode; what config.json and pbt_state.json record is what trains):
    - without PBT, and those PBT does not mutate (adam_beta2, adam_eps) with it: the configuration's, as config.json
      records them (flag > saved config.json > preset, sf/cfg/). A resumed learner forces them onto the optimizer
      state it loads (that state holds the values of the run that saved it).
    - PBT's mutable ones (learning_rate, exploration_loss_coeff, adam_beta1, reward shaping): each policy's own, as
      pbt_state.json records them (a fresh run: the configuration's for every policy). A flag given on the command line
      of a resumed run sets that hyperparameter of every policy (one console line; pbt_state.json records it). The
      learners apply them from SharedState.hyperparams before their first training batch, and the final checkpoint
      holds the last decision's values.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from sf.cfg import ConfigError, RunError
from sf.processes.shared_state import (COPIES_HANDLED, COPIES_REQUESTED, ENV_STEPS, HYPERPARAMS,
                                      shared_hyperparams)
from sf.runner.population.pbt import PopulationBasedTraining
from sf.runner.population.pbt_settings import PbtSettings, default_hyper_specs
from sf.seeding import PBT, run_seed, stream_seed
from sf.utils.files import write_json_atomic

if TYPE_CHECKING:
    from sf.cfg.config import Config

log = logging.getLogger("sf")
STATE_FILE = "pbt_state.json"


def initial_hyperparams(cfg: Config, shaping: dict[str, float]) -> dict[str, float]:
    """Every policy's starting point: the configuration's learning rate, entropy coefficient, Adam beta1, and the env's
    reward-shaping coefficients."""
    return {**shared_hyperparams(cfg), **shaping}


def fill_shared(state, hyper: list[dict]) -> None:
    """Write each policy's hyperparameters into SharedState (learners and rollout workers read them from there)."""
    for p, h in enumerate(hyper):
        state.hyperparams[p] = torch.tensor([h[k] for k in HYPERPARAMS], dtype=torch.float64)
        if state.shaping_keys:
            state.shaping[p] = torch.tensor([h[k] for k in state.shaping_keys], dtype=torch.float64)


def request_copy(state, policy: int, source: int) -> None:
    """Ask `policy`'s learner to copy `source`'s weights: the source first, then the request counted (the learner reads
    the count, then the source). A copy still pending is replaced: the learner copies the latest source."""
    pending = int(state.copy_requests[policy, COPIES_REQUESTED]) > int(state.copy_requests[policy, COPIES_HANDLED])
    if pending:
        log.info("PBT: policy %d's copy of policy %d is still pending: it copies policy %d instead", policy,
                 int(state.replace_from[policy]), source)
    state.replace_from[policy] = source
    state.copy_requests[policy, COPIES_REQUESTED] += 1


def apply_decisions(state, stats, hyper: list[dict], copies: list[tuple[int, int]]) -> None:
    """PBT's decisions in force: every policy's hyperparameters to SharedState first (the learner applies them with the
    copy, before the same batch), then each copy (policy, source) asked of the policy's learner; recorded in `stats`
    (the p{i}/pbt/ scalars)."""
    fill_shared(state, hyper)
    for p, source in copies:
        request_copy(state, p, source)
    record(stats, hyper)


def record(stats, hyper: list[dict]) -> None:
    for p, h in enumerate(hyper):
        stats.policies[p].hyperparams = dict(h)


class PopulationControl:
    def __init__(self, cfg: Config, exp_dir: Path, shaping: dict[str, float]):
        """Builds the PBT state: a resumed run's from pbt_state.json, else a fresh one. A state that does not fit this
        run (another population size, other hyperparameters) is a one-line ConfigError."""
        self.cfg, self.path = cfg, Path(exp_dir) / STATE_FILE
        settings = PbtSettings(cfg.pbt_period_env_steps, cfg.pbt_start_mutation, cfg.pbt_replace_fraction,
                               cfg.pbt_mutation_rate, cfg.pbt_perturb_min, cfg.pbt_perturb_max,
                               cfg.pbt_replace_reward_gap, cfg.pbt_replace_reward_gap_absolute)
        self.pbt = PopulationBasedTraining(cfg.num_policies, settings, initial_hyperparams(cfg, shaping),
                                           default_hyper_specs(tuple(shaping)), stream_seed(run_seed(cfg), PBT))
        self.objective_key: str | None = (None if cfg.pbt_target_objective == "true_objective"
                                          else cfg.pbt_target_objective)
        self.resumed = False
        if cfg.restart_behavior == "resume" and self.path.exists():
            try:
                self.pbt.load_state_dict(json.loads(self.path.read_text()))
            except OSError as e:
                raise RunError(f"cannot read {self.path}: {e.strerror or e}") from None
            except ValueError as e:  # malformed JSON or a state of another population
                raise ConfigError(f"{self.path}: {' '.join(str(e).split())} "
                                  "(move it aside to start PBT afresh)") from None
            self.resumed = True
            self._apply_flags(cfg._explicit)

    def _apply_flags(self, given) -> None:
        """A resumed run: a mutable hyperparameter given as a flag (`given`: the parameters on the command line) is
        every policy's from now on, over pbt_state.json's values."""
        for spec in self.pbt.specs:
            if spec.name in given:
                value = float(getattr(self.cfg, spec.name))
                old = self.pbt.set_all(spec.name, value)
                log.info("PBT: --%s %g given: every policy's %s from now on (%s had %s)", spec.name, value, spec.name,
                         self.path.name, ", ".join(f"{v:.4g}" for v in old))

    def hyperparams(self) -> list[dict]:
        return [self.pbt.hyperparams(p) for p in range(self.cfg.num_policies)]

    @staticmethod
    def figures(state, stats, policies) -> dict[int, dict]:
        """What PBT decides on, for each of `policies`: {"frames": env frames its learner trained, "means": {episode
        key: its average over --stats_avg episodes}} (JSON-ready: a population across ranks sends it as it is)."""
        return {p: {"frames": int(state.learner[p, ENV_STEPS]),
                    "means": {k: stats.policies[p].mean(k) for k in stats.policies[p].episodes}} for p in policies}

    def objectives(self, figures: dict[int, dict]) -> list[float]:
        """Each policy's objective (NaN: no episode yet). true_objective is fixed by the first episodes seen."""
        if self.objective_key is None:
            seen = set().union(*(f["means"] for f in figures.values()))
            if not seen:
                return [math.nan] * self.cfg.num_policies
            self.objective_key = "win" if "win" in seen else "score" if "score" in seen else "reward"
            log.info("PBT ranks the policies by their average %s (--pbt_target_objective true_objective)",
                     self.objective_key)
        return [figures[p]["means"].get(self.objective_key, math.nan) for p in range(self.cfg.num_policies)]

    def step(self, state, stats) -> None:
        """One machine: decide on this process's figures and apply the decisions here."""
        decided = self.decide(self.figures(state, stats, range(self.cfg.num_policies)), stats)
        if decided is not None:
            apply_decisions(state, stats, *decided)

    def decide(self, figures: dict[int, dict], stats) -> tuple[list[dict], list[tuple[int, int]]] | None:
        """Decide for every policy whose learner crossed a boundary (`figures`: every policy's); log and record the
        decisions (console, TensorBoard text, pbt_state.json). Returns every policy's hyperparameters and the copies
        [(policy, source)] to apply, or None when nothing was decided."""
        objectives = None
        decided = False
        copies = []
        for p in range(self.cfg.num_policies):
            env_steps = figures[p]["frames"]
            if env_steps < max(self.pbt.next_update[p], self.cfg.pbt_start_mutation):
                continue
            objectives = objectives if objectives is not None else self.objectives(figures)
            for d in self.pbt.update(p, env_steps, objectives):
                decided = True
                log.info("%s", d.line())
                stats.texts.append(("pbt/decisions", d.line()))
                if d.kind == "replace":
                    copies.append((d.policy, d.source))
        if not decided:
            return None
        self.save()
        return self.hyperparams(), copies

    def save(self) -> None:
        """pbt_state.json, atomically (a crash leaves the previous state or the new one, never half of one)."""
        write_json_atomic(self.path, self.pbt.state_dict())
