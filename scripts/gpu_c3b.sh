#!/usr/bin/env bash
# The 3D action at ncomp = 3, float64, tuned with the component axis (kind nvidia-h100-x1),
# then the action suite untuned and tuned. Back in $OUT/c3b.tgz.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/c3b; mkdir -p "$OUT" "$W" build/tune_c3/tables
export PYTHONUNBUFFERED=1
pack() { tar czf "$W/tune_c3.tgz" build/tune_c3; tar czf "$OUT/c3b.tgz" -C "$W" . ; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
cp tuning/tables/*.json build/tune_c3/tables/
timeout 200 python3 -m smalltc.cli tune --op action --dtype float64 --sizes "3:1-8:p+1,p+2:c3" \
  --work build/tune_c3 --out build/tune_c3/tables --budget-seconds 180 --no-progress 2>&1 \
  | tee "$W/tune_c3_float64.log" | grep -E "^action/3d|sizes;|table:|rror" | tail -n 20
pack
cp build/tune_c3/tables/sm90-float*.json tuning/tables/
for t in off on; do
  SMALLTC_TUNING=$t timeout 50 python3 -m smalltc.cli bench --no-progress --dtype float64 --suite action \
    --dim 3 --no-baselines --no-plot --out "$W/action-$t-float64" > "$W/action-$t-float64.log" 2>&1
  echo "bench tuning=$t rc=$?"; pack
done
