"""Is a kernel launch through the driver (``cupy.cuda.driver.launchKernel`` with the
arguments packed by ``struct.pack_into`` into a reused buffer) cheaper on the host than
``cupy.RawKernel.__call__``? Microseconds per back-to-back call (host wall time over N
calls, GPU work shorter than the launch), for an empty kernel and for smalltc's
GEMM kernel (n = 2, beta = 1, 100,000 matrices), plus the pieces of a call
(current stream, ``a.data.ptr``). Checks that the driver launch writes the same result.

Usage (GPU machine): python3 notes/launch_direct.py
"""
import ctypes
import json
import struct
import time

import cupy as cp
import numpy as np

import smalltc


def per_call(fn, n=3000, warm=100):
    for _ in range(warm):
        fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n
    cp.cuda.Device().synchronize()
    return round(host * 1e6, 2)


def main():
    res = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "cupy": cp.__version__}
    empty = cp.RawKernel(r'extern "C" __global__ void empty(long long n) {}', "empty")
    empty((1,), (32,), (np.int64(0),))
    fptr = empty.kernel.ptr
    buf = ctypes.create_string_buffer(8)
    ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
    pa = ctypes.addressof(ptrs)
    launch = cp.cuda.driver.launchKernel
    res["empty_rawkernel"] = per_call(lambda: empty((1,), (32,), (np.int64(0),)))

    def empty_direct():
        struct.pack_into("q", buf, 0, 0)
        launch(fptr, 1, 1, 1, 32, 1, 1, 0, cp.cuda.get_current_stream().ptr, pa, 0)
    res["empty_direct"] = per_call(empty_direct)
    res["empty_direct_stream0"] = per_call(lambda: launch(fptr, 1, 1, 1, 32, 1, 1, 0, 0, pa, 0))
    res["get_current_stream_ptr"] = per_call(lambda: cp.cuda.get_current_stream().ptr)

    E, n = 100_000, 2
    A, B, C = (cp.random.random((E, n, n)) for _ in range(3))
    out1, out2 = cp.full((E, n, n), np.nan), cp.full((E, n, n), np.nan)
    pl = smalltc.plan("gemm", A, B, C, beta=1.0)
    ex = pl.executor
    res["data_ptr"] = per_call(lambda: A.data.ptr)
    res["executor_rawkernel"] = per_call(lambda: ex.run((A, B, C), out1, alpha=1.0, beta=1.0))
    res["plan_beta1"] = per_call(lambda: pl(A, B, C, out=out1, beta=1.0))
    kern = ex._kernel_here()
    gptr = kern.kernel.ptr
    blocks = min(-(-E // ex.per_block), 2 ** 31 - 1)
    fmt = "PPPPddq"
    gbuf = ctypes.create_string_buffer(struct.calcsize(fmt))
    offs = [struct.calcsize(fmt[:i]) for i in range(len(fmt))]
    gptrs = (ctypes.c_void_p * len(fmt))(*[ctypes.addressof(gbuf) + o for o in offs])
    gpa = ctypes.addressof(gptrs)
    threads, smem = ex.threads, ex.smem

    def gemm_direct(out):
        struct.pack_into(fmt, gbuf, 0, A.data.ptr, B.data.ptr, out.data.ptr, C.data.ptr,
                         1.0, 1.0, E)
        launch(gptr, blocks, 1, 1, threads, 1, 1, smem, cp.cuda.get_current_stream().ptr, gpa, 0)
    gemm_direct(out2)
    ex.run((A, B, C), out1, alpha=1.0, beta=1.0)
    cp.cuda.Device().synchronize()
    res["direct_equals_rawkernel"] = bool(cp.array_equal(out1, out2))
    res["max_err_vs_matmul"] = float(cp.abs(out2 - (A @ B + C)).max())
    res["executor_direct"] = per_call(lambda: gemm_direct(out2))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
