#!/usr/bin/env bash
# Device call: finish what fits of the pairwise tuning, then the tuner's evidence
# (notes/tuning.md): GPU tests with the tables installed, and `smalltc bench`
# untuned (SMALLTC_TUNING=off) against tuned, back to back, each in its own
# process, float64 (plus a second untuned run: the run-to-run noise) and float32.
# Everything comes back as $OUT/evidence.tgz (and build/tune as $OUT/tune.tgz).
#   PW_BUDGET=130 bash scripts/gpu_evidence.sh
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/evidence; mkdir -p "$OUT" "$W" build/tune
export PYTHONUNBUFFERED=1
pack() { tar czf "$OUT/evidence.tgz" -C "$W" .; tar czf "$OUT/tune.tgz" build/tune; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
if [ "${PW_BUDGET:-0}" -gt 0 ]; then
  python3 -m smalltc.cli tune --op pairwise --dtype float64 --work build/tune --out build/tune/tables \
    --resume --budget-seconds "$PW_BUDGET" --no-progress --plot 2>&1 | tee -a build/tune/log.txt | tail -n 3
fi
mkdir -p tuning/tables; cp build/tune/tables/sm90-float*.json tuning/tables/
(python3 -m smalltc.cli info; nvidia-smi --query-gpu=name,driver_version --format=csv) > "$W/info.txt" 2>&1
timeout "${T_TEST:-90}" python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_operations.py \
  tests/test_cuda_kernels.py tests/test_cuda_runtime.py tests/test_tuning_gpu.py tests/test_tuning_tables.py \
  -k "cupy or cuda or gpu or table" > "$W/pytest_tables.log" 2>&1
echo "pytest rc=$?"; tail -n 2 "$W/pytest_tables.log"; pack
bench() {  # bench NAME TUNING ARGS...
  local name=$1 tuning=$2; shift 2
  SMALLTC_TUNING=$tuning timeout "${T_BENCH:-75}" python3 -m smalltc.cli bench --no-progress \
    --out "$W/$name" "$@" > "$W/$name.log" 2>&1
  echo "bench $name rc=$?"; pack
}
S=${SUITES:-"--suite gemm --suite action --suite assembly"}
bench f64-untuned off --dtype float64 $S --no-baselines --no-plot
bench f64-tuned on --dtype float64 $S
bench f64-untuned2 off --dtype float64 $S --no-baselines --no-plot
bench f32-untuned off --dtype float32 $S --no-baselines --no-plot
bench f32-tuned on --dtype float32 $S
for c in "f64-untuned f64-tuned" "f64-untuned f64-untuned2" "f32-untuned f32-tuned"; do
  set -- $c
  python3 -m smalltc.cli bench --compare "$W/$1"/bench-*.json "$W/$2"/bench-*.json > "$W/compare-$1-vs-$2.txt" 2>&1
  grep -i "geometric" "$W/compare-$1-vs-$2.txt"
done
pack
