#!/usr/bin/env bash
# One device-machine session: install, GPU tests, GPU benchmark, demo.
# Run from the repo root on the device machine: bash scripts/gpu_session.sh
# What must come back lands under $OUT: logs, and results.tgz (bench JSON and
# PNGs, demo) re-packed after every step so a later step's time-out loses
# nothing earlier. Each step has its own time box (seconds, overridable).
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/gpu_work; mkdir -p "$OUT" "$W/bench" "$W/demo"
export PYTHONUNBUFFERED=1
pack() { tar czf "$OUT/results.tgz" -C "$W" bench demo; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import cupy, numpy, numba; print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__)"
} > "$OUT/env.txt" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
python3 -m smalltc.cli info >> "$OUT/env.txt" 2>&1; cat "$OUT/env.txt"

XDIST=""; python3 -c "import xdist" 2>/dev/null && XDIST="-n 12"
timeout "${T_TEST:-110}" python3 -m pytest -q -rfE $XDIST -p no:cacheprovider \
  tests/test_operations.py tests/test_errors.py tests/test_cuda_kernels.py \
  tests/test_cuda_runtime.py tests/test_fem_gpu.py tests/test_tuning_gpu.py \
  -k "cupy or cuda or gpu or GPU or mixing" > "$OUT/pytest_gpu.log" 2>&1
echo "pytest rc=$?"; tail -n 15 "$OUT/pytest_gpu.log"

bench() {  # bench TIMEOUT LOG ARGS...
  local t=$1 log=$2; shift 2
  timeout "$t" python3 -m smalltc.cli bench --out "$W/bench" --no-progress "$@" >> "$OUT/$log" 2>&1
  echo "bench $* rc=$?"; pack
}
bench "${T_GEMM:-90}"   bench_f64.log --dtype float64 --suite gemm
bench "${T_ACTION:-140}" bench_f64.log --dtype float64 --suite action
bench "${T_ASM:-35}"    bench_f64.log --dtype float64 --suite assembly
bench "${T_PW:-50}"     bench_f64.log --dtype float64 --suite pairwise --dim 3 --p 2,4,6,8
python3 -m smalltc.cli bench --merge "$W"/bench/bench-*float64.json --out "$W/bench" >> "$OUT/bench_f64.log" 2>&1
bench "${T_F32:-60}"    bench_f32.log --dtype float32 --suite gemm --suite action --dim 3
timeout "${T_DEMO:-55}" python3 -m smalltc.cli demo --budget 45 --out "$W/demo" > "$OUT/demo.log" 2>&1
echo "demo rc=$?"; pack
tail -n 40 "$OUT/demo.log"
grep -E "^\s*(gemm|action|assembly)" "$OUT/bench_f64.log" | head -0
ls -la "$OUT"
