#!/usr/bin/env bash
# Device call (H100: the checkpoints are H100 timings): re-decide the GEMM beta != 0
# sizes timed apart and in place (smalltc tune --reconfirm), write the tables, then the
# in-process A/B of tuned against untuned plans for n = 2..4 (both forms).
#   bash scripts/gpu_reconfirm.sh      (run with carry=["build/tune"], kind nvidia-h100-x1)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
for dt in float64 float32; do
  python3 -m smalltc.cli tune --op gemm --dtype "$dt" --work build/tune --out build/tune/tables \
    --reconfirm --budget-seconds "${RC_BUDGET:-150}" --no-progress 2>&1 | tee -a build/tune/log.txt \
    | grep -E "nn\+beta.*(->|kept)|table:|budget|error"
  tar czf "$OUT/tune.tgz" build/tune
done
cp build/tune/tables/sm90-float*.json tuning/tables/
timeout 100 python3 notes/ab_tables.py --rounds 3 --n 2,3,4 --batches 1000000,4000000 --out both \
  --json "$OUT/ab_after_reconfirm.json" 2>&1 | grep -v "^wrote"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_tuning_gpu.py tests/test_tuning_tables.py 2>&1 | tail -n 2
