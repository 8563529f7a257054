#!/usr/bin/env bash
# Session 5's closing device call (kind nvidia-h100-x1): the whole test suite on the GPU
# with the shipped tables (after the last template changes), then `smalltc bench`
# float64 and float32, every suite, baselines in the same run. Back in $OUT/final.tgz.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/final; mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1
pack() { tar czf "$OUT/final.tgz" -C "$W" . ; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
(python3 -m smalltc.cli info; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv) > "$W/info.txt" 2>&1
timeout 240 python3 -m pytest -q -n 12 -p no:cacheprovider tests > "$W/pytest_gpu_full.log" 2>&1
echo "pytest rc=$?"; tail -n 1 "$W/pytest_gpu_full.log"; grep -E "^FAILED|^ERROR" "$W/pytest_gpu_full.log" | head; pack
for dt in float64 float32; do
  timeout 110 python3 -m smalltc.cli bench --no-progress --dtype $dt --suite gemm --suite action \
    --suite assembly --suite pairwise --out "$W/bench-$dt" > "$W/bench-$dt.log" 2>&1
  echo "bench $dt rc=$?"; pack
done
