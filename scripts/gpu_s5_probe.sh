#!/usr/bin/env bash
# Session 5, first device call (kind nvidia-h100-x1): the GPU tests of what session 4
# left unrun (the line form across executors and streams, its prefetch variant, the
# tuner's small form), ncu of the line kernels (tabled and prefetch), and a scratch
# action search of the 3D float64 sizes p = 4..8 (the prefetch variant against the
# plain line form). Everything comes back in $OUT/probe.tgz.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/probe; mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1
pack() { tar czf "$OUT/probe.tgz" -C "$W" . ; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > "$W/gpu.txt" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
timeout 170 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_kernels.py \
  tests/test_cuda_runtime.py tests/test_tuning_gpu.py tests/test_tuning_measure.py \
  -k "line or tuning or small or prefetch or stream" > "$W/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 3 "$W/pytest.log"; pack
L="line=1,min_blocks=0"
timeout 150 ncu -k regex:_line --launch-skip 0 --launch-count 12 --section SpeedOfLight \
  --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  python3 notes/cuda_ncu.py action:3:5:6:float64 action:3:8:9:float64 \
  "action:3:8:9:float64@$L,per_block=2,prefetch=0" "action:3:8:9:float64@$L,per_block=2,prefetch=1" \
  "action:3:5:6:float64@$L,per_block=3,prefetch=1" action:3:8:9:float32 \
  > "$W/ncu_line.txt" 2> "$W/ncu_line_cases.txt"; echo "ncu rc=$?"; pack
timeout 240 python3 -m smalltc.cli tune --op action --dtype float64 --sizes "3:4-8:p+1" \
  --work "$W/tune" --out "$W/tune/tables" --budget-seconds 220 --no-progress 2>&1 \
  | tee "$W/tune.log" | grep -E "^action/3d|sizes;|table:|rror|budget"
pack
