#!/usr/bin/env bash
# Session 4's last device call (kind nvidia-h100-x1, nothing carried): the GEMM suites
# again on a quiet host (the first final run followed the GPU test suite, and its
# host-bound cases read slow), the launch floor, then Nsight Compute on the kernels
# under target. Everything comes back in $OUT/final2.tgz.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/final2; mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1
pack() { tar czf "$OUT/final2.tgz" -C "$W" . ; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
cat /proc/loadavg > "$W/loadavg.txt"
for dt in float64 float32; do
  SMALLTC_BENCH_NO=torch,cublas timeout 120 python3 -m smalltc.cli bench --no-progress --dtype $dt \
    --suite gemm --out "$W/gemm-$dt" > "$W/gemm-$dt.log" 2>&1; echo "bench gemm $dt rc=$?"; pack
done
timeout 40 python3 notes/launch_floor.py --n 2 4 > "$W/launch_floor.json" 2>&1; pack
CASES="action:3:4:5:float64 action:3:5:6:float64 action:3:6:7:float64 action:3:7:8:float64
action:3:8:9:float64 assembly:3:1:3:float64 assembly:3:2:4:float64 assembly:3:6:8:float64
contract9:8:7:1:49:float64 action:3:8:9:float32"
timeout 300 ncu -k regex:stc_ --section SpeedOfLight --section Occupancy --section LaunchStats \
  --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  python3 notes/cuda_ncu.py $CASES > "$W/ncu.txt" 2> "$W/ncu_cases.txt"
echo "ncu rc=$?"; cat "$W/ncu_cases.txt" | tail -n 12; pack
