"""A user's own workload, without Ray: found beside the sweep file or in the working directory,
shipped to workers as py_modules, and every problem refused at plan time (exit 2, one line,
before anything is drawn). `platform init` writes a skeleton that plans as written."""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from amdahl.cli.commands import main
from amdahl.driver.planning import check_sweep
from amdahl.errors import UserError
from amdahl.plan.launches import plan_sweep
from amdahl.plan.resources import Node
from amdahl.spec.load import load_spec, validate_spec
from amdahl.workload.code import (
    locate_spec_workload,
    locate_workload,
    make_workload,
    workload_search_path,
)
from amdahl.workload.data_checks import check_workload

ROOT = Path(__file__).resolve().parents[3]
BYO = ROOT / "tests" / "integration" / "byo"
PLATFORM = Path(sys.executable).parent / "platform"
TWO_CPUS = [Node(cpus=2.0)]


def _checked_plan(spec, nodes=TWO_CPUS):
    """What `platform plan` does, for `nodes`: every check first, then the plan."""
    check_sweep(spec)
    return plan_sweep(spec, nodes)


GOOD = """\
import numpy as np
from torch import nn

from amdahl import Workload


class Good(Workload):
    defaults = {"where": "WHERE"}

    def build_model(self):
        return nn.Linear(3, 2)

    def generate(self, split, num_rows, seed):
        return {"x": np.zeros((num_rows, 3), np.float32), "y": np.zeros(num_rows, np.int64)}

    def split_batch(self, batch):
        return batch["x"], batch["y"]

    def loss(self, output, target):
        return nn.functional.cross_entropy(output, target)
"""


@pytest.fixture
def clean_imports(monkeypatch, tmp_path):
    """The sys.path entries and modules a test's own workloads (under tmp_path) add are gone
    after it (torch and the like, imported on the way, stay)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        module = sys.modules[name]
        where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", [])), "")
        if str(where).startswith(str(tmp_path)):
            del sys.modules[name]


def _module(folder: Path, name: str, body: str = GOOD, where: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(body.replace("WHERE", where or str(folder)))
    return folder


def _sweep(folder: Path, workload: str, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sweep.yaml"
    path.write_text(f"name: t\nworkload: {workload}\ngrid: {{devices: [1, 2]}}\n{extra}")
    return path


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MLFLOW_TRACKING_URI"] = "file:///dev/null/never-used"
    return env


def test_workload_beside_the_sweep_file_is_found_and_shipped(tmp_path, clean_imports, monkeypatch):
    folder = tmp_path / "folder"
    shutil.copytree(BYO, folder)
    monkeypatch.chdir(tmp_path)  # not the folder: the sweep file's directory is searched
    spec = load_spec(folder / "byo.yaml")
    code = locate_spec_workload(spec)
    assert code.root == folder.resolve()
    env = code.runtime_env()
    # Only the code travels: the package and the helper module it imports, not byo.yaml.
    assert sorted(env["py_modules"]) == sorted(
        [str(folder.resolve() / "clicks.py"), str(folder.resolve() / "mypkg")]
    )
    assert "__pycache__" in env["excludes"]
    plan = _checked_plan(spec, TWO_CPUS)
    assert [t.refused for t in plan.trials] == [None, None]


def test_the_sweep_files_directory_wins_then_the_working_directory(
    tmp_path, clean_imports, monkeypatch
):
    beside, cwd, elsewhere = tmp_path / "beside", tmp_path / "cwd", tmp_path / "elsewhere"
    for folder in (beside, cwd, elsewhere):
        _module(folder, "which")
    monkeypatch.chdir(cwd)
    spec = load_spec(_sweep(beside, "which:Good"))
    assert _checked_plan(spec, TWO_CPUS).trials[0].settings.params["where"] == str(beside)
    assert workload_search_path(None, beside) == [beside.resolve(), cwd.resolve()]
    # workload_path (relative to the sweep file) comes first of all.
    spec = load_spec(_sweep(beside, "which:Good", "workload_path: ../elsewhere\n"))
    assert spec.workload_path == str(elsewhere.resolve())
    assert workload_search_path(spec.workload_path, spec.source_dir)[0] == elsewhere.resolve()


def test_the_working_directory_is_searched_when_the_sweep_file_is_elsewhere(
    tmp_path, clean_imports, monkeypatch
):
    _module(tmp_path / "code", "incwd")
    monkeypatch.chdir(tmp_path / "code")
    spec = load_spec(_sweep(tmp_path, "incwd:Good"))
    assert locate_spec_workload(spec).root == (tmp_path / "code").resolve()


def test_a_module_found_nowhere_names_the_places_looked(tmp_path, clean_imports, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = load_spec(_sweep(tmp_path / "sweeps", "mypkg.tinyrec:TinyRec"))
    with pytest.raises(UserError) as e:
        _checked_plan(spec, TWO_CPUS)
    message = str(e.value)
    assert message.startswith("workload: cannot import 'mypkg.tinyrec' (No module named")
    assert str((tmp_path / "sweeps").resolve()) in message and "workload_path" in message


def test_built_in_workloads_ship_nothing(monkeypatch):
    monkeypatch.chdir(ROOT)  # where workloads/ is a folder too
    assert locate_workload("mlp", [ROOT]).runtime_env() is None
    assert locate_spec_workload(validate_spec({"workload": "gpt"})).root is None


def test_a_missing_method_is_refused_at_plan_time_before_anything_is_drawn(tmp_path):
    body = GOOD.replace("    def loss(self, output, target):\n", "    def _loss(self, o, t):\n")
    _module(tmp_path, "partial", body)
    _sweep(tmp_path, "partial:Good")
    for command in (["sweep", "sweep.yaml", "--no-tracking"], ["plan", "sweep.yaml"]):
        done = subprocess.run(
            [str(PLATFORM), *command],
            cwd=tmp_path,
            env=_child_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr.startswith("error: workload: Good ('partial:Good') does not implement")
        assert "loss" in done.stderr and "Traceback" not in done.stderr
        assert done.stdout == ""  # no live table, no plan table
    assert not any((tmp_path / "runs").glob("t-*"))  # and no sweep directory left behind


def test_a_runtime_import_error_is_one_line_with_its_place(tmp_path, clean_imports):
    _module(tmp_path, "broken", "import numpy\n\nVALUE = 1 / 0\n")
    with pytest.raises(UserError, match=r"ZeroDivisionError: division by zero at .*broken.py:3"):
        locate_workload("broken:Good", [tmp_path])
    _module(tmp_path, "needsdep", "import not_installed_anywhere\n")
    with pytest.raises(UserError, match="No module named 'not_installed_anywhere' at .*needsdep"):
        locate_workload("needsdep:Good", [tmp_path])


@pytest.mark.parametrize(
    "replace, message",
    [
        (
            ('"y": np.zeros(num_rows, np.int64)', '"y": np.zeros(num_rows - 1, np.int64)'),
            "column 'y' has 3 rows, expected 4",
        ),
        (
            ('"y": np.zeros(num_rows, np.int64)', '"y": [0] * num_rows'),
            "column 'y' is a builtins.list, not a numpy array",
        ),
        (
            ("np.zeros(num_rows, np.int64)}", 'np.zeros(num_rows, np.int64)}, "meta"'),
            "returned tuple; it must return a non-empty dict of numpy arrays",
        ),
        (
            ('"y": np.zeros', '("label" if split == "val" else "y"): np.zeros'),
            "gives train the columns ['x', 'y'] but val ['label', 'x']",
        ),
        (
            ('return batch["x"], batch["y"]', 'return batch["x"]'),
            "split_batch(<train batch>) returned a Tensor; it must return a pair",
        ),
        (
            ("return {", "raise KeyError('features')\n        return {"),
            "Good.generate('train', 4, seed=0) raised KeyError: 'features' at",
        ),
    ],
)
def test_wrong_returns_are_refused_at_plan_time(tmp_path, clean_imports, replace, message):
    name = f"wrong{abs(hash(message))}"
    _module(tmp_path, name, GOOD.replace(*replace))
    with pytest.raises(UserError, match=re.escape(message)):
        _checked_plan(validate_spec({"workload": f"{name}:Good", "workload_path": str(tmp_path)}))


def test_preprocess_is_checked_on_rows_as_both_inputs_deliver_them(tmp_path, clean_imports):
    """Both inputs hand preprocess the stored columns: a (rows, 1, 3) column as (rows, 3), never
    an object array of per-row arrays (tests/unit/data/test_preprocess_inputs.py runs both)."""
    stored = GOOD.replace("np.zeros((num_rows, 3), np.float32)", "np.zeros((num_rows, 1, 3))")
    stored = stored.replace(
        "    def split_batch",
        "    def preprocess(self, batch, training):\n"
        "        assert batch['x'].shape[1:] == (3,), batch['x'].shape\n"
        "        return {'x': batch['x'].astype('float32') * 2, 'y': batch['y']}\n\n"
        "    def split_batch",
    )
    _module(tmp_path, "stored", stored)
    for inputs in (["ray_data"], ["torch_loader"], ["ray_data", "torch_loader"]):
        spec = {"workload": "stored:Good", "workload_path": str(tmp_path)}
        spec["grid"] = {"input": inputs}
        assert _checked_plan(validate_spec(spec), TWO_CPUS).runnable


def test_shipped_code_has_a_size_limit(tmp_path, clean_imports, monkeypatch):
    package = tmp_path / "heavy"
    package.mkdir()
    (package / "__init__.py").write_text(GOOD)
    (package / "weights.bin").write_bytes(b"0" * 4096)
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "x.pyc").write_bytes(b"0" * 100_000)  # excluded
    monkeypatch.setattr("amdahl.workload.code.MAX_SHIPPED_BYTES", 3000)
    with pytest.raises(UserError, match="heavy holds 0 MiB, more than the 0 MiB of code"):
        locate_workload("heavy:Good", [tmp_path])
    monkeypatch.setattr("amdahl.workload.code.MAX_SHIPPED_BYTES", 10_000)
    assert locate_workload("heavy:Good", [tmp_path]).ship == (package.resolve(),)


def test_init_writes_a_skeleton_that_plans_and_refuses_to_overwrite(
    tmp_path, clean_imports, monkeypatch
):
    runner = CliRunner()
    done = runner.invoke(main, ["init", str(tmp_path / "mine")])
    assert done.exit_code == 0, done.output
    assert "platform plan sweep.yaml && platform sweep sweep.yaml" in done.output
    written = tmp_path / "mine"
    assert {p.name for p in written.iterdir()} == {"myworkload.py", "sweep.yaml"}
    # It plans as written, both device counts runnable on 2 CPUs (resources: auto).
    monkeypatch.chdir(tmp_path)
    plan = _checked_plan(load_spec(written / "sweep.yaml"), TWO_CPUS)
    assert [t.settings.devices for t in plan.runnable] == [1, 2]
    check_workload(make_workload("myworkload:MyWorkload", {}))
    lint = subprocess.run(
        [shutil.which("ruff") or "ruff", "check", "--config", str(ROOT / "pyproject.toml"), "."],
        cwd=written,
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout
    # Never overwrites: exit 2, one message, nothing written.
    (written / "sweep.yaml").write_text("mine\n")
    again = runner.invoke(main, ["init", str(written)])
    assert again.exit_code == 2
    assert "already exist; nothing was written" in again.output
    assert (written / "sweep.yaml").read_text() == "mine\n"


def test_the_guides_example_is_a_complete_workload(clean_imports):
    guide = (ROOT / "docs" / "workload.md").read_text()
    section = guide.split("## The Workload API", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(textwrap.dedent(code), "docs/workload.md", "exec"), namespace)  # noqa: S102
    workload = namespace["MyModel"]()  # abstract methods all implemented
    check_workload(workload)
    assert workload.correct is not None and workload.flops_per_sample() > 0


def test_a_workload_path_that_is_no_directory_is_refused(tmp_path, clean_imports):
    spec = load_spec(_sweep(tmp_path, "which:Good", "workload_path: nowhere\n"))
    with pytest.raises(UserError, match="workload_path: .*nowhere is not a directory"):
        _checked_plan(spec, TWO_CPUS)
