"""`Workload.preprocess` gets the same numpy columns under both inputs: the same workload's
preprocessing runs in a real local Ray Data pipeline (input ray_data, `data.prepare`) and in the
DataLoader's dataset (input torch_loader, `worker.input`), and reports what it was handed.

Ray Data's own numpy batches would hand a multi-dimensional column over as an object array of
per-row arrays; both inputs convert the stored Arrow rows with `storage.table_columns` instead.
"""

from __future__ import annotations

import numpy as np
import torch

from amdahl.data.prepare import ray_dataset, with_preprocessing
from amdahl.data.storage import read_table, write_parquet_dir
from amdahl.worker.input import _PreprocessedBatches, validation_rows
from amdahl.workload.api import Workload

ROWS = 8


class Reporting(Workload):
    """Rows with a 2-D column, a 3-D one (stored flattened), labels and raw bytes; `preprocess`
    returns, beside a real transformation, a description of every column it was handed."""

    defaults = {"val_rows": ROWS}

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Linear(6, 2)

    def generate(self, split: str, num_rows: int, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        blob = np.empty(num_rows, dtype=object)
        blob[:] = [bytes([i]) * 3 for i in range(num_rows)]
        return {
            "x": rng.standard_normal((num_rows, 6)).astype(np.float32),
            "img": rng.integers(0, 255, (num_rows, 2, 3), dtype=np.uint8),
            "y": np.arange(num_rows, dtype=np.int64),
            "blob": blob,
        }

    def preprocess(self, batch: dict[str, np.ndarray], training: bool) -> dict[str, np.ndarray]:
        seen = ";".join(
            f"{k}:{type(v).__name__}:{v.dtype}:{v.shape[1:]}:{type(v.ravel()[0]).__name__}"
            for k, v in sorted(batch.items())
        )
        n = len(batch["y"])
        return {
            "x": batch["x"] * 2.0 + batch["img"].astype(np.float32).mean(axis=1, keepdims=True),
            "y": batch["y"],
            "seen": np.array([seen] * n),
        }

    def split_batch(self, batch):
        return batch["x"], batch["y"]

    def loss(self, output, target):
        return torch.nn.functional.cross_entropy(output, target)


def test_preprocess_is_handed_the_same_columns_under_ray_data_and_torch_loader(tmp_path, local_ray):
    workload = Reporting()
    path = tmp_path / "train"
    write_parquet_dir(workload.generate("train", ROWS, seed=0), path)

    loader = _PreprocessedBatches(read_table(str(path)), ROWS, workload)[0]
    dataset = with_preprocessing(
        ray_dataset(path, 0.5),
        workload,
        workers=1,
        cpus_per_worker=0.5,
        batch_size=ROWS,
        rows_per_pass=ROWS,
    )
    ray_data = dataset.take_batch(ROWS, batch_format="numpy")

    expected = (
        "blob:ndarray:object:():bytes;img:ndarray:uint8:(6,):uint8;"
        "x:ndarray:float32:(6,):float32;y:ndarray:int64:():int64"
    )
    assert set(loader["seen"]) == {expected}
    assert set(ray_data["seen"]) == {expected}
    np.testing.assert_allclose(ray_data["x"], loader["x"], rtol=0, atol=0)
    np.testing.assert_array_equal(ray_data["y"], loader["y"])


def test_generated_validation_rows_are_handed_over_as_stored():
    val = validation_rows(Reporting(), None, seed=0)
    assert set(val["seen"]) == {
        "blob:ndarray:object:():bytes;img:ndarray:uint8:(6,):uint8;"
        "x:ndarray:float32:(6,):float32;y:ndarray:int64:():int64"
    }
