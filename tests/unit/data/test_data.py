"""The input pipeline without Ray: IDX conversion, stored parquet and its cache key, user data,
the ResNet workload's preprocessing, per-rank DataLoader shards, and a real validation check."""

import gzip
import struct

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from idx_files import write_fashion_mnist, write_idx

from amdahl import UserError
from amdahl.cli.commands import main
from amdahl.data.fashion_mnist import convert_fashion_mnist, read_idx
from amdahl.data.storage import check_source, dataset_path, read_rows, stored_dataset
from amdahl.worker.input import LoaderSource, host_batches, validation_rows
from amdahl.workload.code import make_workload
from workloads.mlp import MLP
from workloads.resnet import MEAN, STD, ResNet, decode_images

# --------------------------------------------------------------------------- IDX -> parquet


def test_idx_header_is_the_standard_one(tmp_path):
    images = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    write_idx(tmp_path / "x.gz", images)
    raw = gzip.open(tmp_path / "x.gz").read()
    assert struct.unpack(">IIII", raw[:16]) == (2051, 2, 28, 28)
    write_idx(tmp_path / "y", np.array([3, 1], dtype=np.uint8))
    assert struct.unpack(">II", (tmp_path / "y").read_bytes()[:8]) == (2049, 2)
    np.testing.assert_array_equal(read_idx(tmp_path / "x.gz"), images)
    np.testing.assert_array_equal(read_idx(tmp_path / "y"), [3, 1])


def test_idx_rejects_what_is_not_idx(tmp_path):
    (tmp_path / "bad").write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(UserError, match="not an IDX file"):
        read_idx(tmp_path / "bad")
    write_idx(tmp_path / "short", np.zeros((4, 28, 28), np.uint8))
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-10])
    with pytest.raises(UserError, match="header says"):
        read_idx(tmp_path / "short")


def test_fashion_mnist_round_trip_through_parquet(tmp_path):
    arrays = write_fashion_mnist(tmp_path / "idx")
    out = convert_fashion_mnist(tmp_path / "idx", tmp_path / "fmnist")
    for split, prefix in (("train", "train"), ("val", "t10k")):
        rows = read_rows(str(out / split))
        assert set(rows) == {"image", "label"}
        np.testing.assert_array_equal(
            decode_images(rows["image"]), arrays[f"{prefix}-images-idx3-ubyte.gz"]
        )
        np.testing.assert_array_equal(rows["label"], arrays[f"{prefix}-labels-idx1-ubyte.gz"])
        assert rows["label"].dtype == np.int64


def test_cli_converts_and_names_the_params_to_use(tmp_path):
    write_fashion_mnist(tmp_path / "idx")
    result = CliRunner().invoke(
        main, ["data", "fashion-mnist", "--from", str(tmp_path / "idx"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "train" / "_COMPLETE").exists() and (tmp_path / "val").is_dir()
    assert f"params: {{data: {tmp_path}}}" in result.output
    missing = CliRunner().invoke(main, ["data", "fashion-mnist", "--from", str(tmp_path / "no")])
    assert missing.exit_code == 2
    assert "train-images-idx3-ubyte.gz" in missing.output


# --------------------------------------------------------------------------- storage


def test_stored_rows_are_keyed_by_the_parameters_that_decide_them(tmp_path, monkeypatch):
    calls = []
    original = ResNet.generate

    def counting(self, split, num_rows, seed):
        calls.append((split, num_rows))
        return original(self, split, num_rows, seed)

    monkeypatch.setattr(ResNet, "generate", counting)
    small = ResNet(train_rows=64, width=4, augment="none")
    first = stored_dataset(small, "resnet", "train", 0, cache=tmp_path)
    # A different model width or augmentation reuses the same rows ...
    again = stored_dataset(
        ResNet(train_rows=64, width=16, augment="heavy"), "resnet", "train", 0, cache=tmp_path
    )
    assert again == first and calls == [("train", 64)]
    # ... a different row count, split or seed does not.
    others = {
        stored_dataset(ResNet(train_rows=128), "resnet", "train", 0, cache=tmp_path),
        stored_dataset(small, "resnet", "val", 0, cache=tmp_path),
        stored_dataset(small, "resnet", "train", 1, cache=tmp_path),
    }
    assert first not in others and len(others) == 3
    assert len(read_rows(str(first))["label"]) == 64
    # Workloads that do not say which params decide their rows are keyed by all of them.
    mlp_a = stored_dataset(MLP(train_rows=64, hidden=[8]), "mlp", "train", 0, cache=tmp_path)
    mlp_b = stored_dataset(MLP(train_rows=64, hidden=[16]), "mlp", "train", 0, cache=tmp_path)
    assert mlp_a != mlp_b


def test_params_data_points_at_the_users_parquet(tmp_path, monkeypatch):
    write_fashion_mnist(tmp_path / "idx")
    convert_fashion_mnist(tmp_path / "idx", tmp_path / "mine")
    monkeypatch.chdir(tmp_path)
    workload = make_workload("resnet", {"data": "mine", "augment": "none"})
    # Relative paths are resolved in the driver (workers run in other directories).
    assert dataset_path(workload, "resnet", "train", 0) == str(tmp_path / "mine" / "train")
    val = validation_rows(workload, str(tmp_path / "mine" / "val"), seed=0)
    assert val["x"].shape == (32, 1, 28, 28) and val["y"].shape == (32,)
    # URIs go to pyarrow / Ray Data untouched; a missing local directory fails before launch.
    s3 = make_workload("resnet", {"data": "s3://bucket/fmnist"})
    assert dataset_path(s3, "resnet", "train", 0) == "s3://bucket/fmnist/train"
    with pytest.raises(UserError, match="params.data: .*missing.* does not exist"):
        check_source(make_workload("resnet", {"data": str(tmp_path / "missing")}))
    # Every workload accepts `data`; other unknown parameters are still rejected.
    assert make_workload("mlp", {"data": "mine"}).source("val") == "mine/val"
    with pytest.raises(UserError, match="did you mean 'width'"):
        make_workload("resnet", {"widht": 8})


# --------------------------------------------------------------------------- preprocessing


def _rows(n=64, **params):
    workload = ResNet(train_rows=n, **params)
    return workload, workload.generate("train", n, seed=0)


def test_preprocess_decodes_and_normalises(tmp_path):
    workload, rows = _rows(augment="none")
    assert rows["image"].dtype == object and len(rows["image"][0]) == 784
    out = workload.preprocess(rows, training=True)
    assert out["x"].shape == (64, 1, 28, 28) and out["x"].dtype == np.float32
    assert out["y"].dtype == np.int64
    expected = (decode_images(rows["image"]).astype(np.float32) / 255 - MEAN) / STD
    np.testing.assert_allclose(out["x"][:, 0], expected, rtol=1e-6)
    np.testing.assert_array_equal(out["y"], rows["label"])


@pytest.mark.parametrize("augment", ["light", "heavy"])
def test_augmentation_changes_images_only_when_training(augment):
    workload, rows = _rows(augment=augment)
    plain = ResNet(augment="none").preprocess(rows, training=True)
    evaluated = workload.preprocess(rows, training=False)
    np.testing.assert_array_equal(evaluated["x"], plain["x"])  # no augmentation in evaluation
    trained = workload.preprocess(rows, training=True)
    assert trained["x"].shape == plain["x"].shape and trained["x"].dtype == np.float32
    assert np.isfinite(trained["x"]).all()
    assert not np.array_equal(trained["x"], plain["x"])
    np.testing.assert_array_equal(trained["y"], plain["y"])
    # Pixels stay in the normalised range of [0, 1] images.
    assert trained["x"].min() >= -MEAN / STD - 1e-5 and trained["x"].max() <= (1 - MEAN) / STD


def test_preprocess_accepts_images_stored_as_uint8_arrays():
    workload, rows = _rows(augment="none")
    as_arrays = {"image": decode_images(rows["image"]).reshape(64, 784), "label": rows["label"]}
    np.testing.assert_array_equal(
        workload.preprocess(as_arrays, training=False)["x"],
        workload.preprocess(rows, training=False)["x"],
    )
    with pytest.raises(ValueError, match="28x28"):
        decode_images(np.zeros((2, 10), np.uint8))


def test_resnet_flops_match_torchs_count():
    from torch.utils.flop_counter import FlopCounterMode

    workload = ResNet(width=8)
    model = workload.build_model()
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(2, 1, 28, 28)).sum().backward()
    # torch skips the input gradient of the first convolution; the 6x rule does not.
    assert counter.get_total_flops() / 2 == pytest.approx(workload.flops_per_sample(), rel=0.01)


def test_bad_augment_is_refused_with_the_choices():
    with pytest.raises(UserError, match="none, light, heavy"):
        ResNet(augment="medium")
    with pytest.raises(UserError, match="synthetic or digits"):
        ResNet(dataset="mnist")


# --------------------------------------------------------------------------- torch_loader input


def test_each_rank_reads_its_own_slice(tmp_path):
    workload = ResNet(train_rows=100, augment="none")
    path = str(stored_dataset(workload, "resnet", "train", 0, cache=tmp_path))  # one file
    labels = [LoaderSource(path, workload, r, 3, 1).table()["label"].to_pylist() for r in (0, 1, 2)]
    assert sorted(sum(labels, [])) == sorted(read_rows(path)["label"].tolist())
    assert [len(x) for x in labels] == [34, 33, 33]


def test_torch_loader_batches_are_preprocessed_tensors(tmp_path):
    workload = ResNet(train_rows=96, augment="light")
    path = str(stored_dataset(workload, "resnet", "train", 0, cache=tmp_path))
    batches = host_batches(LoaderSource(path, workload, 0, 1, 1), 32, 2, False)
    seen = [next(batches) for _ in range(4)]  # three per epoch, then the next epoch
    batches.close()
    for batch in seen:
        assert batch["x"].shape == (32, 1, 28, 28) and batch["x"].dtype == torch.float32
        assert batch["y"].dtype == torch.int64
    with pytest.raises(RuntimeError, match="fewer than batch_size=128"):
        next(host_batches(LoaderSource(path, workload, 0, 1, 1), 128, 2, False))


# --------------------------------------------------------------------------- real data


def test_digits_give_a_real_validation_accuracy():
    """scikit-learn's bundled digits (no download): a tiny ResNet-18 must learn them."""
    workload = ResNet(dataset="digits", width=8, augment="none")
    train = workload.preprocess(workload.generate("train", 10**6, seed=0), training=False)
    val = workload.preprocess(workload.generate("val", 10**6, seed=0), training=False)
    assert len(train["y"]) == 1437 and len(val["y"]) == 360
    assert set(np.unique(val["y"])) == set(range(10))
    torch.manual_seed(0)
    model = workload.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.from_numpy(train["x"]), torch.from_numpy(train["y"])
    generator = torch.Generator().manual_seed(0)
    for _ in range(120):
        i = torch.randint(0, len(y), (32,), generator=generator)
        loss = workload.loss(model(x[i]), y[i])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        output = model(torch.from_numpy(val["x"]))
    accuracy = float(workload.correct(output, torch.from_numpy(val["y"]))) / len(val["y"])
    assert accuracy > 0.6  # chance is 0.1


# --------------------------------------------------------------------------- damaged input, --out


def _idx_bytes(array: np.ndarray) -> bytes:
    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


@pytest.mark.parametrize(
    "name, blob, expected",
    [
        ("empty", b"", "not an IDX file"),
        ("header.gz", b"\x00\x00\x08\x03\x00\x00", "truncated IDX header"),
        ("dims", b"\x00\x00\x08\x03" + struct.pack(">3I", 60000, 28, 28) + b"\x01" * 10, "only 10"),
        ("huge", b"\x00\x00\x0e\x03" + struct.pack(">3I", 2**32 - 1, 2**20, 9), "byte limit"),
        ("long", _idx_bytes(np.zeros(4)) + b"\x00", "more bytes than that"),
    ],
)
def test_damaged_idx_files_are_one_message_naming_the_file(tmp_path, name, blob, expected):
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(blob)
    else:
        path.write_bytes(blob)
    with pytest.raises(UserError, match=expected) as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_a_truncated_gzip_stream_or_a_directory_is_a_user_error(tmp_path):
    write_idx(tmp_path / "x.gz", np.zeros((64, 28, 28), np.uint8) + 7)
    cut = tmp_path / "cut.gz"
    cut.write_bytes((tmp_path / "x.gz").read_bytes()[:-12])  # no end-of-stream marker
    with pytest.raises(UserError, match="cut.gz: cannot read it as an IDX file"):
        read_idx(cut)
    garbage = tmp_path / "garbage.gz"
    garbage.write_bytes(b"\x1f\x8b\x08\x00" + b"\xff" * 40)
    with pytest.raises(UserError, match="garbage.gz"):
        read_idx(garbage)
    (tmp_path / "dir.gz").mkdir()
    with pytest.raises(UserError, match="dir.gz: cannot read it"):
        read_idx(tmp_path / "dir.gz")


def test_a_gzip_bomb_is_read_no_further_than_its_header_says(tmp_path, monkeypatch):
    """The header announces 4 values; the stream holds 64 MiB more. The reader stops after
    5 bytes of payload instead of inflating everything."""
    path = tmp_path / "bomb.gz"
    with gzip.open(path, "wb") as f:
        f.write(_idx_bytes(np.zeros(4)) + bytes(64 * 2**20))
    assert path.stat().st_size < 2**20
    asked = []
    original = gzip.GzipFile.read

    def read(self, size=-1):
        asked.append(size)
        return original(self, size)

    monkeypatch.setattr(gzip.GzipFile, "read", read)
    with pytest.raises(UserError, match="more bytes than that"):
        read_idx(path)
    assert asked and all(0 <= n <= 5 for n in asked)


def test_out_directories_that_are_not_amdahls_are_left_alone(tmp_path):
    write_fashion_mnist(tmp_path / "idx")
    out = tmp_path / "out"
    (out / "val").mkdir(parents=True)
    (out / "val" / "thesis.tex").write_text("years of work")
    result = CliRunner().invoke(
        main, ["data", "fashion-mnist", "--from", str(tmp_path / "idx"), "--out", str(out)]
    )
    assert result.exit_code == 2, result.output
    assert f"{out / 'val'}: exists and is not a dataset split amdahl wrote" in result.output
    assert "written:" not in result.output and "Traceback" not in result.output
    assert (out / "val" / "thesis.tex").read_text() == "years of work"
    assert not (out / "train").exists()  # checked before anything was written or removed
    # amdahl's marker beside foreign files is not enough either
    (out / "val" / "_COMPLETE").touch()
    with pytest.raises(UserError, match="is not a dataset split amdahl wrote"):
        convert_fashion_mnist(tmp_path / "idx", out)
    assert (out / "val" / "thesis.tex").exists()
    # an empty directory, and amdahl's own earlier output, are replaced
    (out / "val" / "thesis.tex").unlink()
    (out / "val" / "_COMPLETE").unlink()
    convert_fashion_mnist(tmp_path / "idx", out)
    write_fashion_mnist(tmp_path / "idx", n_train=48, seed=1)
    convert_fashion_mnist(tmp_path / "idx", out)
    assert len(read_rows(str(out / "train"))["label"]) == 48


def test_a_failed_rename_is_reported_not_written(tmp_path, monkeypatch):
    write_fashion_mnist(tmp_path / "idx")

    def refuse(self, target):
        raise OSError(39, "Directory not empty")

    monkeypatch.setattr("pathlib.Path.rename", refuse)
    result = CliRunner().invoke(
        main, ["data", "fashion-mnist", "--from", str(tmp_path / "idx"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'train'}: the train split was not written" in result.output
    assert "written:" not in result.output


def test_stored_dataset_never_returns_a_directory_without_its_marker(tmp_path, monkeypatch):
    workload = MLP(train_rows=64)
    first = stored_dataset(workload, "mlp", "train", 0, cache=tmp_path)
    (first / "_COMPLETE").unlink()  # damaged: some files, no marker
    with pytest.raises(UserError, match=f"{first}: a cached dataset directory without its"):
        stored_dataset(workload, "mlp", "train", 0, cache=tmp_path)
    for p in first.iterdir():
        p.unlink()  # empty: filled again
    assert stored_dataset(workload, "mlp", "train", 0, cache=tmp_path) == first
    assert (first / "_COMPLETE").exists()

    def refuse(self, target):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr("pathlib.Path.rename", refuse)
    with pytest.raises(UserError, match="could not store the generated dataset"):
        stored_dataset(workload, "mlp", "val", 0, cache=tmp_path)


def test_an_edited_generate_writes_new_rows_and_says_so(tmp_path, caplog):
    """A user fixes generate() and sweeps again: the next sweep must train on the new rows,
    not the cached ones (before, the cache was keyed by parameters alone)."""
    import logging

    from amdahl.data.storage import cached_datasets, clear_datasets

    class Before(MLP):
        def generate(self, split, num_rows, seed):
            return {"x": np.zeros((num_rows, 4), np.float32), "y": np.zeros(num_rows, np.int64)}

    class After(MLP):  # the same workload, its generate() edited
        def generate(self, split, num_rows, seed):
            return {"x": np.ones((num_rows, 4), np.float32), "y": np.ones(num_rows, np.int64)}

    params = dict(train_rows=32, inputs=4, hidden=[4])
    old = stored_dataset(Before(**params), "mine", "train", 0, cache=tmp_path)
    with caplog.at_level(logging.WARNING, logger="amdahl.data.storage"):
        new = stored_dataset(After(**params), "mine", "train", 0, cache=tmp_path)
    assert new != old and read_rows(str(new))["y"].tolist() == [1] * 32
    assert "generate() changed" in caplog.text and str(old) in caplog.text
    # an unchanged generate() reuses its copy, silently
    caplog.clear()
    assert stored_dataset(After(**params), "mine", "train", 0, cache=tmp_path) == new
    assert not caplog.text
    listed = cached_datasets(tmp_path)
    assert {c.path for c in listed} == {old, new}
    assert all(c.made["name"] == "mine" and c.bytes > 0 for c in listed)
    assert clear_datasets(tmp_path, name="other") == []
    assert sorted(clear_datasets(tmp_path, name="mine")) == sorted([old, new])
    assert cached_datasets(tmp_path) == []
