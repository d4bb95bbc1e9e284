"""What an undeclared `preprocess` depends on (workload/preprocess_reads.py): parameter sets that
store the same rows, read the same values and get the same columns share an input pipeline and
so a launch; anything else keeps its own."""

import numpy as np
from torch import nn

from amdahl import Workload
from amdahl.plan.launches import WorkloadFacts, plan_sweep
from amdahl.plan.resources import Node
from amdahl.spec.load import validate_spec
from amdahl.workload.preprocess_reads import input_key


class Scaled(Workload):
    """`preprocess` reads `scale`; `dim` is the model's width only."""

    defaults = {"dim": 8, "scale": 1.0, "train_rows": 64, "val_rows": 16}
    data_params = ("train_rows", "val_rows")

    def build_model(self):
        return nn.Linear(4, self.params["dim"])

    def generate(self, split, num_rows, seed):
        rng = np.random.default_rng(seed)
        return {"x": rng.standard_normal((num_rows, 4)).astype(np.float32), "y": np.zeros(num_rows)}

    def split_batch(self, batch):
        return batch["x"], batch["y"]

    def loss(self, output, target):
        return output.mean()

    def preprocess(self, batch, training):
        noise = np.random.normal(size=batch["x"].shape) if training else 0.0  # seeded by the probe
        return {
            "x": (batch["x"] * self.params["scale"] + noise).astype(np.float32),
            "y": batch["y"],
        }


class CopiedInInit(Scaled):
    """Reads `scale` once, in __init__: no read is recorded, the output shows it."""

    def __init__(self, **params):
        super().__init__(**params)
        self.factor = self.params["scale"]

    def preprocess(self, batch, training):
        return {"x": batch["x"] * self.factor, "y": batch["y"]}


class Unseeded(Scaled):
    """Noise from its own unseeded generator: no two calls agree, nothing is shared."""

    def preprocess(self, batch, training):
        noise = np.random.default_rng().normal(size=batch["x"].shape)
        return {"x": batch["x"] + noise, "y": batch["y"]}


class Declared(Scaled):
    preprocess_params = ("scale",)


def test_a_parameter_preprocess_does_not_read_is_not_in_its_key():
    assert input_key(Scaled(dim=8)) == input_key(Scaled(dim=32))
    assert input_key(Scaled(scale=1.0)) != input_key(Scaled(scale=2.0))
    assert input_key(Scaled(dim=8))["preprocess"] == {"scale": 1.0}


def test_a_parameter_read_outside_params_shows_in_the_output():
    assert input_key(CopiedInInit(scale=1.0)) != input_key(CopiedInInit(scale=2.0))
    assert input_key(CopiedInInit(dim=8)) == input_key(CopiedInInit(dim=32))


def test_output_that_differs_call_to_call_is_never_shared():
    assert input_key(Unseeded(dim=8)) != input_key(Unseeded(dim=32))


def test_a_declaration_or_the_users_data_keeps_the_workloads_own_key(tmp_path):
    assert input_key(Declared(dim=8)) == Declared(dim=8).input_key()
    with_data = Scaled(dim=8, data=str(tmp_path))
    assert input_key(with_data) == with_data.input_key()
    assert input_key(with_data) != input_key(Scaled(dim=32, data=str(tmp_path)))


def test_the_probe_leaves_the_random_state_and_params_as_they_were():
    w = Scaled()
    np.random.seed(5)
    expected = np.random.random()
    np.random.seed(5)
    input_key(w)
    assert np.random.random() == expected
    assert type(w.params) is dict


def test_a_sweep_over_a_width_preprocess_ignores_plans_one_launch_per_device_count():
    spec = validate_spec(
        {
            "name": "w",
            "workload": "mlp",
            "grid": {"devices": [1, 2], "params.dim": [8, 32], "sync": ["ddp", "none"]},
        }
    )
    probed = WorkloadFacts(Scaled.defaults, True, lambda params: input_key(Scaled(**params)))
    plan = plan_sweep(spec, [Node(cpus=4.0)], probed)
    assert len(plan.runnable) == 8
    assert [len(launch.trials) for launch in plan.launches()] == [4, 4]  # one per device count
    # what it was before: every parameter counted, one launch per device count and dim
    declared = WorkloadFacts(Scaled.defaults, True, lambda params: Scaled(**params).input_key())
    assert len(plan_sweep(spec, [Node(cpus=4.0)], declared).launches()) == 4
