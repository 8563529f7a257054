#!/usr/bin/env bash
# Session 4's closing device calls (kind nvidia-h100-x1). Everything comes back in
# $OUT/final-$PHASE.tgz (the tool returns at most 8 files).
#   PHASE=A: install, the whole test suite on the GPU, re-tune the kernel-(9) sizes whose
#            BB stride changed (S = 8) into build/tune_sb, launch floor, bench float64
#            (all suites, baselines) with those tables.
#   PHASE=B: bench float32 the same way (carry=["build/tune_sb"] when the machine is new).
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/final; mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1
pack() { tar czf "$OUT/final-$PHASE.tgz" -C "$W" . ; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
(python3 -m smalltc.cli info; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv) > "$W/info-$PHASE.txt" 2>&1
if [ "$PHASE" = A ]; then
  timeout 200 python3 -m pytest -q -n 12 -p no:cacheprovider tests > "$W/pytest_gpu_full.log" 2>&1
  echo "pytest rc=$?"; tail -n 2 "$W/pytest_gpu_full.log"; pack
  mkdir -p build/tune_sb/tables; cp tuning/tables/*.json build/tune_sb/tables/
  for dt in float64 float32; do
    timeout 100 python3 -m smalltc.cli tune --op pairwise --dtype $dt --sizes assembly:2:6:8 assembly:3:6:8 \
      --work build/tune_sb --out build/tune_sb/tables --no-progress 2>&1 \
      | tee "$W/tune_sb_$dt.log" | grep -E "contract9|table:|sizes;|rror"
  done
  tar czf "$W/tune_sb.tgz" build/tune_sb; pack
  timeout 40 python3 notes/launch_floor.py --n 2 4 > "$W/launch_floor.json" 2>&1; grep -A3 '"n2"' "$W/launch_floor.json" | head -4
fi
cp build/tune_sb/tables/sm90-float*.json tuning/tables/ 2>/dev/null || echo "no build/tune_sb tables: shipped tables"
DT=$([ "$PHASE" = A ] && echo float64 || echo float32)
SMALLTC_BENCH_NO=torch,cublas timeout "${T_BENCH:-330}" python3 -m smalltc.cli bench --no-progress --dtype $DT \
  --suite gemm --suite action --suite assembly --suite pairwise --out "$W/bench-$DT" > "$W/bench-$DT.log" 2>&1
echo "bench $DT rc=$?"; pack
grep -E "^(gemm m=(2|4|8|16|32) n=\S+ k=\S+ beta=1|action dim=3 p=[1-8] nq=\S+ ncomp=1 |assembly dim=3|step \(2c\) dim=3 p=[4-6])" "$W/bench-$DT.log" | head -n 40
