"""Run a rendered action kernel (action.cu.j2 / action_rb.cu.j2) on the CPU: one host thread per
CUDA thread, __syncthreads = std::barrier (notes/emulate/prelude.h), against the einsum reference.
Checks index math and barriers without a GPU (not the GPU itself).   python notes/action_emulate.py"""
import os, subprocess, sys, tempfile
import numpy as np
HERE = os.path.dirname(os.path.abspath(__file__))
from smalltc.backends import _cuda_params as P
from smalltc.backends._cuda_runtime import render
from smalltc.backends import reference as R

def run(dim, nd, nq, ncomp, dt, params, E, grid=2, seed=0):
    ctx = P.action_ctx(dim, nd, nq, ncomp, dt, params=params)
    if ctx is None:
        return None
    src = render(P.action_template(ctx), dict(ctx, entry="stc_emu"))
    rng = np.random.default_rng(seed)
    B1d = rng.standard_normal((nq, nd)); D = rng.random((E,) + (nq,) * dim) + .5
    V = rng.standard_normal((E,) + ((ncomp,) if ncomp > 1 else ()) + (nd,) * dim)
    ref = R.action_einsum(B1d, D, V, dim)
    real = "double" if dt == "float64" else "float"
    with tempfile.TemporaryDirectory() as tmp:
        cu = os.path.join(tmp, "k.cpp")
        with open(cu, "w") as f:
            f.write(open(os.path.join(HERE, "emulate", "prelude.h")).read() + src +
                    f"\n#define REAL {real}\n#define KERNEL stc_emu\n" + open(os.path.join(HERE, "emulate", "main.inc")).read())
        exe = os.path.join(tmp, "k")
        r = subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-pthread", "-o", exe, cu], capture_output=True, text=True)
        if r.returncode:
            print(r.stderr[:3000]); raise SystemExit(1)
        files = []
        for i, a in enumerate((B1d, D, V)):
            pth = os.path.join(tmp, f"in{i}"); a.astype(dt).tofile(pth); files.append(pth)
        out = os.path.join(tmp, "out")
        subprocess.run([exe, str(ctx["threads"]), str(grid), str(E * ncomp), str(B1d.size), str(D.size), str(V.size), *files, out], check=True)
        U = np.fromfile(out, dtype=dt).reshape(V.shape).astype(np.float64)
    ok = np.all(np.isfinite(U))
    err = np.linalg.norm(U - ref) / np.linalg.norm(ref) if ok else np.inf
    return ctx, err

if __name__ == "__main__":
    cases = []
    for dim in (2, 3):
        for (nd, nq) in ((2, 2), (2, 3), (3, 5), (5, 6), (5, 7), (6, 6), (9, 10)):
            for rb in (1, 2, 3, 4):
                cases.append((dim, nd, nq, rb))
    for dim, nd, nq, rb in cases:
        for ncomp, pb in ((1, 3), (3, 2)):
            res = run(dim, nd, nq, ncomp, "float64", dict(per_block=pb, min_blocks=0, rb=rb), E=7)
            if res is None:
                print(dim, nd, nq, rb, "no ctx"); continue
            ctx, err = res
            print(f"{dim}d nd{nd} nq{nq} c{ncomp} rb={rb}->{ctx['rb']} tb={ctx['tb']} tpi={ctx['tpi']} pb={pb}: rel err {err:.2e}", "OK" if err < 1e-12 else "FAIL", flush=True)
