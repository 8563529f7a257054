"""One launch per configuration, for Nsight Compute (ncu) to profile.

    ncu -k regex:stc_ --launch-skip 1 --launch-count N ... python notes/cuda_ncu.py

Each case runs its fused kernel twice (the first launch warms up).
"""
import sys

import cupy as cp

import smalltc

CASES = [("action", 3, 1, 2, "float64"), ("action", 3, 1, 3, "float64"),
         ("action", 3, 5, 6, "float64"), ("action", 3, 5, 7, "float64"),
         ("assembly", 3, 3, 4, "float32"), ("assembly", 3, 3, 4, "float64")]
FOOT = 256 * 2 ** 20

for op, dim, p, nq, dt in CASES:
    nd = p + 1
    s = cp.dtype(dt).itemsize
    B1d = cp.random.standard_normal((nq, nd)).astype(dt)
    if op == "action":
        E = FOOT // (s * (2 * nd ** dim + nq ** dim))
        D = (cp.random.random((E,) + (nq,) * dim) + .5).astype(dt)
        V = cp.random.standard_normal((E,) + (nd,) * dim).astype(dt)
        pl = smalltc.plan("action", B1d, D, V, backend="cuda")
        ops = (B1d, D, V)
    else:
        E = FOOT // (s * (nq ** dim + nd ** (2 * dim)))
        D = (cp.random.random((E,) + (nq,) * dim) + .5).astype(dt)
        pl = smalltc.plan("assembly", B1d, D, backend="cuda")
        ops = (B1d, D)
    for _ in range(2):
        pl(*ops)
    cp.cuda.runtime.deviceSynchronize()
    print(op, dim, p, nq, dt, pl.kernel, pl.params, file=sys.stderr)
    del ops, D
    cp.get_default_memory_pool().free_all_blocks()
