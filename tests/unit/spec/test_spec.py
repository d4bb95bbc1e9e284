"""Sweep-file validation: every bad file gets one message naming the file, line and dotted path."""

from pathlib import Path

import pytest

from amdahl.errors import UserError
from amdahl.spec.load import load_spec, validate_spec

GOOD = "name: t\nworkload: mlp\n"


def _load(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return load_spec(path, overrides)


def _error(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(UserError) as info:
        _load(tmp_path, text, overrides)
    return str(info.value)


def test_minimal_file_gets_defaults(tmp_path):
    spec = _load(tmp_path, GOOD)
    assert spec.grid.devices == [1]
    assert spec.isolation == "exclusive"
    assert spec.experiment == "t"


@pytest.mark.parametrize(
    "text, expected",
    [
        (GOOD + "grid:\n  devices: [1, 2, 0]\n", ":4: grid.devices[2]: must be >= 1, got 0"),
        (GOOD + "trian:\n  steps: 3\n", ":3: trian: unknown key 'trian' (did you mean 'train'?)"),
        (GOOD + "grid:\n  precision: [fp64]\n", "grid.precision[0]: got 'fp64'; allowed values:"),
        (GOOD + "grid:\n  devises: [1]\n", "grid.devises: unknown axis 'devises' (did you mean"),
        (
            GOOD + "train:\n  stepz: 3\n",
            ":4: train.stepz: unknown key 'stepz' (did you mean 'steps",
        ),
        ("name: x\n", "workload: is required"),
        (GOOD + "train:\n  steps: abc\n", ":4: train.steps: input should be a valid integer"),
        (GOOD + "exclude:\n  - {devices: 3}\n", "exclude[0].devices: 3 is not in grid.devices"),
        (GOOD + "exclude:\n  - {gpus: 3}\n", "exclude[0].gpus: unknown axis 'gpus'"),
        (
            GOOD + "isolation: private\n",
            ":3: isolation: got 'private'; allowed values: 'exclusive'",
        ),
        (GOOD + "grid:\n  sync: [allreduce]\n", "grid.sync[0]: got 'allreduce'; allowed values:"),
        (GOOD + "resources:\n  cpus_per_device: 0\n", "resources.cpus_per_device: must be > 0"),
        (
            GOOD + "train:\n  scaling: strong\ngrid:\n  devices: [1, 3]\n  batch_size: [8]\n",
            "grid.batch_size: strong scaling splits the global batch 8 over 3 devices",
        ),
        (GOOD + "grid:\n  params.hidden: []\n", "grid.params.hidden: must be a non-empty list"),
        ("- just\n- a list\n", "a sweep file is a mapping"),
        ("name: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_files_name_the_path(tmp_path, text, expected):
    message = _error(tmp_path, text)
    assert str(tmp_path / "sweep.yaml") in message
    assert expected in message


def test_override_errors_name_the_override(tmp_path):
    assert _error(tmp_path, GOOD, ("train.steps=0",)) == "--set train.steps: must be >= 1, got 0"
    assert "expected KEY.PATH=VALUE" in _error(tmp_path, GOOD, ("train.steps",))


def test_overrides_apply(tmp_path):
    spec = _load(
        tmp_path, GOOD, ("grid.devices=[1,2]", "train.steps=7", "grid.params.hidden=[[8]]")
    )
    assert spec.grid.devices == [1, 2]
    assert spec.train.steps == 7
    assert spec.grid.param_axes() == {"hidden": [[8]]}


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="cannot read sweep file"):
        load_spec(tmp_path / "nope.yaml")


def test_shipped_sweeps_load():
    for path in sorted(Path(__file__).resolve().parents[3].glob("sweeps/*.yaml")):
        load_spec(path)


def test_time_to_target_and_lr_schedule_are_validated():
    spec = validate_spec(
        {
            "workload": "mlp",
            "train": {
                "lr_scaling": "linear",
                "lr_warmup_steps": 5,
                "target": {"metric": "val_loss", "value": 0.3, "max_steps": 400},
            },
        }
    )
    assert spec.train.target.eval_every == 50 and spec.train.lr_base_batch == 256
    with pytest.raises(UserError, match=r"train.target.max_steps: must exceed"):
        validate_spec(
            {
                "workload": "mlp",
                "train": {"target": {"metric": "val_loss", "value": 1, "max_steps": 3}},
            }
        )
    with pytest.raises(UserError, match=r"train.lr_warmup_steps: .*set train.lr_scaling: linear"):
        validate_spec({"workload": "mlp", "train": {"lr_warmup_steps": 5}})
    with pytest.raises(UserError, match=r"train.target.metric: got 'accuracy'"):
        validate_spec(
            {
                "workload": "mlp",
                "train": {"target": {"metric": "accuracy", "value": 1, "max_steps": 99}},
            }
        )


def test_storage_is_a_uri_or_an_absolute_path(tmp_path):
    assert _load(tmp_path, GOOD).storage is None
    assert _load(tmp_path, GOOD + "storage: s3://bucket/amdahl\n").storage == "s3://bucket/amdahl"
    assert _load(tmp_path, GOOD + "storage: /mnt/efs/amdahl\n").storage == "/mnt/efs/amdahl"
    assert _load(tmp_path, GOOD, ("storage=gs://b/x",)).storage == "gs://b/x"
    message = _error(tmp_path, GOOD + "storage: runs/ray\n")
    assert ":3: storage: got 'runs/ray': give a URI such as s3://bucket/amdahl" in message
    assert "absolute path on a filesystem every node mounts" in message
    assert "~/x" in _error(tmp_path, GOOD, ("storage=~/x",))


# --------------------------------------------------------------------------- YAML traps


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    message = _error(tmp_path, GOOD + "grid:\n  devices: [1, 2]\ngrid:\n  batch_size: [8]\n")
    assert message.endswith(
        ":5: duplicate key 'grid' (first on line 3); a key may appear only "
        "once in a mapping: merge the two into one"
    )
    assert ":3: duplicate key 'steps' (first on line 3)" in _error(
        tmp_path, GOOD + "train: {steps: 3, steps: 4}\n"
    )
    assert "--set 'params={a: 1, a: 2}': duplicate key 'a'" in _error(
        tmp_path, GOOD, ("params={a: 1, a: 2}",)
    )
    # keys a `<<` merge brings in may still be overridden, as YAML allows
    merged = _load(tmp_path, GOOD + "params:\n  <<: {hidden: [4]}\n  hidden: [8]\n")
    assert merged.params == {"hidden": [8]}


@pytest.mark.parametrize(
    "text",
    [
        GOOD + "params: &p\n  inner: *p\n",
        GOOD + "params: {hidden: &h [4, *h]}\n",
    ],
)
def test_a_recursive_anchor_is_refused(tmp_path, text):
    message = _error(tmp_path, text)
    assert ":3: this node contains an alias of itself (a recursive anchor)" in message


def test_aliases_that_expand_without_bound_are_refused(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    message = _error(tmp_path, GOOD + "params:\n" + "".join(f"  {ln}\n" for ln in lines))
    assert "aliases expand to over 100,000 values" in message


def test_yaml_that_pyyaml_cannot_build_is_one_message(tmp_path):
    date = _error(tmp_path, GOOD + "x: 2024-13-01\n")
    assert "not valid YAML: cannot build a value (ValueError: month must be in 1..12)" in date
    assert "(AttributeError: " in _error(tmp_path, GOOD + "storage: !!timestamp ''\n")
    deep = GOOD + "params: {x: " + "[" * 5000 + "]" * 5000 + "}\n"
    assert "not valid YAML" in _error(tmp_path, deep)


@pytest.mark.parametrize(
    "text, overrides, expected",
    [
        (GOOD + "train: {lr: .inf}\n", (), ":3: train.lr: must be a finite number, got inf"),
        (GOOD + "train: {lr: inf}\n", (), ":3: train.lr: input should be a finite number"),
        (GOOD, ("train.lr=.nan",), "--set train.lr: must be a finite number, got nan"),
        (GOOD, ("resources.cpus_per_device=.inf",), "--set resources.cpus_per_device: must be"),
        (GOOD + "resources: {cpus_per_data_worker: .inf}\n", (), "finite number, got inf"),
        (GOOD + "report: {cost_per_device_hour: .inf}\n", (), "finite number, got inf"),
        (GOOD + "params: {dropout: .nan}\n", (), ":3: params.dropout: must be a finite number"),
        (GOOD + "grid:\n  params.width: [8, .inf]\n", (), "grid.params.width[1]: must be a"),
    ],
)
def test_non_finite_numbers_are_refused(tmp_path, text, overrides, expected):
    assert expected in _error(tmp_path, text, overrides)


def test_the_cli_refuses_bad_yaml_with_one_line_and_exit_2(tmp_path):
    from click.testing import CliRunner

    from amdahl.cli.commands import main

    path = tmp_path / "sweep.yaml"
    for text in (GOOD + "params: &p {x: *p}\n", GOOD + "grid: {}\ngrid: {}\n"):
        path.write_text(text)
        result = CliRunner().invoke(main, ["plan", str(path), "--set", "train.lr=.inf"])
        assert result.exit_code == 2, result.output
        assert result.output.startswith(f"error: {path}:") and result.output.count("\n") == 1


@pytest.mark.parametrize("value", ['"a\\0b"', "~no-such-user/x"])
def test_an_unusable_workload_path_is_one_message(tmp_path, value):
    message = _error(tmp_path, GOOD + f"workload_path: {value}\n")
    assert "workload_path: " in message and "is not a usable directory path" in message


def test_compiled_trials_need_a_warmup_step():
    """With warmup_steps 0 the window would open before the first step, and compilation would
    land in the throughput: refused, naming the path, the value and the fix."""
    with pytest.raises(UserError) as e:
        validate_spec(
            {
                "workload": "mlp",
                "train": {"warmup_steps": 0},
                "grid": {"compile": ["eager", "inductor"]},
            }
        )
    assert "train.warmup_steps: is 0 while grid.compile has inductor" in str(e.value)
    assert "set train.warmup_steps to 1 or more" in str(e.value)
    eager = validate_spec({"workload": "mlp", "train": {"warmup_steps": 0}})
    assert eager.train.warmup_steps == 0  # eager trials compile nothing: 0 stays allowed
