#!/usr/bin/env bash
# Session 4's last device call (kind nvidia-h100-x1): tune the 3D action at ncomp = 3 (its
# entries had come from the ncomp = 1 ones by the nearest lookup), then `smalltc bench
# --suite action` untuned and tuned, float64 and float32. Back in $OUT/c3.tgz.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/c3; mkdir -p "$OUT" "$W" build/tune_c3/tables
export PYTHONUNBUFFERED=1
pack() { tar czf "$W/tune_c3.tgz" build/tune_c3; tar czf "$OUT/c3.tgz" -C "$W" . ; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
cp tuning/tables/*.json build/tune_c3/tables/
for dt in float64 float32; do
  timeout 170 python3 -m smalltc.cli tune --op action --dtype $dt --sizes "3:1-8:p+1,p+2:c3" \
    --work build/tune_c3 --out build/tune_c3/tables --resume --no-progress 2>&1 \
    | tee "$W/tune_c3_$dt.log" | grep -E "^action/3d|sizes;|table:|rror"
  pack
done
cp build/tune_c3/tables/sm90-float*.json tuning/tables/
for dt in float64 float32; do
  for t in off on; do
    SMALLTC_TUNING=$t timeout 60 python3 -m smalltc.cli bench --no-progress --dtype $dt --suite action \
      --no-baselines --no-plot --out "$W/action-$t-$dt" > "$W/action-$t-$dt.log" 2>&1
    echo "bench $dt tuning=$t rc=$?"
  done
  pack
done
