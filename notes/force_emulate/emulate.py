"""Run rendered corner-force kernels (templates/cuda/force.cu.j2) on host threads against
the dense float64 oracle of tests/test_force.py: one OS thread per CUDA thread,
__syncthreads a block barrier, __syncwarp a barrier of the thread's warp (prelude.h), the
constant bank a host array, shared memory pre-filled with NaN, two blocks striding over the
groups. Checks index arithmetic, buffer plans and barriers without a GPU (not the GPU's
scheduling). notes/cuda.md, section 7d.

    python notes/force_emulate/emulate.py          # needs g++ with C++20
"""
import os, subprocess, sys, tempfile
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from test_force import operands, oracle_force, oracle_force_t, mesh_map
from smalltc.backends.cuda.force import FORCE
from smalltc.backends.cuda.runtime import render
from smalltc.spec import ActionSpec, MassApplySpec
HERE = os.path.dirname(os.path.abspath(__file__))

MAIN = r'''
template <class R> static std::vector<R> readf(const char* path, size_t n) {
    std::vector<R> v(n); FILE* f = fopen(path, "rb");
    if (!f || fread(v.data(), sizeof(R), n, f) != n) { fprintf(stderr, "read %s\n", path); exit(2); }
    fclose(f); return v; }
int main(int argc, char** argv) {
    int threads = atoi(argv[1]), grid = atoi(argv[2]); long long nb = atoll(argv[3]);
    size_t n[8]; for (int i = 0; i < 8; ++i) n[i] = atol(argv[4 + i]);
    auto L = readf<REAL>(argv[12], n[0]); auto B = readf<REAL>(argv[13], n[1]);
    auto G = readf<REAL>(argv[14], n[2]); auto A = readf<REAL>(argv[15], n[3]);
    auto F = readf<REAL>(argv[16], n[4]); auto M = readf<IDX>(argv[17], n[5]);
    auto U = readf<REAL>(argv[18], n[6]); long long ndofs = n[7];
    long long err[3] = {0, 0, 0};
#if LINE
    memcpy(stc_cL, L.data(), sizeof stc_cL); memcpy(stc_cB, B.data(), sizeof stc_cB);
    memcpy(stc_cG, G.data(), sizeof stc_cG);
#endif
    std::memset(stc_smem_raw, 0xff, sizeof stc_smem_raw);   // NaN garbage in shared memory
    gridDim.x = grid; blockDim.x = threads;
    for (int b = 0; b < grid; ++b) {
        std::barrier<> bar(threads); g_bar = &bar;
        g_warp.clear();
        for (int w = 0; w * 32 < threads; ++w) g_warp.emplace_back(new std::barrier<>(std::min(32, threads - w * 32)));
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
            ts.emplace_back([&, t] { threadIdx.x = t; blockIdx.x = b;
                stc_k(L.data(), B.data(), G.data(), A.data(), F.data(), ARGS nb); });
        for (auto& th : ts) th.join();
    }
    FILE* f = fopen(argv[19], "wb"); fwrite(U.data(), sizeof(REAL), n[6], f); fclose(f);
    printf("%lld %lld %lld\n", err[0], err[1], err[2]);
}
'''


def run(dim, p, q, dt, op, it="int32", params=None, grid=2, bad=False, nq=None):
    kw = dict(dim=dim, nq=nq or 2 * p, nd=p + 1, batch=1, dtype=dt, ncomp=dim, comp_axis=True, qfunc=q)
    emap, ndofs = mesh_map(dim, p)
    E = emap.shape[0]
    spec = ActionSpec(**kw) if op == "action" else MassApplySpec(ndofs=ndofs, index_dtype=it, deterministic=False, **kw)
    ctx = FORCE.context(spec, params)
    src = render("force.cu.j2", dict(ctx, entry="stc_k"))
    L, B, G, A, e, w = operands(dim, p, E, dt, seed=dim * 10 + p, nq=nq)
    gather = ctx["gather"]
    emap = emap.astype(it)
    if bad:
        emap = emap.copy(); emap.reshape(E, -1)[E - 1, 1] = ndofs + 3
    if q == "force":
        want = oracle_force(L, B, G, A, e)
        F = e
        if gather:
            Fe = want.reshape(E, dim, -1); want = np.zeros((dim, ndofs))
            for c in range(dim):
                np.add.at(want[c], emap.reshape(E, -1).clip(0, ndofs - 1), Fe[:, c])
            U = np.zeros((dim, ndofs), dt)
        else:
            U = np.full(want.shape, np.nan, dt)
    else:
        if gather:
            wg = np.random.default_rng(2).standard_normal((dim, ndofs)).astype(dt)
            W = np.moveaxis(wg[:, emap.clip(0, ndofs - 1)], 0, 1)
            want = oracle_force_t(L, B, G, A, W); F = wg
        else:
            want = oracle_force_t(L, B, G, A, w); F = w
        U = np.full(want.shape, np.nan, dt)
    M = emap if gather else np.zeros(1, it)
    real = "double" if dt == "float64" else "float"
    idx = "int" if it == "int32" else "long long"
    args = "M.data(), U.data(), ndofs, err, " if gather else "U.data(), "
    with tempfile.TemporaryDirectory() as tmp:
        cu = os.path.join(tmp, "k.cpp")
        with open(cu, "w") as f:
            f.write(open(os.path.join(HERE, "prelude.h")).read() + src
                    + f"\n#define REAL {real}\n#define IDX {idx}\n#define LINE {ctx['line']}\n#define ARGS {args}\n" + MAIN)
        exe = os.path.join(tmp, "k")
        r = subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-pthread", "-o", exe, cu], capture_output=True, text=True)
        if r.returncode:
            print(r.stderr[:3000]); raise SystemExit(1)
        files = []
        for i, a in enumerate((L, B, G, A, F, M, U)):
            pth = os.path.join(tmp, f"in{i}"); np.ascontiguousarray(a).tofile(pth); files.append(pth)
        out = os.path.join(tmp, "out")
        res = subprocess.run([exe, str(ctx["threads"]), str(grid), str(E), *[str(a.size) for a in (L, B, G, A, F, M, U)], str(ndofs), *files, out], check=True, capture_output=True, text=True)
        Y = np.fromfile(out, dtype=dt).reshape(U.shape).astype(np.float64)
    ok = np.all(np.isfinite(Y))
    errv = np.linalg.norm(Y - want) / np.linalg.norm(want) if ok else np.inf
    return ctx, errv, res.stdout.strip()

if __name__ == "__main__":
    import itertools
    sel = sys.argv[1:]
    for dim, p in [(3, 1), (3, 2), (3, 3), (2, 1), (2, 2), (2, 3), (2, 5), (3, 4)]:
        for q in ("force", "force_t"):
            for op in ("action", "mass_apply"):
                for line in (1, 0):
                    for dt in ("float64",):
                        ctx, err, flag = run(dim, p, q, dt, op, params=dict(line=line))
                        tag = "OK" if err < 1e-12 else "FAIL"
                        print(f"{dim}d p{p} {q:7s} {op:10s} line={line} tpi={ctx['tpi']} pb={ctx['per_block']} ws={ctx['warp_sync']} apre={ctx['apre']}: {err:.2e} {tag} {flag}", flush=True)
