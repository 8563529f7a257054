"""Where the time of a small GEMM at 100,000 matrices goes (beta = 1, out separate, as
`smalltc bench`): per n, in one process,

- ``call_us``: the bench's timer (``smalltc._timing.time_calls``: back-to-back plan
  calls between CUDA events, median of 20) -- host and device together;
- ``host_us``: host wall time per call of the same loop;
- ``device_us``: the same call captured 50 times in a CUDA graph, per call (the device
  alone: no Python between kernels);
- ``bytes_us``: the bytes at the copy bandwidth measured in the same run (the bound),
  and each time as a % of it; ``footprint_mb`` against the 50 MB L2;
- ``launch_floor_us``: an empty kernel through the driver (smalltc's Launcher path) and
  through ``cupy.RawKernel``.

Usage (GPU machine): python3 notes/gemm_small_evidence.py [--n 2 3 4 5 6 7 8] > out.json
"""
import argparse
import json
import statistics
import struct
import time

import cupy as cp
import numpy as np

import smalltc
import smalltc.roofline
from smalltc import _timing
from smalltc.backends import _cuda_runtime as RT


def host_per_call(fn, n=2000):
    for _ in range(50):
        fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t0) / n
    cp.cuda.Device().synchronize()
    return t * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[2, 3, 4, 5, 6, 7, 8])
    ap.add_argument("--batch", type=int, default=100_000)
    args = ap.parse_args()
    bw = smalltc.roofline.bandwidth("gpu")
    res = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "cupy": cp.__version__, "bandwidth_GBps": bw / 1e9, "batch": args.batch}
    empty = cp.RawKernel(r'extern "C" __global__ void empty(long long n) {}', "empty")
    empty((1,), (32,), (np.int64(0),))
    direct = RT.Launcher(empty, "q", 1, 32, 0)
    res["launch_floor_us"] = {
        "rawkernel": host_per_call(lambda: empty((1,), (32,), (np.int64(0),))),
        "driver": host_per_call(lambda: direct(0))}
    assert struct.calcsize("q") == 8
    for n in args.n:
        A, B, C = (cp.random.random((args.batch, n, n)) + 0.5 for _ in range(3))
        out = cp.empty_like(A)
        pl = smalltc.plan("gemm", A, B, C, beta=1.0)

        def call():
            pl(A, B, C, out=out, beta=1.0)
        call_us = statistics.median(_timing.time_calls(call, repeats=20, on_gpu=True)) * 1e-3
        dev_us = statistics.median(_timing.graph_times(call, repeats=20, calls=50)) * 1e-3
        bytes_us = 4 * A.nbytes / bw * 1e6
        res[f"n{n}"] = dict(call_us=call_us, host_us=host_per_call(call), device_us=dev_us,
                            bytes_us=bytes_us, footprint_mb=4 * A.nbytes / 1e6,
                            call_pct=100 * bytes_us / call_us, device_pct=100 * bytes_us / dev_us,
                            kernel=str(pl.kernel), source=pl.source)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
