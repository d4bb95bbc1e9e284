"""How many training rows a launch's ranks read, and the passes beyond the measured steps that
decide it: the exposed-communication pairs, the memory step and the profiler pass. The driver
sizes a launch's input with it before any worker starts (driver/trainable.py); the workers run
those passes (worker/trial.py, worker/profile.py) by the same numbers, so no epoch boundary
falls inside a trial.
"""

from __future__ import annotations

from amdahl.protocol.contract import LaunchConfig, TrialConfig
from amdahl.strategies import STRATEGIES

#: Interleaved pairs of (synced, no_sync) forward+backward passes a trial runs after its
#: measured window to estimate its exposed communication (worker/trial.py); each pair reads one
#: micro-batch.
EXPOSED_COMM_PAIRS = 5
#: Untimed optimizer steps after the measured window under the tensor ledger, a trial's
#: tensor-byte peak (worker/tensor_ledger.py); each reads a step's micro-batches.
MEMORY_STEPS = 1
#: Unrecorded steps before the profiler pass's recorded ones (the profiler's warm-up: its first
#: step pays for starting the tracer).
PROFILE_WARMUP = 1


def profiles(profile_steps: int, world: int, sync: str, ranking_only: bool) -> bool:
    """Whether a trial runs the profiler pass (worker/profile.py): asked for, on more than one
    device, with a strategy that communicates, and a trial that measures everything (a
    ranking-only search rung does not)."""
    strategy = STRATEGIES.get(sync)
    talks = strategy.communicates if strategy is not None else True
    return profile_steps > 0 and world > 1 and talks and not ranking_only


def rows_per_rank(launch: LaunchConfig) -> int:
    """Training rows the largest trial of a launch reads on one rank (warmup, measured steps
    with their micro-batches, exposed-communication pairs, the memory step, and the step the
    feed holds ahead): how much data the launch's input streams in one pass, so that no epoch
    boundary falls inside a trial."""
    return max(_rows_per_trial(launch, trial) for trial in launch.trials)


def rows_per_launch(launch: LaunchConfig) -> int:
    """Training rows one rank reads over every trial and repeat of a launch: what one pass of
    a launch-long input stream (worker.input.LaunchStream) must hold."""
    return launch.train.repeats * sum(_rows_per_trial(launch, t) for t in launch.trials)


def _rows_per_trial(launch: LaunchConfig, trial: TrialConfig) -> int:
    # + one step's micro-batches: what the feed holds ahead after the last step
    steps = launch.steps_per_trial + 1 + MEMORY_STEPS
    passes = steps * trial.micro_steps + EXPOSED_COMM_PAIRS
    if profiles(launch.train.profile_steps, trial.settings.devices, trial.settings.sync, False):
        passes += (PROFILE_WARMUP + launch.train.profile_steps) * trial.micro_steps
    return passes * trial.per_device_batch
