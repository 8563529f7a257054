#!/usr/bin/env bash
# Device call: the register-blocked fused action (tuning parameter rb; notes/cuda.md,
# "Register-blocked action"), never run on a GPU before this script. Two steps, ~3-4 min:
#  1. GPU correctness: every forced rb variant (tests/test_cuda_kernels.py
#     test_action_register_blocked: float64 reference, output poisoned with NaN) and the
#     fused action tests of today's kernel;
#  2. timing sweep rb = 1 vs 2, 3 for 3D p = 1..8, nq = p+1, p+2, float64
#     (notes/action_rb_sweep.py: CUDA events, median of 20, >= 256 MB per call).
#  (step 1 also runs the assembly's rows/pad variants, tests/test_cuda_assembly_rows.py;
#  step 3: notes/launch_floor.py --profile, where a tiny GEMM call's host time goes)
# Results under $OUT: info.txt, action_rb_pytest.log, action_rb_sweep.{json,log},
# launch_floor.txt.
#   bash scripts/gpu_action_rb.sh
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
(git log -1 --format='%h %s' 2>/dev/null; python3 -m smalltc.cli info;
 nvidia-smi --query-gpu=name,driver_version --format=csv) > "$OUT/info.txt" 2>&1
N=""; python3 -c "import xdist" 2>/dev/null && N="-n 12"
timeout "${T_TEST:-110}" python3 -m pytest -q $N -p no:cacheprovider -m "not slow" \
  tests/test_cuda_kernels.py tests/test_cuda_assembly_rows.py \
  -k "register_blocked or (test_action and fused) or variants" \
  > "$OUT/action_rb_pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$OUT/action_rb_pytest.log"
timeout "${T_SWEEP:-130}" python3 notes/action_rb_sweep.py --ps 1-8 --dq 1,2 --dtype float64 \
  --json "$OUT/action_rb_sweep.json" > "$OUT/action_rb_sweep.log" 2>&1
echo "sweep rc=$?"; grep -E "^==|compiled|bandwidth|wrote|Error" "$OUT/action_rb_sweep.log"
timeout "${T_FLOOR:-60}" python3 notes/launch_floor.py --n 2 4 --profile > "$OUT/launch_floor.txt" 2>&1
echo "launch_floor rc=$?"
