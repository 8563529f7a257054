#!/usr/bin/env bash
# Session 5's device calls, one per PHASE (kind nvidia-h100-x1: the checkpoints are H100
# timings), each with carry=["build/tune"]. Prepare here first (fresh action searches):
#   rm -rf build/tune && mkdir -p build/tune/tables && cp tuning/tables/*.json build/tune/tables/ &&
#   for f in results/gpu-nvidia-h100-80gb-hbm3/tuning/checkpoints/sm90-gemm-*.gz; do
#     gunzip -c $f > build/tune/$(basename ${f%.gz}); done
# and after each call: tar xzf <files_at>/s5-$PHASE.tgz ./tune.tgz -O | tar xz  (restores build/tune)
#   PHASE=T: the whole test suite on the GPU (the line form's prefetch forms 1 and 2, now
#            the 3D heuristic's), then the float64 action search from scratch, 3D first.
#   PHASE=2 / 3: the action search, float64 / float32 (resumes): 3D, 2D p = 1..8, and the
#            3D ncomp = 3 sizes. Run again with the same PHASE if it says "budget".
#   PHASE=L: after a line-template change: its GPU tests, ncu, the float64 action search.
#   PHASE=G: the layout kernel's cp.async form: GPU tests, then the GEMM sizes missing from
#            the checkpoints searched (drop them first: scripts/drop_sizes.py; session 6:
#            --prefix gemm/nn+beta/ --min-mn 64, see notes/tuning.md).
#   PHASE=4: copy build/tune/tables to tuning/tables, then the tuned/untuned evidence.
# Everything comes back in $OUT/s5-$PHASE.tgz (build/tune inside it as tune.tgz).
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/s5; mkdir -p "$OUT" "$W" build/tune/tables
export PYTHONUNBUFFERED=1
T0=$(date +%s)
pack() { tar czf "$W/tune.tgz" build/tune; tar czf "$OUT/s5-$PHASE.tgz" -C "$W" . ; }
left() { echo $(( ${LIMIT:-570} - $(date +%s) + T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
for f in tuning/tables/*.json; do [ -e "build/tune/tables/${f##*/}" ] || cp "$f" build/tune/tables/; done
action() {  # action DTYPE: the search, within what is left of this call
  local b=$(( $(left) - 25 ))
  [ "$b" -gt 30 ] || { echo "no time left for the $1 search"; return; }
  python3 -m smalltc.cli tune --op action --dtype "$1" --sizes "3:1-8:p+1,p+2" "2:1-8:p+1,p+2" \
    "3:1-8:p+1,p+2:c3" --work build/tune --out build/tune/tables --resume --budget-seconds "$b" \
    --no-progress --plot 2>&1 | tee -a "$W/tune_action_$1.log" | grep -E "^action/|sizes;|table:|rror|budget"
}
case "$PHASE" in
T)
  (python3 -m smalltc.cli info; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv) > "$W/info.txt" 2>&1
  timeout 230 python3 -m pytest -q -n 12 -p no:cacheprovider tests > "$W/pytest_gpu_full.log" 2>&1
  echo "pytest rc=$?"; tail -n 2 "$W/pytest_gpu_full.log"; pack
  action float64 ;;
L)
  # after the line template's address-math change: its GPU tests, ncu of the prefetch
  # forms at nd = nq = 9, then the float64 search (3D sizes dropped from the checkpoint)
  timeout 100 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_cuda_kernels.py \
    tests/test_cuda_runtime.py -k "line or prefetch or stream" > "$W/pytest_line.log" 2>&1
  echo "pytest rc=$?"; tail -n 2 "$W/pytest_line.log"; pack
  F="line=1,min_blocks=0"
  timeout 90 ncu -k regex:_line --launch-skip 1 --launch-count 1 --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    --section InstructionStats --section MemoryWorkloadAnalysis python3 notes/cuda_ncu.py \
    "action:3:8:9:float64@$F,per_block=2,prefetch=1" > "$W/ncu_pf1.txt" 2> "$W/ncu_cases.txt"
  echo "ncu rc=$?"; grep -E "Duration|DRAM Through|Issue Slots|Registers Per|Achieved Occ" "$W/ncu_pf1.txt"
  action float64 ;;
G)
  # the layout kernel's cp.async form: its GPU tests, then the square GEMM sizes with
  # m * n >= 64 re-searched (dropped from the checkpoints), float64 then float32
  timeout 120 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_cuda_kernels.py \
    tests/test_cuda_runtime.py tests/test_tuning_gpu.py -k "gemm or contract or prefetch or tuning" \
    > "$W/pytest_gemm.log" 2>&1; echo "pytest rc=$?"; tail -n 2 "$W/pytest_gemm.log"; pack
  for dt in float64 float32; do
    [ "$dt" = float64 ] && b=$(( ($(left) - 20) / 2 )) || b=$(( $(left) - 20 ))
    python3 -m smalltc.cli tune --op gemm --dtype $dt --work build/tune --out build/tune/tables \
      --resume --budget-seconds "$b" --no-progress 2>&1 | tee -a "$W/tune_gemm_$dt.log" \
      | grep -E "^gemm/|sizes;|table:|rror|budget" | cut -c1-160
    pack
  done ;;
2) action float64 ;;
3) action float32 ;;
4)
  cp build/tune/tables/*.json tuning/tables/
  SUITES="--suite gemm --suite action --suite assembly --suite pairwise" PW_BUDGET=0 T_BENCH=90 \
    OUT="$W" bash scripts/gpu_evidence.sh > "$W/evidence.log" 2>&1; tail -n 20 "$W/evidence.log" ;;
esac
pack
