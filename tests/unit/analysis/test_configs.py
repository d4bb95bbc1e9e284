"""Rows measured under different settings are never repeats of one configuration.

A sweep directory resumed with other settings (before `--resume` refused that) holds rows of the
same axis values measured differently; the report keeps them apart, and leaves ordinary sweeps
exactly as they were.
"""

from __future__ import annotations

from report_rows import conform, row, scaling_rows, write_sweep

from amdahl.analysis.configs import MEASURED_UNDER, group_configs
from amdahl.analysis.scaling import scaling_curves
from amdahl.report import build_report, write_reports


def _configs(rows):
    return {c.label: c for c in group_configs(conform(rows))}


def test_rows_of_different_step_counts_are_not_repeats():
    rows = [
        row(1, 128, throughput=1000.0, repeat=0, steps=150, trial_id="long"),
        row(1, 128, throughput=1010.0, repeat=1, steps=150, trial_id="long"),
        row(1, 128, throughput=700.0, repeat=0, steps=20, trial_id="short"),
    ]
    configs = _configs(rows)
    assert sorted(configs) == [
        "d1 b128 fp32 eager w1 ddp steps=150",
        "d1 b128 fp32 eager w1 ddp steps=20",
    ]
    assert configs["d1 b128 fp32 eager w1 ddp steps=150"].throughput.n == 2
    assert configs["d1 b128 fp32 eager w1 ddp steps=20"].throughput.median == 700.0


def test_rows_of_different_warmups_are_not_repeats():
    rows = [
        row(1, 128, repeat=0, warmup_steps=2, trial_id="a"),
        row(1, 128, repeat=0, warmup_steps=10, trial_id="b"),
    ]
    assert sorted(_configs(rows)) == [
        "d1 b128 fp32 eager w1 ddp warmup=10",
        "d1 b128 fp32 eager w1 ddp warmup=2",
    ]


def test_rows_of_other_trials_are_not_repeats_even_when_the_row_shows_no_difference():
    # Another lr, seed, optimizer or resources: only the trial id (their hash) differs.
    rows = [
        row(1, 128, throughput=1000.0, repeat=0, trial_id="lr005"),
        row(1, 128, throughput=1400.0, repeat=0, trial_id="lr01"),
        row(2, 128, throughput=1800.0, repeat=0, trial_id="d2"),
    ]
    configs = _configs(rows)
    assert sorted(configs) == [
        "d1 b128 fp32 eager w1 ddp trial=lr005",
        "d1 b128 fp32 eager w1 ddp trial=lr01",
        "d2 b128 fp32 eager w1 ddp",
    ]
    assert all(c.throughput.n == 1 for c in configs.values())


def test_an_ordinary_sweep_groups_and_labels_as_before():
    rows = [*scaling_rows(), row(1, sync="ddp", throughput=1010.0, repeat=1)]
    configs = group_configs(conform(rows))
    assert [c.label for c in configs][:3] == [
        "d1 b128 fp32 eager w1 ddp",
        "d2 b128 fp32 eager w1 ddp",
        "d4 b128 fp32 eager w1 ddp",
    ]
    assert configs[0].throughput.n == 2
    assert all(c.settings[m] is None for c in configs for m in MEASURED_UNDER)


def test_time_to_target_repeats_stay_one_configuration():
    goal = {"target": "val_accuracy>=0.9"}
    rows = [
        row(1, 128, repeat=0, steps=180, trial_id="t", **goal),
        row(1, 128, repeat=1, steps=240, trial_id="t", **goal),
        # A launch that crashed records the configured steps and no target.
        row(1, 128, repeat=2, steps=50, trial_id="t", status="failed", error="launch failed"),
    ]
    [config] = group_configs(conform(rows))
    assert config.label == "d1 b128 fp32 eager w1 ddp" and len(config.rows) == 3


def test_each_setting_gets_its_own_scaling_curve():
    rows = [
        row(1, 128, throughput=1000.0, steps=150, trial_id="a1"),
        row(2, 128, throughput=1800.0, steps=150, trial_id="a2"),
        row(1, 128, throughput=600.0, steps=20, trial_id="b1"),
        row(2, 128, throughput=900.0, steps=20, trial_id="b2"),
    ]
    curves = {c.label: c for c in scaling_curves(group_configs(conform(rows)))}
    assert sorted(curves) == [
        "b128 fp32 eager w1 ddp steps=150",
        "b128 fp32 eager w1 ddp steps=20",
    ]
    assert curves["b128 fp32 eager w1 ddp steps=150"].points[1].speedup.median == 1.8
    assert curves["b128 fp32 eager w1 ddp steps=20"].points[1].speedup.median == 1.5


def test_the_report_of_a_mixed_directory_shows_both(tmp_path):
    rows = [
        row(1, 128, throughput=1000.0, repeat=0, steps=150, trial_id="long"),
        row(1, 128, throughput=700.0, repeat=0, steps=20, trial_id="short"),
    ]
    sweep_dir = write_sweep(tmp_path / "s", rows)
    assert len(build_report(sweep_dir).configs) == 2
    markdown = write_reports(sweep_dir)["markdown"].read_text()
    assert "steps=150" in markdown and "steps=20" in markdown
