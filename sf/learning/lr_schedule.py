"""Learning-rate schedules (--lr_schedule), after Sample Factory 2.1.1's sample_factory/algo/learning/learner.py
(LearningRateScheduler and its subclasses).

The rate in force is a function of the base rate (--learning_rate, which population-based training mutates) and the
schedule's state:

    constant               rate = base
    linear_decay           rate = base * max(0, 1 - frames / --train_for_env_steps), frames: the env frames trained
                           on so far, advanced after every SGD step by its share of its training batch's frames
    kl_adaptive_minibatch  after every SGD step, with kl the KL divergence of the policy from the behaviour policy
    kl_adaptive_epoch      on that step's minibatch (the mean over the epoch's minibatches, after every epoch):
                               kl > 2 * threshold:    rate = max(rate / 1.5, --lr_adaptive_min)
                               kl < threshold / 2:    rate = min(rate * 1.5, --lr_adaptive_max)
                           starting from base (not clipped before the first change)

Sample Factory's linear decay counts SGD steps against `train_for_env_steps // batch_size * num_epochs`: the same as
counting frames when a sample is one frame, but with --env_frameskip 4 its rate ends at 3/4 of the base. Counting the
frames the learner trained on makes the rate reach 0 at --train_for_env_steps whatever the frameskip, the mode
(hts/ppo minibatches) or the number of data-parallel ranks, and a resumed run continues the decay where it was
(Sample Factory's starts it again).

A base that changes while a KL-adaptive schedule runs (PBT's mutation, a resumed run's new --learning_rate) scales the
adapted rate by the same factor: PBT's rate is the base the schedule scales, for every schedule.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional, Sequence

if TYPE_CHECKING:
    from sf.cfg.config import Config

KL_ADAPTIVE = ("kl_adaptive_minibatch", "kl_adaptive_epoch")
LR_SCHEDULES = ("constant", "linear_decay", *KL_ADAPTIVE)
KL_FACTOR = 1.5  # Sample Factory's: the rate is multiplied or divided by this


class LrSchedule:
    def __init__(self, kind: str = "constant", *, kl_threshold: float = 0.008, lr_min: float = 1e-6,
                 lr_max: float = 1e-2, budget_frames: float = math.inf):
        if kind not in LR_SCHEDULES:
            raise ValueError(f"unknown learning-rate schedule {kind!r}; known: {LR_SCHEDULES}")
        self.kind, self.kl_threshold, self.lr_min, self.lr_max = kind, kl_threshold, lr_min, lr_max
        self.budget_frames = float(budget_frames)
        self.frames = 0.0  # linear_decay: env frames trained on
        self.adapted: Optional[tuple[float, float]] = None  # kl_adaptive_*: (rate, the base it was adapted from)

    @classmethod
    def from_cfg(cls, cfg: Config) -> "LrSchedule":
        return cls(cfg.lr_schedule, kl_threshold=cfg.lr_schedule_kl_threshold, lr_min=cfg.lr_adaptive_min,
                   lr_max=cfg.lr_adaptive_max, budget_frames=cfg.train_for_env_steps)

    def rate(self, base: float) -> float:
        """The rate in force for the base rate `base`."""
        if self.kind == "linear_decay":
            return base * max(0.0, 1.0 - self.frames / self.budget_frames)
        if self.adapted is not None:
            rate, adapted_from = self.adapted
            return rate if base == adapted_from else rate * (base / adapted_from)
        return base

    def advance(self, frames: float) -> None:
        """linear_decay: `frames` more env frames trained on (an SGD step's share)."""
        self.frames += frames

    def after_minibatch(self, base: float, kl: Optional[float]) -> None:
        """After an SGD step: kl_adaptive_minibatch adapts to its KL (None: the step measured none)."""
        if self.kind == "kl_adaptive_minibatch" and kl is not None:
            self._adapt(base, kl)

    def after_epoch(self, base: float, kls: Sequence[float]) -> None:
        """After an epoch: kl_adaptive_epoch adapts to the mean KL of its minibatches (those that measured one)."""
        if self.kind == "kl_adaptive_epoch" and len(kls):
            self._adapt(base, sum(kls) / len(kls))

    def _adapt(self, base: float, kl: float) -> None:
        rate = new = self.rate(base)
        if kl > 2.0 * self.kl_threshold:
            new = max(rate / KL_FACTOR, self.lr_min)
        if kl < 0.5 * self.kl_threshold:
            new = min(rate * KL_FACTOR, self.lr_max)
        if new != rate or self.adapted is not None:
            self.adapted = (new, base)

    # --- checkpoints ---
    def state_dict(self) -> dict:
        """Plain floats and strings (weights_only-safe; the checkpoint's `lr` holds the rate in force)."""
        state = {"kind": self.kind, "frames": float(self.frames)}
        if self.adapted is not None:
            state["adapted_rate"], state["adapted_from"] = float(self.adapted[0]), float(self.adapted[1])
        return state

    def load_state_dict(self, state: Optional[dict]) -> None:
        """Restore a saved state. A KL-adapted rate carries over between the two kl_adaptive_* schedules; a state of
        another schedule, or none (an older checkpoint), leaves this one at its start (linear_decay's frames are the
        learner's to set: APPO.train(env_frames=...))."""
        if not isinstance(state, dict):
            return
        if "frames" in state and state.get("kind") == self.kind:
            self.frames = float(state["frames"])
        if self.kind in KL_ADAPTIVE and state.get("kind") in KL_ADAPTIVE and "adapted_rate" in state:
            self.adapted = (float(state["adapted_rate"]), float(state["adapted_from"]))
