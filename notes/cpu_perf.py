"""Hand-run CPU kernel measurements for notes/cpu.md (not a test).

Usage: python notes/cpu_perf.py [gemm|action|assembly ...] [--threads N]

Each line is one run's ratios: ours / Pmax (SPEC section 4, bandwidth and
peak measured in this process) and ours / NumPy baseline (numpy.matmul on
the same stacked arrays; the einsum chain for the action).
"""
import sys
import time

import numpy as np

import smalltc
from smalltc import roofline
from smalltc.backends.reference import action_einsum, assembly_einsum


def best(fn, reps=15):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), float(np.median(ts))


def gemm(rng, beta=1.0, E=100_000):
    for n in (2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32):
        A, B, C = (rng.random((E, n, n)) for _ in range(3))
        t0 = time.perf_counter()
        p = smalltc.plan("gemm", A, B, C, beta=beta, backend="cpu")
        tc = time.perf_counter() - t0
        out = np.empty_like(C)
        t, tmed = best(lambda: p(A, B, C, beta=beta, out=out))
        tn, _ = best(lambda: np.add(np.matmul(A, B), beta * C), reps=3)
        b = roofline.bound(p.spec, device="cpu")
        print(f"gemm n={n:2d} {p.kernel:36s} compile {tc:5.1f}s  {b.flops / t / 1e9:6.1f} GF/s "
              f"Pmax {b.pmax / 1e9:6.1f} ({b.limited_by[:2]})  ours/Pmax {b.fraction(t):.2f} "
              f"(median {b.fraction(tmed):.2f})  ours/numpy {tn / t:5.1f}", flush=True)


def action(rng, dim=3, target=256 * 2**20):
    for p in range(1, 9):
        nd, nq = p + 1, p + 2
        E = target // (8 * (2 * nd ** dim + nq ** dim))
        B1d = rng.random((nq, nd))
        D = rng.random((E,) + (nq,) * dim)
        V = rng.random((E,) + (nd,) * dim)
        t0 = time.perf_counter()
        pl = smalltc.plan("action", B1d, D, V, backend="cpu")
        tc = time.perf_counter() - t0
        out = np.empty_like(V)
        t, tmed = best(lambda: pl(B1d, D, V, out=out), reps=10)
        te, _ = best(lambda: action_einsum(B1d, D, V, dim), reps=2)
        b = roofline.bound(pl.spec, device="cpu")
        print(f"action {dim}d p={p} {pl.kernel:32s} compile {tc:5.1f}s {b.flops / t / 1e9:6.1f} GF/s "
              f"Pmax {b.pmax / 1e9:6.1f} ({b.limited_by[:2]})  ours/Pmax {b.fraction(t):.2f} "
              f"(median {b.fraction(tmed):.2f})  ours/einsum {te / t:5.1f}  "
              f"{E * nd ** dim / t / 1e9:.2f} GDoF/s", flush=True)


def assembly(rng, dim=3, target=256 * 2**20):
    for p in range(1, 7):
        nd, nq = p + 1, p + 2
        E = max(64, target // (8 * (nq ** dim + nd ** (2 * dim))))
        B1d = rng.random((nq, nd))
        D = rng.random((E,) + (nq,) * dim)
        t0 = time.perf_counter()
        pl = smalltc.plan("assembly", B1d, D, backend="cpu")
        tc = time.perf_counter() - t0
        out = np.empty(pl.out_shape)
        t, tmed = best(lambda: pl(B1d, D, out=out), reps=10)
        te, _ = best(lambda: assembly_einsum(B1d, D, dim), reps=2)
        b = roofline.bound(pl.spec, device="cpu")
        print(f"assembly {dim}d p={p} {pl.kernel:30s} compile {tc:5.1f}s {b.flops / t / 1e9:6.1f} GF/s "
              f"Pmax {b.pmax / 1e9:6.1f} ({b.limited_by[:2]})  ours/Pmax {b.fraction(t):.2f} "
              f"(median {b.fraction(tmed):.2f})  ours/einsum {te / t:5.1f}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--threads" in args:
        i = args.index("--threads")
        from smalltc.backends.cpu import set_num_threads
        set_num_threads(int(args[i + 1]))
        del args[i:i + 2]
    bw, pk = roofline.bandwidth("cpu"), roofline.peak("float64", "cpu")
    print(f"BW {bw / 1e9:.1f} GB/s, peak {pk / 1e9:.1f} GF/s (float64)", flush=True)
    rng = np.random.default_rng(0)
    for what in args or ["gemm", "action", "assembly"]:
        globals()[what](rng)
