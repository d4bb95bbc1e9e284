"""gloo's all-reduce beyond the node's cores: the link law the step-time model extrapolates with
(analysis/comm.py, `Oversubscribed`), fitted on a calibration's counts up to `--fit-to` ranks
and compared with the same calibration's own fits at the wider counts it measured.

Each calibration is either measured here (`platform calibrate DIR --devices N`, one after the
other, nothing else running; about 80 s each for 16 ranks on the 2-core box) or read from
existing calibration.json files. For every wider count it prints the per-step latency alpha
and the ring time of one all-reduce of `--bytes` (default 1 MiB: the simulated accelerator's
gradient) three ways: as calibrated at that count; by the law fitted at the narrower counts
(the model's prediction); by the rule before the law (the within-cores link, which the
contention term then stretched by the compute's queueing: that stretch is not included, so the
column shows how much of the growth the link itself missed). Nothing is asserted.

    python benchmarks/gloo_oversubscribed.py [--runs 3] [--devices 16] [--fit-to 4]
        [--out DIR] [--bytes N] [--host-cores C] [calibration.json ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness import add_smoke_flag, print_stamp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, help="calibration.json files to evaluate")
    ap.add_argument("--runs", type=int, default=3, help="calibrations to measure (no files)")
    ap.add_argument("--devices", type=int, default=16)
    ap.add_argument("--fit-to", type=int, default=4, help="widest count the law is fitted on")
    ap.add_argument("--bytes", type=float, default=2**20)
    ap.add_argument("--host-cores", type=float, default=None, help="default: this machine's")
    ap.add_argument("--out", type=Path, default=None)
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.devices, args.fit_to = 1, 4, 2
    print_stamp()
    files = args.files or measure(args.runs, args.devices, args.out)
    cores = args.host_cores or float(len(os.sched_getaffinity(0)))
    for f in files:
        evaluate(f, cores, args.fit_to, args.bytes)


def measure(runs: int, devices: int, out: Path | None) -> list[Path]:
    base = out or Path(tempfile.mkdtemp(prefix="gloo-over-"))
    files = []
    for i in range(runs):
        d = base / f"cal{i + 1}"
        d.mkdir(parents=True, exist_ok=True)
        cmd = ["platform", "calibrate", str(d), "--devices", str(devices)]
        subprocess.run([*cmd, "--cpus-per-worker", "0.1"], check=True, capture_output=True)
        files.append(d / "calibration.json")
    return files


def evaluate(path: Path, cores: float, fit_to: int, n: float) -> None:
    import json

    from amdahl.analysis.calibration import Calibration
    from amdahl.analysis.comm import comm_model
    from amdahl.analysis.selfcheck import calibration_up_to

    full = Calibration.from_dict(json.loads(path.read_text()))
    narrowed = calibration_up_to(full, fit_to)
    if narrowed is None:
        print(f"{path}: fewer than two calibrated counts up to {fit_to}")
        return
    model = comm_model(narrowed, cores)
    print(f"{path}: {model.growth()}")
    within = max(q for q in narrowed.by_devices if q <= cores) if cores >= 2 else None
    for q, (alpha, bandwidth) in sorted(full.by_devices.items()):
        if q <= fit_to:
            continue
        link, _ = model.link(1, q)
        cells = [_ring(q, alpha, bandwidth, n), _ring(q, link.alpha_s, link.bandwidth_Bps, n)]
        old = ""
        if within is not None:
            a0, b0 = narrowed.by_devices[within]
            old_s = _ring(q, a0, b0, n)
            old = f"   before the law {old_s * 1e3:7.2f} ms ({old_s / cells[0] - 1:+.0%})"
        law_s, at_s = cells[1], cells[0]
        print(
            f"  p={q:<3d} alpha calibrated {alpha * 1e6:7.0f} us, law {link.alpha_s * 1e6:7.0f} us"
            f" ({link.alpha_s / alpha - 1:+.0%});  {n / 2**20:g} MiB all-reduce calibrated "
            f"{at_s * 1e3:7.2f} ms, law {law_s * 1e3:7.2f} ms ({law_s / at_s - 1:+.0%}){old}"
        )


def _ring(p: int, alpha: float, bandwidth: float, n: float) -> float:
    """The ring all-reduce: 2(p-1) alpha + 2(p-1)/p n / B."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bandwidth


if __name__ == "__main__":
    sys.exit(main())
