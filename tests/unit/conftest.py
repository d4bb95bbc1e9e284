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
