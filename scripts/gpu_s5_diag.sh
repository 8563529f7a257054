#!/usr/bin/env bash
# Session 5, after the evidence (kind nvidia-h100-x1): the tuned/untuned cases that read
# below 0.97 re-measured in one process (notes/ab_cases.py), and ncu of the cases still
# under the targets (GEMM n >= 18, the 3D action p = 8 nq = 10, the 2D action
# p = 7-8, the 3D assembly p = 1, 2, 6), with the shipped tables. Back in $OUT/diag.tgz.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/diag; mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1
pack() { tar czf "$OUT/diag.tgz" -C "$W" . ; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
timeout 100 python3 notes/ab_cases.py --dtype float64 --rounds 5 --json "$W/ab_f64.json" \
  --case "gemm m=8 n=8 k=8 beta=1 batch_class=large" --case "step (4f) dim=3 p=4 nq=6" \
  --case "step (3c) dim=2 p=2 nq=4" --case "assembly dim=3 p=1 nq=3" --case "step (4f) dim=3 p=5 nq=7" \
  2>&1 | tee "$W/ab_f64.log" | cut -c1-220; pack
timeout 60 python3 notes/ab_cases.py --dtype float32 --rounds 5 --json "$W/ab_f32.json" \
  --case "gemm m=2 n=2 k=2 beta=1 batch_class=paper" --case "step (4a) dim=3 p=3 nq=5" \
  --case "gemm m=5 n=16 k=4 shared_a beta=0 batch_class=paper" 2>&1 | tee "$W/ab_f32.log" | cut -c1-220; pack
timeout 240 ncu -k regex:stc_ --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  --section InstructionStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
  python3 notes/cuda_ncu.py gemm:20:float64 gemm:27:float64 gemm:32:float64 action:3:8:10:float64 \
  action:2:8:9:float64 action:2:7:9:float64 assembly:3:1:3:float64 assembly:3:2:4:float64 assembly:3:6:8:float64 \
  > "$W/ncu_misses.txt" 2> "$W/ncu_misses_cases.txt"; echo "ncu rc=$?"
grep -E "^  stc_|Duration|DRAM Throughput|L1/TEX Cache Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy" "$W/ncu_misses.txt" | cut -c1-110
pack
