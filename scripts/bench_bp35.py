"""BP3/BP5 (3D diffusion, fused apply through a map, float64) on the GPU: GDoF/s and the
fraction of the bandwidth bound (x read once, y written once, Q read once, the int32 map
read once, at the copy bandwidth measured in the same run), for the CUDA heuristic and a few
forced forms. Usage: python scripts/bench_bp35.py OUT.json [p ...]"""
import json
import sys
import time

import numpy as np


def structured_map(n, p):
    """elem_dofs (n^3, p+1, p+1, p+1) int32 of an n^3 box, lexicographic global numbering."""
    m = n * p + 1
    e = np.arange(n)
    i = np.arange(p + 1)
    ax = (e[:, None] * p + i[None, :])                       # (n, p+1)
    z = ax[:, None, None, :, None, None]
    y = ax[None, :, None, None, :, None]
    x = ax[None, None, :, None, None, :]
    g = (z * m + y) * m + x
    return g.reshape(n ** 3, p + 1, p + 1, p + 1).astype(np.int32), m ** 3


def timeit(cp, fn, reps=10, samples=15):
    fn()
    cp.cuda.Device().synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(samples):
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        ts.append(cp.cuda.get_elapsed_time(start, stop) / 1e3 / reps)
    return float(np.median(ts))


def variants(bp, p):
    """(name, params) timed per case: the heuristic, the line form at 1 item a block and at
    ~128 threads with each qmode, and (p <= 4) the shared-memory form."""
    nd = p + 1
    nq = nd if bp == "bp5" else p + 2
    T = max(nd, nq)
    tpi = (T | 1) * T
    h = max(1, min(8, round(128 / tpi)))
    out = [("heuristic", None)]
    for pb in sorted({1, h}):
        for qm in ("global", "smem") + (("regs",) if pb == h else ()):
            out.append((f"line pb{pb} {qm}", dict(per_block=pb, min_blocks=0, line=1, qmode=qm)))
    if p <= 4:
        out.append(("smem form", dict(per_block=max(1, 128 // (T * T)), min_blocks=0, line=0)))
    return out


def spec_of(bp, p, E=1, ndofs=1):
    from smalltc.spec import MassApplySpec
    nd = p + 1
    nq = nd if bp == "bp5" else p + 2
    return MassApplySpec(dim=3, nq=nq, nd=nd, batch=E, dtype="float64", ndofs=ndofs,
                         qfunc="diffusion", collocated=bp == "bp5")


def _compile(job):
    """Build (compile into CuPy's disk cache) one variant, in a worker process."""
    bp, p, params = job
    from smalltc.backends.cuda import CudaBackend
    try:
        CudaBackend().build(spec_of(bp, p), params)
        return None
    except Exception as err:          # reported again by the timing process
        return f"{bp} p={p} {params}: {err}"


def precompile(ps, workers=14):
    import multiprocessing as mp
    jobs = [(bp, p, prm) for p in ps for bp in ("bp3", "bp5") for _, prm in variants(bp, p)]
    t0 = time.time()
    with mp.get_context("spawn").Pool(workers) as pool:
        errs = [e for e in pool.map(_compile, jobs, chunksize=1) if e]
    print(f"precompiled {len(jobs)} kernels in {time.time() - t0:.1f} s", *errs, sep="\n",
          flush=True)


def main():
    import cupy as cp
    from smalltc.backends.cuda import CudaBackend
    out_path = sys.argv[1]
    ps = [int(a) for a in sys.argv[2:]] or list(range(1, 9))
    dev = cp.cuda.runtime.getDeviceProperties(0)["name"]
    dev = dev.decode() if isinstance(dev, bytes) else dev
    a = cp.random.random(2 ** 27)                            # 1 GiB
    b = cp.empty_like(a)
    t = timeit(cp, lambda: cp.copyto(b, a), reps=5, samples=10)
    bw = 2 * a.nbytes / t
    del a, b
    res = dict(device=dev, copy_bw=bw, cases=[])
    precompile(ps)
    print(f"{dev}: copy {bw / 1e12:.3f} TB/s", flush=True)
    be = CudaBackend()
    for p in ps:
        for bp, co in (("bp3", False), ("bp5", True)):
            nd = p + 1
            nq = nd if co else p + 2
            n = max(2, round((2.0e6) ** (1 / 3) / p))          # ~2M DoFs
            m, ndofs = structured_map(n, p)
            E = m.shape[0]
            rng = cp.random.default_rng(0)
            B1d = None if co else rng.standard_normal((nq, nd))
            G1d = rng.standard_normal((nq, nd))
            Q = rng.standard_normal((E, 6, nq, nq, nq))
            x = rng.standard_normal(ndofs)
            mm = cp.asarray(m)
            y = cp.empty(ndofs)
            ops = [o for o in (B1d, G1d, Q, x, mm) if o is not None]
            nbytes = 8 * (2 * ndofs + E * 6 * nq ** 3) + 4 * E * nd ** 3
            spec = spec_of(bp, p, E, ndofs)
            ref = None
            for name, params in variants(bp, p):
                try:
                    ex = be.build(spec, params)
                except Exception as err:            # a form that does not fit
                    print(bp, p, name, "failed:", err, flush=True)
                    continue
                ex.run(ops, y)
                if ref is None:
                    ref = y.copy()
                    from smalltc.backends.reference import operator_apply_unfused
                    chk = operator_apply_unfused("diffusion", B1d, G1d, None, Q, x, mm, 3) \
                        if E * nq ** 3 < 2e8 else None
                    err = None if chk is None else float(cp.linalg.norm(y - chk) / cp.linalg.norm(chk))
                else:
                    err = float(cp.linalg.norm(y - ref) / cp.linalg.norm(ref))
                tt = timeit(cp, lambda: ex.run(ops, y))
                row = dict(bp=bp, p=p, variant=name, kernel=ex.kernel, params=ex.params,
                           per_block=ex.ctx["per_block"], qmode=ex.ctx.get("qmode"),
                           ndofs=ndofs, E=E, time_s=tt, gdofs=ndofs / tt / 1e9,
                           bound_frac=nbytes / bw / tt, rel_err=err)
                res["cases"].append(row)
                print(f"{bp} p={p} {name:16s} pb={ex.ctx['per_block']} {tt * 1e6:8.1f} us {row['gdofs']:6.2f} GDoF/s "
                      f"{100 * row['bound_frac']:5.1f}% regs={ex.params.get('registers')} "
                      f"local={ex.params.get('local_bytes')} err={err}", flush=True)
            del Q, x, y, mm
            cp.get_default_memory_pool().free_all_blocks()
            with open(out_path, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
