"""Sweep-file validation: every bad file gets one message naming the file, line and dotted path."""

from pathlib import Path

import pytest

from amdahl.errors import UserError
from amdahl.spec import load_spec, validate_spec

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
    for path in sorted(Path(__file__).resolve().parents[2].glob("sweeps/*.yaml")):
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
