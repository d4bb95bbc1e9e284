"""Compile seconds per configuration in search sweeps: how many rows of each configuration paid
a compilation, and how many seconds in all, beside the rows' summed wall seconds.

A search whose promoted configurations compile again at every rung shows rows > 1 with
compile_s well above zero for `compile: inductor`; one that compiles once per configuration
per sweep shows one such row.

    python benchmarks/compile_per_config.py SWEEP_DIR [SWEEP_DIR ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from _harness import add_smoke_flag, print_stamp


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dirs", nargs="*", type=Path)
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.sweep_dirs = [_smoke_sweep()]
    if not args.sweep_dirs:
        sys.exit(__doc__)
    print_stamp()
    for d in args.sweep_dirs:
        summarise(d)


def _smoke_sweep() -> Path:
    """A sweep directory of two compiled rows in the results schema: the columns read above
    must still be the table's."""
    from amdahl.columns import SCHEMA
    from amdahl.sweepdir.layout import RESULTS_FILE

    d = Path(tempfile.mkdtemp(prefix="amdahl-compile-"))
    row = {"compile": "default", "batch_size": 64, "status": "ok", "steps": 5, "wall_s": 1.0}
    rows = [{**row, "repeat": k, "compile_s": 0.5, "throughput": 100.0} for k in range(2)]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), d / RESULTS_FILE)
    return d


if __name__ == "__main__":
    main()
