"""ResNet-18 for 28x28 single-channel images, as D2L 12.6 trains it on Fashion-MNIST.

The model is D2L's `resnet18`: a 3x3 stem without max-pooling, four stages of two residual blocks
(widths w, 2w, 4w, 8w; w = `width`, 64 in D2L), global average pooling and a linear classifier.

Rows are stored as Fashion-MNIST stores them: `image` = 784 raw uint8 bytes (28x28, row-major)
and `label` = the class. `preprocess` runs in the input pipeline, not in the training step:
it decodes the bytes, augments when training (`augment`: none; light = random crop with 2-pixel
padding and horizontal flip, vectorised over the batch; heavy = RandAugment-style, per image
`augment_ops` operations drawn from affine warp, elastic distortion, blur, contrast, brightness,
noise and random erasing (about 30-60 us each here), then the light recipe: the per-sample CPU
work that starves a fast accelerator), and normalises with Fashion-MNIST's mean and standard
deviation.

Data, when `params.data` names no parquet directory of your own (`platform data fashion-mnist`
writes one): `dataset: synthetic` draws learnable images (ten smooth class prototypes, shifted
and noised), `dataset: digits` is scikit-learn's bundled 8x8 handwritten digits scaled to 28x28,
a real data set that needs no download, so validation accuracy is a real check.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from amdahl import UserError, Workload

SIDE = 28
#: Fashion-MNIST training-set pixel mean and standard deviation (on the 0..1 scale).
MEAN, STD = 0.2860, 0.3530
_DIGITS_VAL_FRACTION = 0.2


class Residual(nn.Module):
    """D2L's residual block: two 3x3 convolutions with batch norm, a 1x1 shortcut if resized."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, kernel_size=3, padding=1, stride=stride)
        self.conv2 = nn.Conv2d(cout, cout, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(cout)
        self.bn2 = nn.BatchNorm2d(cout)
        resized = stride != 1 or cin != cout
        self.shortcut = nn.Conv2d(cin, cout, kernel_size=1, stride=stride) if resized else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.shortcut is not None:
            x = self.shortcut(x)
        return F.relu(y + x)


def resnet18(width: int, classes: int, in_channels: int = 1) -> nn.Sequential:
    """D2L 12.6's resnet18 (kernel 3, stride 1, no max-pool: made for 28x28 inputs)."""
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    ]
    cin = width
    for stage, cout in enumerate((width, 2 * width, 4 * width, 8 * width)):
        stride = 1 if stage == 0 else 2
        layers.append(nn.Sequential(Residual(cin, cout, stride), Residual(cout, cout)))
        cin = cout
    layers += [nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


class ResNet(Workload):
    defaults = {
        "width": 64,
        "classes": 10,
        "augment": "light",
        "augment_ops": 2,
        "dataset": "synthetic",
        "train_rows": 8192,
        "val_rows": 1024,
    }
    data_params = ("dataset", "classes", "train_rows", "val_rows")
    #: What `preprocess` reads: decoding and normalising use constants, and the rows themselves
    #: (dataset, classes) are already in the input key through `data_params`.
    preprocess_params = ("augment", "augment_ops")

    def __init__(self, **params):
        super().__init__(**params)
        if self.params["augment"] not in _AUGMENTS or int(self.params["augment_ops"]) < 1:
            raise UserError(
                f"params.augment: got {self.params['augment']!r} with augment_ops "
                f"{self.params['augment_ops']!r}; use one of {', '.join(_AUGMENTS)} and "
                "augment_ops >= 1"
            )
        if self.params["dataset"] not in ("synthetic", "digits"):
            raise UserError(
                f"params.dataset: got {self.params['dataset']!r}; use synthetic or digits "
                "(or params.data for your own parquet)"
            )

    def build_model(self) -> nn.Module:
        return resnet18(int(self.params["width"]), int(self.params["classes"]))

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        # BatchNorm's running statistics are updated again by each recomputed forward, as in
        # any checkpointed ResNet; the measured throughput and memory are unaffected.
        return [m for m in model.modules() if isinstance(m, Residual)]

    def generate(self, split: str, num_rows: int, seed: int) -> dict[str, np.ndarray]:
        if self.params["dataset"] == "digits":
            images, labels = _digits(split)
            images, labels = images[:num_rows], labels[:num_rows]
        else:
            images, labels = _synthetic(split, num_rows, seed, int(self.params["classes"]))
        return {"image": encode_images(images), "label": labels.astype(np.int64)}

    def preprocess(self, batch: dict[str, np.ndarray], training: bool) -> dict[str, np.ndarray]:
        images = decode_images(batch["image"]).astype(np.float32) / 255.0
        augment, rng = self.params["augment"], np.random.default_rng()
        if training and augment == "light":
            images = _light(images, rng)
        elif training and augment == "heavy":
            images = _heavy(images, rng, int(self.params["augment_ops"]))
        x = (images - MEAN) / STD
        return {"x": x[:, None].astype(np.float32), "y": np.array(batch["label"], np.int64)}

    def split_batch(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch["x"], batch["y"]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    def flops_per_sample(self) -> float:
        """6 x the multiply-accumulates of convolutions and the classifier (D2L's count) less
        the stem's input gradient, which autograd never computes (the images need none): what
        the training step executes, a cross-check of the counted figure (worker/flops.py)."""
        w, classes = int(self.params["width"]), int(self.params["classes"])
        side, cin = SIDE, w
        stem = macs = 9 * 1 * w * side * side
        for stage, cout in enumerate((w, 2 * w, 4 * w, 8 * w)):
            if stage:
                side = math.ceil(side / 2)
                macs += (9 * cin * cout + cin * cout) * side * side  # strided conv + shortcut
            else:
                macs += 9 * cin * cout * side * side
            macs += 3 * 9 * cout * cout * side * side  # the other three 3x3 convolutions
            cin = cout
        macs += cin * classes
        return 6.0 * macs - 2.0 * stem


# --------------------------------------------------------------------------- image rows


def encode_images(images: np.ndarray) -> np.ndarray:
    """(n, 28, 28) uint8 -> n raw-byte strings, the stored `image` column."""
    flat = np.ascontiguousarray(images, dtype=np.uint8).reshape(len(images), -1)
    out = np.empty(len(flat), dtype=object)
    out[:] = [row.tobytes() for row in flat]
    return out


def decode_images(column: np.ndarray) -> np.ndarray:
    """The stored `image` column (raw bytes, or uint8 arrays) -> (n, 28, 28) uint8."""
    n = len(column)
    if column.dtype == object:
        raw = b"".join(bytes(v) for v in column)
        flat = np.frombuffer(raw, dtype=np.uint8)
    else:
        flat = np.asarray(column, dtype=np.uint8).reshape(-1)
    if flat.size != n * SIDE * SIDE:
        raise ValueError(
            f"image column: expected {SIDE}x{SIDE} uint8 images ({SIDE * SIDE} bytes each), "
            f"got {flat.size} bytes for {n} rows"
        )
    return flat.reshape(n, SIDE, SIDE)


def _synthetic(split: str, n: int, seed: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Learnable images: one smooth random prototype per class, shifted and noised per row."""
    protos = np.random.default_rng(seed)  # the same prototypes for train and val
    yy, xx = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32)
    prototypes = np.zeros((classes, SIDE, SIDE), np.float32)
    for c in range(classes):
        for cy, cx, r in zip(*protos.uniform((6, 6, 2), (22, 22, 6), (4, 3)).T, strict=True):
            prototypes[c] += np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r))
    prototypes /= prototypes.max(axis=(1, 2), keepdims=True)
    rng = np.random.default_rng([seed, 0 if split == "train" else 1])
    labels = rng.integers(0, classes, n)
    images = _shift(prototypes[labels], rng, pad=3)
    images = images + rng.normal(0, 0.25, images.shape).astype(np.float32)
    return (np.clip(images, 0, 1) * 255).astype(np.uint8), labels


def _digits(split: str) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 8x8 digits, scaled 3x and padded to 28x28; a fixed 80/20 split."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images, np.ones((3, 3))) * (255.0 / 16.0)
    images = np.pad(images, ((0, 0), (2, 2), (2, 2))).round().astype(np.uint8)
    order = np.random.default_rng(0).permutation(len(images))
    cut = int(len(images) * (1 - _DIGITS_VAL_FRACTION))
    keep = order[:cut] if split == "train" else order[cut:]
    return images[keep], digits.target[keep].astype(np.int64)


# --------------------------------------------------------------------------- augmentation


def _shift(images: np.ndarray, rng: np.random.Generator, pad: int) -> np.ndarray:
    """Random crop after zero padding: each image moves by up to `pad` pixels (vectorised)."""
    n = len(images)
    padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad)))
    dy, dx = rng.integers(0, 2 * pad + 1, (2, n))
    rows = dy[:, None] + np.arange(SIDE)
    cols = dx[:, None] + np.arange(SIDE)
    return padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]


def _light(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random crop with 2-pixel padding and a horizontal flip, the CIFAR/D2L recipe."""
    out = _shift(images, rng, pad=2)
    flip = rng.random(len(out)) < 0.5
    out[flip] = out[flip, :, ::-1]
    return out


_CENTRE = (SIDE - 1) / 2
_GRID_Y, _GRID_X = (g.astype(np.float32) - _CENTRE for g in np.mgrid[0:SIDE, 0:SIDE])
_AXIS = np.arange(SIDE, dtype=np.float32)
#: Gaussian smoothing (sigma 4 pixels) as a matrix, for elastic displacement fields.
_SMOOTH = np.exp(-((_AXIS[:, None] - _AXIS[None, :]) ** 2) / (2 * 4.0**2))
_SMOOTH /= _SMOOTH.sum(axis=1, keepdims=True)


def _affine(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Rotate (+-15 degrees), scale (0.9-1.1), shear (+-0.2) and translate (+-2 px)."""
    angle = math.radians(rng.uniform(-15, 15))
    scale, shear = rng.uniform(0.9, 1.1), rng.uniform(-0.2, 0.2)
    ty, tx = rng.uniform(-2, 2, 2)
    cos, sin = math.cos(angle) / scale, math.sin(angle) / scale
    src_y = cos * _GRID_Y - sin * _GRID_X + _CENTRE - ty
    src_x = sin * _GRID_Y + (cos + shear) * _GRID_X + _CENTRE - tx
    return _bilinear(image, src_y, src_x)


def _elastic(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Elastic distortion (Simard et al. 2003: alpha 34, sigma 4), the MNIST classic."""
    dy = _SMOOTH @ rng.uniform(-1, 1, (SIDE, SIDE)) @ _SMOOTH.T * 34.0
    dx = _SMOOTH @ rng.uniform(-1, 1, (SIDE, SIDE)) @ _SMOOTH.T * 34.0
    return _bilinear(image, _GRID_Y + _CENTRE + dy, _GRID_X + _CENTRE + dx)


def _blur(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Mix with a 3x3 box blur by a random amount."""
    box = (image + np.roll(image, 1, 0) + np.roll(image, -1, 0)) / 3
    box = (box + np.roll(box, 1, 1) + np.roll(box, -1, 1)) / 3
    amount = rng.uniform(0.0, 0.7)
    return (1 - amount) * image + amount * box


def _contrast(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    mean = image.mean()
    return np.clip((image - mean) * rng.uniform(0.6, 1.4) + mean, 0, 1)


def _brightness(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.clip(image * rng.uniform(0.7, 1.3), 0, 1)


def _noise(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.clip(image + rng.normal(0, 0.05, image.shape), 0, 1)


def _erase(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random erasing: a rectangle of 4-11 pixels a side set to zero."""
    h, w = rng.integers(4, 12, 2)
    y0, x0 = rng.integers(0, SIDE - h), rng.integers(0, SIDE - w)
    out = image.copy()
    out[y0 : y0 + h, x0 : x0 + w] = 0
    return out


_OPS = (_affine, _elastic, _blur, _contrast, _brightness, _noise, _erase)


def _heavy(images: np.ndarray, rng: np.random.Generator, ops: int) -> np.ndarray:
    """RandAugment-style: per image, `ops` operations drawn at random, applied in sequence
    (deliberately one image at a time, as real pipelines are), then the light recipe."""
    out = np.empty_like(images)
    for i, image in enumerate(images):
        for op in rng.integers(0, len(_OPS), ops):
            image = _OPS[op](image, rng)
        out[i] = image
    return _light(out, rng)


def _bilinear(image: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Sample `image` at fractional (y, x) with zeros outside."""
    padded = np.pad(image, 1)
    y = np.clip(y + 1, 0, SIDE)
    x = np.clip(x + 1, 0, SIDE)
    y0 = np.minimum(y.astype(np.int64), SIDE)
    x0 = np.minimum(x.astype(np.int64), SIDE)
    fy, fx = y - y0, x - x0
    top = padded[y0, x0] * (1 - fx) + padded[y0, x0 + 1] * fx
    bottom = padded[y0 + 1, x0] * (1 - fx) + padded[y0 + 1, x0 + 1] * fx
    return (top * (1 - fy) + bottom * fy).astype(np.float32)


_AUGMENTS = ("none", "light", "heavy")
