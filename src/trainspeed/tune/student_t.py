"""Student's t for a mean judged by its own few rounds: how many standard errors, estimated from
those rounds, a mean must clear to be as unlikely by chance as `z` standard errors known exactly.

The tune's verification judged the mean of its rounds by CONFIRM_Z = 3 standard errors whose
standard deviation came from the same 3 rounds. With 2 degrees of freedom the sample standard
deviation is often far below the true one: a null edit's three rounds read 1.04-1.07x (a 5 % bias
of the machine's disk between trials), cleared "3 standard errors" and were verified faster in
3 of 10 runs. At the same tail (one-sided 0.00135) t needs 19.2 standard errors of 3 rounds,
9.2 of 4, 5.5 of 6, 3.85 of 12, and tends to 3 as the rounds grow.

The distribution function uses the finite series for integer degrees of freedom (Abramowitz and
Stegun 26.7.3-4), exact to rounding; the quantile is found by bisection. Pure math: no scipy.
"""

from __future__ import annotations

import math


def t_tail(t: float, dof: int) -> float:
    """P(T > t) for Student's t with `dof` >= 1 degrees of freedom, t >= 0."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    theta = math.atan2(t, math.sqrt(dof))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if dof % 2:  # odd: A = (2/pi)(theta + sin cos (1 + 2/3 cos^2 + (2*4)/(3*5) cos^4 + ...))
        term, total = 1.0, 1.0 if dof > 1 else 0.0
        for k in range(1, (dof - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        within = 2 / math.pi * (theta + s * math.cos(theta) * total)
    else:  # even: A = sin (1 + 1/2 cos^2 + (1*3)/(2*4) cos^4 + ...)
        term, total = 1.0, 1.0
        for k in range(1, dof // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        within = s * total
    return max(0.0, (1.0 - within) / 2)


def normal_tail(z: float) -> float:
    """P(Z > z) for a standard normal."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def t_critical(z: float, dof: int) -> float:
    """The t whose one-sided tail with `dof` degrees of freedom equals the standard normal's
    beyond `z`: the standard errors a mean must clear when its standard deviation is estimated
    from dof + 1 values."""
    tail = normal_tail(z)
    lo, hi = z, max(2 * z, 1.0)
    while t_tail(hi, dof) > tail:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_tail(mid, dof) > tail else (lo, mid)
    return hi


__all__ = ["normal_tail", "t_critical", "t_tail"]
