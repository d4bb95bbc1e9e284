"""Compile seconds per configuration in search sweeps: how many rows of each configuration paid
a compilation, and how many seconds in all, beside the rows' summed wall seconds.

A search whose promoted configurations compile again at every rung shows rows > 1 with
compile_s well above zero for `compile: inductor`; one that compiles once per configuration
per sweep shows one such row.

    python benchmarks/compile_per_config.py SWEEP_DIR [SWEEP_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.parquet as pq


def summarise(sweep_dir: Path) -> None:
    if not (sweep_dir / "results.parquet").exists():
        print(f"\n{sweep_dir}: no results.parquet")
        return
    rows = pq.read_table(sweep_dir / "results.parquet").to_pylist()
    print(f"\n{sweep_dir.name}: {len(rows)} rows")
    by_config: dict[tuple, list[dict]] = {}
    for r in rows:
        by_config.setdefault((r["compile"], r["batch_size"]), []).append(r)
    print(
        f"  {'compile':10s} {'batch':>6s} {'rows':>5s} {'steps':>12s} {'compile_s':>24s} "
        f"{'wall_s':>8s} {'samples/s':>10s}"
    )
    for (compile_, batch), rs in sorted(by_config.items()):
        rs.sort(key=lambda r: (r.get("rung") or 0, r["repeat"]))
        steps = ",".join(str(r.get("steps") or "-") for r in rs)
        comp = ",".join(
            f"{r['compile_s']:.2f}" if r.get("compile_s") is not None else "-" for r in rs
        )
        wall = sum(r.get("wall_s") or 0.0 for r in rs)
        last = rs[-1].get("throughput")
        thr = f"{last:10,.0f}" if last else f"{'-':>10s}"
        print(
            f"  {compile_:10s} {batch:6d} {len(rs):5d} {steps:>12s} {comp:>24s} {wall:8.1f} {thr}"
        )
    statuses = sorted({r["status"] for r in rows})
    print(f"  statuses: {statuses}; summed wall_s {sum(r.get('wall_s') or 0 for r in rows):.1f}")


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for d in sys.argv[1:]:
        summarise(Path(d))


if __name__ == "__main__":
    main()
