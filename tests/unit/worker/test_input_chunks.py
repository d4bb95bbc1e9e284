"""The ray_data input's chunks (`input.arrow_chunks`: Arrow batches converted by `torch_columns`)
hold exactly what Ray Data's own `iter_torch_batches` gives, the independent reference: the
stored rows (fixed-size-list columns) and a preprocessed pipeline's output (Ray's tensor
extension columns), through a real local Ray Data pipeline."""

from __future__ import annotations

import numpy as np
import torch

from amdahl.data.prepare import ray_dataset, with_preprocessing
from amdahl.data.storage import write_parquet_dir
from amdahl.worker.input import arrow_chunks
from amdahl.workload.api import Workload

ROWS = 23  # not a multiple of the chunk: the last chunk is short
CHUNK = 5


class Scaled(Workload):
    """Rows with a 2-D float column, a 3-D uint8 one (stored flattened) and labels;
    preprocessing turns them into a 2-D float column and labels."""

    defaults = {"val_rows": ROWS}

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Linear(6, 2)

    def generate(self, split: str, num_rows: int, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {
            "x": rng.standard_normal((num_rows, 6)).astype(np.float32),
            "img": rng.integers(0, 255, (num_rows, 2, 3), dtype=np.uint8),
            "y": np.arange(num_rows, dtype=np.int64),
        }

    def preprocess(self, batch: dict[str, np.ndarray], training: bool) -> dict[str, np.ndarray]:
        return {"x": batch["x"] * 2.0 + batch["img"][:, :6].astype(np.float32), "y": batch["y"]}

    def split_batch(self, batch):
        return batch["x"], batch["y"]

    def loss(self, output, target):
        return torch.nn.functional.cross_entropy(output, target)


def _assert_same_chunks(dataset) -> None:
    ours = list(arrow_chunks(dataset, CHUNK, prefetch_chunks=1, pin=False))
    reference = list(dataset.iter_torch_batches(batch_size=CHUNK, device="cpu"))
    rows = dataset.count()  # a preprocessing pass covers an epoch more than it was asked for
    assert [len(c["y"]) for c in ours] == [CHUNK] * (rows // CHUNK) + [rows % CHUNK]
    assert len(ours) == len(reference)
    for mine, theirs in zip(ours, reference, strict=True):
        assert mine.keys() == theirs.keys()
        for key in mine:
            assert mine[key].dtype == theirs[key].dtype, key
            assert mine[key].shape == theirs[key].shape, key
            assert torch.equal(mine[key], theirs[key]), key


def test_stored_rows_convert_as_ray_datas_own_torch_batches(tmp_path, local_ray):
    workload = Scaled()
    write_parquet_dir(workload.generate("train", ROWS, seed=0), tmp_path / "train")
    dataset = ray_dataset(tmp_path / "train", 0.5).materialize()
    _assert_same_chunks(dataset)
    first = next(arrow_chunks(dataset, CHUNK, prefetch_chunks=0, pin=False))
    assert first["img"].shape == (CHUNK, 6)  # stored as (rows, width), as preprocess sees it


def test_a_preprocessed_pipelines_output_converts_as_ray_datas_own(tmp_path, local_ray):
    workload = Scaled()
    write_parquet_dir(workload.generate("train", ROWS, seed=0), tmp_path / "train")
    dataset = with_preprocessing(
        ray_dataset(tmp_path / "train", 0.5),
        workload,
        workers=1,
        cpus_per_worker=0.5,
        batch_size=ROWS,
        rows_per_pass=ROWS,
    ).materialize()
    _assert_same_chunks(dataset)
