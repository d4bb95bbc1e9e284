"""Successive halving's decisions (search/halving.py): rungs, promotion with a noise band,
constraints (search/objectives.py), budget, replay from rows (resume), and the step-time model's
skips; the search section's checks (search/spec_checks.py)."""

import json

import pytest

from amdahl.search.halving import (
    estimate_s,
    grid_estimate_s,
    predicted_skips,
    promote,
    ranks_only,
    replay,
    rung_repeats,
    rung_steps,
    trim_to_budget,
)
from amdahl.search.objectives import Constraint
from amdahl.spec.schema import SearchSpec, TargetSpec, TrainSpec


def _row(tid, throughput, rung=0, steps=10, status="ok", jitter=0.0, **extra):
    """A results row whose per-step times have relative spread `jitter` around the mean."""
    step = 64 / throughput if throughput else 0.01
    times = [step * (1 + jitter * (-1) ** i) for i in range(steps)]
    history = {"step": [2 + i + 1 for i in range(steps)], "step_time_s": times}
    return {
        "trial_id": tid,
        "repeat": extra.pop("repeat", 0),
        "rung": rung,
        "status": status,
        "error": None if status == "ok" else f"{status}: boom",
        "throughput": throughput if status == "ok" else None,
        "devices": 1,
        "steps": steps,
        "warmup_steps": 2,
        "history": json.dumps(history),
        "wall_s": 1.0 + step * steps,
        "measured_s": step * steps,
        **extra,
    }


def test_rung_steps_grow_by_eta_and_end_at_the_full_length():
    assert rung_steps(SearchSpec(min_steps=10, eta=3), TrainSpec(steps=200)) == [10, 30, 90, 200]
    assert rung_steps(SearchSpec(min_steps=10, eta=3), TrainSpec(steps=90)) == [10, 30, 90]
    assert rung_steps(SearchSpec(min_steps=50, eta=2), TrainSpec(steps=20)) == [20]
    # 270 would be a rung almost as long as the last: the last step up is 90 -> 300
    assert rung_steps(SearchSpec(min_steps=10, eta=3), TrainSpec(steps=300)) == [10, 30, 90, 300]
    assert rung_steps(SearchSpec(min_steps=10, eta=3), TrainSpec(steps=100)) == [10, 30, 100]
    target = TrainSpec(steps=5, target=TargetSpec(metric="val_loss", value=0.1, max_steps=40))
    assert rung_steps(SearchSpec(min_steps=10, eta=2), target) == [10, 20, 40]


def test_rungs_before_the_last_only_rank_unless_something_reads_the_full_measurement():
    train = TrainSpec(steps=90)
    search = SearchSpec(method="halving", min_steps=10, eta=3)  # rungs 10, 30, 90
    assert [ranks_only(search, train, r) for r in (0, 1, 2)] == [True, True, False]
    assert not ranks_only(search, train, None)  # a grid sweep measures everything
    reads_val = SearchSpec(method="halving", constraints=["val_accuracy >= 0.5"])
    assert not ranks_only(reads_val, train, 0)
    cheap = SearchSpec(method="halving", constraints=["peak_mem_bytes <= 1e9"])
    assert ranks_only(cheap, train, 0)
    target = TrainSpec(steps=5, target=TargetSpec(metric="val_loss", value=0.1, max_steps=40))
    assert not ranks_only(SearchSpec(method="halving", objective="time_to_target"), target, 0)


def test_promote_keeps_the_best_third_and_says_why_the_others_go():
    search = SearchSpec(method="halving", eta=3)
    rows = [_row(f"t{i}", 1000.0 * (i + 1)) for i in range(6)]  # t5 best
    rung = promote(rows, 0, 10, search)
    assert rung.kept == ["t5", "t4"]
    assert rung.measured[0] == "t5" and set(rung.dropped) == {"t0", "t1", "t2", "t3"}
    assert "below the cutoff 5,000 samples/s" in rung.dropped["t3"]
    assert "rung 0 (10 steps)" in rung.dropped["t0"]


def test_a_configuration_within_the_noise_of_the_cutoff_is_not_dropped():
    search = SearchSpec(method="halving", eta=3)
    steady = [_row("a", 3000.0), _row("b", 2000.0), _row("c", 1990.0)]
    assert promote(steady, 0, 10, search).kept == ["a"]  # c 0.5% below: steady steps tell
    noisy = [_row("a", 3000.0, jitter=0.3), _row("b", 2000.0, jitter=0.3)]
    noisy.append(_row("c", 1990.0, jitter=0.3))
    # Two-sigma bands of noisy rows overlap: b and c cannot be told apart from the cutoff a.
    kept = promote(noisy, 0, 10, SearchSpec(method="halving", eta=2)).kept
    assert kept == ["a", "b", "c"]


def test_with_repeats_the_band_is_the_spread_between_runs_not_within_one():
    search = SearchSpec(method="halving", eta=3)
    # steady steps inside every run (jitter 0), but each configuration's two runs 10% apart
    rows = []
    for tid, v in (("a", 3000.0), ("b", 2000.0), ("c", 1900.0), ("d", 1000.0)):
        rows += [_row(tid, v * 1.05, repeat=0), _row(tid, v * 0.95, repeat=1)]
    rung = promote(rows, 0, 10, search)
    assert rung.run_sd == pytest.approx(0.0707, rel=0.01)
    # c is 5% below the cutoff b: within two run-to-run standard errors, so kept; one run's
    # steady steps alone would have dropped it
    assert rung.kept == ["a", "b", "c"]
    assert "from the spread between runs, 7.1% pooled" in rung.dropped["d"]
    single = promote([r for r in rows if r["repeat"] == 0], 0, 10, search)
    assert single.run_sd is None and single.kept == ["a", "b"]
    assert "no repeats, so the noise between runs is not measured" in single.dropped["c"]


def test_failures_and_constraint_breaks_are_dropped_with_their_reason():
    search = SearchSpec(method="halving", constraints=["peak_mem_bytes <= 1e9"])
    rows = [
        _row("fits", 1000.0, peak_mem_bytes=5e8),
        _row("big", 9000.0, peak_mem_bytes=2e9),
        _row("crashed", 0.0, status="oom", peak_mem_bytes=None),
    ]
    rung = promote(rows, 0, 10, search)
    assert rung.kept == ["fits"]
    assert rung.dropped["big"] == "rung 0: peak_mem_bytes 2e+09 breaks the constraint " + str(
        Constraint("peak_mem_bytes", "<=", 1e9)
    )
    assert rung.dropped["crashed"].startswith("rung 0: oom: oom: boom")


def test_per_device_objective_ranks_by_throughput_over_devices():
    search = SearchSpec(method="halving", eta=2, objective="throughput_per_device")
    rows = [_row("d1", 1000.0), _row("d4", 3000.0, devices=4)]
    assert promote(rows, 0, 10, search).kept == ["d1"]


def test_the_budget_trims_survivors_worst_first():
    search = SearchSpec(method="halving", eta=2)
    rows = [_row(f"t{i}", 1000.0 * (i + 1)) for i in range(4)]
    rung = promote(rows, 0, 10, search)
    assert rung.kept == ["t3", "t2"]
    trim_to_budget(rung, rows, next_steps=30, left_s=1.1 + 64 / 4000 * 30)
    assert rung.kept == ["t3"] and "budget" in rung.dropped["t2"]


def test_grid_estimate_scales_windows_and_counts_unmeasured_configurations():
    rows = [_row("a", 640.0, steps=10), _row("b", 6400.0, steps=10)]  # 1 s and 0.1 s windows
    # full length 100: 1 + 10 and 1 + 1 seconds, and one unmeasured at the median 7 s
    assert grid_estimate_s(rows, 3, 100) == pytest.approx(11 + 2 + 6.5)


def test_a_continued_rows_own_window_is_what_its_outside_seconds_leave_out():
    """A continued row's measured_s pools its earlier windows; its wall is the item's own."""
    fresh = {"wall_s": 2.0, "measured_s": 1.0, "steps": 10}
    continued = {"wall_s": 1.5, "measured_s": 3.0, "item_measured_s": 1.0, "steps": 30}
    assert estimate_s(fresh, 30) == pytest.approx(1.0 + 3.0)
    # outside 0.5 s (not 0, as wall - measured_s would clip to), window 0.1 s a step
    assert estimate_s(continued, 90) == pytest.approx(0.5 + 9.0)


def test_replay_recovers_the_rungs_a_resumed_search_continues_from():
    search = SearchSpec(method="halving", eta=2, min_steps=10)
    train = TrainSpec(steps=40)
    first = [_row(f"t{i}", 1000.0 * (i + 1)) for i in range(4)]
    state = replay(first, search, train)
    assert [r.index for r in state.rungs] == [0] and state.rungs[0].kept == ["t3", "t2"]
    assert not state.finished
    # Rung 1 half done (the driver died): still at rung 0's decision.
    partial = [*first, _row("t3", 4100.0, rung=1, steps=20)]
    assert len(replay(partial, search, train).rungs) == 1
    done = [*partial, _row("t2", 3900.0, rung=1, steps=20), _row("t3", 4000.0, rung=2, steps=40)]
    state = replay(done, search, train)
    assert [r.kept for r in state.rungs] == [["t3", "t2"], ["t3"], ["t3"]]
    assert state.finished
    assert state.ranking()[0] == ("t3", 2, 4000.0)
    assert [tid for tid, _, _ in state.ranking()] == ["t3", "t2", "t1", "t0"]


def test_the_last_rung_ranks_by_the_median_of_its_repeats_and_names_the_ties():
    search = SearchSpec(method="halving", eta=2, min_steps=10, final_repeats=3)
    train = TrainSpec(steps=20)
    assert [rung_repeats(search, train, r) for r in (0, 1)] == [1, 3]
    assert rung_repeats(search, TrainSpec(steps=20, repeats=4), 1) == 4  # never fewer
    first = [_row(t, v) for t, v in (("a", 3000.0), ("b", 2900.0), ("c", 2800.0), ("d", 100.0))]
    last = [  # a: one lucky run; b: steadily fast; c: clearly behind b
        *[_row("a", v, rung=1, steps=20, repeat=k) for k, v in enumerate((5000, 2000, 2100))],
        *[_row("b", v, rung=1, steps=20, repeat=k) for k, v in enumerate((3000, 3100, 2900))],
    ]
    # Two of b's three final runs are in: the rung is not complete, the search goes on there.
    state = replay([*first, *last[:5]], search, train)
    assert len(state.rungs) == 1 and not state.finished
    state = replay([*first, *last], search, train)
    final = state.rungs[-1]
    assert state.finished and final.measured == ["b", "a"]  # medians 3000 and 2100
    assert final.values == {"b": 3000.0, "a": 2100.0}
    assert final.repeats["a"] == [2000.0, 2100.0, 5000.0]
    # a's median is 900 below b's, within a's own range of 3000: not measurably different.
    assert final.tied == ["a"]
    steady = [
        *[_row("a", v, rung=1, steps=20, repeat=k) for k, v in enumerate((2000, 2050, 2100))],
        *last[3:],
    ]
    assert replay([*first, *steady], search, train).rungs[-1].tied == []


def test_with_one_final_run_each_ties_come_from_the_per_step_noise():
    search = SearchSpec(method="halving", eta=2, min_steps=10)
    rows = [_row("a", 3000.0, jitter=0.3), _row("b", 2950.0, jitter=0.3), _row("c", 1000.0)]
    rung = promote(rows, 2, 90, search, last=True)
    assert rung.measured == ["a", "b", "c"] and rung.tied == ["b"]
    assert rung.kept == ["a", "b", "c"]  # the last rung drops nothing for rank


def test_the_model_skips_a_configuration_predicted_far_behind_and_says_why():
    def candidate(tid, devices, batch, sync="none"):
        return {
            "trial_id": tid,
            "workload": "mlp",
            "params": "{}",
            "scaling": "weak",
            "devices": devices,
            "batch_size": batch,
            "precision": "fp32",
            "compile": "eager",
            "data_workers": 1,
            "input": "ray_data",
            "prefetch_batches": 2,
            "sync": sync,
            "steps": 10,
            "warmup_steps": 2,
        }

    def measured(tid, batch, step_s):
        c = candidate(tid, 1, batch)
        return {
            **c,
            "repeat": 0,
            "status": "ok",
            "throughput": batch / step_s,
            "step_time_s": step_s,
            "data_wait_s": 0.0,
            "micro_steps": 1,
            "global_batch": batch,
        }

    # Compute 1 ms + 0.1 ms per sample: batch 8 runs 1.8 ms (4.4k/s), batch 512 52 ms (9.8k/s).
    rows = [measured("small", 8, 0.0018), measured("big", 512, 0.0522)]
    search = SearchSpec(method="halving", skip_below=0.5)
    slow = candidate("d2-tiny", 2, 2)  # 1.2 ms for 4 samples: 3.3k/s < 0.5 x 9.8k/s
    fast = candidate("d2-big", 2, 512)  # 19.6k/s
    ddp = candidate("d2-ddp", 2, 2, sync="ddp")  # no communication model: never skipped
    skips = predicted_skips(rows, [slow, fast, ddp], search, {}, None)
    assert set(skips) == {"d2-tiny"}
    assert "predicted 3,333 samples/s by the step-time model" in skips["d2-tiny"]
    assert (
        predicted_skips(rows, [slow], SearchSpec(method="halving", skip_below=None), {}, None) == {}
    )


def test_bad_search_settings_are_refused_before_anything_runs(tmp_path):
    from amdahl.errors import UserError
    from amdahl.search.spec_checks import check_search
    from amdahl.spec.load import load_spec, validate_spec

    base = {"name": "s", "workload": "mlp"}
    with pytest.raises(UserError, match="time_to_target needs train.target"):
        check_search(
            validate_spec({**base, "search": {"method": "halving", "objective": "time_to_target"}})
        )
    halving = {"method": "halving"}
    missing = {"search": {**halving, "calibration": str(tmp_path / "nope.json")}}
    missing = validate_spec({**base, **missing})
    with pytest.raises(UserError, match="search.calibration: cannot read .*nope.json"):
        check_search(missing)
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="not a JSON object"):
        listed = {**halving, "calibration": str(tmp_path / "list.json")}
        check_search(validate_spec({**base, "search": listed}))
    # a grid sweep would ignore halving's settings: refused rather than silently unused
    with pytest.raises(UserError, match=r"search.eta, search.min_steps: only a halving search"):
        check_search(validate_spec({**base, "search": {"eta": 4, "min_steps": 5}}))
    check_search(validate_spec({**base, "search": {"method": "grid"}}))
    from amdahl import run_sweep

    with pytest.raises(UserError, match="only a halving search"):  # before anything is made
        run_sweep(validate_spec({**base, "search": {"eta": 4}}), runs_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: s\nworkload: mlp\nsearch:\n  budget: lots\n")
    with pytest.raises(UserError, match=r"search.budget.*'25%'"):
        load_spec(sweep)
    sweep.write_text("name: s\nworkload: mlp\nsearch:\n  constraints: ['memory <= 1']\n")
    with pytest.raises(UserError, match="not a numeric results column"):
        load_spec(sweep)
    budgeted = SearchSpec(budget="25%")
    assert budgeted.budget_s(400.0) == 100.0 and SearchSpec(budget=60).budget_s(1e9) == 60.0


def test_calibration_auto_reads_the_sweep_directory_once_it_is_measured(tmp_path):
    from amdahl.search.spec_checks import check_search, read_calibration
    from amdahl.spec.load import validate_spec

    spec = validate_spec(
        {
            "name": "s",
            "workload": "mlp",
            "search": {"method": "halving", "calibration": "auto"},
        }
    )
    check_search(spec)  # nothing to read before the sweep measures it
    measured = tmp_path / "calibration.json"
    assert read_calibration(spec, measured) is None and read_calibration(spec) is None
    measured.write_text(json.dumps({"alpha_s": 1e-4, "bandwidth_Bps": 1e9}))
    assert read_calibration(spec, measured)["alpha_s"] == 1e-4


def test_the_reports_final_ranking_says_how_each_finalist_stands_against_the_best():
    from types import SimpleNamespace

    from amdahl.report.sections import search_section

    search = SearchSpec(method="halving", eta=2, min_steps=10, final_repeats=2)
    train = TrainSpec(steps=20)
    rows = [_row(t, v) for t, v in (("a", 3000.0), ("b", 2900.0), ("c", 2800.0), ("d", 10.0))]
    rows += [
        _row(t, v, rung=1, steps=20, repeat=k)
        for t, runs in (("a", (3000, 3400)), ("b", (3100, 3200)))
        for k, v in enumerate(runs)
    ]
    state = replay(rows, search, train)
    section = search_section(SimpleNamespace(search=state, labels={"a": "A", "b": "B"}, configs=[]))
    ranking = next(t for t in section.tables if t.title.startswith("Final ranking"))
    assert ranking.rows[0] == ["A", "1", "3,200", "2: 3,000-3,400", "best"]
    assert ranking.rows[1] == [
        "B",
        "1",
        "3,150",
        "2: 3,100-3,200",
        "1.6% below (not measurably different)",
    ]
    assert ranking.rows[2][-1] == "stopped at rung 0"
    assert any("cannot be told apart from the best" in p for p in section.paras)


def test_a_reloaded_compile_shows_its_configurations_first_compile():
    """A later rung that reloaded its configuration's compiled graphs (compile_cache: own) is
    the configuration's longest row, but its compile figures are the first rung's: what
    compiling it costs."""
    from amdahl.search.halving import final_rows

    def row(rung, compile_s, cache, steps):
        return {
            "trial_id": "t",
            "repeat": 0,
            "rung": rung,
            "status": "ok",
            "steps": steps,
            "compile_s": compile_s,
            "warmup_s": compile_s + 0.1,
            "first_step_s": compile_s,
            "compile_cache": cache,
            "throughput": 100.0 * steps,
        }

    rows = [row(0, 2.5, "cold", 30), row(1, 0.1, "own", 90), row(2, 0.12, "own", 270)]
    (shown,) = final_rows(rows)
    assert shown["steps"] == 270 and shown["throughput"] == 27000.0  # the longest window
    assert (shown["compile_s"], shown["warmup_s"], shown["first_step_s"]) == (2.5, 2.6, 2.5)
    assert shown["compile_cache"] == "cold" and rows[2]["compile_s"] == 0.12  # rows untouched
    # a row that compiled for itself keeps its own figures
    cold = [row(0, 2.5, "cold", 30), row(1, 2.4, "cold", 90)]
    assert final_rows(cold)[0]["compile_s"] == 2.4
