#!/usr/bin/env bash
# Session 4 device call: the folded kernel (9) (GPU tests, its three new pairwise table
# sizes per dtype, the pairwise bench), the in-process A/B of the doubtful small GEMMs,
# and the launch-floor profile. carry=["build/tune"], kind nvidia-h100-x1.
#   bash scripts/gpu_session4.sh
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" build/tune/tables
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt"
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_kernels.py \
  -k "contract or assembly" > "$OUT/pytest_fold.log" 2>&1; echo "pytest rc=$?"; tail -n 2 "$OUT/pytest_fold.log"
for dt in float64 float32; do
  timeout 120 python3 -m smalltc.cli tune --op pairwise --dtype $dt --work build/tune --out build/tune/tables \
    --resume --no-progress 2>&1 | tee -a build/tune/log.txt | grep -E "k1l(25|36|49) |table:|sizes;|error|Error"
done
tar czf "$OUT/tune.tgz" build/tune
cp build/tune/tables/sm90-float*.json tuning/tables/
A=(--case "gemm m=2 n=2 k=2 beta=1 batch_class=paper" --case "gemm m=3 n=3 k=3 beta=1 batch_class=paper"
   --case "gemm m=4 n=4 k=4 beta=1 batch_class=paper" --case "gemm m=6 n=6 k=6 beta=1 batch_class=paper")
timeout 90 python3 notes/ab_cases.py --dtype float32 "${A[@]}" --json "$OUT/ab_gemm_f32.json" 2>&1 | tail -n 6
timeout 90 python3 notes/ab_cases.py --dtype float64 "${A[@]}" --json "$OUT/ab_gemm_f64.json" 2>&1 | tail -n 6
timeout 60 python3 notes/launch_floor.py --n 2 4 --profile > "$OUT/launch_floor_profile.txt" 2>&1
head -n 12 "$OUT/launch_floor_profile.txt"
for dt in float64 float32; do
  timeout 100 python3 -m smalltc.cli bench --no-progress --dtype $dt --suite pairwise --p 4-6 --dim 3 \
    --out "$OUT/pw-$dt" > "$OUT/pw-$dt.log" 2>&1; echo "bench pw $dt rc=$?"
  grep -E "\(2c\)" "$OUT/pw-$dt.log" | head -n 8
done
