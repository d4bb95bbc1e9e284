"""cluster.yaml and the sweep files, checked without a cloud.

cluster.yaml goes through the same preparation and schema validation `ray up` runs before it
contacts AWS (`prepare_config` then `validate_config`, against Ray's ray-schema.json), then through
the promises docs/cluster.md makes: nothing open to every address, MLflow and the dashboard on the
head's loopback, token authentication on, a GPU node type that scales from zero, the repository
synced and installed, no credentials in the file. Every sweep file must load, and
sweeps/scaling.yaml must fit the cluster cluster.yaml describes.
"""

from __future__ import annotations

import copy
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from amdahl.plan import Node, expand_grid, plan_sweep
from amdahl.spec import AXES, load_spec
from amdahl.workload import make_workload

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster.yaml"
SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))
REPO_ON_NODES = "/home/ubuntu/amdahl"
COMMAND_LISTS = (
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)


@pytest.fixture(scope="module")
def text() -> str:
    return CLUSTER.read_text()


@pytest.fixture(scope="module")
def config(text: str) -> dict[str, Any]:
    return yaml.safe_load(text)


def _worker_types(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    head = config["head_node_type"]
    return {name: t for name, t in config["available_node_types"].items() if name != head}


def _one(commands: list[str], needle: str) -> str:
    found = [c for c in commands if needle in c]
    assert len(found) == 1, f"expected one command with {needle!r}, got {found}"
    return found[0]


# --------------------------------------------------------------------------- Ray's own checks


def test_ray_prepares_and_validates_the_config(config):
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)  # raises jsonschema.ValidationError or ValueError
    assert prepared["provider"]["type"] == "aws"
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_ray_validation_is_not_vacuous(config):
    """The same check rejects a misspelt key, so passing it above means something."""
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    broken = copy.deepcopy(config)
    broken["idle_timeout_minute"] = broken.pop("idle_timeout_minutes")
    with pytest.raises(jsonschema.ValidationError, match="idle_timeout_minute"):
        validate_config(prepare_config(broken))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_every_command_is_valid_bash(config):
    for key in COMMAND_LISTS:
        for command in config.get(key) or []:
            done = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
            assert done.returncode == 0, f"{key}: {command!r}\n{done.stderr}"


# --------------------------------------------------------------------------- exposure


def test_nothing_is_opened_to_every_address(text, config):
    for everywhere in ("0.0.0.0", "::/0"):
        assert everywhere not in text
    rules = config["provider"].get("security_group", {}).get("IpPermissions", [])
    assert not rules, "extra inbound rules: reach services through SSH tunnels instead"


def test_dashboard_and_mlflow_listen_on_the_heads_loopback(config):
    start = config["head_start_ray_commands"]
    assert "--dashboard-host=127.0.0.1" in _one(start, "ray start --head")
    mlflow = _one(start, "bin/mlflow server")
    assert re.search(r"--host[ =]127\.0\.0\.1\b", mlflow)
    assert re.search(r"--port[ =]5000\b", mlflow)


def test_mlflow_store_defaults_to_the_head_and_is_overridable(config):
    mlflow = _one(config["head_start_ray_commands"], "bin/mlflow server")
    assert '--backend-store-uri "${AMDAHL_MLFLOW_BACKEND_URI:-sqlite:////home/ubuntu/' in mlflow
    assert '--artifacts-destination "${AMDAHL_MLFLOW_ARTIFACTS:-/home/ubuntu/' in mlflow


def test_the_driver_finds_mlflow(config):
    assert any(
        "export MLFLOW_TRACKING_URI=http://127.0.0.1:5000" in c
        for c in config["head_setup_commands"]
    )


def test_token_authentication_stays_on(text, config):
    assert not re.search(r"RAY_AUTH_MODE=(?!token\b)", text)
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        assert "RAY_AUTH_MODE=token" in _one(config[key], "ray start")
    assert config["file_mounts"]["/home/ubuntu/.ray/auth_token"] == "~/.ray/auth_token"


SECRETS = {
    "AWS access key id": r"\b(AKIA|ASIA)[0-9A-Z]{16}\b",
    "AWS secret key": r"(?i)aws_secret_access_key|aws_session_token",
    "private key": r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
    "credentials in a URL": r"://[^\s/:@]+:[^\s/@]+@",
    "password or API key": r"(?i)\b(password|passwd|secret_key|api_key)\s*[:=]",
    "inline Ray token": r"RAY_AUTH_TOKEN\s*=",
}


@pytest.mark.parametrize("kind", SECRETS)
def test_no_credentials_in_the_file(text, kind):
    found = re.search(SECRETS[kind], text)
    assert not found, f"{kind} in cluster.yaml: {found.group(0)!r}"


# --------------------------------------------------------------------------- nodes and setup


def test_a_gpu_worker_type_scales_from_zero(config):
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    workers = _worker_types(config)
    gpu = [t for t in workers.values() if t["resources"].get("GPU", 0) >= 1]
    assert gpu, "no worker node type declares GPU resources"
    assert all(t.get("min_workers", 0) == 0 for t in workers.values())
    assert all(t["max_workers"] >= 1 for t in gpu)
    assert sum(t["max_workers"] for t in workers.values()) <= config["max_workers"]


def test_idle_nodes_do_not_keep_billing(config):
    assert config["idle_timeout_minutes"] <= 10
    assert config["provider"]["cache_stopped_nodes"] is False


def test_the_repository_is_synced_and_installed_on_every_node(config):
    assert config["file_mounts"][REPO_ON_NODES] == "."
    assert ".gitignore" in config["rsync_filter"]  # no .venv, runs/ or mlflow.db uploads
    setup = config["setup_commands"]  # common to head and workers
    assert any(re.search(rf"pip install\b.*-e {REPO_ON_NODES}\b", c) for c in setup)
    assert any("download.pytorch.org/whl/cu" in c for c in setup)


# --------------------------------------------------------------------------- sweep files


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_every_sweep_file_loads(path):
    spec = load_spec(path)
    make_workload(spec.workload, spec.params)  # the workload accepts every parameter


def test_scaling_sweep_is_the_promised_gpu_study():
    spec = load_spec(ROOT / "sweeps" / "scaling.yaml")
    assert spec.workload == "mlp"
    assert spec.resources.use_gpu
    assert spec.grid.devices == [1, 2, 4, 8]
    assert {"fp32", "bf16"} <= set(spec.grid.precision)
    assert {"eager", "inductor"} <= set(spec.grid.compile)
    assert {"ddp", "ddp_bf16", "powersgd", "zero1", "fsdp", "none"} <= set(spec.grid.sync)
    assert len(spec.grid.batch_size) > 1 and len(spec.grid.data_workers) > 1


def test_every_exclusion_in_scaling_removes_trials():
    spec = load_spec(ROOT / "sweeps" / "scaling.yaml")
    kept = len(expand_grid(spec, {}))
    assert kept < math.prod(len(getattr(spec.grid, axis)) for axis in AXES)
    for i, entry in enumerate(spec.exclude):
        rest = spec.exclude[:i] + spec.exclude[i + 1 :]
        without = len(expand_grid(spec.model_copy(update={"exclude": rest}), {}))
        assert without > kept, f"exclude[{i}] {entry} removes nothing the others do not"


def test_scaling_sweep_fits_the_cluster(config):
    """Planned against cluster.yaml at full size, no trial is refused for lack of resources."""
    spec = load_spec(ROOT / "sweeps" / "scaling.yaml")
    head = config["available_node_types"][config["head_node_type"]]["resources"]
    nodes = [Node(cpus=head.get("CPU", 0), gpus=head.get("GPU", 0), name="head")]
    for name, node_type in _worker_types(config).items():
        r = node_type["resources"]
        node = Node(cpus=r.get("CPU", 0), gpus=r.get("GPU", 0), name=name)
        nodes += [node] * node_type["max_workers"]
    on_cluster = plan_sweep(spec, nodes, {})
    unlimited = plan_sweep(spec, [Node(cpus=1e9, gpus=1e9)], {})
    assert unlimited.runnable, "the build supports no trial of sweeps/scaling.yaml"
    refused = {t.trial_id: t.refused for t in on_cluster.trials if t.refused}
    assert refused == {t.trial_id: t.refused for t in unlimited.trials if t.refused}
