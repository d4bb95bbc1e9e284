"""The utilisation sampler's CUDA reader: NVML utilisation and torch's allocated memory."""

import time

import torch

from amdahl.worker.utilisation import UtilisationSampler


def _window(device, busy: bool, seconds: float = 0.8) -> dict:
    a = torch.randn(4096, 4096, device=device)
    s = UtilisationSampler(device, interval=0.1)
    s.start()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if busy:
            a = (a @ a).tanh_()
        else:
            time.sleep(0.01)
        torch.cuda.synchronize(device)
    s.stop()
    return s.series()


def test_gpu_utilisation_tells_busy_from_idle_and_memory_follows_allocations(cuda):
    idle, busy = _window(cuda, busy=False), _window(cuda, busy=True)
    assert None not in busy["gpu_percent"], "NVML unreadable: is nvidia-ml-py installed?"
    assert max(busy["gpu_percent"]) >= 50 > sum(idle["gpu_percent"]) / len(idle["gpu_percent"])
    held = torch.empty(256 * 2**20, dtype=torch.uint8, device=cuda)
    with_held = _window(cuda, busy=False, seconds=0.3)
    assert min(with_held["gpu_mib"]) >= min(idle["gpu_mib"]) + 255
    del held
