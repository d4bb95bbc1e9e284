"""best.yaml end to end on local Ray: a tiny sweep through `platform sweep` writes it beside
the report and prints the command; `platform plan` and `platform sweep` run it as written, and
it measures exactly the recommended configuration (its trial id) three times."""

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from amdahl import build_report, read_results
from amdahl.cli.commands import main
from amdahl.report.best import best_config

pytestmark = pytest.mark.integration

TINY = {
    "name": "tiny",
    "workload": "mlp",
    "params": {"hidden": [32], "train_rows": 2048, "val_rows": 256},
    "train": {"steps": 8, "warmup_steps": 2},
    "grid": {"devices": [1, 2], "batch_size": [32], "sync": ["ddp", "none"]},
    "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
    "tracking": {"enabled": False},
}


def _sweep(path: Path, runs: Path) -> str:
    """`platform sweep` in this process (so on the session's Ray); its output."""
    result = CliRunner().invoke(main, ["sweep", str(path), "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    return result.output


def test_best_yaml_runs_the_recommended_configuration_as_written(ray_cluster, tmp_path):
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(yaml.safe_dump(TINY))
    runs = tmp_path / "runs"
    output = _sweep(spec_file, runs)
    (first,) = [d for d in runs.iterdir() if d.name.startswith("tiny-2")]
    best_file = first / "best.yaml"
    assert best_file.is_file()
    assert f"best:    platform sweep {best_file}" in output

    recommended = best_config(build_report(first))
    assert not isinstance(recommended, str), recommended
    (trial_id,) = {r["trial_id"] for r in recommended.config.ok_rows}

    planned = CliRunner().invoke(main, ["plan", str(best_file), "--json"])
    assert planned.exit_code == 0, planned.output
    plan = yaml.safe_load(planned.output)  # JSON is YAML
    assert [t["trial_id"] for t in plan["trials"]] == [trial_id]
    assert plan["trials"][0]["refused"] is None

    output = _sweep(best_file, runs)
    (second,) = [d for d in runs.iterdir() if d.name.startswith("tiny-best-")]
    rows = read_results(second).to_pylist()
    assert [(r["trial_id"], r["status"]) for r in rows] == [(trial_id, "ok")] * 3
    assert sorted(r["repeat"] for r in rows) == [0, 1, 2]
    assert all(r["throughput"] > 0 for r in rows)
    # Its own report recommends the one configuration it measured, and says so again.
    assert f"best:    platform sweep {second / 'best.yaml'}" in output
