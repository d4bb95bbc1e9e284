"""Every prediction's 80% interval (analysis/intervals.py): from the sweep's own checks at the
prediction's distance, wider past the farthest check and with the repeats' spread, and the words
beyond every check, which quote no check measured nearer."""

from __future__ import annotations

import json
import re
import statistics

import pytest
from click.testing import CliRunner
from report_rows import CALIBRATION, row, scaling_rows, write_sweep

from amdahl.analysis.calibration import Calibration
from amdahl.analysis.configs import group_configs
from amdahl.analysis.intervals import (
    REAL_OVERSUBSCRIBED,
    REAL_RANKS,
    SIMULATED,
    Evidence,
    Regime,
    evidence_of,
    interval,
    nearest_evidence,
)
from amdahl.analysis.prediction import predict_inputs
from amdahl.analysis.selfcheck import Extrapolation
from amdahl.analysis.stepmodel import ModelInputs
from amdahl.cli.commands import main
from amdahl.spec.schema import OptionsSpec

#: Measured at 1-4 devices; leave-one-out errors 4-6%; one check 2x out (2 -> 4): 8% / 12%.
EVIDENCE = Evidence(4, (0.04, 0.05, 0.06), (Extrapolation(2, 4, 0.08, 0.12, 3),))


def _inputs(rows: list[dict]) -> ModelInputs:
    return ModelInputs(
        group_configs(rows), Calibration.from_dict(CALIBRATION), OptionsSpec(bucket_cap_mb=1)
    )


def test_the_interval_holds_the_point_at_every_distance():
    for devices in (2, 4, 8, 16, 64):
        band = interval(1000.0, devices, EVIDENCE)
        assert band.low < 1000.0 < band.high and band.contains(1000.0)


def test_inside_the_measured_counts_leave_one_out_sets_it_and_a_check_at_its_own_distance():
    inside, at_check = interval(1000.0, 4, EVIDENCE), interval(1000.0, 8, EVIDENCE)
    assert "leave-one-out" in inside.basis
    assert "2x self-check" in at_check.basis
    assert inside.half_width < at_check.half_width


def test_past_the_farthest_check_the_interval_grows_with_the_distance():
    """The check reaches 2x (8 devices); 16 and 32 devices are 4x and 8x: each wider."""
    widths = [interval(1000.0, p, EVIDENCE).half_width for p in (8, 16, 32)]
    assert widths[0] < widths[1] < widths[2]
    assert "distance past it" in interval(1000.0, 32, EVIDENCE).basis


def test_beyond_every_check_it_is_never_narrower_than_the_held_out_error():
    tight = Evidence(4, (0.001,), (Extrapolation(2, 4, 0.002, 0.003, 3),))
    band = interval(1000.0, 16, tight)
    assert band.high / 1000.0 - 1 >= SIMULATED.floor - 1e-9
    assert "simulated held-out" in band.basis


def test_the_repeats_spread_widens_it():
    noisy = Evidence(EVIDENCE.widest, EVIDENCE.loo, EVIDENCE.checks, spread=0.1)
    for devices in (4, 8, 16):
        assert interval(1000.0, devices, noisy).half_width > (
            interval(1000.0, devices, EVIDENCE).half_width
        )


def test_an_extrapolated_regime_holds_the_low_end_at_its_held_out_sets_bound():
    """Only the low end moves: to the regime's held-out bound where the sweep's own width is
    narrower than it, nowhere where the sweep's own width is wider already."""
    plain = interval(1000.0, 16, EVIDENCE)
    loaded = interval(1000.0, 16, EVIDENCE, Regime("the cores' load extrapolated", REAL_RANKS))
    assert loaded.high == pytest.approx(plain.high) and loaded.low < plain.low
    assert loaded.low == pytest.approx(1000.0 / (1 + REAL_RANKS.floor))
    assert "low end at least 61.3%" in loaded.basis
    wide = Evidence(4, (0.5, 0.5, 0.5))  # leave-one-out 50%, grown 4x: past either set's bound
    held = interval(1000.0, 16, wide, Regime("the cores' load extrapolated", SIMULATED))
    unheld = interval(1000.0, 16, wide)
    assert (held.low, held.high) == pytest.approx((unheld.low, unheld.high))


def test_the_regimes_evidence_is_the_held_out_set_whose_ranks_are_most_alike():
    """Ranks mostly off the cores (a device's kernels, the simulated device's sleeps) are the
    simulated sets' regime; CPU-bound ranks near a core each are the 16-core real-rank run's,
    and far above the cores the 2-core real-rank set's."""
    for per_core in (1.0, 2.0, 8.0):
        assert nearest_evidence(0.05, per_core) is SIMULATED
        assert nearest_evidence(0.2, per_core) is SIMULATED
    assert nearest_evidence(1.0, 1.0) is REAL_RANKS and nearest_evidence(0.8, 2.0) is REAL_RANKS
    assert nearest_evidence(1.0, 8.0) is REAL_OVERSUBSCRIBED
    assert nearest_evidence(0.9, 4.0) is REAL_OVERSUBSCRIBED
    assert nearest_evidence(0.0, 0.0) is SIMULATED


@pytest.mark.parametrize(
    ("cpu_percent", "evidence"), [(5.0, SIMULATED), (50.0, REAL_OVERSUBSCRIBED)]
)
def test_the_cores_load_regime_quotes_and_holds_the_set_measured_with_ranks_like_these(
    cpu_percent, evidence
):
    """Rows on a 2-core node at 1-4 devices: 16 ranks load the cores beyond any measured count.
    Ranks 10% CPU work (5% of 2 cores) get the simulated sets' words and bound; ranks that keep
    a core busy (50% of 2), 8 to a core at 16, the 2-core real-rank set's."""
    rows = [{**r, "host_cores": 2, "cpu_utilisation": cpu_percent} for r in scaling_rows()]
    result = predict_inputs(_inputs(rows), [4, 16])
    for fam in result.families:
        four, sixteen = fam.rows
        assert "load extrapolated" not in four.interval.basis
        said = [c for c in sixteen.prediction.caveats if c.startswith("the cores' load")]
        assert said and f"median |error| {evidence.median:.1%}" in said[0]
        assert f"80% bound, {evidence.floor:.1%}" in said[0]
        # 16 is beyond every check too: the distance caveat names that set, not repeating it
        quoting = [c for c in sixteen.prediction.caveats if evidence.text() in c]
        assert quoting == said[:1]
        point = sixteen.prediction.throughput
        assert sixteen.interval.low <= point / (1 + evidence.floor) * (1 + 1e-9)


def test_the_interval_spans_the_communication_laws_alternative():
    """An alternative throughput beyond either end (the gloo link held at its widest
    calibration) moves that end to it and is said; one inside changes nothing."""
    plain = interval(1000.0, 16, EVIDENCE)
    faster = interval(1000.0, 16, EVIDENCE, alternative=plain.high * 1.3)
    assert faster.high == pytest.approx(plain.high * 1.3) and faster.low == plain.low
    assert "held at its widest calibration" in faster.basis
    slower = interval(1000.0, 16, EVIDENCE, alternative=plain.low * 0.8)
    assert slower.low == pytest.approx(plain.low * 0.8) and slower.high == plain.high
    inside = interval(1000.0, 16, EVIDENCE, alternative=1010.0)
    assert (inside.low, inside.high, inside.basis) == (plain.low, plain.high, plain.basis)


def test_a_prediction_beyond_the_calibrated_gloo_counts_spans_the_held_link(tmp_path):
    """Rows on a 2-core node at 1-4 devices, gloo calibrated at 2-4 ranks (3 and 4 above the
    cores, alpha growing there): 16 ranks' link is the law's, extrapolated. The prediction
    says so with the alternative's throughput (the link held at 4 ranks': faster, since the
    law grows alpha), and its interval holds it; 4 devices, calibrated, has neither."""
    import math

    by = {
        str(q): {"alpha_s": 3e-4 * (1 + 1.5 * math.log(q / 2)), "bandwidth_Bps": 1e9}
        for q in (2, 3, 4)
    }
    calibration = {**CALIBRATION, "devices": 4, "by_devices": by}
    rows = [{**r, "host_cores": 2, "cpu_utilisation": 5.0} for r in scaling_rows()]
    inputs = ModelInputs(
        group_configs(rows), Calibration.from_dict(calibration), OptionsSpec(bucket_cap_mb=1)
    )
    result = predict_inputs(inputs, [4, 16])
    spanned = 0
    for fam in result.families:
        four, sixteen = fam.rows
        assert not any("held at 4 ranks' link" in c for c in four.prediction.caveats)
        said = [c for c in sixteen.prediction.caveats if "held at 4 ranks' link" in c]
        if fam.family.sync == "none":
            assert not said
            continue
        assert said
        alt = float(said[0].split("it gives ")[1].split(" samples/s")[0].replace(",", ""))
        assert alt > sixteen.prediction.throughput and sixteen.interval.contains(alt)
        spanned += 1
    assert spanned


def test_without_any_self_check_the_held_out_error_is_the_interval():
    band = interval(1000.0, 2, Evidence(1))
    assert band.high == pytest.approx(1000.0 * (1 + SIMULATED.floor))
    assert "no self-check" in band.basis


def test_every_predicted_row_carries_its_interval():
    for fam in predict_inputs(_inputs(scaling_rows()), [4, 16]).families:
        for pr in fam.rows:
            assert pr.throughput_low < pr.prediction.throughput < pr.throughput_high
            low, high = pr.step_s_range
            assert low < pr.prediction.step_s < high


def test_the_spread_is_the_one_between_a_sweeps_repeats():
    """Each configuration measured twice, 10% apart: the spread is their relative sd, and every
    interval of the sweep's predictions counts it."""
    rows = scaling_rows()
    again = [{**r, "repeat": 1, "throughput": r["throughput"] * 1.1} for r in rows]
    inputs = _inputs(rows + again)
    result = predict_inputs(inputs, [4, 16])
    ev = evidence_of(inputs, result.loo, result.extrapolations)
    assert ev.spread == pytest.approx(statistics.stdev([1.0, 1.1]) / 1.05, rel=1e-6)
    assert evidence_of(_inputs(rows), result.loo, result.extrapolations).spread == 0.0
    assert all("spread" in pr.interval.basis for f in result.families for pr in f.rows)


def test_a_prediction_beyond_every_check_quotes_none_and_says_how_far_out_it_is():
    """Measured at 1, 2 and 4: the one check is 2 -> 4 (2x). 16 devices is 4x out: the caveat
    names the farthest check without its error and gives the held-out figures instead."""
    result = predict_inputs(_inputs(scaling_rows()), [8, 16])
    ext = result.extrapolation
    assert (ext.fitted_max, ext.held_out) == (2, 4)
    for fam in result.families:
        for pr in fam.rows:
            beyond = next(c for c in pr.prediction.caveats if "the widest measured" in c)
            if pr.devices == 8:
                assert f"median error {ext.median:.1%}" in beyond
                continue
            assert "4x the widest measured (4)" in beyond
            assert "the farthest check: fitted up to 2 devices, the model predicted 4 (2x)" in (
                beyond
            )
            assert f"median error {ext.median:.1%}" not in beyond
            assert f"median |error| {SIMULATED.median:.1%}" in beyond
            assert f"naive Amdahl {SIMULATED.naive_median:.1%}" in beyond


def test_predict_json_has_each_interval_beside_its_point(tmp_path):
    rows = scaling_rows() + [row(2, 512, "none", 5600.0, phases=(0.001, 0.04, 0.08, 0.007))]
    d = write_sweep(tmp_path / "s", rows, CALIBRATION)
    result = CliRunner().invoke(main, ["predict", str(d), "--devices", "8,16", "--json"])
    assert result.exit_code == 0, result.output
    predictions = [p for f in json.loads(result.output)["families"] for p in f["predictions"]]
    assert predictions
    for p in predictions:
        assert p["throughput_low"] < p["throughput"] < p["throughput_high"]
        assert p["step_s_low"] < p["step_s"] < p["step_s_high"]
        assert p["interval_basis"]


def test_predict_text_shows_the_interval(tmp_path):
    d = write_sweep(tmp_path / "s", scaling_rows(), CALIBRATION)
    wide = CliRunner(env={"COLUMNS": "240"})
    result = wide.invoke(main, ["predict", str(d), "--devices", "16"])
    assert result.exit_code == 0, result.output
    assert "80% interval samples/s" in result.output and "80% interval step ms" in result.output


def test_predict_prints_a_caveat_several_families_carry_once_and_each_family_points_to_it(
    tmp_path,
):
    """ddp and sync none predicted at 16 (4x beyond the 2x check) carry the same distance
    caveat, whose held-out evidence runs to a paragraph: it is printed once, numbered, and
    each family's section names its number; a caveat one family alone carries stays there."""
    from amdahl.analysis.prediction import predict_inputs
    from amdahl.report.predict import load_model_inputs
    from amdahl.report.prediction_document import prediction_sections

    d = write_sweep(tmp_path / "s", scaling_rows(), CALIBRATION)
    result = predict_inputs(load_model_inputs(d), [16])
    *families, shared = prediction_sections(result)[1:]
    assert shared.title.startswith("CAVEATS SHARED")
    distance = [b for b in shared.bullets if "16 devices is 4x the widest measured" in b]
    assert len(distance) == 1 and distance[0].startswith("[")
    number = distance[0].split("]")[0] + "]"
    for sec in families:
        assert not any("16 devices is 4x" in b for b in sec.bullets)
        assert any("caveats shared" in b and number in b for b in sec.bullets)
    none = next(sec for sec in families if sec.title.endswith("none"))
    assert any("no-communication ceiling" in b for b in none.bullets)
    wide = CliRunner(env={"COLUMNS": "240"}).invoke(main, ["predict", str(d), "--devices", "16"])
    assert wide.exit_code == 0 and wide.output.count("16 devices is 4x the widest") == 1


def test_the_reports_projections_carry_the_interval_and_the_distance_words(tmp_path):
    """Measured at 1, 2 and 4 devices, the report projects each curve past 4: every projected
    row has its interval, and those beyond the one 2x check quote no check's error."""
    from amdahl.report import write_reports

    d = write_sweep(tmp_path / "s", scaling_rows(), CALIBRATION)
    md = write_reports(d)["markdown"].read_text()
    section = md[md.index("## Predicted vs measured") :]
    section = section[: section.index("\n## ")]
    table = section[section.index("PREDICTION from the step-time model") :]
    projected = [line for line in table.splitlines() if line.startswith("| ") and " to " in line]
    assert projected and "80% interval samples/s" in table
    # each row cites its caveats by number; the notes under the table hold them, each once
    notes = dict(line[2:].split(" ", 1) for line in table.splitlines() if line.startswith("- \\["))
    assert len(notes) == len(set(notes.values()))

    def words(row: str) -> list[str]:
        return [notes[f"\\[{n}\\]"] for n in re.findall(r"\\\[(\d+)\\\]", row)]

    beyond = [w for row in projected for w in words(row) if "the farthest check" in w]
    assert beyond and all("median error" not in w for w in beyond)


def test_more_ranks_than_cores_with_none_measured_there_is_an_extrapolated_regime():
    """Rows on a 4-core node at 1-4 devices, each rank's step 4% CPU work (8 ranks would load
    the cores 11%, under the half where the load's own regime starts): 8 ranks are above its
    cores, which no measured point was, so the interval's low end widens and the caveat gives
    the figures of the set whose ranks are most like these (mostly off the cores: the simulated
    sets'); CPU-bound ranks there get a real-rank set's."""
    rows = [{**r, "host_cores": 4, "cpu_utilisation": 1.0} for r in scaling_rows()]
    result = predict_inputs(_inputs(rows), [4, 8])
    for fam in result.families:
        four, eight = fam.rows
        assert "above the cores" not in four.interval.basis
        assert "8 ranks on 4 cores" in eight.interval.basis
        said = [c for c in eight.prediction.caveats if c.startswith("8 ranks on 4 cores")]
        assert said and f"median |error| {SIMULATED.median:.1%}" in said[0]
