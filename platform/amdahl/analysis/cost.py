"""Efficiency and cost of a configuration: model FLOPs utilisation, device-hours and price per
million samples, and the throughput/cost Pareto front.

- MFU = achieved FLOP/s / (p * peak FLOP/s per device).

Pure: imports neither ray nor torch.
"""

from __future__ import annotations


def mfu(achieved_flops: float, devices: int, peak_flops_per_device: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over all ranks / (p * peak per device)."""
    return achieved_flops / (devices * peak_flops_per_device)


def device_hours_per_million(devices: int, throughput: float) -> float:
    """Device-hours one million samples take: the price-free cost."""
    return devices * 1e6 / throughput / 3600.0


def cost_per_million(devices: int, throughput: float, price_per_device_hour: float) -> float:
    return device_hours_per_million(devices, throughput) * price_per_device_hour


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indexes of (throughput, cost) points no other point beats on both (more throughput for
    no more cost, or less cost for no less throughput), sorted by cost."""
    front = []
    for i, (x, c) in enumerate(points):
        dominated = any(
            (x2 >= x and c2 <= c) and (x2 > x or c2 < c)
            for j, (x2, c2) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][1], -points[i][0]))
