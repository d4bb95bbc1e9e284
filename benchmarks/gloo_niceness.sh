#!/usr/bin/env bash
# Does Ray's worker niceness (15 by default) stretch gloo's collectives on a full node? The
# all-reduce calibration at 16 CPU ranks, alternately with Ray's default and with
# RAY_worker_niceness=0, twice each; prints wall / CPU ms per call at 8 and 16 ranks.
set -u
OUT=${OUT:-/tmp/nice}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if ! python3 -c "import ray, pydantic" 2>/dev/null; then
  mkdir -p /tmp/site
  for w in .whl/*.whl .whl/*.zip; do [ -e "$w" ] && python3 -m zipfile -e "$w" /tmp/site; done
  chmod +x /tmp/site/ray/core/src/ray/raylet/raylet /tmp/site/ray/core/src/ray/gcs/gcs_server
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/platform:$PWD
for round in 1 2; do
  for nice in default 0; do
    d=/tmp/nice-$nice-$round; mkdir -p "$d"
    printf 'name: c\nworkload: mlp\n' > "$d/spec.yaml"
    env_nice=(); [ "$nice" = 0 ] && env_nice=(env RAY_worker_niceness=0)
    ( while sleep 8; do ps -eo ni,comm | grep "RayTrain" | sort | uniq -c | head -3; done ) \
      > "$d/ni.log" 2>&1 & mon=$!
    timeout 150 "${env_nice[@]}" python3 -c 'from amdahl.cli.commands import main; main()' \
      calibrate "$d" --devices 16 --cpus-per-worker 0.9 > "$d/out.log" 2>&1
    echo "niceness $nice, round $round: exit $?; workers' niceness: $(sort -u "$d/ni.log" | head -2 | tr '\n' ' ')"
    kill $mon 2>/dev/null
    python3 - "$d/calibration.json" <<'PY'
import json, sys
try:
    cal = json.load(open(sys.argv[1]))
except OSError:
    sys.exit(print("  no calibration.json"))
for p, rows in cal.get("all_reduce_by_devices", {}).items():
    if p in ("4", "8", "16"):
        print(f"  {p:>2} ranks", " ".join(f"{int(r['bytes'])}:{r['seconds']*1e3:.2f}/{r.get('cpu_seconds',0)*1e3:.2f}"
                              for r in rows if r["bytes"] in (1024.0, 65536.0, 1048576.0, 16777216.0)))
PY
  done
done
