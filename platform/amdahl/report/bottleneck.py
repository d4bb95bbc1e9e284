"""The bottleneck rules: the categories a step's time can be lost to, the thresholds that name
one, the rule table that applies them to one step's figures, and what to try for each.

A category is named, in the seed table's vocabulary (Python/framework overhead, data loading,
host-device transfer, kernel-launch overhead, communication, memory), when its share of the step
passes its threshold in `THRESHOLDS`, which every report prints (`THRESHOLD_TEXT`); none passing:
the step is compute-bound. diagnose.py measures the figures these rules read.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass

COMMUNICATION = "communication"
DATA = "data loading"
TRANSFER = "host-device transfer"
OVERHEAD = "Python/framework overhead"
LAUNCH = "kernel-launch overhead"
MEMORY = "memory"
COMPUTE = "compute"

#: The thresholds the diagnosis uses (printed in every report).
THRESHOLDS: dict[str, float] = {
    "communication": 0.20,
    "data_wait": 0.05,
    "outside_phases": 0.15,
    "fixed_cost": 0.50,
    "memory": 0.90,
    "accuracy_points": 0.005,
    "loss_relative": 0.01,
    "overlap_hidden": 0.50,
    "straggler": 0.05,
}

THRESHOLD_TEXT = [
    f"{COMMUNICATION}: exposed communication (phase time with the sync strategy minus the same "
    f"configuration with sync none) >= {THRESHOLDS['communication']:.0%} of the step",
    f"{DATA} (on GPUs data wait is the device's idle gap between steps, so it also holds a "
    f"{TRANSFER} that did not finish under the previous step): data wait >= "
    f"{THRESHOLDS['data_wait']:.0%} of the step",
    f"{OVERHEAD}: time outside the timed phases (Python loop, stragglers) >= "
    f"{THRESHOLDS['outside_phases']:.0%} of the step, or on CPU a fixed per-step cost "
    f">= {THRESHOLDS['fixed_cost']:.0%} of the compute phases",
    f"{LAUNCH} (GPU): fixed per-step cost (intercept of compute time against batch size) "
    f">= {THRESHOLDS['fixed_cost']:.0%} of the compute phases",
    f"{MEMORY}: peak memory >= {THRESHOLDS['memory']:.0%} of the device's memory, or a larger "
    "batch of the same configuration ran out of memory",
    f"{COMPUTE}: none of the above; the model's own arithmetic dominates",
    f"{COMMUNICATION}, from the profiler traces: overlap (the share of the communication time "
    "during which computation ran too, HTA's definition) below "
    f"{THRESHOLDS['overlap_hidden']:.0%}: the all-reduce is not hidden behind backward; at or "
    "above it: it is, and what stays exposed is wire time beyond backward",
    f"straggler: the other ranks wait for one rank (least exposed communication in the traces) "
    f">= {THRESHOLDS['straggler']:.0%} of the step",
    "dominant = the flagged category with the largest share of the step",
    f"quality: val accuracy lower than the reference by more than max(spread, "
    f"{THRESHOLDS['accuracy_points'] * 100:.1f} points), or val loss higher by more than "
    f"max(spread, {THRESHOLDS['loss_relative']:.0%}), is flagged and never recommended",
]

#: What to try next, per bottleneck, in the sweep file's own terms.
#: The compute tip the sweep's own measurements can contradict (report/diagnose.py checks it).
BF16_TIP = "precision: bf16 (autocast) for faster matmuls"

ADVICE: dict[str, list[str]] = {
    COMMUNICATION: [
        "raise batch_size: more compute per all-reduce",
        "compress the traffic: sync ddp_fp16 or powersgd; or thin it: grid.accumulate_steps "
        "[2, 4] communicates once per that many micro-batches (with any sync)",
        "tune options.bucket_cap_mb so all-reduce overlaps backward",
        "if the speedup stays below 1, fewer devices train faster",
    ],
    DATA: [
        "raise data_workers and resources.cpus_per_data_worker",
        "raise grid.prefetch_batches",
        "move preprocessing out of the step (store it once)",
    ],
    TRANSFER: [
        "a copy longer than a step cannot hide behind it: send fewer bytes per batch",
        "send compact dtypes (uint8, bf16) and convert on the device",
    ],
    OVERHEAD: [
        "raise batch_size: the fixed per-step cost is paid once per step",
        "compile: inductor or torchscript to cut per-op Python dispatch",
        "look for per-step Python work (logging, .item(), host syncs)",
    ],
    LAUNCH: [
        "raise batch_size: more work per kernel",
        "compile: inductor with options.compile_mode reduce-overhead (CUDA graphs)",
        "fuse small ops (compile) and avoid host syncs in the step",
    ],
    MEMORY: [
        "precision: bf16 or bf16_weights to halve activations/weights",
        "grid.accumulate_steps with a smaller batch_size (smaller micro-batches, same samples "
        "per optimizer step)",
        "sync: zero1 or fsdp to shard optimizer state and parameters",
        "activation_checkpointing: full or selective (the workload's blocks) to recompute "
        "activations in the backward instead of keeping them",
    ],
    COMPUTE: [
        BF16_TIP,
        "compile: inductor, and keep it only if it measures faster",
        "this is the healthy case: add devices while efficiency holds",
    ],
}


@dataclass(frozen=True)
class Finding:
    """A bottleneck category that passed its threshold: its share of the step and the evidence."""

    category: str
    share: float
    evidence: str


@dataclass(frozen=True)
class StepFigures:
    """What the bottleneck rules read about one configuration's step (seconds per step)."""

    wall: float
    cuda: bool
    comm: float  # exposed communication
    comm_measured: bool  # measured against a sync-none twin and above its spread
    data: float  # data wait
    other: float  # outside the timed phases
    compute: float  # forward + backward + optimizer
    fixed: float  # fixed per-step cost from the batch-size sweep (0 when unknown)
    overlap: float | None = None  # share of traced communication overlapped by computation
    straggler: tuple[int, float] | None = None  # (rank, seconds per step the others wait)

    @property
    def fixed_hit(self) -> bool:
        """Whether the fixed per-step cost passes its threshold (share of the compute phases)."""
        return self.compute > 0 and self.fixed / self.compute >= THRESHOLDS["fixed_cost"]

    @property
    def overhead(self) -> float:
        """Python/framework overhead: time outside the phases, plus on CPU a fixed cost that
        passes its threshold (on a GPU that cost is kernel-launch overhead)."""
        return self.other + (self.fixed if not self.cuda and self.fixed_hit else 0.0)

    @property
    def data_name(self) -> str:
        """On a GPU the device's idle gap also holds a late host-to-device copy."""
        return f"{DATA} or {TRANSFER}" if self.cuda else DATA

    def of_step(self, seconds: float) -> str:
        return f"{seconds / self.wall:.0%} of the {ms_text(self.wall)} step"

    def fixed_text(self) -> str:
        return (
            f"a fixed per-step cost of {ms_text(self.fixed)} ({self.fixed / self.compute:.0%} of "
            "compute, from the batch-size sweep)"
        )


def ms_text(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _communication_rule(s: StepFigures) -> Finding | None:
    if not (s.comm_measured and s.comm / s.wall >= THRESHOLDS["communication"]):
        return None
    evidence = f"exposed communication {ms_text(s.comm)} = {s.of_step(s.comm)}"
    if s.overlap is not None:
        evidence += f", {s.overlap:.0%} of the traced all-reduce overlapped with compute"
    return Finding(COMMUNICATION, s.comm / s.wall, evidence)


def _data_rule(s: StepFigures) -> Finding | None:
    if not (s.data / s.wall >= THRESHOLDS["data_wait"]):
        return None
    return Finding(
        s.data_name, s.data / s.wall, f"data wait {ms_text(s.data)} = {s.of_step(s.data)}"
    )


def _overhead_rule(s: StepFigures) -> Finding | None:
    cpu_fixed = s.fixed_hit and not s.cuda
    if not (s.other / s.wall >= THRESHOLDS["outside_phases"] or cpu_fixed):
        return None
    parts = [f"{ms_text(s.other)} outside the timed phases"] if s.other else []
    if cpu_fixed:
        parts.append(s.fixed_text())
    evidence = " and ".join(parts) + f" = {s.of_step(s.overhead)}"
    return Finding(OVERHEAD, s.overhead / s.wall, evidence)


def _launch_rule(s: StepFigures) -> Finding | None:
    if not (s.cuda and s.fixed_hit):
        return None
    return Finding(LAUNCH, s.fixed / s.wall, s.fixed_text())


#: The bottleneck rules, in THRESHOLD_TEXT's order. Every rule that fires is a finding; the one
#: with the largest share of the step is the bottleneck (on a tie, the earlier rule), the others
#: are named beside it. None firing: compute-bound.
BOTTLENECK_RULES = (_communication_rule, _data_rule, _overhead_rule, _launch_rule)


def step_shares(s: StepFigures, findings: list[Finding]) -> dict[str, float]:
    """Each category's share of the step (kernel-launch overhead only when it is a finding)."""
    shares = {COMMUNICATION: s.comm / s.wall, s.data_name: s.data / s.wall}
    shares[OVERHEAD] = s.overhead / s.wall
    shares.update({f.category: f.share for f in findings})
    shares[COMPUTE] = s.compute / s.wall
    return shares


def step_findings(s: StepFigures) -> list[Finding]:
    """Every rule of BOTTLENECK_RULES that fires on the step, in the table's order."""
    return [f for rule in BOTTLENECK_RULES if (f := rule(s)) is not None]


def overlap_advice(overlap: float) -> str:
    """The communication tip the traced overlap points to (THRESHOLDS["overlap_hidden"])."""
    if overlap < THRESHOLDS["overlap_hidden"]:
        return (
            f"all-reduce not hidden ({overlap:.0%} of it overlapped with compute): either its "
            "buckets start late (lower options.bucket_cap_mb so they start during backward; "
            "gradients ready out of bucket order hold a bucket back) or it outlasts backward "
            "(then send fewer bytes: sync ddp_fp16 or powersgd)"
        )
    return (
        f"all-reduce already hidden ({overlap:.0%} of it overlapped with compute): bucket "
        "tuning will not help; what is exposed is wire time beyond backward, so send fewer "
        "bytes or compute more per byte"
    )


def trace_notes(s: StepFigures) -> list[str]:
    """What the traces add beside the findings: a straggler the others wait for."""
    if s.straggler is None:
        return []
    rank, wait = s.straggler
    if wait / s.wall < THRESHOLDS["straggler"]:
        return []
    return [
        f"straggler: the other ranks wait {ms_text(wait)} per step for rank {rank} "
        f"({s.of_step(wait)}, from the profiler traces)"
    ]


def advice_for(bottleneck: str, s: StepFigures, memory_bound: bool) -> list[str]:
    """What to try, from ADVICE: on a GPU an idle gap may be input or copy, so both lists'
    first tips; a compute-bound step near its memory limit also gets the memory tip; exposed
    communication with a traced overlap gets the tip the overlap points to first."""
    if bottleneck == COMMUNICATION and s.overlap is not None:
        rest = [tip for tip in ADVICE[COMMUNICATION] if "bucket_cap_mb" not in tip]
        return [overlap_advice(s.overlap), *rest]
    if bottleneck == s.data_name and s.cuda:
        return ADVICE[DATA][:2] + ADVICE[TRANSFER][:1]
    if memory_bound and bottleneck == COMPUTE:
        return ADVICE[COMPUTE] + ADVICE[MEMORY][:1]
    return list(ADVICE[bottleneck])  # a copy: the table is shared by every diagnosis
