"""Population-based training's settings (Sample Factory's --pbt_* flags: PbtSettings) and its mutable hyperparameters
(HyperSpec: bounds and how a perturbation applies; default_hyper_specs: the paper's), each checked when made
(ValueError, one line). The decisions that use them: sf/runner/population/pbt.py."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

SPEC_KINDS = ("scale", "one_minus")
SHAPING_BOUND = 1e3


def is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def is_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


@dataclass(frozen=True)
class PbtSettings:
    """Sample Factory's --pbt_* flags (without the prefix)."""
    period_env_steps: int = 5_000_000
    start_mutation: int = 20_000_000
    replace_fraction: float = 0.3
    mutation_rate: float = 0.15
    perturb_min: float = 1.2
    perturb_max: float = 1.2
    replace_reward_gap: float = 0.1
    replace_reward_gap_absolute: float = 1e-6

    def __post_init__(self):
        if not is_int(self.period_env_steps) or self.period_env_steps < 1:
            raise ValueError(f"PBT setting period_env_steps must be an integer >= 1, got {self.period_env_steps!r}")
        if not is_int(self.start_mutation) or self.start_mutation < 0:
            raise ValueError(f"PBT setting start_mutation must be an integer >= 0, got {self.start_mutation!r}")
        for name in ("replace_fraction", "mutation_rate"):
            v = getattr(self, name)
            if not is_number(v) or not 0.0 <= v <= 1.0:
                raise ValueError(f"PBT setting {name} must be a fraction in [0, 1], got {v!r}")
        for name in ("perturb_min", "perturb_max"):
            v = getattr(self, name)
            if not is_number(v) or not math.isfinite(v) or v < 1.0:
                raise ValueError(f"PBT setting {name} must be a finite number >= 1, got {v!r}")
        if self.perturb_min > self.perturb_max:
            raise ValueError(f"PBT setting perturb_min ({self.perturb_min}) must be <= "
                             f"perturb_max ({self.perturb_max})")
        for name in ("replace_reward_gap", "replace_reward_gap_absolute"):
            v = getattr(self, name)
            if not is_number(v) or not math.isfinite(v) or v < 0.0:
                raise ValueError(f"PBT setting {name} must be a finite number >= 0, got {v!r}")


@dataclass(frozen=True)
class HyperSpec:
    """A mutable hyperparameter: bounds [low, high] and kind "scale" (value * or / factor) or "one_minus"
    (1 - value * or / factor, for Adam beta1: high must be < 1 so the value stays < 1)."""
    name: str
    low: float
    high: float
    kind: str = "scale"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"PBT hyperparameter spec: name must be a non-empty string, got {self.name!r}")
        if self.kind not in SPEC_KINDS:
            raise ValueError(f"PBT hyperparameter {self.name}: kind must be one of {SPEC_KINDS}, got {self.kind!r}")
        if not (is_number(self.low) and is_number(self.high) and math.isfinite(self.low)
                and math.isfinite(self.high) and self.low <= self.high):
            raise ValueError(f"PBT hyperparameter {self.name}: bounds must be finite with low <= high, "
                             f"got [{self.low!r}, {self.high!r}]")
        if self.kind == "one_minus" and self.high >= 1.0:
            raise ValueError(f"PBT hyperparameter {self.name}: a one_minus bound must stay below 1, "
                             f"got high={self.high}")

    def perturb(self, value: float, factor: float) -> float:
        """The value after multiplying by `factor` (dividing: pass 1/factor), clipped to the bounds."""
        new = value * factor if self.kind == "scale" else 1.0 - (1.0 - value) * factor
        return float(min(max(new, self.low), self.high))


def default_hyper_specs(shaping_keys: Sequence[str] = ()) -> list[HyperSpec]:
    """The paper's mutable hyperparameters: learning rate, entropy coefficient, Adam beta1 and every reward-shaping
    coefficient (scaled: 0 stays 0, a negative coefficient stays negative)."""
    specs = [HyperSpec("learning_rate", 1e-6, 1e-2, "scale"),
             HyperSpec("exploration_loss_coeff", 1e-5, 1.0, "scale"),
             HyperSpec("adam_beta1", 0.5, 0.999, "one_minus")]
    return specs + [HyperSpec(k, -SHAPING_BOUND, SHAPING_BOUND, "scale") for k in shaping_keys]
