#!/usr/bin/env bash
# Device call: the GPU tests with the tables in build/tune/tables installed, then the
# pairwise searches (float64 then float32, resumed from build/tune checkpoints).
#   bash scripts/gpu_tests_pairwise.sh   (run with carry=["build/tune"])
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > $OUT/install.log 2>&1
mkdir -p tuning/tables; cp build/tune/tables/sm90-float*.json tuning/tables/
timeout 120 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_operations.py tests/test_cuda_kernels.py tests/test_cuda_runtime.py tests/test_tuning_gpu.py tests/test_tuning_tables.py tests/test_cuda_assembly_rows.py -k "cupy or cuda or gpu or table or variants" > $OUT/pytest_tables.log 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_tables.log
# tuned vs untuned in one process, alternating (the cases that read < 1 across processes)
timeout 150 python3 notes/ab_tables.py --json $OUT/ab_tables.json 2>&1 | grep -v "^wrote"
JOBS="pairwise:float64 pairwise:float32" BUDGET=${PW_BUDGET:-330} bash scripts/gpu_tune.sh 2>&1 | grep -E "sizes;|table:|budget|failed"
tar czf $OUT/tune.tgz build/tune
