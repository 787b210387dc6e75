"""Student's t for the verification's mean of few rounds (tune/student_t.py), against published
quantiles, and what it asks of the rounds."""

from __future__ import annotations

import pytest

from trainspeed.tune.student_t import normal_tail, t_critical, t_tail

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("t, dof, tail", [(6.314, 1, 0.05), (4.303, 2, 0.025), (4.541, 3, 0.01),
                                          (2.571, 5, 0.025), (3.169, 10, 0.005), (1.0, 4, 0.18695)])
def test_the_tail_matches_published_quantiles(t, dof, tail):
    assert t_tail(t, dof) == pytest.approx(tail, abs=5e-5)


def test_the_critical_value_at_three_standard_errors_falls_with_the_rounds_towards_the_normal():
    needs = [t_critical(3.0, rounds - 1) for rounds in (3, 4, 6, 12, 201)]
    assert [round(x, 2) for x in needs[:4]] == [19.21, 9.22, 5.51, 3.85]
    assert needs == sorted(needs, reverse=True) and 3.0 < needs[-1] < 3.05
    assert t_tail(needs[0], 2) == pytest.approx(normal_tail(3.0), rel=1e-6)


def test_a_null_edits_three_tight_rounds_do_not_clear_it():
    """The null edit's rounds, 1.04-1.07x (a 5 % bias between trials): 3.0 standard errors of
    their own spread read as verified; t with 2 degrees of freedom asks 19.2."""
    import math
    import statistics

    logs = [math.log(x) for x in (1.04, 1.055, 1.07)]
    z = statistics.fmean(logs) / (statistics.stdev(logs) / math.sqrt(3))
    assert 3.0 < z < t_critical(3.0, 2)


def test_no_degrees_of_freedom_is_an_error():
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_tail(1.0, 0)
