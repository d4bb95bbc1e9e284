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
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from amdahl.columns import AXES
from amdahl.plan.launches import WorkloadFacts, plan_sweep
from amdahl.plan.resources import Node
from amdahl.plan.trials import expand_grid
from amdahl.spec.load import load_spec
from amdahl.workload.code import make_workload

ROOT = Path(__file__).resolve().parents[3]
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
    # the backend store's URL (a database password) goes through the environment, not argv
    store = 'MLFLOW_BACKEND_STORE_URI="${AMDAHL_MLFLOW_BACKEND_URI:-sqlite:////home/ubuntu/'
    assert store in mlflow
    assert "--backend-store-uri" not in mlflow
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


def _torch_install(config: dict[str, Any]) -> str:
    return _one(config["setup_commands"], "--query-gpu=driver_version")


def _run_torch_install(command: str, home: Path, driver: str, cuda: bool) -> tuple[int, str, str]:
    """Run cluster.yaml's torch install in a sandbox: a fake `nvidia-smi` reporting `driver`
    (none: no usable GPU), a fake uv recording its arguments, and the venv's python seeing a
    fake torch whose CUDA is `cuda`. Returns the exit code, the index uv got, stderr."""
    bin_dir, fake = home / "bin", home / "fake"
    for d in (bin_dir, home / ".local" / "bin", home / "venv" / "bin", fake / "torch"):
        d.mkdir(parents=True, exist_ok=True)
    scripts = {
        bin_dir / "nvidia-smi": '[ -n "$FAKE_DRIVER" ] || exit 9\n'
        'case "$1" in -L) echo "GPU 0: NVIDIA A10G";;\n'
        '  --query-gpu=driver_version) echo "$FAKE_DRIVER"; echo "$FAKE_DRIVER";; esac\n',
        home / ".local" / "bin" / "uv": 'printf "%s\\n" "$@" > "$HOME/uv-args"\n',
        home / "venv" / "bin" / "python": f'exec "{sys.executable}" "$@"\n',
    }
    for path, body in scripts.items():
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    (fake / "torch" / "__init__.py").write_text(
        '__version__ = "2.13.0+fake"\n'
        "class cuda:\n"
        f"    is_available = staticmethod(lambda: {cuda})\n"
    )
    env = {
        "HOME": str(home),
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "PYTHONPATH": str(fake),
        "FAKE_DRIVER": driver,
    }
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env)
    args = (home / "uv-args").read_text().split() if (home / "uv-args").exists() else []
    index = args[args.index("--index-url") + 1] if "--index-url" in args else ""
    return done.returncode, index, done.stderr


WHL = "https://download.pytorch.org/whl/"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    "driver, index",
    [
        ("", WHL + "cpu"),  # no usable GPU: the head
        ("595.12", WHL + "cu130"),
        ("580.65.06", WHL + "cu130"),
        ("575.57.08", WHL + "cu126"),
        ("550.54.15", WHL + "cu126"),
        ("535.247.01", None),  # too old for any torch 2.13 CUDA wheel: the setup stops
        ("unknown", None),
    ],
)
def test_the_driver_version_picks_the_torch_wheel_index(config, tmp_path, driver, index):
    code, got, stderr = _run_torch_install(_torch_install(config), tmp_path, driver, cuda=True)
    if index is None:
        assert code != 0 and got == "", "an unsuitable driver must stop the setup"
        assert f"NVIDIA driver '{driver}' is too old for torch 2.13-2.14 CUDA" in stderr
        assert "cu126 needs >= 550, cu130 >= 580" in stderr
    else:
        assert code == 0, stderr
        assert got == index


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_torch_without_cuda_on_a_gpu_node_stops_the_setup(config, tmp_path):
    code, got, stderr = _run_torch_install(_torch_install(config), tmp_path, "580.65.06", False)
    assert got == WHL + "cu130"
    assert code != 0
    assert "torch 2.13.0+fake cannot use CUDA (torch.cuda.is_available() is False)" in stderr
    assert "NVIDIA driver 580.65.06" in stderr


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
    on_cluster = plan_sweep(spec, nodes, WorkloadFacts({}))
    unlimited = plan_sweep(spec, [Node(cpus=1e9, gpus=1e9)], WorkloadFacts({}))
    assert unlimited.runnable, "the build supports no trial of sweeps/scaling.yaml"
    refused = {t.trial_id: t.refused for t in on_cluster.trials if t.refused}
    assert refused == {t.trial_id: t.refused for t in unlimited.trials if t.refused}


# --------------------------------------------------------------------------- fail closed

SG_PLACEHOLDER = "sg-REPLACE-WITH-RESTRICTED-GROUP-ID"


def test_every_node_type_names_its_security_group(config):
    """A node type without SecurityGroupIds makes Ray create its default group, which opens
    SSH to every address; the shipped value is a placeholder `ray up` cannot resolve."""
    assert "security_group" not in config["provider"], "Ray's default group is not used"
    for name, node_type in config["available_node_types"].items():
        groups = node_type["node_config"].get("SecurityGroupIds")
        assert groups == [SG_PLACEHOLDER], f"{name}: SecurityGroupIds {groups!r}"


@pytest.fixture
def ray_aws_config(monkeypatch):
    """Ray's AWS bootstrap module; where boto3 is not installed, imported over stand-ins for
    the few boto3/botocore names it imports (nothing here talks to AWS)."""
    import importlib
    import importlib.util
    import types

    name = "ray.autoscaler._private.aws.config"
    if importlib.util.find_spec("boto3") is not None:
        yield importlib.import_module(name)  # a generator fixture: yield, never return a value
        return
    stubs = {
        "boto3": {"__version__": "1.40.0"},
        "boto3.exceptions": {"ResourceNotExistsError": type("E", (Exception,), {})},
        "boto3.resources": {},
        "boto3.resources.base": {"ServiceResource": object},
        "botocore": {},
        "botocore.client": {"BaseClient": object},
        "botocore.config": {"Config": object},
        "botocore.exceptions": {"ClientError": type("E", (Exception,), {})},
    }
    for module, attrs in stubs.items():
        stub = types.ModuleType(module)
        stub.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, module, stub)
    for loaded in [m for m in sys.modules if m.startswith("ray.autoscaler._private.aws")]:
        monkeypatch.delitem(sys.modules, loaded)
    module = importlib.import_module(name)
    yield module
    for loaded in [m for m in sys.modules if m.startswith("ray.autoscaler._private.aws")]:
        del sys.modules[loaded]  # modules bound to the stand-ins go; monkeypatch restores


def test_ray_creates_no_security_group_and_refuses_the_placeholder(
    config, ray_aws_config, monkeypatch, capsys
):
    from ray.autoscaler._private.util import prepare_config

    created = []
    prepared = prepare_config(copy.deepcopy(config))
    group = type("SecurityGroup", (), {"id": "sg-0default"})

    def upsert(conf, node_types):
        created.append(node_types)
        return dict.fromkeys(node_types, group)

    monkeypatch.setattr(ray_aws_config, "_upsert_security_groups", upsert)
    ray_aws_config._configure_security_group(copy.deepcopy(prepared))
    assert created == [], "Ray would create its default security group (SSH from anywhere)"

    # `ray up` looks the named groups up before starting anything; no group has the placeholder
    class NoGroups:
        class security_groups:  # noqa: N801 - mimics boto3's ec2 resource
            @staticmethod
            def filter(Filters):  # noqa: N803
                assert Filters == [{"Name": "group-id", "Values": [SG_PLACEHOLDER]}]
                return []

    monkeypatch.setattr(ray_aws_config, "_resource", lambda service, conf: NoGroups)
    with pytest.raises(AssertionError):
        ray_aws_config._configure_subnet(copy.deepcopy(prepared))
    assert "Failed to detect a security group with id equal to any of the configured" in (
        capsys.readouterr().err
    )

    # not vacuous: without SecurityGroupIds on one node type, Ray would create its own group
    head = config["head_node_type"]
    del prepared["available_node_types"][head]["node_config"]["SecurityGroupIds"]
    ray_aws_config._configure_security_group(prepared)
    assert created == [[head]]


# --------------------------------------------------------------------------- supply chain, secrets


def _uv_install(config: dict[str, Any]) -> str:
    return _one(config["setup_commands"], "UV_SHA256=")


def test_no_installer_is_piped_into_a_shell(config):
    for key in COMMAND_LISTS:
        for command in config.get(key) or []:
            assert not re.search(r"\|\s*(sudo\s+)?(ba|z|da)?sh\b", command), command


def test_uv_is_a_pinned_release_checked_against_its_sha256(config):
    command = _uv_install(config)
    assert re.search(r"UV_WHEEL=https://files\.pythonhosted\.org/\S+/uv-\d+\.\d+\.\d+-", command)
    assert re.search(r"UV_SHA256=[0-9a-f]{64};", command)
    assert "sha256sum -c" in command
    assert command.index("sha256sum -c") < command.index("install -m 755")


def _run_uv_install(command: str, home: Path, machine: str) -> tuple[int, str]:
    """Run cluster.yaml's uv install with a fake curl that downloads `not a wheel` and a fake
    uname reporting `machine`; returns the exit code and stderr."""
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True)
    scripts = {
        "curl": 'while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\n'
        'echo "not a wheel" > "$out"\n',
        "uname": f"echo {machine}\n",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env)
    return done.returncode, done.stderr


@pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("sha256sum") is None,
    reason="needs bash and sha256sum",
)
@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_a_tampered_or_foreign_uv_download_installs_nothing(config, tmp_path, machine):
    code, stderr = _run_uv_install(_uv_install(config), tmp_path, machine)
    assert code != 0
    assert not (tmp_path / ".local" / "bin" / "uv").exists()
    if machine == "x86_64":
        assert "does not have the pinned sha256" in stderr
    else:
        assert "the pinned uv is the x86_64 build, this node is aarch64" in stderr


def _group_cmdlines(pgid: int) -> dict[int, str]:
    """The command lines of every live process in process group `pgid` (Linux /proc)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if int(fields[2]) == pgid:
            found[int(proc.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def _wait_for(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.integration  # starts a real server: seconds on an idle machine, minutes on a busy one
@pytest.mark.skipif(
    shutil.which("bash") is None
    or shutil.which("setsid") is None
    or not Path("/proc/self/stat").exists(),
    reason="needs bash, setsid and /proc",
)
def test_the_database_password_is_not_on_mlflows_command_line(config, tmp_path):
    """cluster.yaml's own start and stop commands run the real `mlflow server` (this venv's
    entry point as ~/venv/bin/mlflow). ps shows every user a process's arguments, its
    environment only to its owner: the backend store's URL (here a SQLite path whose directory
    stands for a password) reaches the server, which creates its database there, yet is on no
    command line of the server's process group (uvicorn's workers included)."""
    secret = "s3cr3t-pw"
    store = tmp_path / secret / "mlflow.db"
    store.parent.mkdir()
    (tmp_path / ".amdahl").mkdir()
    (tmp_path / ".amdahl" / "mlflow.env").write_text(
        f"AMDAHL_MLFLOW_BACKEND_URI='sqlite:///{store}'\n"
        f"AMDAHL_MLFLOW_ARTIFACTS='{tmp_path / 'artifacts'}'\n"
        "MLFLOW_WORKERS=1\n"  # mlflow.env is the user's: one server process, not four
    )
    (tmp_path / "mlflow").mkdir()
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "mlflow").symlink_to(Path(sys.executable).parent / "mlflow")
    start_cmd = _one(config["head_start_ray_commands"], "bin/mlflow server")
    stop_cmd = _one(config["head_start_ray_commands"], "server.pgid 2>")
    assert "--port 5000" in start_cmd
    with socket.socket() as sock:  # 5000 on the head; a free one here, beside other tests
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    start_cmd = start_cmd.replace("--port 5000", f"--port {port}")
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    subprocess.run(["bash", "-c", start_cmd], check=True, env=env, timeout=30)
    pgid_file = tmp_path / "mlflow" / "server.pgid"
    log = tmp_path / "mlflow" / "server.log"
    try:
        assert _wait_for(pgid_file.exists, 30), log.read_text()
        pgid = int(pgid_file.read_text())

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    return True
            except OSError:
                return False

        assert _wait_for(healthy, 120), log.read_text()[-3000:]
        assert store.exists()  # the server opened the store the environment named
        cmdlines = _group_cmdlines(pgid)
        assert any("mlflow server" in c for c in cmdlines.values()), cmdlines
        assert all(secret not in c for c in cmdlines.values()), cmdlines
    finally:
        # cluster.yaml's restart step: stops the previous server by its process group
        subprocess.run(["bash", "-c", stop_cmd], env=env, timeout=60)
    assert not pgid_file.exists()
    assert _wait_for(lambda: not _group_cmdlines(pgid), 30), _group_cmdlines(pgid)
