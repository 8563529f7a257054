"""Host emulation of the rendered operator-family kernels (no GPU): one host thread per CUDA
thread, __syncthreads as a std::barrier (notes/emulate/prelude.h), shared memory filled with
garbage, atomics by compare-and-swap, cp.async as plain copies, 2 blocks striding over the
groups; against the float64 oracle of tests/oracle.py. Checks index arithmetic and barriers,
not the GPU's scheduling. Needs g++ (C++20).

    python notes/qfunc_emulate.py            # the default cases (a few minutes on 2 cores)
    python notes/qfunc_emulate.py apply,diffusion,1,3,4,1,1,smem    # kind,qfunc,co,dim,p,nc,line,qmode
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from smalltc.backends.cuda.runtime import render
HERE = os.path.join(ROOT, "notes", "emulate")
import re
def patch(src):
    src = re.sub(r'const unsigned d = static_cast<unsigned>\(__cvta_generic_to_shared\(dst\)\);\n\s*asm volatile\("cp.async.ca[^;]*;[^;]*;', '*dst = *src;', src)
    src = re.sub(r'asm volatile\("cp.async.(commit|wait)[^;]*;[^;]*;', ';', src)
    assert "asm" not in src, src[src.index("asm") - 200: src.index("asm") + 200]
    return src
SHIM = r'''
#include <atomic>
template <class T> inline T atomicAdd(T* p, T v) { std::atomic_ref<T> r(*p); T old = r.load();
  while (!r.compare_exchange_weak(old, old + v)) {} return old; }
'''
CT = {"float64": "double", "float32": "float", "int32": "int", "int64": "long long"}

def run(template, ctx, args, out_index, nitems, grid=2, consts=()):
    import re
    src = patch(render(template, dict(ctx, entry="stc_emu")))
    with tempfile.TemporaryDirectory() as tmp:
        decl, call = [], []
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray):
                pth = os.path.join(tmp, f"a{i}"); a.tofile(pth)
                t = CT[a.dtype.name]
                decl.append(f'auto a{i} = readf<{t}>("{pth}", {a.size});')
                call.append(f"a{i}.data()")
            else:
                call.append(f"(long long){a}")
        for name, a in consts:
            pth = os.path.join(tmp, name); a.tofile(pth)
            decl.append(f'{{ auto c = readf<{CT[a.dtype.name]}>("{pth}", {a.size}); memcpy({name}, c.data(), {a.size} * sizeof(c[0])); }}')
        outp = os.path.join(tmp, "out")
        o = args[out_index]
        main = f'''
#include <cstring>
template <class R> static std::vector<R> readf(const char* path, size_t n) {{
    std::vector<R> v(n); FILE* f = fopen(path, "rb"); if (!f || fread(v.data(), sizeof(R), n, f) != n) exit(2); fclose(f); return v; }}
int main() {{
    {" ".join(decl)}
    std::memset(stc_smem_raw, 0xff, sizeof stc_smem_raw);
    int threads = {ctx["threads"]}, grid = {grid};
    gridDim.x = grid; blockDim.x = threads;
    for (int b = 0; b < grid; ++b) {{
        std::barrier<> bar(threads); g_bar = &bar;
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
            ts.emplace_back([&, t, b] {{ threadIdx.x = t; blockIdx.x = b; stc_emu({", ".join(call)}, (long long){nitems}); }});
        for (auto& th : ts) th.join();
    }}
    FILE* f = fopen("{outp}", "wb"); fwrite(a{out_index}.data(), sizeof(a{out_index}[0]), {o.size}, f); fclose(f);
}}
'''
        cu = os.path.join(tmp, "k.cpp")
        open(cu, "w").write(open(os.path.join(HERE, "prelude.h")).read() + SHIM + src + main)
        exe = os.path.join(tmp, "k")
        r = subprocess.run(["g++", "-std=c++20", "-O0", "-w", "-pthread", "-o", exe, cu], capture_output=True, text=True)
        if r.returncode:
            print(r.stderr[:3000]); raise SystemExit(1)
        subprocess.run([exe], check=True)
        return np.fromfile(outp, dtype=o.dtype).reshape(o.shape)

import oracle  # noqa: E402
from smalltc.backends.cuda.action import ACTION  # noqa: E402
from smalltc.backends.cuda.mass_apply import MASS_APPLY, MASS_DIAGONAL  # noqa: E402
from smalltc.fem import H1Space, box_mesh  # noqa: E402
from smalltc.spec import ActionSpec, MassApplySpec, MassDiagonalSpec  # noqa: E402


def case(kind, qf, co, dim, p, nc, line, qmode="global", it="int32"):
    diag = kind == "diag"
    nd = p + 1; nq = nd if co else p + 2
    space = H1Space(box_mesh(dim, {1: 4, 2: 2, 3: 2}[dim]), p)
    E, n = space.nelements, space.ndofs
    rng = np.random.default_rng(0)
    B1d = None if co else rng.standard_normal((nq, nd)); G1d = rng.standard_normal((nq, nd))
    Q = rng.standard_normal((E, dim * (dim + 1) // 2) + (nq,) * dim)
    D = rng.random((E,) + (nq,) * dim) + .5 if qf == "helmholtz" else None
    m = rng.permutation(n)[space.elem_dofs].astype(it)
    x = rng.standard_normal((nc, n) if nc > 1 else (n,))
    if diag:
        spec = MassDiagonalSpec(dim=dim, nq=nq, nd=nd, batch=E, dtype="float64", ndofs=n, index_dtype=it, qfunc=qf, collocated=co)
        ctx = MASS_DIAGONAL.context(spec)
        y = np.zeros(n)
        args = [a for a in (B1d, G1d, D, Q, m) if a is not None] + [y]
        out = run("mass_diagonal.cu.j2", ctx, args, len(args) - 1, E)
        ref = oracle.operator_diagonal(qf, B1d, G1d, D, Q, m, n, dim)
    elif kind == "action":
        spec = ActionSpec(dim=dim, nq=nq, nd=nd, batch=E, dtype="float64", ncomp=nc, comp_axis=nc > 1, qfunc=qf, collocated=co)
        ctx = ACTION.context(spec, dict(per_block=2, line=line, qmode=qmode))
        V = rng.standard_normal((E,) + ((nc,) if nc > 1 else ()) + (nd,) * dim)
        U = np.zeros_like(V)
        consts = []
        if ctx["line"]:
            head = [a for a in (D, Q) if a is not None]
            if B1d is not None: consts.append(("stc_cB", B1d))
            consts.append(("stc_cG", G1d))
        else:
            head = [a for a in (B1d, G1d, D, Q) if a is not None]
        out = run(ctx["template"], ctx, head + [V, U], len(head) + 1, E * nc, consts=consts)
        ref = oracle.operator_action(qf, B1d, G1d, D, Q, V, dim)
    else:
        spec = MassApplySpec(dim=dim, nq=nq, nd=nd, batch=E, dtype="float64", ndofs=n, ncomp=nc, comp_axis=nc > 1, index_dtype=it, qfunc=qf, collocated=co)
        ctx = MASS_APPLY.context(spec, dict(per_block=2, line=line, qmode=qmode))
        y = np.zeros_like(x)
        consts = []
        if ctx["line"]:
            head = [a for a in (D, Q) if a is not None]
            if B1d is not None: consts.append(("stc_cB", B1d))
            consts.append(("stc_cG", G1d))
        else:
            head = [a for a in (B1d, G1d, D, Q) if a is not None]
        args = head + [x, m, y, n]
        out = run(ctx["template"], ctx, args, len(head) + 2, E * nc, consts=consts)
        ref = oracle.operator_apply(qf, B1d, G1d, D, Q, x, m, dim)
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    print(kind, qf, "collocated" if co else "gauss", f"{dim}d p={p} ncomp={nc}", "line" if line else "smem-form", qmode, it, f"rel err {err:.2e}", "OK" if err < 1e-12 else "FAIL", flush=True)
    return err < 1e-12



DEFAULT = ["action,diffusion,0,1,3,1,0", "action,helmholtz,1,2,2,3,0", "action,helmholtz,0,3,2,1,0",
           "action,diffusion,1,3,3,1,0", "action,helmholtz,0,3,3,3,1,global",
           "action,diffusion,0,3,4,1,1,smem", "action,helmholtz,1,3,3,1,1,regs",
           "apply,diffusion,0,2,2,3,0,global,int64", "apply,diffusion,0,3,2,1,1,smem",
           "apply,helmholtz,1,3,2,2,1,global,int64", "diag,diffusion,0,3,2,1,0",
           "diag,helmholtz,1,2,2,1,0,global,int64"]

if __name__ == "__main__":
    ok = True
    for c in sys.argv[1:] or DEFAULT:
        f = c.split(",")
        ok &= case(f[0], f[1], f[2] == "1", int(f[3]), int(f[4]), int(f[5]), int(f[6]), *f[7:])
    sys.exit(0 if ok else 1)
