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
