"""Stat's spread figures: the median's standard error against a simulation of it."""

import math
import random
import statistics

import pytest

from amdahl.analysis.stats import Stat


def test_the_medians_standard_error_matches_its_spread_over_many_samples():
    rng = random.Random(0)
    n, sigma = 25, 0.05
    samples = [[rng.gauss(1.0, sigma) for _ in range(n)] for _ in range(4000)]
    observed = statistics.stdev(statistics.median(s) for s in samples)
    stated = statistics.fmean(Stat.of(s).rel_se_median for s in samples)
    assert stated == pytest.approx(observed, rel=0.1)
    assert stated == pytest.approx(math.sqrt(math.pi / 2) * sigma / math.sqrt(n), rel=0.05)


def test_one_repeat_has_no_standard_error():
    assert Stat.of([3.0]).rel_se_median is None
