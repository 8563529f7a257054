"""Prototype: the "line" form of the fused 3D action (templates/cuda/action_line.cu.j2)
against the runtime's plan (tuning tables on), same inputs, same process.

B1d goes to the kernel's constant bank (``stc_cB``) by a device-to-device copy on the
stream before each launch (timed with the kernel). Each case: the plan's result is the
reference (itself checked against einsum by the test suite); the line kernel's output is
poisoned (NaN) first and compared; both timed with CUDA events, median of 20, after 3
warm-ups; per_block swept.

    python3 notes/action_line.py [--dtype float64] [--p 1-8] [--json FILE]
Without a GPU: renders every case and compiles it with nvcc when on the PATH (--compile-only).
"""
import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from smalltc.backends._cuda_runtime import NVRTC_OPTIONS, render


def line_ctx(nd, nq, dtype, per_block, min_blocks=0):
    T = max(nd, nq)
    TT = T | 1
    buf = T * T * TT
    istr = 2 * buf + (1 - (2 * buf) % 2)
    s = 8 if dtype == "float64" else 4
    tpi = TT * T
    if tpi * per_block > 1024:
        return None
    smem = s * (per_block * istr + 1)
    if smem > 227 * 1024:
        return None
    return dict(dim=3, nd=nd, nq=nq, T=T, TT=TT, istr=istr, dtype=dtype, per_block=per_block,
                threads=tpi * per_block, smem_bytes=smem, min_blocks=min_blocks)


def entry(ctx):
    return f"stc_action_line_{ctx['dtype'][5:]}_nd{ctx['nd']}nq{ctx['nq']}_pb{ctx['per_block']}"


def ranges(text):
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def compile_only(cases, dtype):
    nvcc = shutil.which("nvcc")
    for nd, nq in cases:
        ctx = line_ctx(nd, nq, dtype, 2)
        src = render("action_line.cu.j2", dict(ctx, entry=entry(ctx)))
        if nvcc is None:
            print(entry(ctx), "rendered", len(src), "chars (no nvcc)")
            continue
        with tempfile.TemporaryDirectory() as d:
            open(f"{d}/k.cu", "w").write(src)
            r = subprocess.run([nvcc, "-arch=sm_90", "-cubin", "-std=c++17", "-Xptxas", "-v",
                                "-o", f"{d}/k.cubin", f"{d}/k.cu"], capture_output=True, text=True)
            regs = [ln.strip() for ln in r.stderr.splitlines() if "registers" in ln]
            print(entry(ctx), "rc", r.returncode, regs[-1] if regs else r.stderr[-400:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--p", default="1-8")
    ap.add_argument("--json")
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    cases = [(p + 1, nq) for p in ranges(args.p) for nq in (p + 1, p + 2)]
    if args.compile_only:
        return compile_only(cases, args.dtype)
    import cupy as cp
    import smalltc
    from smalltc import _timing

    dt = args.dtype
    s = np.dtype(dt).itemsize
    x = cp.empty(2 ** 28, dtype=cp.uint8)
    ev = [cp.cuda.Event() for _ in range(2)]
    ev[0].record(); cp.cuda.runtime.memcpyAsync(x[2 ** 27:].data.ptr, x.data.ptr, 2 ** 27, 3, 0)
    ev[1].record(); ev[1].synchronize()
    best = []
    for _ in range(5):
        ev[0].record()
        cp.cuda.runtime.memcpyAsync(x[2 ** 27:].data.ptr, x.data.ptr, 2 ** 27, 3, 0)
        ev[1].record(); ev[1].synchronize()
        best.append(2 * 2 ** 27 / (cp.cuda.get_elapsed_time(ev[0], ev[1]) * 1e-3))
    bw = max(best)
    del x
    rows = []
    rng = np.random.default_rng(0)
    for nd, nq in cases:
        per_elem = s * (2 * nd ** 3 + nq ** 3)
        E = int(1e9 // per_elem)
        B1d = cp.asarray(rng.standard_normal((nq, nd))).astype(dt)
        D = (cp.random.random((E, nq, nq, nq)) + .5).astype(dt)
        V = cp.random.standard_normal((E, nd, nd, nd)).astype(dt)
        pl = smalltc.plan("action", B1d, D, V, backend="cuda")
        ref = pl(B1d, D, V)
        t_plan = {"median_s": 1e-9 * statistics.median(_timing.time_calls(
            lambda: pl(B1d, D, V, out=ref), repeats=20, warmup=3, on_gpu=True))}
        row = dict(nd=nd, nq=nq, E=E, bytes=per_elem * E, plan_kernel=pl.kernel,
                   plan_params=pl.params, plan_source=pl.source,
                   plan_median_s=t_plan["median_s"], variants=[])
        U = cp.empty_like(V)
        for pb in (1, 2, 3, 4, 6, 8, 12, 16):
            ctx = line_ctx(nd, nq, dt, pb)
            if ctx is None:
                continue
            src = render("action_line.cu.j2", dict(ctx, entry=entry(ctx)))
            mod = cp.RawModule(code=src, options=NVRTC_OPTIONS)
            kern = mod.get_function(entry(ctx))
            if ctx["smem_bytes"] > 48 * 1024:
                kern.max_dynamic_shared_size_bytes = ctx["smem_bytes"]
            cB = mod.get_global("stc_cB")
            nb = B1d.nbytes
            groups = math.ceil(E / pb)
            blocks = min(groups, 2 ** 31 - 1)

            def call():
                stream = cp.cuda.get_current_stream()
                cp.cuda.runtime.memcpyAsync(cB.ptr, B1d.data.ptr, nb, 3, stream.ptr)
                kern((blocks,), (ctx["threads"],), (D, V, U, np.int64(E)), shared_mem=ctx["smem_bytes"])

            U.fill(np.nan)
            call()
            err = float(cp.abs(U - ref).max() / cp.abs(ref).max())
            t = {"median_s": 1e-9 * statistics.median(_timing.time_calls(
                call, repeats=20, warmup=3, on_gpu=True))}
            v = dict(per_block=pb, threads=ctx["threads"], smem=ctx["smem_bytes"],
                     regs=kern.attributes["num_regs"], local=kern.attributes["local_size_bytes"],
                     rel_err=err, median_s=t["median_s"],
                     fraction=per_elem * E / t["median_s"] / bw)
            row["variants"].append(v)
        ok = [v for v in row["variants"] if v["rel_err"] < (1e-12 if dt == "float64" else 1e-4)]
        win = min(ok, key=lambda v: v["median_s"]) if ok else None
        row["plan_fraction"] = per_elem * E / row["plan_median_s"] / bw
        rows.append(row)
        print(f"3D nd={nd} nq={nq} {dt}: plan {100 * row['plan_fraction']:.0f}% "
              f"({row['plan_params'].get('rb')}, {row['plan_params'].get('registers')} regs)"
              + (f" | line best per_block={win['per_block']} {100 * win['fraction']:.0f}% "
                 f"regs {win['regs']} local {win['local']} -> x{row['plan_median_s'] / win['median_s']:.2f}"
                 if win else " | line: no correct variant ")
              + " | errs " + " ".join("%.0e" % v["rel_err"] for v in row["variants"]), flush=True)
        del D, V, U, ref
        cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        json.dump(dict(device=cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                       dtype=dt, bandwidth=bw, rows=rows), open(args.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
