#!/usr/bin/env bash
# Later call of a session (machine warm): GEMM suites, first with the torch and
# raw-cuBLAS baselines off (cupy.matmul is the cuBLAS baseline), then float64
# once more with torch on, in its own folder (it may crash the process).
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/gpu_work3; mkdir -p "$OUT" "$W/bench" "$W/bench_torch"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
pack() { tar czf "$OUT/results3.tgz" -C "$W" bench bench_torch; }
SMALLTC_BENCH_NO=torch,cublas timeout 110 python3 -m smalltc.cli bench --out "$W/bench" --no-progress \
  --dtype float64 --suite gemm > "$OUT/bench3_f64.log" 2>&1; echo "gemm f64 rc=$?"; pack
SMALLTC_BENCH_NO=torch,cublas timeout 80 python3 -m smalltc.cli bench --out "$W/bench" --no-progress \
  --dtype float32 --suite gemm > "$OUT/bench3_f32.log" 2>&1; echo "gemm f32 rc=$?"; pack
SMALLTC_BENCH_NO=cublas timeout 100 python3 -X faulthandler -m smalltc.cli bench --out "$W/bench_torch" \
  --no-progress --dtype float64 --suite gemm > "$OUT/bench3_torch.log" 2>&1; echo "gemm f64 torch rc=$?"; pack
grep -B2 -A12 "Fatal Python" "$OUT/bench3_torch.log" | head -30
tail -n 42 "$OUT/bench3_f64.log"
