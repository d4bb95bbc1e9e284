"""`platform init`: a workload skeleton and a sweep file that runs as written.

The two files are kept here as text (not package data) so they install with the code; the
tests run the written sweep, so they stay working.
"""

from __future__ import annotations

from pathlib import Path

from amdahl.errors import UserError

WORKLOAD_FILE = "myworkload.py"
SWEEP_FILE = "sweep.yaml"

WORKLOAD = '''\
"""My workload: the model, data and loss amdahl measures in every configuration of sweep.yaml.

`platform sweep sweep.yaml`, run from this folder, imports this file as `myworkload` (the sweep
file's directory is searched first, then the working directory) and ships it to every Ray
worker through Ray's runtime_env, on a laptop and on a cluster alike. Everything it imports at
module level must be installed on every node, or live next to it.

Change the model, the data and the loss; keep the method names and what they return. A missing
required method, or `generate` returning the wrong shape, is refused before anything runs.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from amdahl import Workload


class MyWorkload(Workload):
    """Classify points drawn around one random centre per class (a learnable toy task)."""

    # Every parameter the sweep file may set under `params:` (or sweep as
    # `grid: {params.hidden: [32, 128]}`), with its default. Other names are refused.
    defaults = {
        "features": 16,
        "hidden": 64,
        "classes": 4,
        "train_rows": 4096,  # rows stored for training (the default `rows()` reads these)
        "val_rows": 512,
    }
    # The parameters that decide the generated rows: sweeping any other one (`hidden`)
    # reuses the stored data instead of generating it again.
    data_params = ("features", "classes", "train_rows", "val_rows")

    # ---- required -----------------------------------------------------------------------

    def build_model(self) -> nn.Module:
        """A freshly initialised model (torch is seeded before this is called)."""
        p = self.params
        return nn.Sequential(
            nn.Linear(p["features"], p["hidden"]),
            nn.ReLU(),
            nn.Linear(p["hidden"], p["classes"]),
        )

    def generate(self, split: str, num_rows: int, seed: int) -> dict[str, np.ndarray]:
        """Rows for "train" or "val": a dict of numpy arrays, one per column, each with
        `num_rows` rows, the same columns for both splits. Stored once as parquet."""
        p = self.params
        centres = np.random.default_rng(seed).normal(size=(p["classes"], p["features"]))
        rng = np.random.default_rng([seed, 0 if split == "train" else 1])
        y = rng.integers(0, p["classes"], num_rows)
        x = centres[y] + rng.normal(scale=1.5, size=(num_rows, p["features"]))
        return {"x": x.astype(np.float32), "y": y.astype(np.int64)}

    def split_batch(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) from one batch of columns, now torch tensors: the model is
        called on the inputs, `loss` on its output and the targets."""
        return batch["x"], batch["y"]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The mean loss over the batch."""
        return nn.functional.cross_entropy(output, target)

    # ---- optional -----------------------------------------------------------------------

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
        """How many predictions are right, for val_accuracy (this is the default). Return
        None for a regression, where accuracy means nothing."""
        return (output.argmax(dim=-1) == target).sum()

    def flops_per_sample(self) -> float | None:
        """Training FLOPs per sample as you state them; None: unknown. MFU uses the figure
        torch counts over one training step, and the report names both where they differ by
        more than 10% (set `flops_override = True` on the class to make MFU use this one)."""
        p = self.params
        macs = p["features"] * p["hidden"] + p["hidden"] * p["classes"]
        # 2 FLOPs per multiply-add: forward, weight gradients, and input gradients but the
        # first layer's (the inputs need none, so autograd never computes it).
        return 6.0 * macs - 2.0 * p["features"] * p["hidden"]

    # def preprocess(self, batch, training):
    #     """Stored rows -> model-ready columns (decode, normalise, augment when `training`),
    #     numpy in, numpy out. Runs in the input pipeline (grid.data_workers of them), never
    #     in the timed step. Without it, rows go to the model as stored."""
    #     return {"x": batch["x"] / 4.0, "y": batch["y"]}
'''

SWEEP = """\
# A sweep of myworkload.py, runnable as written (about a minute on a 2-CPU laptop):
#   platform plan sweep.yaml     # the trials, their resources, anything that will not run and why
#   platform sweep sweep.yaml    # run them; results in runs/<name>-<UTC time>/, then:
#   platform report runs/myworkload-<UTC time>
# Every key is explained in docs/sweep-file.md, the sweep-file reference.
name: myworkload
# module:Class. The module is looked for next to this file, then in the working directory
# (`workload_path: DIR` adds a directory of your choice, searched first).
workload: myworkload:MyWorkload
params: {hidden: 64}          # keyword arguments of MyWorkload (its `defaults`)
train:
  steps: 20                   # measured optimizer steps per trial; raise it for steadier numbers
  warmup_steps: 5             # run first, not timed
grid:                         # every combination of these lists is one trial
  devices: [1, 2]             # train workers (CPU slots here; GPUs with resources.use_gpu)
  batch_size: [64]            # per device (train.scaling: weak)
# resources: auto is the default: CPUs per worker chosen so the largest trial fits this
# machine (`platform plan` prints them). Set numbers to override, e.g.
# resources: {cpus_per_device: 1, cpus_per_data_worker: 0.5}
"""


def next_steps(directory: str | Path) -> str:
    """The commands that plan and run the written sweep, from the working directory."""
    here = "" if Path(directory).resolve() == Path.cwd() else f"cd {directory} && "
    return f"{here}platform plan {SWEEP_FILE} && platform sweep {SWEEP_FILE}"


def write_scaffold(directory: str | Path) -> list[Path]:
    """Write WORKLOAD_FILE and SWEEP_FILE into `directory` (made if missing); refuse, writing
    nothing, if either exists."""
    directory = Path(directory)
    targets = {directory / WORKLOAD_FILE: WORKLOAD, directory / SWEEP_FILE: SWEEP}
    existing = [str(p) for p in targets if p.exists()]
    if existing:
        raise UserError(
            f"init: {' and '.join(existing)} already exist{'s' * (len(existing) == 1)}; "
            "nothing was written. Pick an empty directory (platform init DIR) or move them"
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for path, text in targets.items():
            path.write_text(text)
    except OSError as e:
        raise UserError(f"init: cannot write into {directory} ({e.strerror or e})") from None
    return list(targets)
