"""Fixtures for the unit tests that need a real local Ray (Ray Data pipelines in-process)."""

import pytest


@pytest.fixture(scope="module")
def local_ray(request):
    """A one-CPU local Ray for the module (unless one is up), with the test module shipped to
    Ray's workers by value: they do not have tests/ on their path, and the module's workloads
    run inside Ray Data's tasks."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(request.module)
    yield
    if started:
        ray.shutdown()


@pytest.fixture
def no_cluster(tmp_path, monkeypatch):
    """No Ray cluster for `platform plan` to find: RAY_ADDRESS unset, Ray's temp directory one
    without a record of `ray start`, and no Ray initialised in this process (in a combined run
    the integration tests' session Ray is up, and a plan is made for the Ray a process has)."""
    import sys

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    ray = sys.modules.get("ray")
    if ray is not None:
        monkeypatch.setattr(ray, "is_initialized", lambda: False)
