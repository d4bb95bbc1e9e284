#!/usr/bin/env bash
# Everything a lent GPU machine is for, in one run (docs/performance-history.md, "GPU"): the CUDA suite,
# the step-time model on 16 real CPU ranks, the GPU smoke sweep and its report, and halving over
# compilation against the grid. Each step has its own time limit, so one hang costs only itself;
# every figure is printed, and the sweeps' files come back as $OUT/runs.tgz.
#
#   bash benchmarks/device_check.sh            # on the GPU machine, from the repository root
#   STEPS=12 bash benchmarks/device_check.sh   # only tests/gpu without its matrix, and step 2
#
# Steps: 1 tests/gpu but its precision x compile x sync matrix, m the matrix, 2 the step-time
# model on CPU ranks, 3 the GPU smoke sweep, 4 halving over compilation. On an H200: step 1
# about 40 s, m about 230 s, 2 about 190-260 s (its sweep 131-153 s, the host probe about 40),
# 3 and 4 about 2 minutes each; more than one device call may run (10): split them over calls,
# e.g. STEPS=12 then STEPS=m34. Step 4 starts only while less than STEP4_BEFORE_S (default 320)
# seconds have passed in this call.
#
# The machine's image has torch (CUDA) but not Ray, pydantic or jsonschema (which `import ray`
# needs): `bash benchmarks/device_wheels.sh` builds their wheels into .whl/ here (Ray's without
# its Java jars and dashboard UI, binaries stripped, to fit a call; name .whl in the call's
# carry), and they are unpacked onto PYTHONPATH. MLflow is not needed: every sweep runs with
# tracking off.
set -u
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT" /tmp/site /tmp/runs
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if ! python3 -c "import ray, pydantic" 2>/dev/null; then
  for w in .whl/*.whl .whl/*.zip; do
    [ -e "$w" ] && python3 -m zipfile -e "$w" /tmp/site
  done
  chmod +x /tmp/site/ray/core/src/ray/raylet/raylet /tmp/site/ray/core/src/ray/gcs/gcs_server
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/platform:$PWD
amdahl() { python3 -c 'from amdahl.cli.commands import main; main()' "$@"; }
step() { echo; echo "=== $* ($(date +%T))"; }
started=$(date +%s)

step "machine"
nproc
lscpu 2>/dev/null | grep -E "^(Model name|Thread|Core|Socket|NUMA node\(s\)|CPU\(s\))" || true
python3 - <<'EOF'
import torch, ray, pydantic
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
print("ray", ray.__version__, "pydantic", pydantic.__version__)
EOF

STEPS=${STEPS:-1m234}
[[ $STEPS == *1* || $STEPS == *m* ]] && {
step "1. pytest tests/gpu"
# The quick files first, the long matrix last (step m). SIGINT at the limit: pytest then
# prints the failures it has so far.
gpu_tests() {
  timeout -s INT "${LIMIT:-150}" python3 -m pytest "$@" -q -p no:cacheprovider --tb=short -ra \
    2>&1 | tee -a "$OUT/gpu_tests.log" | grep -v -E "^(SKIPPED|PASSED)" | tail -40
  echo "$*: exit ${PIPESTATUS[0]}"
}
[[ $STEPS == *1* ]] && LIMIT=${LIMIT1:-150} gpu_tests tests/gpu -k "not every_precision"
# the precision x compile x sync matrix, ~220 s on an H200 (MATRIX narrows it: a -k expression)
[[ $STEPS == *m* ]] && LIMIT=${LIMITM:-260} gpu_tests tests/gpu/test_gpu_trials.py \
  -k "every_precision and (${MATRIX:-precision})"
}

[[ $STEPS == *3* ]] && {
step "3. platform sweep sweeps/gpu_smoke.yaml, then platform report"
timeout 120 bash -c 'python3 -c "from amdahl.cli.commands import main; main()" sweep \
  sweeps/gpu_smoke.yaml --no-tracking --local --runs-dir /tmp/runs' 2>&1 | tail -25
echo "sweep exit ${PIPESTATUS[0]}"
smoke=$(ls -d /tmp/runs/gpu_smoke-* 2>/dev/null | tail -1)
if [ -n "$smoke" ]; then
  amdahl report "$smoke" 2>&1 | head -40
  echo "report exit ${PIPESTATUS[0]}"
fi
}

[[ $STEPS == *2* ]] && {
step "2. step-time model, fit at ${FIT:=1,2,4} CPU ranks, predict ${TRUTH:=8,12,16}"
# First, about 40 s: one rank's matmul rate as 1-16 single-thread processes share the host, and
# its hardware threads per core (the in-core slowdown the model copies from measured counts).
timeout 120 python3 benchmarks/host_contention.py 2>&1 | tail -12
# One interleaved sweep over both sets of device counts (--interleaved: the box's drift lands on
# both alike within one time limit); a sweep cut by the limit is evaluated on the rows it wrote
# (without its closing calibration, if cut before).
# every process's CPU share every 5 s (is anything busy while a narrow trial runs after wide ones?)
top -b -c -d 5 -w 160 -n "$(( ${SCALE_LIMIT:-300} / 5 ))" 2>/dev/null \
  | grep -A12 "^top -" > "$OUT/top.log" & top_pid=$!
timeout -s INT "${SCALE_LIMIT:-300}" python3 benchmarks/scale_check.py --fit "$FIT" \
  --truth "$TRUTH" --interleaved --batches "${BATCHES:-64,256}" \
  --syncs "${SYNCS:-ddp,zero1,none}" --steps 100 --repeats "${REPEATS:-2}" \
  --cpus-per-device 0.9 --out /tmp/runs/scale 2>&1 \
  | grep -v -E "WARNING|INFO" | tail -60
rc=${PIPESTATUS[0]}
echo "exit $rc"
scale=$(ls -d /tmp/runs/scale/scale-* 2>/dev/null | tail -1)
kill "$top_pid" 2>/dev/null
if [ "$rc" != 0 ] && [ -f "$scale/results.parquet" ]; then
  echo "the rows so far:"
  python3 benchmarks/scale_check.py --fit "$FIT" --truth "$TRUTH" --evaluate "$scale"
fi
if [ -f "$scale/calibration.json" ]; then
  echo "the same rows, the model given the calibration up to the widest held-out count:"
  python3 benchmarks/scale_check.py --fit "$FIT" --truth "$TRUTH" --evaluate "$scale" \
    --calibrated-to "${TRUTH##*,}" | grep -E "^  |^communication"
  python3 - "$scale/calibration.json" <<'EOF'
import json, sys
cal = json.load(open(sys.argv[1]))
print("all-reduce by ranks, bytes: wall ms / a rank's CPU ms")
for p, rows in cal.get("all_reduce_by_devices", {}).items():
    print(p, " ".join(f"{int(r['bytes'])}:{r['seconds'] * 1e3:.2f}/{r.get('cpu_seconds', 0) * 1e3:.2f}"
                      for r in rows))
EOF
fi
}

[[ $STEPS == *4* ]] && {
step "4. halving over eager/inductor against the grid (elapsed $(( $(date +%s) - started )) s)"
if [ $(( $(date +%s) - started )) -lt ${STEP4_BEFORE_S:-320} ]; then
  for method in halving grid; do
    s=$(date +%s)
    set_search=""
    [ $method = halving ] && set_search="--set search.method=halving --set search.min_steps=30"
    timeout 90 bash -c "python3 -c 'from amdahl.cli.commands import main; main()' sweep \
      sweeps/gpu_compile_search.yaml $set_search --no-tracking --local \
      --runs-dir /tmp/runs/$method" 2>&1 | tail -8
    echo "$method: exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - s )) s"
  done
  python3 benchmarks/compile_per_config.py /tmp/runs/halving/gpu_compile_search-* \
    /tmp/runs/grid/gpu_compile_search-*
else
  echo "skipped: too little time left"
fi
}

tar czf "$OUT/runs.tgz" --exclude=ray --exclude='*.log' -C /tmp runs
echo "total $(( $(date +%s) - started )) s"
