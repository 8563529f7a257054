#!/usr/bin/env bash
# The next device session's runbook, one call per PHASE (kind nvidia-h100-x1: the
# checkpoints are H100 timings), each with carry=["build/tune"]. Prepare here first:
#   mkdir -p build/tune/tables && cp tuning/tables/*.json build/tune/tables/ &&
#   for f in results/gpu-nvidia-h100-80gb-hbm3/tuning/checkpoints/sm90-gemm-*.gz; do
#     gunzip -c $f > build/tune/$(basename ${f%.gz}); done
# and after each call: tar xzf <files_at>/s5-$PHASE.tgz tune.tgz -O | tar xz  (restores build/tune)
#   PHASE=1: GPU tests of what session 4 left unrun (the line form across executors, its
#            prefetch variant, the tuner's small form), the GEMM --reconfirm with the small
#            form (float64, float32), ncu of the line kernels.
#   PHASE=2 / 3: the action search from scratch, float64 / float32: 2D and 3D p = 1..8 and
#            the 3D ncomp = 3 sizes (the space now has the line form's prefetch variant).
#            Run again with the same PHASE if it says "budget".
#   PHASE=4: copy build/tune/tables to tuning/tables, then the tuned/untuned evidence.
# Everything comes back in $OUT/s5-$PHASE.tgz (build/tune inside it as tune.tgz).
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/s5; mkdir -p "$OUT" "$W" build/tune/tables
export PYTHONUNBUFFERED=1
pack() { tar czf "$W/tune.tgz" build/tune; tar czf "$OUT/s5-$PHASE.tgz" -C "$W" . ; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
for f in tuning/tables/*.json; do [ -e "build/tune/tables/${f##*/}" ] || cp "$f" build/tune/tables/; done
action() {  # action DTYPE
  python3 -m smalltc.cli tune --op action --dtype "$1" --sizes "2:1-8:p+1,p+2" "3:1-8:p+1,p+2" \
    "3:1-8:p+1,p+2:c3" --work build/tune --out build/tune/tables --resume --budget-seconds 530 \
    --no-progress --plot 2>&1 | tee -a "$W/tune_action_$1.log" | grep -E "^action/3d|sizes;|table:|rror|budget"
}
case "$PHASE" in
1)
  timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_kernels.py \
    tests/test_tuning_gpu.py tests/test_tuning_measure.py -k "line or tuning or small" \
    > "$W/pytest.log" 2>&1; echo "pytest rc=$?"; tail -n 2 "$W/pytest.log"; pack
  for dt in float64 float32; do
    timeout 200 python3 -m smalltc.cli tune --op gemm --dtype $dt --work build/tune \
      --out build/tune/tables --reconfirm --budget-seconds 180 --no-progress 2>&1 \
      | tee "$W/reconfirm_gemm_$dt.log" | grep -E "m[2-8]n[2-8]k[2-8] |sizes;|table:|rror|small"
    pack
  done
  timeout 120 ncu -k regex:_line --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    python3 notes/cuda_ncu.py action:3:5:6:float64 action:3:6:7:float64 action:3:8:9:float64 \
    > "$W/ncu_line.txt" 2> "$W/ncu_line_cases.txt"; echo "ncu rc=$?" ;;
2) action float64 ;;
3) action float32 ;;
4)
  cp build/tune/tables/*.json tuning/tables/
  SUITES="--suite gemm --suite action --suite assembly --suite pairwise" PW_BUDGET=0 T_BENCH=90 \
    OUT="$W" bash scripts/gpu_evidence.sh > "$W/evidence.log" 2>&1; tail -n 20 "$W/evidence.log" ;;
esac
pack
