"""The cluster a sweep runs on: which one, Ray's start and the nodes there are.

- `cluster_address`: the one rule for which cluster `platform sweep` runs on and `platform plan`
  plans for: the address given, else the cluster running here as `ray.init()` would find it
  (`running_cluster`), else none (a local Ray of this machine); "local" always none;
- `connect_ray`: the one place amdahl initialises Ray (the sweep driver, `platform calibrate`,
  `platform plan` where a cluster is there to join): a local Ray sized to this machine unless
  an address is given, never a stray one found on the machine;
- the nodes to plan against: `cluster_nodes` (those of the cluster `cluster_address` picks,
  joined but never started), `local_nodes` (this machine, no Ray needed), `ray_nodes` (a
  connected cluster, counting the nodes its autoscaler may add: `autoscaler_nodes`).

The plan for those nodes is driver.planning's. Nothing here imports Ray Tune or Train, and ray
itself only inside the functions that talk to a running Ray (and `running_cluster` only where
Ray has recorded a cluster), so `platform plan` stays quick (tests/unit/cli/test_cli.py checks
it).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from amdahl.files import touch_private
from amdahl.plan.resources import Node

# --------------------------------------------------------------------------- Ray


def connect_ray(
    address: str | None,
    log_path: Path | None,
    verbose: bool = False,
    runtime_env: dict[str, Any] | None = None,
) -> bool:
    """Connect to `address`, else start a private local Ray sized to this machine (a caller
    that wants the cluster running here passes `running_cluster()`), with Ray's chatter kept
    out of the terminal unless `verbose` (it goes to `log_path` when one is given). Returns
    whether this call initialised Ray (the caller may shut it down again); a Ray this process
    initialised before is used as it is.

    `runtime_env` (WorkloadCode.runtime_env: the user's workload code as py_modules) becomes
    the job's, so every Ray worker of the sweep (train workers, Ray Data tasks, Tune trials) on
    every node imports the same code. A Ray this process initialised before keeps its own
    runtime_env: whoever called ray.init passes `runtime_env=locate_spec_workload(spec)
    .runtime_env()` to it (else workers import the code only where their sys.path has it).
    """
    import ray

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if not verbose:
        os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
        os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        if log_path is not None:
            route_ray_logs(log_path)
    if ray.is_initialized():
        if runtime_env and not ray.get_runtime_context().runtime_env.get("py_modules"):
            logging.getLogger(__name__).warning(
                "Ray was initialised without the workload's code in its runtime_env (%s): "
                "workers import it only where their sys.path finds it",
                runtime_env["py_modules"],
            )
        return False
    kwargs: dict[str, Any] = {
        "log_to_driver": verbose,
        "include_dashboard": False,
        "logging_level": logging.INFO if verbose else logging.WARNING,
    }
    if runtime_env:
        kwargs["runtime_env"] = runtime_env
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(address="local", num_cpus=os.cpu_count(), **kwargs)
    return True


def cluster_address(address: str | None) -> str | None:
    """The Ray cluster a sweep given `address` runs on, None for a local Ray of this machine:
    `address` as given; "local" none, even where a cluster runs; None (not given) the cluster
    running here as `ray.init()` would join it (`running_cluster`: after `ray up` and
    `ray attach`, or `ray start`), else none. `platform sweep` and `platform plan` both ask
    this, so a plan is made for the machines the sweep runs on."""
    if address is None:
        return running_cluster()
    return None if address == "local" else address


def running_cluster() -> str | None:
    """The address of the Ray cluster `ray.init()` would join from here (RAY_ADDRESS, else the
    last cluster started on this node), when its GCS accepts a connection; None otherwise (no
    cluster, or a stale record of one that is gone). Where neither is there, Ray is not even
    imported (`platform plan` on a machine without a cluster stays quick)."""
    if not os.environ.get("RAY_ADDRESS") and not ray_address_file().exists():
        return None
    import socket

    from ray._private.services import canonicalize_bootstrap_address

    try:
        address = canonicalize_bootstrap_address(None)
    except (ValueError, ConnectionError):
        return None
    if not address:
        return None
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return address
    except (OSError, ValueError):
        return None


def ray_address_file() -> Path:
    """Where `ray start` records the cluster it started and `ray.init()` looks for one (Ray's
    `ray._common.utils.get_ray_address_file(None)`, found without importing Ray: its default
    temp directory is RAY_TMPDIR, else TMPDIR on Linux, else /tmp)."""
    if "RAY_TMPDIR" in os.environ:
        temp = os.environ["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        temp = os.environ["TMPDIR"]
    elif sys.platform.startswith(("linux", "darwin")):
        temp = "/tmp"
    else:
        temp = tempfile.gettempdir()
    return Path(temp) / "ray" / "ray_current_cluster"


def cluster_summary() -> str:
    """The Ray this process is connected to, in a few words: nodes, CPUs, GPUs, address."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    total = ray.cluster_resources()
    gpus = f", {total['GPU']:g} GPUs" if total.get("GPU") else ""
    address = ray.get_runtime_context().gcs_address
    return (
        f"{len(alive)} node{'s' if len(alive) != 1 else ''}, {total.get('CPU', 0):g} CPUs{gpus} "
        f"(Ray at {address})"
    )


def route_ray_logs(log_path: Path) -> None:
    """Ray's own loggers (ray, Tune, Train, Data) into `log_path` (owner-only), not the terminal."""
    handler = logging.FileHandler(touch_private(log_path))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("ray", "ray.tune", "ray.train", "ray.data"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False


# --------------------------------------------------------------------------- nodes


def cluster_nodes(address: str | None) -> list[Node]:
    """The nodes a sweep given `address` runs on, without starting Ray: a Ray this process
    initialised already (as `connect_ray` uses it), else the cluster `cluster_address` names,
    joined (`ray_nodes`), else this machine (`local_nodes`: no Ray started at all)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray_nodes()
    joined = cluster_address(address)
    if joined is None:
        return local_nodes()
    connect_ray(joined, None)
    return ray_nodes()


def local_nodes() -> list[Node]:
    """This machine as Ray would see it if started here with defaults."""
    gpus = 0
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:
        pass
    return [Node(cpus=float(os.cpu_count() or 1), gpus=float(gpus), name="local")]


def ray_nodes() -> list[Node]:
    """The nodes the connected Ray cluster has, or can have: the alive nodes, or, on an
    autoscaling cluster whose node types add up to more, every node the autoscaler may start
    (`max_workers` of each type; Ray Train waits while it starts them). Without this, a fresh
    cluster with `min_workers: 0` would refuse every GPU trial."""
    import ray

    alive = [
        Node(
            cpus=n["Resources"].get("CPU", 0.0),
            gpus=n["Resources"].get("GPU", 0.0),
            name=n.get("NodeManagerAddress", "node"),
        )
        for n in ray.nodes()
        if n.get("Alive")
    ]
    possible = autoscaler_nodes(ray._private.state.state.get_cluster_config())
    capacity = lambda nodes: (sum(n.gpus for n in nodes), sum(n.cpus for n in nodes))  # noqa: E731
    return possible if capacity(possible) > capacity(alive) else alive


#: Nodes planned for a node type whose `max_workers` is unbounded.
UNBOUNDED_NODE_TYPE = 64


def autoscaler_nodes(config: Any) -> list[Node]:
    """Every node an autoscaler's cluster config (Ray's `autoscaler_pb2.ClusterConfig`, as the
    autoscaler publishes it in the GCS; None without an autoscaler) may run at once."""
    if config is None:
        return []
    nodes = []
    for group in config.node_group_configs:
        count = group.max_count if group.max_count >= 0 else UNBOUNDED_NODE_TYPE
        cpus, gpus = float(group.resources.get("CPU", 0)), float(group.resources.get("GPU", 0))
        nodes += [Node(cpus=cpus, gpus=gpus, name=f"{group.name}-{i}") for i in range(count)]
    return nodes
