"""Which cluster a sweep runs on and a plan is made for (driver.cluster.cluster_address): the
address given, else the cluster running here as `ray.init()` would find it, else this machine;
`platform plan` joins that cluster (never starts one) and plans for its nodes, as `platform
sweep` would run there. No Ray is started here: a listening socket stands in for a GCS."""

from __future__ import annotations

import socket
import sys
import types

import pytest
import yaml
from click.testing import CliRunner

from amdahl.cli.commands import main
from amdahl.driver import cluster
from amdahl.plan.resources import Node

TINY = {"name": "tiny", "workload": "mlp", "params": {"hidden": [16]}, "grid": {"devices": [1]}}
CLUSTER = [Node(cpus=8.0, gpus=2.0, name="10.0.0.1"), Node(cpus=8.0, gpus=2.0, name="10.0.0.2")]


@pytest.fixture
def nowhere(no_cluster, tmp_path):
    """No cluster to find (tests/unit/conftest.py's no_cluster)."""
    return tmp_path / "raytmp"


@pytest.fixture
def gcs():
    """A listening socket on every interface: where a GCS would accept a connection."""
    server = socket.create_server(("", 0))
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def joined(monkeypatch):
    """Joining a cluster recorded instead of done: the addresses `connect_ray` was given; the
    joined cluster's nodes are CLUSTER."""
    calls: list[str | None] = []
    monkeypatch.setattr(
        cluster, "connect_ray", lambda address, log_path, *a, **k: calls.append(address)
    )
    monkeypatch.setattr(cluster, "ray_nodes", lambda: CLUSTER)
    return calls


def test_the_address_given_wins_and_local_means_this_machine(nowhere, gcs, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{gcs}")  # a cluster is running here
    assert cluster.cluster_address("10.1.2.3:6379") == "10.1.2.3:6379"
    assert cluster.cluster_address("local") is None
    assert cluster.cluster_address(None) is not None


def test_the_cluster_running_here_is_found_as_ray_init_finds_it(nowhere, gcs, monkeypatch):
    assert cluster.running_cluster() is None  # no RAY_ADDRESS, no record of `ray start`
    record = nowhere / "ray" / "ray_current_cluster"  # what `ray start` writes
    record.parent.mkdir(parents=True)
    record.write_text(f"127.0.0.1:{gcs}")
    assert cluster.running_cluster().endswith(f":{gcs}")
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{gcs}")  # what `ray attach` gives a shell
    assert cluster.running_cluster().endswith(f":{gcs}")


def test_a_stale_record_of_a_cluster_that_is_gone_is_no_cluster(nowhere, gcs, monkeypatch):
    with socket.create_server(("", 0)) as gone:
        port = gone.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    assert cluster.running_cluster() is None


@pytest.mark.parametrize(
    "env", [{}, {"TMPDIR": "/var/tmp/x"}, {"RAY_TMPDIR": "/scratch/r", "TMPDIR": "/var/tmp/x"}]
)
def test_the_record_is_looked_for_where_ray_keeps_it(monkeypatch, env):
    from ray._common.utils import get_ray_address_file

    for name in ("RAY_TMPDIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert str(cluster.ray_address_file()) == get_ray_address_file(None)


def test_with_no_cluster_the_plan_is_for_this_machine_and_starts_no_ray(nowhere, joined):
    assert [n.name for n in cluster.cluster_nodes(None)] == ["local"]
    assert [n.name for n in cluster.cluster_nodes("local")] == ["local"]
    assert joined == []


def test_a_running_cluster_is_joined_and_its_nodes_planned_for(nowhere, gcs, joined, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{gcs}")
    assert cluster.cluster_nodes(None) == CLUSTER
    assert cluster.cluster_nodes("10.1.2.3:6379") == CLUSTER
    assert [n.name for n in cluster.cluster_nodes("local")] == ["local"]
    assert [a.rpartition(":")[2] for a in joined] == [str(gcs), "6379"]


def test_a_ray_this_process_has_is_the_one_planned_for(nowhere, joined, monkeypatch):
    """As run_sweep uses it (connect_ray), whatever the address."""
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: True))
    assert cluster.cluster_nodes(None) == CLUSTER
    assert cluster.cluster_nodes("local") == CLUSTER
    assert joined == []


def _plan_nodes(tmp_path, *args):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    result = CliRunner().invoke(main, ["plan", str(path), "--json", *args])
    assert result.exit_code == 0, result.output
    return [n["name"] for n in yaml.safe_load(result.output)["nodes"]]


def test_platform_plan_plans_for_the_cluster_sweep_would_join(nowhere, gcs, joined, monkeypatch):
    tmp_path = nowhere.parent
    assert _plan_nodes(tmp_path) == ["local"]  # no cluster: this machine, no Ray
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{gcs}")  # on a cluster's head node
    assert _plan_nodes(tmp_path) == ["10.0.0.1", "10.0.0.2"]
    assert _plan_nodes(tmp_path, "--local") == ["local"]  # as `sweep --local`
    assert _plan_nodes(tmp_path, "--address", "10.1.2.3:6379") == ["10.0.0.1", "10.0.0.2"]
    assert [a.rpartition(":")[2] for a in joined] == [str(gcs), "6379"]


def test_plan_refuses_local_with_an_address(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    result = CliRunner().invoke(main, ["plan", str(path), "--local", "--address", "x:1"])
    assert result.exit_code == 2
    assert "--local plans for this machine" in result.output
