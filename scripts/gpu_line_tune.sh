#!/usr/bin/env bash
# Session 4: the line form of the 3D action in the runtime and the tuner (kind nvidia-h100-x1).
#   PHASE=1: install, GPU tests of the action (line form included), then the action search
#            float64 from scratch into build/tune_line (tables start as the shipped ones).
#   PHASE=2 (carry=["build/tune_line"]): finish float64, search float32, then `smalltc bench
#            --suite action` untuned and tuned (float64, float32; baselines in the tuned runs).
# Everything comes back in $OUT/line-tune-$PHASE.tgz.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/lt; mkdir -p "$OUT" "$W" build/tune_line/tables
export PYTHONUNBUFFERED=1
T0=$(date +%s)
pack() { tar czf "$W/tune_line.tgz" build/tune_line; tar czf "$OUT/line-tune-$PHASE.tgz" -C "$W" . ; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
for f in tuning/tables/*.json; do [ -e "build/tune_line/tables/${f##*/}" ] || cp "$f" build/tune_line/tables/; done
if [ "$PHASE" = 1 ]; then
  timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_cuda_kernels.py \
    tests/test_cuda_action_variants.py tests/test_cuda_runtime.py tests/test_operations.py \
    -k "action or line or stream or Action" > "$W/pytest_line.log" 2>&1
  echo "pytest rc=$?"; tail -n 3 "$W/pytest_line.log"; pack
  JOBS="float64"
else
  JOBS="float64 float32"
fi
for dt in $JOBS; do
  left=$(( ${BUDGET:-540} - $(date +%s) + T0 ))
  [ "$left" -gt 40 ] || { echo "budget spent before $dt"; break; }
  python3 -m smalltc.cli tune --op action --dtype $dt --work build/tune_line --out build/tune_line/tables \
    --resume --budget-seconds "$left" --no-progress --plot 2>&1 | tee -a "$W/tune_action_$dt.log" \
    | grep -E "action/3d|sizes;|table:|rror|plot"
  pack
done
if [ "$PHASE" = 2 ] && [ "$(( $(date +%s) - T0 ))" -lt 400 ]; then
  cp build/tune_line/tables/sm90-float*.json tuning/tables/
  for dt in float64 float32; do
    SMALLTC_TUNING=off timeout 60 python3 -m smalltc.cli bench --no-progress --dtype $dt --suite action \
      --no-baselines --no-plot --out "$W/action-untuned-$dt" > "$W/action-untuned-$dt.log" 2>&1
    SMALLTC_BENCH_NO=torch,cublas timeout 90 python3 -m smalltc.cli bench --no-progress --dtype $dt \
      --suite action --out "$W/action-tuned-$dt" > "$W/action-tuned-$dt.log" 2>&1
    echo "bench $dt rc=$?"; grep -E "^action dim=3 p=[1-8] nq=\S+ ncomp=1 " "$W/action-tuned-$dt.log"; pack
  done
fi
pack
