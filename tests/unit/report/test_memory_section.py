"""The report's memory section: measured beside predicted, the largest part, and an
under-prediction (an OOM a device sized by the prediction would hit) called out."""

from report_rows import row, write_sweep

from amdahl.report import build_report
from amdahl.report.memory_section import memory_section

MIB = 2**20


def _section(tmp_path, rows):
    return memory_section(build_report(write_sweep(tmp_path / "s", rows)))


def test_each_configuration_shows_measured_predicted_error_and_largest_part(tmp_path):
    parts = dict(
        mem_parameters_bytes=10 * MIB,
        mem_optimizer_bytes=10 * MIB,
        mem_activations_bytes=60 * MIB,
        mem_temporaries_bytes=20 * MIB,
    )
    rows = [
        row(1, 64, peak_mem_bytes=100 * MIB, predicted_peak_mem_bytes=104 * MIB, **parts),
        row(1, 256, peak_mem_bytes=400 * MIB, predicted_peak_mem_bytes=300 * MIB),
    ]
    sec = _section(tmp_path, rows)
    table = sec.tables[0]
    assert table.headers[1:] == ["measured MiB", "predicted MiB", "error", "largest part"]
    first, second = sorted(table.rows, key=lambda r: float(r[1].replace(",", "")))
    assert first[1:] == ["100.0", "104.0", "+4.0%", "activations 60%"]
    assert second[3:] == ["-25.0%", "n/a"]
    assert any("median 14.5%" in b for b in sec.bullets)
    under = [b for b in sec.bullets if "run out of memory" in b]
    assert len(under) == 1 and "25% below" in under[0]


def test_rows_without_memory_columns_say_so(tmp_path):
    sec = _section(tmp_path, [row(1, 64)])
    assert not sec.tables and "No trial measured or predicted" in sec.paras[-1]


def test_the_largest_configurations_say_what_another_strategy_or_precision_would_hold(tmp_path):
    import json

    from report_rows import PARAMS

    from amdahl.analysis.memory_model import MemoryFacts, predict_peak

    fp32 = MemoryFacts(100 * MIB, 100 * MIB, 100 * MIB, 0, (50 * MIB, 50 * MIB), 0.0, MIB)
    bf16 = MemoryFacts(100 * MIB, 100 * MIB, 100 * MIB, 0, (50 * MIB, 50 * MIB), 0.0, MIB / 2)
    own = predict_peak(fp32, "ddp", 2, 64).total
    d = write_sweep(tmp_path / "s", [row(2, 64, peak_mem_bytes=own, predicted_peak_mem_bytes=own)])
    facts = [
        {"params": json.loads(PARAMS), "precision": p, "facts": f.as_dict()}
        for p, f in (("fp32", fp32), ("bf16", bf16))
    ]
    (d / "plan.json").write_text(json.dumps({"trials": [], "memory_facts": facts}))
    sec = memory_section(build_report(d))
    [line] = [b for b in sec.bullets if "MiB less" in b]
    zero1 = own - predict_peak(fp32, "zero1", 2, 64).total
    half = own - predict_peak(bf16, "ddp", 2, 64).total
    assert f"sync zero1 {zero1 / MIB:,.1f} MiB less" in line
    assert f"bf16 {half / MIB:,.1f} MiB less" in line


def test_predict_gives_each_device_count_its_memory_per_device(tmp_path):
    import json

    from report_rows import PARAMS, scaling_rows

    from amdahl.analysis.memory_model import MemoryFacts, predict_peak
    from amdahl.report.predict import predict_sweep

    facts = MemoryFacts(100 * MIB, 100 * MIB, 100 * MIB, 0, (50 * MIB, 50 * MIB), 0.0, MIB)
    d = write_sweep(tmp_path / "s", scaling_rows())
    entry = {"params": json.loads(PARAMS), "precision": "fp32", "facts": facts.as_dict()}
    (d / "plan.json").write_text(json.dumps({"trials": [], "memory_facts": [entry]}))
    result = predict_sweep(d, [2, 16])
    rows = [(f.family.sync, r) for f in result.families for r in f.rows]
    assert rows
    for sync, r in rows:
        assert r.memory_bytes == predict_peak(facts, sync, r.devices, r.batch).total
    dumped = result.as_dict()["families"][0]["predictions"][0]
    assert dumped["peak_mem_bytes"] is not None


def _with_facts(d, facts, device_memory_gb=None):
    import json

    from report_rows import PARAMS

    entry = {"params": json.loads(PARAMS), "precision": "fp32", "facts": facts.as_dict()}
    plan = {"trials": [], "memory_facts": [entry], "device_memory_gb": device_memory_gb}
    (d / "plan.json").write_text(json.dumps(plan))
    return d


def test_the_overhead_the_rows_hold_beyond_the_model_is_fitted_and_predict_adds_it(tmp_path):
    """A device's fixed overhead (cuBLAS workspaces, ...) is what measured peaks hold beyond the
    model's predictions: the median over ok rows, failed rows left out; `platform predict` adds
    it to every figure, and the memory section says how much and from how many rows."""
    from report_rows import scaling_rows

    from amdahl.analysis.memory_model import MemoryFacts, predict_peak
    from amdahl.report.predict import predict_sweep

    facts = MemoryFacts(100 * MIB, 100 * MIB, 100 * MIB, 0, (50 * MIB, 50 * MIB), 0.0, MIB)
    rows = scaling_rows()
    for i, r in enumerate(rows):
        own = predict_peak(facts, r["sync"], r["devices"], r["batch_size"]).total
        r.update(predicted_peak_mem_bytes=own, peak_mem_bytes=own + (8 + i % 3) * MIB)
    rows.append(row(8, 128, status="oom", predicted_peak_mem_bytes=1, peak_mem_bytes=10**12))
    d = _with_facts(write_sweep(tmp_path / "s", rows), facts)
    sec = memory_section(build_report(d))
    [line] = [b for b in sec.bullets if "fixed overhead" in b]
    assert "9.0 MiB per device" in line and "of what 6 rows held" in line
    result = predict_sweep(d, [16])
    for f in result.families:
        for r in f.rows:
            plain = predict_peak(facts, f.family.sync, r.devices, r.batch).total
            assert r.memory_bytes == plain + 9 * MIB


def test_a_memory_bound_configuration_is_advised_what_the_model_predicts_each_change_saves(
    tmp_path,
):
    """Peak at >= 90% of the device the plan held trials to (plan.json's device_memory_gb,
    where no calibration measured one): the advice names the memory model's savings, largest
    first, in place of the generic memory tips; a configuration with room gets none."""
    from amdahl.analysis.memory_model import MemoryFacts, predict_peak

    facts = MemoryFacts(400 * MIB, 400 * MIB, 800 * MIB, 0, (200 * MIB, 200 * MIB), 0.0, MIB)
    own = predict_peak(facts, "ddp", 2, 128).total
    gb = own / 0.95 / 1e9
    rows = [
        row(2, 128, peak_mem_bytes=own, predicted_peak_mem_bytes=own),
        row(1, 16, peak_mem_bytes=own / 4, predicted_peak_mem_bytes=own / 4),
    ]
    d = _with_facts(write_sweep(tmp_path / "s", rows), facts, device_memory_gb=gb)
    report = build_report(d)
    tight = next(x for x in report.diagnoses if x.config.devices == 2)
    assert any(a.startswith("memory: peak") for a in tight.also)
    fsdp = own - predict_peak(facts, "fsdp", 2, 128).total
    zero1 = own - predict_peak(facts, "zero1", 2, 128).total
    assert fsdp > zero1 > 0
    assert tight.advice[0] == (
        "predicted per device at this batch (analysis/memory_model.py): "
        f"sync fsdp {fsdp / MIB:,.1f} MiB less, sync zero1 {zero1 / MIB:,.1f} MiB less, "
        f"batch 64 {64 * MIB / MIB:,.1f} MiB less"
    )
    assert not any("zero1 or fsdp to shard" in a for a in tight.advice)
    roomy = next(x for x in report.diagnoses if x.config.devices == 1)
    assert not any("MiB less" in a for a in roomy.advice)


def test_the_report_predicts_a_row_with_the_fsdp_options_its_options_column_names(tmp_path):
    """A row's `options` column (its options away from their defaults) reaches the memory
    model: an fsdp trial without resharding after the forward is predicted, per device, to
    hold every unit's gathered parameters; `platform predict` says the same of its family."""
    import json

    from amdahl.analysis.memory_model import MemoryFacts, predict_peak
    from amdahl.report.predict import predict_sweep

    facts = MemoryFacts(100 * MIB, 100 * MIB, 100 * MIB, 0, (20 * MIB, 20 * MIB), 0.0, MIB)
    kept = {"fsdp_reshard_after_forward": False}
    rows = [row(2, 64, sync="fsdp", options=json.dumps(kept), peak_mem_bytes=300 * MIB)]
    d = _with_facts(write_sweep(tmp_path / "s", rows), facts)
    report = build_report(d)
    [config] = report.configs
    assert config.settings["options"] == json.dumps(kept)
    held = predict_peak(facts, "fsdp", 2, 64, options=kept).total
    # 100 MiB less its shard gathered, against the two 20 MiB units less theirs
    assert held - predict_peak(facts, "fsdp", 2, 64).total == (50 - 20) * MIB
    assert report.memory.predicted(config) == held
    [family] = predict_sweep(d, [2]).families
    assert [r.memory_bytes for r in family.rows if r.devices == 2] == [held]


def test_predict_holds_each_familys_own_accumulation_not_the_specs(tmp_path):
    """sync accumulate swept at accumulate_steps 1 (`grid.options.accumulate_steps`, recorded in
    the rows' options column) holds no gradient across micro-batches; the spec's option (4,
    the default) would add one: `platform predict` reads the family's own."""
    import json

    from report_rows import scaling_rows

    from amdahl.analysis.memory_model import MemoryFacts, predict_peak
    from amdahl.report.predict import predict_sweep

    facts = MemoryFacts(100 * MIB, 100 * MIB, 100 * MIB, 0, (50 * MIB, 50 * MIB), 0.0, MIB)
    rows = [r for r in scaling_rows() if r["sync"] != "none"]
    for r in rows:
        r.update(sync="accumulate", options=json.dumps({"accumulate_steps": 1}))
    d = _with_facts(write_sweep(tmp_path / "s", rows), facts)
    result = predict_sweep(d, [16])
    predicted = [r for f in result.families for r in f.rows]
    assert predicted
    for r in predicted:
        assert r.memory_bytes == predict_peak(facts, "accumulate", r.devices, r.batch, 1).total
        assert r.memory_bytes < predict_peak(facts, "accumulate", r.devices, r.batch, 4).total
