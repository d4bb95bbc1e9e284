"""Planning against an autoscaling cluster: the nodes it may start count, not only those up.

A fresh `ray up cluster.yaml` has no GPU node (`min_workers: 0`). The autoscaler publishes its
node types in the GCS; here the test publishes one the same way (Ray's own key and protobuf) on
the session's local Ray, and removes it afterwards.
"""

import pytest
from ray.core.generated import autoscaler_pb2

from amdahl.driver.cluster import UNBOUNDED_NODE_TYPE, autoscaler_nodes, ray_nodes
from amdahl.plan.launches import WorkloadFacts, plan_sweep
from amdahl.spec.load import validate_spec
from workloads.mlp import MLP

pytestmark = pytest.mark.integration


@pytest.fixture
def autoscaler_config(ray_cluster):
    import ray._raylet
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_put

    config = autoscaler_pb2.ClusterConfig()
    head = config.node_group_configs.add(name="head", max_count=1)
    head.resources["CPU"] = 0
    gpu = config.node_group_configs.add(name="gpu_worker", min_count=0, max_count=2)
    gpu.resources["CPU"] = 48
    gpu.resources["GPU"] = 4
    key = ray._raylet.GCS_AUTOSCALER_CLUSTER_CONFIG_KEY
    namespace = ray._raylet.GCS_AUTOSCALER_STATE_NAMESPACE
    _internal_kv_put(key, config.SerializeToString(), overwrite=True, namespace=namespace)
    yield
    _internal_kv_del(key, namespace=namespace)


def test_gpu_trials_plan_against_the_nodes_the_autoscaler_may_start(autoscaler_config):
    nodes = ray_nodes()
    assert sorted(n.gpus for n in nodes) == [0.0, 4.0, 4.0]
    spec = validate_spec(
        {
            "workload": "mlp",
            "grid": {"devices": [4, 8, 16]},
            "resources": {"use_gpu": True, "cpus_per_device": 4},
        }
    )
    plan = plan_sweep(spec, nodes, WorkloadFacts(MLP.defaults))
    refused = {t.settings.devices: t.refused for t in plan.trials}
    assert refused[4] is None and refused[8] is None
    assert "needs 16 GPUs" in refused[16] and "the cluster has 8" in refused[16]


def test_unbounded_node_types_are_capped():
    config = autoscaler_pb2.ClusterConfig()
    group = config.node_group_configs.add(name="any", max_count=-1)
    group.resources["GPU"] = 8
    nodes = autoscaler_nodes(config)
    assert len(nodes) == UNBOUNDED_NODE_TYPE and nodes[0].gpus == 8.0
    assert autoscaler_nodes(None) == []


def test_without_an_autoscaler_the_alive_nodes_are_planned(ray_cluster):
    nodes = ray_nodes()
    assert len(nodes) == 1 and nodes[0].gpus == 0
