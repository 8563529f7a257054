"""Host cost of one call, from Python, on a GPU: where the tiny-GEMM time goes.

Prints JSON with microseconds per call, each the mean of back-to-back calls
(host wall time over N calls, then one synchronize; the GPU work of these calls
is shorter than their launch, so the host is what is measured) and, for the
kernels, the device time per call from CUDA events around the same loop:

- ``empty_rawkernel``: an empty ``cupy.RawKernel`` launch, the floor of any
  CuPy-launched kernel;
- ``executor``: smalltc's compiled GEMM kernel launched through its executor
  (no checks);
- ``plan``: ``plan(A, B, out=C)``: the checked call;
- ``api``: ``smalltc.batched_gemm(A, B, out=C)``: spec and plan lookup too;
- ``plan_beta1``: ``plan(A, B, C, out=D, beta=1)``: the bench's GEMM call;
- ``api_beta1``: ``smalltc.batched_gemm(A, B, C, beta=1, out=D)``;
- ``api_alloc``: ``smalltc.batched_gemm(A, B)``: the result allocated per call;
- ``*_rawkernel``: the same with every launch through ``cupy.RawKernel.__call__``
  (``SMALLTC_DIRECT_LAUNCH=0``'s path; plans built afresh), in the same process;
- ``cupy_matmul``: ``cupy.matmul(A, B, out=C)`` (cuBLAS);
- the bytes' own time at the measured copy bandwidth.

With ``--profile``, also a cProfile of 2,000 ``plan(A, B, out=C)`` and
``batched_gemm`` calls at the first n (the functions that take the host time).

Usage (on the GPU machine): python3 notes/launch_floor.py [--n 2] [--batch 100000] [--profile]
"""
import argparse
import cProfile
import io
import json
import pstats
import time

import cupy as cp
import numpy as np

import smalltc
import smalltc.roofline
from smalltc import api
from smalltc.backends import _cuda_runtime as RT
from smalltc.plan import clear_plans


def per_call(fn, n=2000, warm=50):
    for _ in range(warm):
        fn()
    cp.cuda.Device().synchronize()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    t0 = time.perf_counter()
    e0.record()
    for _ in range(n):
        fn()
    e1.record()
    host = (time.perf_counter() - t0) / n
    e1.synchronize()
    dev = cp.cuda.get_elapsed_time(e0, e1) * 1e-3 / n
    return {"host_us": host * 1e6, "events_us": dev * 1e6}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--profile", action="store_true", help="cProfile the plan and API calls")
    args = ap.parse_args()
    empty = cp.RawKernel(r'extern "C" __global__ void empty(int n) {}', "empty")
    res = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "cupy": cp.__version__, "empty_rawkernel": per_call(lambda: empty((1,), (32,), (np.int32(0),)))}
    bw = smalltc.roofline.bandwidth("gpu")
    res["bandwidth_GBps"] = bw / 1e9
    rng = np.random.default_rng(0)
    for n in args.n:
        A = cp.asarray(rng.random((args.batch, n, n)))
        B = cp.asarray(rng.random((args.batch, n, n)))
        C = cp.empty_like(A)
        D = cp.asarray(rng.random((args.batch, n, n)))
        RT.DIRECT_LAUNCH = False
        clear_plans()
        api._GEMM_PLANS.clear()
        raw = smalltc.plan("gemm", A, B, D, beta=1.0)
        raw_rows = {
            "plan_beta1_rawkernel": per_call(lambda: raw(A, B, D, out=C, beta=1.0)),
            "api_beta1_rawkernel": per_call(lambda: smalltc.batched_gemm(A, B, D, beta=1.0, out=C)),
        }
        RT.DIRECT_LAUNCH = True
        clear_plans()
        api._GEMM_PLANS.clear()
        pl = smalltc.plan("gemm", A, B)
        pl1 = smalltc.plan("gemm", A, B, D, beta=1.0)
        ex = pl.executor
        row = dict(raw_rows)
        row.update({
            "executor": per_call(lambda: ex.run((A, B, None), C)),
            "plan": per_call(lambda: pl(A, B, out=C)),
            "api": per_call(lambda: smalltc.batched_gemm(A, B, out=C)),
            "plan_beta1": per_call(lambda: pl1(A, B, D, out=C, beta=1.0)),
            "api_beta1": per_call(lambda: smalltc.batched_gemm(A, B, D, beta=1.0, out=C)),
            "api_alloc": per_call(lambda: smalltc.batched_gemm(A, B)),
            "cupy_matmul": per_call(lambda: cp.matmul(A, B, out=C)),
            "bytes_us": 3 * A.nbytes / bw * 1e6,
            "bytes_beta1_us": 4 * A.nbytes / bw * 1e6,
            "plan_repr": repr(pl),
        })
        res[f"n{n}"] = row
        if args.profile and n == args.n[0]:
            for name, fn in (("plan", lambda: pl(A, B, out=C)),
                             ("plan_beta1", lambda: pl1(A, B, D, out=C, beta=1.0)),
                             ("api", lambda: smalltc.batched_gemm(A, B, out=C))):
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(2000):
                    fn()
                prof.disable()
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
                res[f"profile_{name}_n{n}"] = buf.getvalue()
    cp.cuda.Device().synchronize()
    print(json.dumps({k: v for k, v in res.items() if not k.startswith("profile_")}, indent=1))
    for k, v in res.items():
        if k.startswith("profile_"):
            print(f"--- {k}\n{v}")


if __name__ == "__main__":
    main()
