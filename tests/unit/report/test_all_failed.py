"""A sweep where no trial ran ok (issue 53): the report opens with that and the failures, each
with where in the user's code it failed, and prints no ranking, recommendation or model."""

from report_rows import row, write_sweep

from amdahl.report import build_report, write_reports
from amdahl.report.brief import brief_sections
from amdahl.report.sections import NOTHING_OK

ERROR = (
    "failed: RuntimeError: mat1 and mat2 shapes cannot be multiplied (at model.py:187 in forward)"
    "\n/home/u/model.py:187\n  File ..."
)


def _failed(devices, batch, **extra):
    return {**row(devices, batch, **extra), "status": "failed", "error": ERROR, "throughput": None}


def test_the_report_is_the_failures_with_their_place_in_the_users_code(tmp_path):
    d = write_sweep(tmp_path / "s", [_failed(1, 32), _failed(2, 32), _failed(2, 32, repeat=1)])
    assert [s.key for s in brief_sections(build_report(d))] == ["summary", "failures"]
    text = write_reports(d)["markdown"].read_text()
    assert text.index(NOTHING_OK) < text.index("Failed, out-of-memory")
    for absent in ("Recommendation", "Predicted vs measured", "Top ", "## Scaling"):
        assert absent not in text, absent
    assert "(at model.py:187 in forward)" in text
    assert "column of results.parquet" in text  # where the traceback is


def test_one_ok_trial_brings_the_usual_report_back(tmp_path):
    d = write_sweep(tmp_path / "s", [_failed(1, 32), row(2, 32)])
    keys = [s.key for s in brief_sections(build_report(d))]
    assert "recommendation" in keys and NOTHING_OK not in write_reports(d)["markdown"].read_text()
