"""The peak-FLOP/s probe shared by the harness and `platform calibrate` (amdahl.worker.peak)."""

import pytest
import torch

from amdahl.worker import peak

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch):
    """An empty cache and a short timed window, so each test measures, and quickly."""
    monkeypatch.setattr(peak, "_CACHE", {})
    monkeypatch.setattr(peak, "MIN_SECONDS", 0.02)
    saved = torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved


def test_peak_is_positive_and_measured_once_per_process(monkeypatch):
    first = peak.measure_peak_flops(CPU, "fp32")
    assert first > 0
    calls = []
    monkeypatch.setattr(peak, "_time_matmuls", lambda *a: calls.append(a) or 1.0)
    assert peak.measure_peak_flops(CPU, "fp32") == first  # cached: no second measurement
    assert calls == []


def test_tf32_on_cpu_is_fp32_and_bf16_weights_is_bf16():
    assert peak.measure_peak_flops(CPU, "tf32") == peak.measure_peak_flops(CPU, "fp32")
    assert peak.measure_peak_flops(CPU, "bf16_weights") == peak.measure_peak_flops(CPU, "bf16")
    assert len(peak._CACHE) == 2


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precisions_run_in_their_own_dtype(monkeypatch, precision):
    seen = []
    mm = torch.mm

    def spy(a, b, **kw):
        seen.append(a.dtype)
        return mm(a, b, **kw)

    monkeypatch.setattr(peak.torch, "mm", spy)
    assert peak.measure_peak_flops(CPU, precision) > 0
    assert set(seen) == {peak.precision_dtype(precision)}
    assert len(seen) >= peak.WARMUP + 1


@pytest.mark.parametrize("before", [True, False])
def test_tf32_flag_set_for_the_probe_and_restored(monkeypatch, before):
    flags = []
    mm = torch.mm

    def spy(a, b, **kw):
        flags.append(torch.backends.cuda.matmul.allow_tf32)
        return mm(a, b, **kw)

    monkeypatch.setattr(peak.torch, "mm", spy)
    torch.backends.cuda.matmul.allow_tf32 = before
    peak.measure_peak_flops(CPU, "fp32")
    assert set(flags) == {False}  # fp32 is IEEE fp32, whatever the trial had set
    assert torch.backends.cuda.matmul.allow_tf32 is before


def test_tf32_flag_restored_when_the_probe_fails(monkeypatch):
    def boom(*a, **kw):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(peak.torch, "mm", boom)
    torch.backends.cuda.matmul.allow_tf32 = True
    with pytest.raises(RuntimeError, match="out of memory"):
        peak.measure_peak_flops(CPU, "fp32")
    assert torch.backends.cuda.matmul.allow_tf32 is True
    assert peak._CACHE == {}


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        peak.measure_peak_flops(CPU, "fp8")


def test_matrix_sizes():
    assert peak.matrix_size(CPU) == 512
    assert peak.matrix_size(torch.device("cuda", 0)) == 8192


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_probe_uses_tf32_for_tf32_only_and_leaves_no_memory(monkeypatch):
    device = torch.device("cuda")
    flags = []
    mm = torch.mm

    def spy(a, b, **kw):
        flags.append((a.dtype, torch.backends.cuda.matmul.allow_tf32))
        return mm(a, b, **kw)

    monkeypatch.setattr(peak.torch, "mm", spy)
    torch.backends.cuda.matmul.allow_tf32 = False
    for dtype in (torch.float32, torch.bfloat16):  # cuBLAS keeps a workspace once it has run
        torch.ones(8, 8, device=device, dtype=dtype) @ torch.ones(8, 8, device=device, dtype=dtype)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    peaks = {p: peak.measure_peak_flops(device, p) for p in ("fp32", "tf32", "bf16", "fp16")}
    assert torch.cuda.memory_allocated() == allocated
    assert torch.cuda.memory_reserved() == reserved
    assert {f for f in flags if f[0] == torch.float32} == {
        (torch.float32, False),
        (torch.float32, True),
    }
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert all(v > 0 for v in peaks.values())
    assert peaks["tf32"] > peaks["fp32"]  # tensor cores: the reason tf32 needs its own peak
    # "cuda" and "cuda:<current>" are the same device: one cache entry each precision
    assert (
        peak.measure_peak_flops(torch.device("cuda", torch.cuda.current_device()), "fp32")
        == (peaks["fp32"])
    )
