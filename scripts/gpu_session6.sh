#!/usr/bin/env bash
# Session 6's device calls, one per PHASE (kind nvidia-h100-x1: the checkpoints are H100
# timings), each with carry=["build/tune"]. Prepare here first:
#   rm -rf build/tune && mkdir -p build/tune/tables && cp tuning/tables/*.json build/tune/tables/ &&
#   for f in results/gpu-nvidia-h100-80gb-hbm3/tuning/checkpoints/sm90-gemm-*.gz; do
#     gunzip -c $f > build/tune/$(basename ${f%.gz}); done &&
#   for dt in float64 float32; do python3 scripts/drop_sizes.py \
#     build/tune/sm90-gemm-$dt.checkpoint.json --prefix gemm/nn+beta/ --min-mn 64; done
# and after each call: tar xzf <files_at>/s6-$PHASE.tgz ./tune.tgz -O | tar xz  (restores build/tune)
#   PHASE=A: the plan-call path (host cost of a small GEMM): its GPU tests, the launch
#            floor with a profile, the GEMM bench (float64); then the GEMM search with
#            beta != 0 and the layout kernel's cp.async form, float64 (resumes).
#   PHASE=B: driver launch against RawKernel (notes/launch_direct.py), then the GEMM
#            search (resumes): float64, then float32.
#   PHASE=C: after the driver launch and the plan's fast path: the whole test suite, the
#            launch floor, the GEMM bench; then the GEMM searches (resume).
#   PHASE=G: the GEMM search again (resumes): float64, then float32.
#   PHASE=F: the last float32 GEMM size; build/tune/tables copied to tuning/tables; the
#            GEMM/tuning GPU tests with them; `smalltc bench` float64 and float32; ncu of the
#            GEMM sizes under 90% not profiled before (100,000 matrices, as the bench).
#   PHASE=V: the committed tables: GEMM GPU tests and the GEMM bench, float64 and float32.
# Everything comes back in $OUT/s6-$PHASE.tgz (build/tune inside it as tune.tgz).
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/s6; mkdir -p "$OUT" "$W" build/tune/tables
export PYTHONUNBUFFERED=1
T0=$(date +%s)
pack() { tar czf "$W/tune.tgz" build/tune; tar czf "$OUT/s6-$PHASE.tgz" -C "$W" . ; }
left() { echo $(( ${LIMIT:-570} - $(date +%s) + T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
(python3 -m smalltc.cli info; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv) > "$W/info.txt" 2>&1
for f in tuning/tables/*.json; do [ -e "build/tune/tables/${f##*/}" ] || cp "$f" build/tune/tables/; done
gemm() {  # gemm DTYPE SECONDS: the GEMM search (resumes from the checkpoint)
  [ "$2" -gt 30 ] || { echo "no time left for the $1 GEMM search"; return; }
  python3 -m smalltc.cli tune --op gemm --dtype "$1" --work build/tune --out build/tune/tables \
    --resume --budget-seconds "$2" --no-progress 2>&1 | tee -a "$W/tune_gemm_$1.log" \
    | grep -E "^gemm/|sizes;|table:|rror|budget" | cut -c1-160
  pack
}
case "$PHASE" in
A)
  timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_operations.py \
    tests/test_errors.py tests/test_cuda_runtime.py tests/test_cuda_kernels.py -k "gemm or out or stream or overlap or contig" \
    > "$W/pytest_plan.log" 2>&1; echo "pytest rc=$?"; tail -n 1 "$W/pytest_plan.log"
  grep -E "^FAILED|^ERROR" "$W/pytest_plan.log" | head
  timeout 90 python3 notes/launch_floor.py --n 2 3 4 5 8 --profile > "$W/launch_floor.txt" 2>&1
  echo "launch_floor rc=$?"; pack
  timeout 90 python3 -m smalltc.cli bench --no-progress --dtype float64 --suite gemm \
    --out "$W/bench-gemm-float64" > "$W/bench-gemm-float64.log" 2>&1; echo "bench rc=$?"; pack
  gemm float64 $(( $(left) - 20 )) ;;
B)
  timeout 60 python3 notes/launch_direct.py > "$W/launch_direct.json" 2>&1; echo "launch_direct rc=$?"
  cat "$W/launch_direct.json"; pack
  gemm float64 $(( ($(left) - 20) / 3 ))
  gemm float32 $(( $(left) - 20 )) ;;
C)
  timeout 250 python3 -m pytest -q -n 12 -p no:cacheprovider tests > "$W/pytest_gpu_full.log" 2>&1
  echo "pytest rc=$?"; tail -n 1 "$W/pytest_gpu_full.log"; grep -E "^FAILED|^ERROR" "$W/pytest_gpu_full.log" | head; pack
  timeout 90 python3 notes/launch_floor.py --n 2 3 4 5 8 --profile > "$W/launch_floor.txt" 2>&1
  echo "launch_floor rc=$?"; head -c 1500 "$W/launch_floor.txt"; pack
  timeout 90 python3 -m smalltc.cli bench --no-progress --dtype float64 --suite gemm \
    --out "$W/bench-gemm-float64" > "$W/bench-gemm-float64.log" 2>&1; echo "bench rc=$?"; pack
  gemm float64 $(( ($(left) - 20) / 3 ))
  gemm float32 $(( $(left) - 20 )) ;;
G)
  gemm float64 $(( ($(left) - 20) * 2 / 3 ))
  gemm float32 $(( $(left) - 20 )) ;;
F)
  gemm float32 60
  cp build/tune/tables/*.json tuning/tables/
  timeout 120 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_operations.py tests/test_plan_calls.py \
    tests/test_cuda_kernels.py tests/test_tuning_gpu.py -k "gemm or tuning or prefetch" > "$W/pytest_tables.log" 2>&1
  echo "pytest rc=$?"; tail -n 1 "$W/pytest_tables.log"; grep -E "^FAILED|^ERROR" "$W/pytest_tables.log" | head; pack
  for dt in float64 float32; do
    timeout 115 python3 -m smalltc.cli bench --no-progress --dtype $dt --suite gemm --suite action \
      --suite assembly --suite pairwise --out "$W/bench-$dt" > "$W/bench-$dt.log" 2>&1
    echo "bench $dt rc=$?"; pack
  done
  for n in ${NCU_N:-4 5 21 24 28 30}; do
    [ "$(left)" -gt 40 ] || break
    timeout 35 ncu -k regex:stc_gemm --launch-skip 1 --launch-count 1 --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --section LaunchStats python3 notes/cuda_ncu.py "gemm:$n:100000:float64" > "$W/ncu_gemm_n$n.txt" 2>&1
    echo "ncu n=$n rc=$?"
  done
  pack ;;
V)
  # the committed tables (the float64 n = 2, 4 beta != 0 entries demoted again, as in
  # session 4): their GPU tests and the GEMM bench, float64 and float32
  timeout 100 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_plan_calls.py tests/test_operations.py \
    tests/test_tuning_gpu.py -k "gemm or tuning or calls" > "$W/pytest_v.log" 2>&1
  echo "pytest rc=$?"; tail -n 1 "$W/pytest_v.log"; grep -E "^FAILED|^ERROR" "$W/pytest_v.log" | head; pack
  for dt in float64 float32; do
    timeout 150 python3 -m smalltc.cli bench --no-progress --dtype $dt --suite gemm \
      --out "$W/bench-gemm-$dt" > "$W/bench-gemm-$dt.log" 2>&1; echo "bench $dt rc=$?"; pack
  done ;;
esac
pack
