"""`platform data fashion-mnist`: Fashion-MNIST's IDX files converted to the stored parquet
layout (data/storage.py) that `params.data` reads, refusing to overwrite anything it did not
write. Kept apart because only the CLI uses it, and its IDX reader guards untrusted files.
"""

from __future__ import annotations

import gzip
import math
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np

from amdahl.data.storage import COMPLETE_MARKER, is_empty_dir, write_parquet_dir
from amdahl.errors import UserError

#: Fashion-MNIST's files (the names of its official distribution), per split we store.
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
#: Largest IDX payload read (Fashion-MNIST's largest file holds 47 MB). The header's sizes fix
#: how much is read, so a gzip bomb or a damaged header cannot make the reader allocate more.
MAX_IDX_BYTES = 2**30


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file (the MNIST format, gzipped or not): magic = 0, 0, dtype code, ndim; then
    ndim big-endian uint32 sizes; then the data, big-endian, row-major.

    Reads exactly what the header announces (at most MAX_IDX_BYTES); anything else (a short or
    long file, a damaged gzip stream, an unreadable path) is a UserError naming the file."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            magic = f.read(4)
            if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] not in _IDX_DTYPES:
                raise UserError(f"{path}: not an IDX file (bad magic number {magic.hex()})")
            ndim = magic[3]
            header = f.read(4 * ndim)
            if len(header) < 4 * ndim:
                raise UserError(
                    f"{path}: truncated IDX header (the magic number announces {ndim} "
                    f"dimensions, {4 * ndim} bytes of sizes, but the file ends after "
                    f"{len(header)}); download the file again"
                )
            dims = struct.unpack(f">{ndim}I", header)
            dtype = np.dtype(_IDX_DTYPES[magic[2]])
            expected = math.prod(dims) * dtype.itemsize
            # sizes of 0 beside huge ones hold nothing but still make no array shape
            if math.prod(max(d, 1) for d in dims) * dtype.itemsize > MAX_IDX_BYTES:
                raise UserError(
                    f"{path}: header says {dims} {dtype.name} values ({expected:,} bytes), "
                    f"over the {MAX_IDX_BYTES:,}-byte limit of this reader; not an IDX file "
                    "amdahl converts (a damaged header?)"
                )
            raw = f.read(expected + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise UserError(f"{path}: cannot read it as an IDX file ({e})") from None
    if len(raw) != expected:
        held = f"only {len(raw):,} bytes" if len(raw) < expected else "more bytes than that"
        raise UserError(
            f"{path}: header says {dims} {dtype.name} values ({expected:,} bytes) but the file "
            f"holds {held}; the file is truncated or damaged, download it again"
        )
    data = np.frombuffer(raw, dtype=dtype)
    return data.reshape(dims).astype(dtype.newbyteorder("="))


def convert_fashion_mnist(src: str | Path, out: str | Path) -> Path:
    """Fashion-MNIST's four IDX files in `src` -> `out/train/` and `out/val/` parquet
    (`image`: 784 raw uint8 bytes, 28x28 row-major; `label`: int64), the layout `params.data`
    reads. The 10,000 t10k rows become the validation split."""
    src, out = Path(src), Path(out)
    splits = {}
    for split, (images_name, labels_name) in FASHION_MNIST_FILES.items():
        images = read_idx(_find(src, images_name))
        labels = read_idx(_find(src, labels_name))
        if (
            images.ndim != 3
            or images.dtype != np.uint8
            or labels.ndim != 1
            or labels.dtype.kind not in "iu"
            or len(images) != len(labels)
        ):
            raise UserError(
                f"{src}: {images_name} holds {images.dtype} {images.shape} and {labels_name} "
                f"{labels.dtype} {labels.shape}; expected (n, rows, cols) uint8 images and n "
                "integer labels"
            )
        splits[split] = (images, labels)
    targets = {split: out / split for split in splits}
    for target in targets.values():  # all checked before anything is removed
        _check_replaceable(target)
    for split, (images, labels) in splits.items():
        flat = np.ascontiguousarray(images).reshape(len(images), -1)
        encoded = np.empty(len(flat), dtype=object)
        encoded[:] = [row.tobytes() for row in flat]
        target = targets[split]
        try:
            if target.exists():
                shutil.rmtree(target)
            write_parquet_dir({"image": encoded, "label": labels.astype(np.int64)}, target)
        except OSError as e:
            raise UserError(f"{target}: cannot write the {split} split there ({e})") from None
        if not (target / COMPLETE_MARKER).exists():  # the rename into place did not happen
            raise UserError(
                f"{target}: the {split} split was not written (another process holds the "
                "directory?); check it and run again"
            )
    return out


def _check_replaceable(target: Path) -> None:
    """`target` may be replaced: it does not exist, is an empty directory, or is a split this
    converter wrote (its COMPLETE_MARKER and part-*.parquet files, nothing else)."""
    if not target.exists() and not target.is_symlink():
        return
    if is_empty_dir(target):
        return
    ours = (
        target.is_dir()
        and not target.is_symlink()
        and (target / COMPLETE_MARKER).is_file()
        and all(
            p.name == COMPLETE_MARKER or (p.name.startswith("part-") and p.suffix == ".parquet")
            for p in target.iterdir()
        )
    )
    if not ours:
        raise UserError(
            f"{target}: exists and is not a dataset split amdahl wrote (no {COMPLETE_MARKER} "
            "marker beside only part-*.parquet files), so it is left alone; choose another "
            "--out, or move it away yourself"
        )


def _find(src: Path, name: str) -> Path:
    for candidate in (src / f"{name}.gz", src / name):
        if candidate.exists():
            return candidate
    raise UserError(
        f"{src}: no {name}.gz (or {name}); download Fashion-MNIST's four IDX files "
        "(github.com/zalandoresearch/fashion-mnist) into this directory"
    )
