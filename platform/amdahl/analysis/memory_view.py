"""What a report knows of memory beyond each row's figures: the memory probe's facts (plan.json),
the device's memory the plan held trials to, and the fixed overhead the sweep's own rows show;
and from them, what another strategy, precision or batch would hold per device (the memory
section's savings and the bottleneck advice of a memory-bound configuration alike).

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from amdahl.analysis.configs import Config, config_options
from amdahl.analysis.memory_model import (
    MemoryFacts,
    Overhead,
    alternatives,
    overhead_from_rows,
    predict_peak,
)


@dataclass(frozen=True)
class MemoryView:
    #: The probe's facts by (workload parameters as sorted JSON, precision).
    facts: dict[tuple[str, str], MemoryFacts] = field(default_factory=dict)
    #: The device's memory (bytes) trials were held to: calibration.json's measured size, else
    #: the plan's (`resources.device_memory_gb` or the workload's stated); None: unknown.
    device_bytes: float | None = None
    overhead: Overhead = field(default_factory=Overhead)

    @classmethod
    def of(
        cls,
        facts: dict[tuple[str, str], MemoryFacts],
        rows: list[dict],
        device_bytes: float | None,
    ) -> MemoryView:
        return cls(dict(facts), device_bytes, overhead_from_rows(rows))

    def facts_of(self, c: Config, precision: str | None = None) -> MemoryFacts | None:
        """The probe's facts for a configuration's parameters at its (or another) precision."""
        params = json.dumps(json.loads(c.settings.get("params") or "{}"), sort_keys=True)
        return self.facts.get((params, precision or c.settings["precision"]))

    def predicted(self, c: Config) -> float | None:
        """The configuration's predicted peak per device, the fitted overhead included."""
        facts = self.facts_of(c)
        if facts is None or c.batch_size is None:
            return None
        own = predict_peak(
            facts,
            c.sync,
            c.devices,
            c.batch_size,
            micro_steps(c),
            checkpointing=_mode(c),
            options=config_options(c.settings),
            precision=c.settings["precision"],
        )
        return own.total + self.overhead.bytes

    def savings(self, c: Config) -> list[tuple[str, float]]:
        """(what to change, bytes per device it saves), largest saving first; empty where the
        probe's facts for the configuration are unknown."""
        facts = self.facts_of(c)
        if facts is None or c.batch_size is None:
            return []
        bf16 = self.facts_of(c, "bf16") if c.settings["precision"] == "fp32" else None
        micro, mode = micro_steps(c), _mode(c)
        options, precision = config_options(c.settings), c.settings["precision"]
        own = self.predicted(c) - self.overhead.bytes
        found = alternatives(
            facts, bf16, c.sync, c.devices, c.batch_size, micro, mode, options, precision
        )
        return [(name, own - other) for name, other in found]


def _mode(c: Config) -> str:
    """The configuration's activation checkpointing (none in a table from before the axis)."""
    return c.settings.get("activation_checkpointing") or "none"


def micro_steps(c: Config) -> int:
    """The passes per optimizer step a configuration's rows ran (strategies.micro_steps)."""
    return int(c.rows[0].get("micro_steps") or 1)
