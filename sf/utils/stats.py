"""Student's t distribution, for confidence intervals over a few runs or episodes (sf.eval, sf.launch --summary):
numpy and the standard library have none, and scipy is not a dependency."""
from __future__ import annotations

import math


def _t_two_sided(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with df degrees of freedom (integer df: Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    c = math.cos(theta) ** 2
    term = total = 1.0
    if df % 2:
        for k in range(1, (df - 1) // 2):
            term *= c * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0))
    for k in range(1, df // 2):
        term *= c * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def t_quantile(p: float, df: int) -> float:
    """The quantile of Student's t: t with P(T <= t) = p (0.5 < p < 1), df >= 1 degrees of freedom. Exact (bisection
    on the distribution function) up to 200 degrees of freedom, the Cornish-Fisher series (A&S 26.7.5, error below
    1e-9) above."""
    if df > 200:
        from statistics import NormalDist
        z = NormalDist().inv_cdf(p)
        g = [(z**3 + z) / 4, (5 * z**5 + 16 * z**3 + 3 * z) / 96, (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
             (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160]
        return z + sum(gi / df ** (i + 1) for i, gi in enumerate(g))
    target, lo, hi = 2 * p - 1, 0.0, 1.0
    while _t_two_sided(hi, df) < target:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_two_sided(mid, df) < target else (lo, mid)
    return (lo + hi) / 2
