#!/usr/bin/env bash
# Session 5, last device minutes (kind nvidia-h100-x1): does the layout kernel's cp.async
# form (prefetch 1) help the GEMMs with beta != 0 that ncu shows latency-bound? A scratch
# search (nothing installed) of n = 20, 27, 32, float64. Back in $OUT/gemm_beta.tgz.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/gb; mkdir -p "$OUT" "$W"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
timeout 170 python3 -m smalltc.cli tune --op gemm --dtype float64 --sizes "20:nn+beta" "27:nn+beta" \
  "32:nn+beta" --work "$W/tune" --out "$W/tune/tables" --budget-seconds 150 --no-progress 2>&1 \
  | tee "$W/tune.log" | grep -E "^gemm/|sizes;|rror|budget" | cut -c1-170
tar czf "$OUT/gemm_beta.tgz" -C "$W" .
