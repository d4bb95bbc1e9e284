"""One local Ray for the whole integration session, started in-process and shut down after.

Never `ray stop` or kill by process name: that would hit Ray processes that are not ours.
"""

import os
import socket

import pytest
from trial_runner import MLP_PARAMS


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    started = False
    if not ray.is_initialized():
        # Test workloads defined in this folder (flaky_workload.py) import by name in Ray
        # workers too: the job's workers get this folder on their import path.
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
        )
        started = True
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch):
    """A fresh SQLite MLflow store per test (the real store MLflow users get by default)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="module")
def process_group():
    """A one-rank gloo process group on loopback for in-process harness tests."""
    import torch.distributed as dist

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def mlp_shard(ray_cluster, process_group):
    """A real Ray Data iterator over 512 rows of the MLP_PARAMS MLP (what a rank's shard is)."""
    import ray.data

    from workloads.mlp import MLP

    columns = MLP(**MLP_PARAMS).generate("train", 512, seed=0)
    return (
        ray.data.from_items(
            [{"x": x, "y": y} for x, y in zip(columns["x"], columns["y"], strict=True)]
        )
        .materialize()
        .iterator()
    )
