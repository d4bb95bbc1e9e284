"""An earlier sweep's calibration found again only under the same cluster shape, and only while
it is fresh (driver/calibration_reuse.py)."""

import json

from amdahl.analysis.calibration import Calibration
from amdahl.analysis.comm import comm_model
from amdahl.driver import calibration_reuse as reuse
from amdahl.report.model_sections import links_text

NODES = [{"host": "box", "cpus": 2.0, "gpus": 0.0, "accelerators": []}]


def _key(**change):
    fields = {
        "use_gpu": False,
        "workers": 2,
        "cpus_per_worker": 0.5,
        "gpus_per_worker": 0.0,
        "max_bytes": 16 * 2**20,
        "nodes": NODES,
        "torch_version": "2.9.0",
    }
    return reuse.shape_key(**(fields | change))


MEASUREMENT = {
    "devices": 2,
    "all_reduce": [{"bytes": 4, "seconds": 1e-4}],
    "resources_per_worker": {"CPU": 0.5},
}


def test_a_kept_measurement_is_found_under_its_key_with_where_it_came_from(tmp_path):
    reuse.keep(tmp_path, _key(), MEASUREMENT, tmp_path / "sweep-1")
    found = reuse.find(tmp_path, _key())
    assert found is not None and found.measurement == MEASUREMENT
    assert found.sweep_dir == str((tmp_path / "sweep-1").resolve())
    assert found.provenance()["sweep_dir"] == found.sweep_dir
    found.measurement["devices"] = 99  # a copy: the stored entry is not changed through it
    assert reuse.find(tmp_path, _key()).measurement["devices"] == 2
    stored = next((tmp_path / reuse.CACHE_DIR).iterdir())
    assert stored.stat().st_mode & 0o077 == 0  # owner-only, as every sweep file


def test_another_cluster_shape_measures_again(tmp_path):
    reuse.keep(tmp_path, _key(), MEASUREMENT, tmp_path / "sweep-1")
    other_node = [{**NODES[0], "cpus": 16.0}]
    for other in (
        _key(workers=4),
        _key(cpus_per_worker=1.0),
        _key(use_gpu=True, gpus_per_worker=1.0),
        _key(max_bytes=512 * 2**20),
        _key(nodes=other_node),
        _key(nodes=NODES * 2),
        _key(torch_version="2.10.0"),
    ):
        assert other != _key() and reuse.find(tmp_path, other) is None


def test_an_old_or_unreadable_entry_is_measured_again_not_an_error(tmp_path):
    reuse.keep(tmp_path, _key(), MEASUREMENT, tmp_path / "sweep-1")
    (entry,) = (tmp_path / reuse.CACHE_DIR).iterdir()
    kept_at = json.loads(entry.read_text())["measured_at"]
    assert reuse.find(tmp_path, _key(), now=kept_at + reuse.MAX_AGE_S - 1) is not None
    assert reuse.find(tmp_path, _key(), now=kept_at + reuse.MAX_AGE_S + 1) is None
    assert reuse.find(tmp_path, _key(), now=kept_at - 60) is None  # from the future: a clock jump
    entry.write_text("{not json")
    assert reuse.find(tmp_path, _key()) is None
    entry.write_text(json.dumps({"key": _key(workers=4), "measurement": {}, "measured_at": 0}))
    assert reuse.find(tmp_path, _key()) is None  # a digest shared with another key
    assert reuse.find(tmp_path / "nowhere", _key()) is None


def test_the_report_says_which_sweep_measured_a_reused_calibration():
    base = {"alpha_s": 1e-4, "bandwidth_Bps": 1e9, "devices": 2, "backend": "gloo"}
    source = {"sweep_dir": "/runs/tiny-1", "measured_at": "2026-11-26T10:00:00+00:00"}
    reused = links_text(comm_model(Calibration.from_dict({**base, "reused_from": source})))
    assert "reused from /runs/tiny-1, measured 2026-11-26T10:00:00+00:00" in reused
    assert "reused" not in links_text(comm_model(Calibration.from_dict(base)))
