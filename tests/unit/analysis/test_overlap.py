"""analysis/overlap.py: the classifier, the interval arithmetic and the trial's figures, on small
hand-made traces whose answers are worked out by hand, on random intervals against a brute
force count, and on real torch.profiler traces of two gloo processes whose overlap and
straggler the test sets up (hidden, exposed, and one rank late by a known sleep)."""

from __future__ import annotations

import gzip
import json
import os
import random
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from amdahl.analysis.overlap import (
    COMM,
    COMPUTE,
    MEMORY,
    NO_FIGURES,
    RankFigures,
    classify,
    intersection,
    is_device_trace,
    merge,
    rank_figures,
    read_trace,
    straggler_of,
    total,
    trace_figures,
)


def _x(name: str, ts: float, dur: float, cat: str = "kernel", tid: int = 7) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid, "pid": 0}


def _steps(n: int, length: float = 1000.0) -> list[dict]:
    return [_x(f"ProfilerStep#{i + 1}", i * length, length, "user_annotation", 1) for i in range(n)]


# --------------------------------------------------------------------------- classification

NCCL = [
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
    "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
]


@pytest.mark.parametrize("name", NCCL)
def test_nccl_kernels_are_communication(name):
    assert classify(_x(name, 0, 1), device=True) == COMM


def test_device_kernels_copies_and_host_events():
    gemm = "ampere_sgemm_128x64_tn"
    assert classify(_x(gemm, 0, 1), device=True) == COMPUTE
    copy = _x("Memcpy HtoD (Pageable -> Device)", 0, 1, cat="gpu_memcpy")
    assert classify(copy, device=True) == MEMORY
    assert classify(_x("Memset (Device)", 0, 1, cat="gpu_memset"), device=True) == MEMORY
    # host-side events of a GPU trace: NCCL's enqueue and the CPU ops are not device time
    assert classify(_x("nccl:all_reduce", 0, 1, cat="user_annotation"), device=True) is None
    assert classify(_x("aten::mm", 0, 1, cat="cpu_op"), device=True) is None
    assert classify(_x("cudaLaunchKernel", 0, 1, cat="cuda_runtime"), device=True) is None


def test_cpu_trace_gloo_and_operators():
    gloo_thread = frozenset({99})
    assert classify(_x("gloo:all_reduce", 0, 1, "user_annotation", 99), False, gloo_thread) == COMM
    assert classify(_x("aten::mm", 0, 1, "cpu_op", 1), False, gloo_thread) == COMPUTE
    backward = "autograd::engine::evaluate_function: AddmmBackward0"
    assert classify(_x(backward, 0, 1, "cpu_op", 1), False, gloo_thread) == COMPUTE
    # handing the collective to gloo is not computation, nor is anything on gloo's thread
    assert classify(_x("c10d::allreduce_", 0, 1, "cpu_op", 1), False, gloo_thread) is None
    assert classify(_x("aten::copy_", 0, 1, "cpu_op", 99), False, gloo_thread) is None
    assert classify(_x("ProfilerStep#1", 0, 1, "user_annotation", 1), False, gloo_thread) is None


def test_device_trace_detection():
    assert is_device_trace({"deviceProperties": [{"id": 0}], "traceEvents": []})
    assert is_device_trace({"traceEvents": [_x("k", 0, 1)]})
    assert not is_device_trace({"traceEvents": [_x("aten::mm", 0, 1, "cpu_op")]})


# --------------------------------------------------------------------------- intervals


def test_merge_and_intersection_by_hand():
    assert merge([(5, 7), (0, 2), (1, 3), (3, 4), (9, 9)]) == [(0, 4), (5, 7)]
    a, b = merge([(0, 10), (20, 30)]), merge([(5, 25)])
    assert total(a) == 20
    assert intersection(a, b) == 10  # [5, 10) and [20, 25)
    assert intersection(a, merge([(10, 20)])) == 0  # touching is not overlapping


def test_intersection_against_a_brute_force_count():
    rng = random.Random(0)
    for _ in range(200):
        spans = [
            [(s, s + rng.randint(1, 15)) for s in (rng.randint(0, 80) for _ in range(6))]
            for _ in range(2)
        ]
        busy = [set().union(*(range(s, e) for s, e in side)) for side in spans]
        expected = len(busy[0] & busy[1])
        assert intersection(merge(spans[0]), merge(spans[1])) == expected
        assert total(merge(spans[0])) == len(busy[0])


# --------------------------------------------------------------------------- a trial's figures


def _gpu_rank(rank: int, nccl: list[tuple[float, float]]) -> dict:
    """Two steps of 1000 us: compute kernels [0, 100) and [150, 250) (two streams overlapping
    in [200, 250)), a copy, and the given NCCL kernels."""
    events = _steps(2) + [
        _x("ampere_sgemm_128x64_tn", 0, 100),
        _x("ampere_sgemm_128x64_tn", 150, 100),
        _x("vectorized_elementwise_kernel", 200, 50, tid=8),
        _x("Memcpy HtoD (Pageable -> Device)", 300, 400, cat="gpu_memcpy"),
    ]
    events += [_x(NCCL[0], s, d, tid=20) for s, d in nccl]
    return {
        "deviceProperties": [{"id": 0}],
        "distributedInfo": {"rank": rank},
        "traceEvents": events,
    }


def test_overlap_of_a_hand_made_gpu_trace():
    # NCCL [50, 200) and [700, 800): 250 us; overlapped by compute: [50, 100) + [150, 200);
    # the copy at [300, 700) is memory, not computation
    fig = rank_figures(_gpu_rank(0, [(50, 150), (700, 100)]), rank=5)
    assert fig.rank == 0  # the trace's own rank wins
    assert fig.steps == 2
    assert fig.comm_s == pytest.approx(250e-6)
    assert fig.overlapped_s == pytest.approx(100e-6)
    assert fig.overlap == pytest.approx(0.4)
    assert fig.exposed_per_step == pytest.approx(75e-6)


def test_a_gpu_trace_counts_each_step_once():
    # Kineto writes each ProfilerStep#N twice on a GPU: the host's annotation and its copy on
    # the device timeline; counting both would halve every per-step figure.
    trace = _gpu_rank(0, [(50, 150), (700, 100)])
    device_copies = [
        {**e, "cat": "gpu_user_annotation", "tid": 9}
        for e in trace["traceEvents"]
        if str(e.get("name", "")).startswith("ProfilerStep")
    ]
    trace = {**trace, "traceEvents": trace["traceEvents"] + device_copies}
    fig = rank_figures(trace, rank=0)
    assert fig.steps == 2
    assert fig.exposed_per_step == pytest.approx(75e-6)


def test_overlap_of_a_hand_made_cpu_trace():
    # gloo's all-reduce on its thread 99 over [0, 100) us, a copy gloo makes on that thread
    # (the collective's own work, not computation), the main thread's operators [50, 80) and
    # the hand-off to c10d [0, 5); one step
    events = _steps(1) + [
        _x("gloo:all_reduce", 0, 100, "user_annotation", 99),
        _x("aten::copy_", 10, 10, "cpu_op", 99),
        _x("c10d::allreduce_", 0, 5, "cpu_op", 1),
        _x("autograd::engine::evaluate_function: AddmmBackward0", 50, 30, "cpu_op", 1),
        _x("aten::mm", 55, 20, "cpu_op", 1),  # nested: counted once
    ]
    fig = rank_figures({"traceEvents": events}, rank=0)
    assert fig.comm_s == pytest.approx(100e-6)
    assert fig.overlapped_s == pytest.approx(30e-6)
    assert fig.exposed_per_step == pytest.approx(70e-6)


def test_straggler_is_the_rank_that_waits_least():
    # rank 1 arrives late: the others' NCCL kernels wait for it (long, exposed); its own is short
    ranks = [
        rank_figures(_gpu_rank(0, [(50, 150), (300, 300)]), 0),  # exposed 50 + 300 -> 175/step
        rank_figures(_gpu_rank(1, [(50, 150), (500, 60)]), 1),  # exposed 50 + 60 -> 55/step
        rank_figures(_gpu_rank(2, [(50, 150), (300, 200)]), 2),  # exposed 50 + 200 -> 125/step
    ]
    fig = trace_figures(ranks)
    assert fig.straggler_rank == 1
    assert fig.straggler_s == pytest.approx((150e-6) - 55e-6)  # median(175, 125) - 55 us
    # comm: (450, 210, 350) us over 2 steps -> median 175 us per step; 100 us of each is
    # overlapped -> overlaps 100/450, 100/210, 100/350, median 100/350
    assert fig.comm_trace_s == pytest.approx(175e-6)
    assert fig.comm_overlap == pytest.approx(100 / 350)


def test_no_communication_no_figures():
    assert trace_figures([RankFigures(0, 0.0, 0.0, 3), RankFigures(1, 0.0, 0.0, 3)]) == NO_FIGURES
    one = trace_figures([RankFigures(0, 0.2, 0.1, 2)])
    assert one.comm_overlap == 0.5 and one.straggler_rank is None


def test_straggler_over_repeats():
    rows = [
        {"straggler_rank": 1, "straggler_s": 0.02},
        {"straggler_rank": 0, "straggler_s": 0.001},
        {"straggler_rank": 1, "straggler_s": 0.04},
        {"straggler_rank": None, "straggler_s": None},
    ]
    assert straggler_of(rows) == (1, pytest.approx(0.03))
    assert straggler_of([{}]) is None


def test_read_trace_plain_or_compressed():
    trace = {"traceEvents": [_x("k", 0, 1)]}
    blob = json.dumps(trace).encode()
    assert read_trace(blob) == trace == read_trace(gzip.compress(blob))
    with pytest.raises(ValueError):
        read_trace(b"[1, 2]")


# --------------------------------------------------------------------------- real gloo traces

SLEEP_S = 0.1
# The hidden all-reduce runs beside MATMULS products of N x N, ~0.1 s a step: long beside the
# few milliseconds a gloo thread can wait for a core when two ranks share two, and each product
# long beside the Python between products (not an op, so not compute).
MATMULS, N = 40, 512


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _traced_rank(rank: int, port: int, out: str) -> None:
    """Three profiled scenarios on two gloo ranks: an all-reduce hidden behind matmuls, one
    with nothing beside it, and one that rank 1 joins SLEEP_S late."""
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x, grad = torch.randn(N, N), torch.ones(1 << 10)

    def hidden() -> None:
        work = dist.all_reduce(grad, async_op=True)
        for _ in range(MATMULS):
            x @ x
        work.wait()

    def exposed() -> None:
        dist.all_reduce(grad)
        x @ x

    def late() -> None:
        if rank == 1:
            time.sleep(SLEEP_S)
        dist.all_reduce(grad)

    try:
        for name, body in (("hidden", hidden), ("exposed", exposed), ("late", late)):
            dist.barrier()
            plan = schedule(wait=0, warmup=1, active=2, repeat=1)
            with profile(activities=[ProfilerActivity.CPU], schedule=plan) as prof:
                for _ in range(3):
                    body()
                    prof.step()
            prof.export_chrome_trace(f"{out}/{name}-rank{rank}.json.gz")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)  # torch 2.13 (CPU) may abort in static destructors after gloo (test_sync.py)


@pytest.fixture(scope="module")
def gloo_traces(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("traces")
    mp.spawn(_traced_rank, args=(_free_port(), str(out)), nprocs=2, join=True)
    return out


def _figures(folder: Path, name: str):
    ranks = [
        rank_figures(read_trace((folder / f"{name}-rank{r}.json.gz").read_bytes()), r)
        for r in (0, 1)
    ]
    return ranks, trace_figures(ranks)


def test_real_gloo_trace_hidden_all_reduce(gloo_traces):
    ranks, fig = _figures(gloo_traces, "hidden")
    assert all(r.steps == 2 and r.comm_s > 0 for r in ranks)
    # One rank's collective runs all but entirely beside its matmuls. Which one varies: the rank
    # that posts first may wait for the other past its own matmuls, and on a loaded two-core
    # machine the one that posts last can be held off the core inside the post (measured: the
    # better rank 0.885-1.0 over 14 runs, 6 of them beside a busy process; 0.88 once in CI with
    # 40 products of 256 x 256). The median rank (of two, their mean) was tried as the bar: four
    # quiet runs read 0.77-1.0, but beside a busy process one run in ten read [0.998, 0.0] (likely
    # the worse rank's gloo thread held off the cores until its matmuls ended), which no body
    # on two loaded cores can rule out. So the bar is the better rank well above the exposed
    # case's ~0, and the mean of the two above the exposed case's by 0.3.
    overlaps = [r.overlap for r in ranks]
    assert max(overlaps) > 0.75, overlaps
    exposed = _figures(gloo_traces, "exposed")[1].comm_overlap
    assert fig.comm_overlap > exposed + 0.3, (overlaps, exposed)


def test_real_gloo_trace_exposed_all_reduce(gloo_traces):
    ranks, fig = _figures(gloo_traces, "exposed")
    assert all(r.comm_s > 0 for r in ranks)
    assert fig.comm_overlap < 0.2


def test_real_gloo_trace_straggler(gloo_traces):
    _, fig = _figures(gloo_traces, "late")
    assert fig.straggler_rank == 1
    # rank 0 waits the sleep in its all-reduce on every step
    assert SLEEP_S * 0.6 < fig.straggler_s < SLEEP_S * 2.5
