"""The report's formulas against hand-computed cases: speedup (weak and strong), efficiency, both
ideals, Karp-Flatt, the Amdahl fit and its projection, spreads, ring all-reduce, MFU, cost."""

import math

import pytest
from report_rows import conform, row, scaling_rows

from amdahl.analysis.alphabeta import bus_bandwidth, fit_alpha_beta, ring_allreduce_s
from amdahl.analysis.configs import group_configs
from amdahl.analysis.cost import cost_per_million, mfu, pareto_front
from amdahl.analysis.scaling import amdahl_speedup, fit_amdahl, karp_flatt, scaling_curves
from amdahl.analysis.stats import Stat, differs, ratio


def _curves(rows):
    return {c.label: c for c in scaling_curves(group_configs(conform(rows)))}


def test_seed_worked_example_amdahl_s_010_p4_gives_at_most_308x():
    assert amdahl_speedup(0.10, 4) == pytest.approx(1 / 0.325)
    assert f"{amdahl_speedup(0.10, 4):.2f}" == "3.08"
    assert amdahl_speedup(0.0, 8) == 8
    assert amdahl_speedup(1.0, 8) == 1


def test_karp_flatt_hand_computed():
    assert karp_flatt(1.6, 2) == pytest.approx((1 / 1.6 - 0.5) / 0.5)  # 0.25
    assert karp_flatt(1.6, 2) == pytest.approx(0.25)
    assert karp_flatt(2.0, 4) == pytest.approx((0.5 - 0.25) / 0.75)
    assert karp_flatt(4.0, 4) == pytest.approx(0.0)
    assert karp_flatt(1.0, 1) is None
    # on an exact Amdahl curve, Karp-Flatt recovers the serial fraction at every p
    for p in (2, 4, 16):
        assert karp_flatt(amdahl_speedup(0.1, p), p) == pytest.approx(0.1)


def test_weak_scaling_speedup_efficiency_and_both_ideals():
    curves = _curves(scaling_rows())
    ddp = curves["b128 fp32 eager w1 ddp"]
    assert ddp.scaling == "weak"
    pts = {p.devices: p for p in ddp.points}
    assert [p.devices for p in ddp.points] == [1, 2, 4]
    assert pts[2].speedup.median == pytest.approx(1.6)
    assert pts[4].speedup.median == pytest.approx(2.0)
    assert pts[4].efficiency == pytest.approx(0.5)
    assert pts[4].karp_flatt == pytest.approx((0.5 - 0.25) / 0.75)
    # no-communication ceiling: 4 workers alone reach 3000/1000 = 3x
    assert pts[4].ceiling_speedup == pytest.approx(3.0)
    assert pts[4].contention_efficiency == pytest.approx(0.75)  # hardware contention
    assert pts[4].comm_efficiency == pytest.approx(2.0 / 3.0)  # communication
    # the two factors multiply back to the efficiency
    assert pts[4].contention_efficiency * pts[4].comm_efficiency == pytest.approx(0.5)
    none = curves["b128 fp32 eager w1 none"]
    assert not none.has_ceiling


def test_strong_scaling_uses_the_time_ratio_and_groups_by_global_batch():
    # global batch 512 split over 1, 2, 4 devices; seconds per step 0.10, 0.06, 0.04.
    # throughput is deliberately constant: a weak-scaling formula would say "no speedup".
    rows = [
        row(p, 512 // p, throughput=1.0, wall=t, scaling="strong")
        for p, t in ((1, 0.10), (2, 0.06), (4, 0.04))
    ]
    (curve,) = scaling_curves(group_configs(conform(rows)))
    assert curve.scaling == "strong"
    assert curve.label.startswith("gb512 ")
    s = [p.speedup.median for p in curve.points]
    assert s == pytest.approx([1.0, 0.10 / 0.06, 2.5])
    assert curve.points[2].efficiency == pytest.approx(2.5 / 4)


def test_spread_over_repeats_and_no_measurable_difference():
    s = Stat.of([100.0, 110.0, 90.0, None, float("nan")])
    assert (s.median, s.lo, s.hi, s.n) == (100.0, 90.0, 110.0, 3)
    assert s.spread == 20.0 and s.rel_spread == pytest.approx(0.2)
    assert s.cv == pytest.approx(0.1)
    assert not differs(s, Stat.of([105.0, 108.0, 102.0]))  # 5 apart, spread 20
    assert differs(s, Stat.of([150.0, 151.0]))
    assert Stat.of([None]) is None
    # speedup range from repeats: lo = min(p) / max(1), hi = max(p) / min(1)
    r = ratio(Stat.of([1800.0, 2000.0, 2200.0]), Stat.of([900.0, 1000.0, 1100.0]))
    assert r.median == pytest.approx(2.0)
    assert r.lo == pytest.approx(1800 / 1100) and r.hi == pytest.approx(2200 / 900)


def test_speedup_carries_the_repeat_spread():
    rows = [row(1, throughput=x, repeat=i) for i, x in enumerate((900.0, 1000.0, 1100.0))]
    rows += [row(2, throughput=x, repeat=i) for i, x in enumerate((1800.0, 2000.0, 2200.0))]
    (curve,) = scaling_curves(group_configs(conform(rows)))
    p2 = curve.points[1]
    assert p2.config.throughput.n == 3
    assert p2.speedup.median == pytest.approx(2.0)
    assert (p2.speedup.lo, p2.speedup.hi) == pytest.approx((1800 / 1100, 2200 / 900))


def test_amdahl_fit_recovers_the_serial_fraction_and_projects_with_a_label():
    points = [(1, 1.0)] + [(p, amdahl_speedup(0.05, p)) for p in (2, 4, 8)]
    fit = fit_amdahl(points)
    assert fit.serial_fraction == pytest.approx(0.05, abs=1e-6)
    assert fit.r2 == pytest.approx(1.0) and fit.rmse < 1e-6
    assert fit.quality.startswith("good")
    assert fit.limit == pytest.approx(20.0)

    rows = [row(p, throughput=1000.0 * amdahl_speedup(0.05, p)) for p in (1, 2, 4, 8)]
    (curve,) = scaling_curves(group_configs(conform(rows)))
    assert [p.devices for p in curve.projections] == [16, 32, 64]
    assert curve.projections[0].speedup == pytest.approx(amdahl_speedup(0.05, 16), rel=1e-4)
    assert curve.projections[0].throughput == pytest.approx(
        1000.0 * amdahl_speedup(0.05, 16), rel=1e-4
    )


def test_amdahl_fit_quality_with_too_few_points_and_with_slowdowns():
    one = fit_amdahl([(1, 1.0), (2, 1.6)])
    assert one.serial_fraction == pytest.approx(0.25, abs=1e-6)  # equals Karp-Flatt
    assert one.r2 is None and "no degrees of freedom" in one.quality
    slower = fit_amdahl([(2, 0.6), (4, 0.5)])
    assert slower.serial_fraction == pytest.approx(1.0)
    assert "never exceeds 1" in slower.quality
    assert fit_amdahl([(1, 1.0)]) is None


def test_ring_allreduce_and_bus_bandwidth_hand_computed():
    # 2(p-1) alpha + 2(p-1)/p * n / B with p=4, n=1e6 B, alpha=10 us, B=1 GB/s
    assert ring_allreduce_s(4, 1e6, 10e-6, 1e9) == pytest.approx(6e-5 + 1.5e-3)
    assert ring_allreduce_s(1, 1e6, 10e-6, 1e9) == 0.0
    assert bus_bandwidth(2, 1e6, 1e-3) == pytest.approx(1e9)
    assert bus_bandwidth(4, 1e6, 1e-3) == pytest.approx(1.5e9)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_fit_alpha_beta_recovers_latency_and_bandwidth(p):
    sizes = [4.0**k for k in range(1, 13)]
    times = [ring_allreduce_s(p, n, 50e-6, 2e9) for n in sizes]
    ab = fit_alpha_beta(p, sizes, times)
    assert ab.alpha_s == pytest.approx(50e-6, rel=1e-6)
    assert ab.bandwidth_Bps == pytest.approx(2e9, rel=1e-6)
    assert ab.rel_rmse < 1e-9


def test_fit_alpha_beta_refuses_what_it_cannot_separate():
    with pytest.raises(ValueError, match="p >= 2"):
        fit_alpha_beta(1, [1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="two message sizes"):
        fit_alpha_beta(2, [8.0, 8.0], [1e-3, 1e-3])


def test_mfu_cost_and_pareto_front():
    assert mfu(4e12, 2, 1e13) == pytest.approx(0.2)
    # 2 devices at 1000 samples/s: 1e6 samples take 1000 s = 2000 device-s = 0.556 device-h
    assert cost_per_million(2, 1000.0, 3.6) == pytest.approx(2.0)
    pts = [(100.0, 1.0), (200.0, 2.0), (150.0, 3.0), (50.0, 0.5)]
    assert pareto_front(pts) == [3, 0, 1]  # (150, 3) is beaten by (200, 2)
    assert math.isinf(fit_amdahl([(2, 2.0)]).limit)
