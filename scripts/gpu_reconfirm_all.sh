#!/usr/bin/env bash
# One device call of the "double form" reconfirm (notes/tuning.md, "Next device session"):
# install, optionally the tuner's GPU tests ($TESTS=1), then `smalltc tune --reconfirm` for
# each "op:dtype" in $JOBS, each given what is left of $BUDGET seconds. build/tune comes
# back as $OUT/tune.tgz after every job. Run with carry=["build/tune"], kind nvidia-h100-x1
# (the checkpoints hold H100 times).
#   TESTS=1 JOBS="assembly:float64 pairwise:float64" BUDGET=520 bash scripts/gpu_reconfirm_all.sh
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" build/tune/tables
export PYTHONUNBUFFERED=1
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
if [ "${TESTS:-0}" = 1 ]; then
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_tuning_gpu.py tests/test_tuning_measure.py 2>&1 | tail -n 3
fi
for job in ${JOBS:-assembly:float64}; do
  op=${job%%:*}; dt=${job##*:}
  left=$(( ${BUDGET:-520} - $(date +%s) + T0 ))
  [ "$left" -gt 40 ] || { echo "budget spent before $job"; break; }
  echo "=== reconfirm $op $dt (budget ${left}s)" | tee -a build/tune/log.txt
  t=$(date +%s)
  python3 -m smalltc.cli tune --op "$op" --dtype "$dt" --work build/tune --out build/tune/tables \
    --reconfirm --budget-seconds "$left" --confirm-top "${TOP:-3}" --no-progress 2>&1 \
    | tee -a build/tune/log.txt | grep -vE "^\s*$" | tail -n "${TAIL:-25}"
  echo "--- $op $dt: rc ${PIPESTATUS[0]}, $(( $(date +%s) - t )) s"
  tar czf "$OUT/tune.tgz" build/tune
done
tar czf "$OUT/tune.tgz" build/tune
