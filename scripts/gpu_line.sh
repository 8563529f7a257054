#!/usr/bin/env bash
# Device call (kind nvidia-h100-x1): the line-form 3D action prototype against the
# runtime's plans (notes/action_line.py), float64 and float32, and the in-process A/B
# of tuned against untuned small GEMMs in place with CUDA-graph device times
# (notes/ab_tables.py, n = 2..8). Everything comes back in $OUT/line.tgz.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/line; mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1
pack() { tar czf "$OUT/line.tgz" -C "$W" . ; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
timeout 130 python3 notes/ab_tables.py --rounds 3 --n 2,3,4,5,6,7,8 --batches 100000,4000000 --out inplace \
  --json "$W/ab_tables_n2-8.json" > "$W/ab_tables.log" 2>&1; echo "ab rc=$?"; pack
for dt in float64 float32; do
  timeout 200 python3 notes/action_line.py --dtype $dt --p 1-8 --json "$W/line-$dt.json" 2>&1 | tee "$W/line-$dt.log" | cut -c1-200
  pack
done
