#!/usr/bin/env bash
# One device call of the tuning run (notes/tuning.md, runbook): install, then the
# searches named in $JOBS ("op dtype" pairs, in order) with --resume, each given
# what is left of $BUDGET seconds; build/tune comes back as $OUT/tune.tgz.
# Carry build/tune between machines (run's carry=["build/tune"]) so checkpoints
# travel; a finished search is skipped in seconds.
#   JOBS="gemm:float64 gemm:float32" BUDGET=480 bash scripts/gpu_tune.sh
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" build/tune
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
# new entries merge into the shipped tables (a table is written when a search ends)
mkdir -p build/tune/tables
for f in tuning/tables/*.json; do [ -e "build/tune/tables/${f##*/}" ] || cp "$f" build/tune/tables/; done
T0=$(date +%s)
for job in ${JOBS:-gemm:float64}; do
  op=${job%%:*}; dt=${job##*:}
  left=$(( ${BUDGET:-480} - $(date +%s) + T0 ))
  [ "$left" -gt 30 ] || { echo "budget spent before $job"; break; }
  echo "=== $op $dt (budget ${left}s)" | tee -a build/tune/log.txt
  python3 -m smalltc.cli tune --op "$op" --dtype "$dt" --work build/tune --out build/tune/tables \
    --resume --budget-seconds "$left" --no-progress --plot 2>&1 | tee -a build/tune/log.txt
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "tune $op $dt failed"; break; }
  tar czf "$OUT/tune.tgz" build/tune
done
tar czf "$OUT/tune.tgz" build/tune
ls -la build/tune build/tune/tables 2>/dev/null | tail -n 20
