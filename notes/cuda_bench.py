"""Timing script for the CUDA backend (SPEC section 5), one run on one GPU.

CUDA events around each timed call, 3 warm-ups, median of 20, random inputs,
footprints >= 256 MB (plus the paper's 100,000-matrix GEMM batch); baselines
in the same run: measured copy bandwidth, cuBLAS (cupy.matmul), the cupy
einsum chain (the reference backend on CuPy arrays). Each figure is a ratio
measured in this run.

    python notes/cuda_bench.py [--dtypes float64,float32] [--only gemm,action,assembly,action2d]
                               [--json PATH] [--pairwise]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import cupy as cp

import smalltc
from smalltc.backends import reference as R

REPS, WARM = 20, 3
FOOT = 512 * 2 ** 20          # bytes touched per timed call (>= 256 MB)


def timeit(fn, reps=REPS, warm=WARM, inner=5):
    """Median over ``reps`` samples of the time per call; a sample is ``inner``
    back-to-back calls between two events, so the host's per-call Python work
    (plan checks, launch) overlaps the device's and is not counted as idle GPU."""
    for _ in range(warm):
        fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(reps):
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        ts.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3 / inner)
    return float(np.median(ts))


def copy_bw():
    n = 2 ** 30 // 8
    a = cp.random.random(n)
    b = cp.empty_like(a)
    t = timeit(lambda: cp.copyto(b, a))
    return 2 * a.nbytes / t


def free():
    cp.get_default_memory_pool().free_all_blocks()


def bench_gemm(dt, bw, rows):
    s = np.dtype(dt).itemsize
    for n in (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32):
        for batch in (100_000, max(100_000, FOOT // (3 * n * n * s))):
            A = cp.random.standard_normal((batch, n, n)).astype(dt)
            B = cp.random.standard_normal((batch, n, n)).astype(dt)
            C = cp.empty((batch, n, n), dt)
            p = smalltc.plan("gemm", A, B, backend="cuda")
            t = timeit(lambda: p(A, B, out=C))
            ref = cp.matmul(A, B)
            err = float(cp.linalg.norm(C - ref) / cp.linalg.norm(ref))
            tb = timeit(lambda: cp.matmul(A, B, out=C))
            bytes_ = 3 * batch * n * n * s
            tmin = bytes_ / bw
            rows.append(dict(op="gemm", dtype=dt, n=n, batch=batch, t=t, t_cublas=tb,
                             frac_pmax=tmin / t, vs_cublas=tb / t, err=err,
                             gflops=2 * n ** 3 * batch / t * 1e-9, params=p.params))
            print(f"gemm {dt} n={n:2d} batch={batch:8d}  {rows[-1]['gflops']:8.1f} GF/s  "
                  f"{100 * tmin / t:5.1f}% Pmax  cuBLAS {100 * tmin / tb:5.1f}%  "
                  f"x{tb / t:6.2f}  err {err:.1e}", flush=True)
            del A, B, C, ref
            free()


def bench_action(dt, bw, rows, dim, pairwise, ps=range(1, 9)):
    s = np.dtype(dt).itemsize
    for p in ps:
        for nq in (p + 1, p + 2):
            nd = p + 1
            per = s * (2 * nd ** dim + nq ** dim)
            E = max(1000, FOOT // per)
            B1d = cp.random.standard_normal((nq, nd)).astype(dt)
            D = (cp.random.random((E,) + (nq,) * dim) + 0.5).astype(dt)
            V = cp.random.standard_normal((E,) + (nd,) * dim).astype(dt)
            U = cp.empty_like(V)
            pf = smalltc.plan("action", B1d, D, V, backend="cuda", method="fused")
            t = timeit(lambda: pf(B1d, D, V, out=U))
            sl = slice(0, 2000)
            ref = R.action_einsum(B1d[...], D[sl], V[sl], dim)
            err = float(cp.linalg.norm(U[sl] - ref) / cp.linalg.norm(ref))
            te = timeit(lambda: R.action_einsum(B1d, D, V, dim), reps=5, warm=1, inner=1)
            row = dict(op=f"action{dim}d", dtype=dt, p=p, nq=nq, E=E, t=t, t_einsum=te,
                       frac_bound=per * E / bw / t, vs_einsum=te / t, err=err,
                       gdofs=E * nd ** dim / t * 1e-9, params=pf.params, kernel=pf.kernel)
            msg = ""
            if pairwise:
                pp = smalltc.plan("action", B1d, D, V, backend="cuda", method="pairwise")
                tp = timeit(lambda: pp(B1d, D, V, out=U), reps=10, inner=2)
                # the pairwise path's own bound: every step reads its inputs, writes its output
                pbytes = 0
                for st in smalltc.catalogue.steps("action", dim):
                    e = st.extents(nd, nq)
                    xs = e["i"] * e["s"] * e["j"] if st.x[0] != "B" else 0
                    ys = e["k"] * e["s"] * e["l"] if st.y[0] != "B" else 0
                    os_ = e["i"] * e["j"] * e["k"] * e["l"]
                    pbytes += s * E * (xs + ys + os_ + (2 * nq ** dim if st.scale else 0))
                row.update(t_pairwise=tp, pairwise_frac_own_bound=pbytes / bw / tp,
                           fused_vs_pairwise=tp / t)
                msg = f"  pairwise {100 * pbytes / bw / tp:5.1f}% own bound, fused x{tp / t:5.2f}"
            rows.append(row)
            print(f"action{dim}d {dt} p={p} nq={nq:2d} E={E:8d}  {row['gdofs']:7.1f} GDoF/s  "
                  f"{100 * row['frac_bound']:5.1f}% bound  einsum x{te / t:6.1f}  err {err:.1e}"
                  f"{msg}", flush=True)
            del B1d, D, V, U
            free()


def bench_assembly(dt, bw, rows, ps=range(1, 7)):
    s = np.dtype(dt).itemsize
    for p in ps:
        for nq in (p + 1, p + 2):
            nd = p + 1
            per = s * (nq ** 3 + nd ** 6)
            E = max(100, FOOT // per)
            B1d = cp.random.standard_normal((nq, nd)).astype(dt)
            D = (cp.random.random((E, nq, nq, nq)) + 0.5).astype(dt)
            M = cp.empty((E, nd ** 3, nd ** 3), dt)
            pf = smalltc.plan("assembly", B1d, D, backend="cuda")
            t = timeit(lambda: pf(B1d, D, out=M))
            sl = slice(0, 50)
            ref = R.assembly_einsum(B1d, D[sl], 3)
            err = float(cp.linalg.norm(M[sl] - ref) / cp.linalg.norm(ref))
            row = dict(op="assembly3d", dtype=dt, p=p, nq=nq, E=E, t=t, frac_bound=per * E / bw / t,
                       err=err, params=pf.params)
            rows.append(row)
            print(f"assembly3d {dt} p={p} nq={nq:2d} E={E:7d}  {100 * row['frac_bound']:5.1f}% bound"
                  f"  {t * 1e3:7.3f} ms  err {err:.1e}", flush=True)
            del B1d, D, M
            free()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("--only", default="gemm,action,action2d,assembly")
    ap.add_argument("--json", default=None)
    ap.add_argument("--pairwise", action="store_true")
    ap.add_argument("--ps", default="1,2,3,4,5,6,7,8")
    a = ap.parse_args(argv)
    ps = [int(x) for x in a.ps.split(",")]
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    name = dev["name"].decode() if isinstance(dev["name"], bytes) else dev["name"]
    bw = copy_bw()
    print(f"device {name}; copy bandwidth {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    rows = []
    t0 = time.time()
    def save():
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(device=name, copy_bw=bw, reps=REPS, rows=rows,
                               seconds=time.time() - t0, argv=sys.argv[1:]), f, indent=1,
                          default=str)

    for dt in a.dtypes.split(","):
        only = a.only.split(",")
        if "action" in only:
            bench_action(dt, bw, rows, 3, a.pairwise, ps)
        if "assembly" in only:
            bench_assembly(dt, bw, rows, [p for p in ps if p <= 6])
        save()
        if "gemm" in only:
            bench_gemm(dt, bw, rows)
        save()
        if "action2d" in only:
            bench_action(dt, bw, rows, 2, a.pairwise, ps)
        save()


if __name__ == "__main__":
    main()
