"""Small Fashion-MNIST-format IDX files, written byte by byte as the format specifies."""

import gzip
import struct

import numpy as np


def write_idx(path, array: np.ndarray) -> None:
    """The IDX format as Fashion-MNIST ships it: magic 0x00000803 (images, 2051) or 0x00000801
    (labels, 2049) = two zero bytes, dtype 0x08 (ubyte), ndim; big-endian uint32 dims; data."""
    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    blob = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(blob)
    else:
        path.write_bytes(blob)


def write_fashion_mnist(directory, n_train=96, n_val=32, seed=0):
    """Fashion-MNIST's four IDX files under their names; returns the arrays written."""
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte.gz": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (n_val, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, n_val, dtype=np.uint8),
    }
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        write_idx(directory / name, array)
    return arrays
