"""The basis family (``smalltc.interpolate``/``smalltc.integrate`` on the CUDA backend).

Without a GPU: every variant of a table of sizes renders and compiles with nvcc for sm_90
(no warning, no spill); the stage plan that the template renders (levels, regions,
strides, loops, barriers) is run by a model of the kernel in Python (:func:`emulate`, one
shared array an item group, every read of an unwritten or foreign entry and every race
between barriers an error) against the dense float64 oracle of tests/test_evaluation.py;
the choice (heuristic, params, fallback) and the tuner's space. With a GPU: the kernels
against the oracle (output poisoned with NaN), params through :func:`smalltc.plan`, the map
changed in place after its first use (tests/test_evaluation.py runs the public functions'
table on the cuda backend too).
"""
import pathlib
import re
import shutil
import subprocess
import types

import numpy as np
import pytest

import smalltc
from smalltc import roofline
from smalltc._arrays import gpu_available
from smalltc.backends.cuda import CudaBackend, choose, family_of
from smalltc.backends.cuda import runtime as RT
from smalltc.backends.cuda.basis import BASIS, MAX_EXTENT
from smalltc.backends.cuda.family import DEFAULT_DEVICE, SMEM_TARGET
from smalltc.spec import BasisSpec

from conftest import TOL, rel_err
from ptxas import NVCC, compiles_clean
from test_evaluation import integrate_oracle, interp_oracle, mesh_map

GXX = shutil.which("g++")
HOST_H = pathlib.Path(__file__).parent / "data" / "cuda_host.h"
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no CUDA device")


def _spec(dim, nd, nq, what, transpose=False, ncomp=1, mapped=True, E=5, dtype="float64",
          index_dtype="int32", ndofs=40):
    return BasisSpec(dim=dim, nq=nq, nd=nd, batch=E, dtype=dtype, what=what,
                     transpose=transpose, ncomp=ncomp, comp_axis=ncomp > 1,
                     ndofs=ndofs if mapped else None, index_dtype=index_dtype)


# --- render and compile (no GPU) ---------------------------------------------------------

# (dim, nd, nq, what, transpose, ncomp, map index dtype or None, dtype, params or None)
COMPILED = [
    (1, 4, 5, "both", False, 1, "int32", "float64", None),
    (1, 3, 5, "gradients", True, 2, None, "float32", None),
    (2, 3, 5, "values", False, 3, "int64", "float64", None),
    (2, 5, 6, "both", True, 1, "int32", "float64", None),
    (2, 17, 17, "both", False, 1, None, "float64", None),
    (2, 17, 17, "gradients", True, 2, "int64", "float64", None),
    (3, 2, 3, "both", True, 3, "int64", "float32", None),
    (3, 5, 6, "both", False, 1, "int32", "float64", None),
    (3, 5, 6, "both", True, 1, "int32", "float64", None),
    (3, 5, 6, "values", False, 1, None, "float32", dict(per_block=3, threads=64, hstage=1)),
    (3, 4, 6, "gradients", True, 1, "int32", "float64", dict(per_block=1, threads=32,
                                                             hstage=1)),
    (3, 9, 10, "values", True, 1, "int32", "float64", None),
    (3, 9, 10, "both", False, 3, "int32", "float64", None),
]


def _compiled(case):
    dim, nd, nq, what, tr, nc, it, dt, params = case
    spec = _spec(dim, nd, nq, what, tr, nc, it is not None, dtype=dt,
                 index_dtype=it or "int32")
    ctx = BASIS.context(spec, params)
    assert ctx is not None, case
    return spec, ctx


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_every_variant_compiles_for_sm90_without_spills(tmp_path):
    """One translation unit (each kernel in its namespace), ptxas -v: every entry compiles,
    no warning, no spill store, no stack."""
    kernels = {}
    for i, case in enumerate(COMPILED):
        spec, ctx = _compiled(case)
        entry = f"{BASIS.entry(spec, ctx)}_{i}"
        kernels[entry] = RT.render("basis.cu.j2", dict(ctx, entry=entry))
    compiles_clean(tmp_path / "basis_sm_90.cu", kernels)


def test_entry_names_say_what_runs():
    s = _spec(3, 5, 6, "both")
    assert BASIS.entry(s, BASIS.context(s)) == "stc_basis_interp_both_3d_f64_nd5nq6c1_i32"
    t = _spec(2, 3, 4, "values", transpose=True, ncomp=2, mapped=False, dtype="float32")
    assert BASIS.entry(t, BASIS.context(t)) == "stc_basis_interp_t_values_2d_f32_nd3nq4c2_hs"


def test_rendered_source_reads_the_map_through_the_checks():
    s = _spec(2, 3, 4, "both", transpose=True, index_dtype="int64")
    src = RT.render("basis.cu.j2", dict(BASIS.context(s), entry="stc_x"))
    assert "long long* __restrict__ ERR" in src and "stc_worst" in src
    assert "atomicAdd(Y + mi[r]" in src and "__constant__ real_t stc_cG" in src
    v = _spec(2, 3, 4, "values", mapped=False)
    src = RT.render("basis.cu.j2", dict(BASIS.context(v), entry="stc_x"))
    assert "ERR" not in src and "stc_cG" not in src and "MAP" not in src


# --- a model of the kernel: the rendered plan run in Python --------------------------------

def _index(code):
    """The rendered line decomposition (``const int j0 = l / 5, j2 = l % 5;``) as
    (variable, expression) pairs."""
    code = code.strip()
    if code == "(void)l;":
        return []
    assert code.startswith("const int ") and code.endswith(";"), code
    return [tuple(p.split(" = ")) for p in code[len("const int "):-1].split(", ")]


def _ev(expr, env):
    return eval(expr.replace("/", "//"), {}, dict(env))     # non-negative ints only


class _Shared:
    """A group's shared memory: NaN until written; between two barriers an entry written by
    one task and read or written by another is a race."""

    def __init__(self, per_block, istr):
        self.a, self.istr = np.full(per_block * istr, np.nan), istr
        self.reads, self.writes = {}, {}

    def _at(self, q, off):
        assert 0 <= off < self.istr, f"item offset {off} outside the item's {self.istr}"
        return q * self.istr + off

    def read(self, q, off, task):
        i = self._at(q, off)
        assert not np.isnan(self.a[i]), f"{task} reads entry {off} of item {q}, never written"
        self.reads.setdefault(i, set()).add(task)
        return self.a[i]

    def write(self, q, off, v, task):
        i = self._at(q, off)
        self.writes.setdefault(i, set()).add(task)
        self.a[i] = v

    def barrier(self):
        for i, w in self.writes.items():
            assert len(w) == 1, f"entry {i} written by {sorted(w)[:2]} between barriers"
            others = self.reads.get(i, set()) - w
            assert not others, f"entry {i} written by {w} and read by {sorted(others)[:2]}"
        self.reads, self.writes = {}, {}


def emulate(spec, ctx, B, G, field, emap=None):
    """What ``basis.cu.j2`` rendered with ``ctx`` computes, item group by item group, in
    float64: the flat copies and every stage loop as the template writes them."""
    dim, nd, nq, nc = spec.dim, spec.nd, spec.nq, spec.ncomp
    NDD, NQD, NS = nd ** dim, nq ** dim, spec.nslots
    PB, ISTR, levels = ctx["per_block"], ctx["istr"], ctx["levels"]
    mats = {"stc_cB": np.asarray(B, np.float64),
            "stc_cG": None if G is None else np.asarray(G, np.float64)}
    items = spec.batch * nc
    field = np.asarray(field, np.float64)
    mapped = emap is not None
    if mapped:
        emap = np.asarray(emap).reshape(spec.batch, NDD)
    if spec.transpose:
        Hg = field.reshape(-1)
        out = np.zeros((nc, spec.ndofs)) if mapped else np.full(items * NDD, np.nan)
    else:
        x = field.reshape(nc, -1) if mapped else field.reshape(-1)
        Hg = out = np.full(items * NS * NQD, np.nan)

    def at(L, node, f):
        lv = levels[L]
        return lv["off"] + node * lv["size"] + f // lv["nlast"] * lv["row"] + f % lv["nlast"]

    def run_loop(sh, st, si, li, lp, b0, nvalid):
        src, dst = levels[st["src"]], levels[st["dst"]]
        M = mats[lp["mat"]]
        for t in range(len(lp["terms"]) * PB * st["nl"]):
            u, l = divmod(t, st["nl"])
            term, q = divmod(u, PB)
            if q >= nvalid:
                continue
            env = {"l": l}
            for var, expr in _index(st["index"]):
                env[var] = _ev(expr, env)
            tm = lp["terms"][term]
            assert lp["sync"] or not tm["acc"]
            so = tm["src"] * src["size"] + _ev(st["src_off"], env)
            do = tm["dst"] * dst["size"] + _ev(st["dst_off"], env)
            task = (si, li, t)

            def load(k):
                if src["smem"]:
                    return sh.read(q, src["off"] + so + k * st["ain"], task)
                assert spec.transpose and not ctx["hstage"]
                return Hg[(b0 + q) * NS * NQD + so + k * st["ain"]]

            def store(k, v):
                if dst["smem"]:
                    sh.write(q, dst["off"] + do + k * st["aout"], v, task)
                else:
                    assert not spec.transpose and not ctx["hstage"]
                    i = (b0 + q) * NS * NQD + do + k * st["aout"]
                    assert np.isnan(Hg[i]), f"H entry {i} stored twice"
                    Hg[i] = v
            if not spec.transpose:
                v = np.array([load(j) for j in range(nd)])
                for k in range(nq):
                    store(k, float(M[k] @ v))
            else:
                v = np.array([load(k) for k in range(nq)])
                for d in range(nd):
                    acc = float(M[:, d] @ v)
                    if tm["acc"]:
                        acc += sh.read(q, dst["off"] + do + d * st["aout"], task)
                    store(d, acc)

    for b0 in range(0, items, PB):
        nvalid = min(PB, items - b0)
        sh = _Shared(PB, ISTR)
        if not spec.transpose:
            for t in range(nvalid * NDD):
                q, f = divmod(t, NDD)
                e, c = divmod(b0 + q, nc)
                val = x[c, emap[e, f]] if mapped else x[(b0 + q) * NDD + f]
                sh.write(q, at(0, 0, f), val, ("gather", t))
            sh.barrier()
            for si, st in enumerate(ctx["stages"]):
                for li, lp in enumerate(st["loops"]):
                    run_loop(sh, st, si, li, lp, b0, nvalid)
                if si < len(ctx["stages"]) - 1 or ctx["hstage"]:
                    sh.barrier()
            if ctx["hstage"]:
                for t in range(nvalid * NS * NQD):
                    q, r = divmod(t, NS * NQD)
                    s, k = divmod(r, NQD)
                    out[b0 * NS * NQD + t] = sh.read(q, at(dim, s, k), ("store", t))
        else:
            if ctx["hstage"]:
                for t in range(nvalid * NS * NQD):
                    q, r = divmod(t, NS * NQD)
                    s, k = divmod(r, NQD)
                    sh.write(q, at(dim, s, k), Hg[b0 * NS * NQD + t], ("load", t))
                sh.barrier()
            for si, st in enumerate(ctx["stages"]):
                for li, lp in enumerate(st["loops"]):
                    if lp["sync"]:
                        sh.barrier()
                    run_loop(sh, st, si, li, lp, b0, nvalid)
                sh.barrier()
            for t in range(nvalid * NDD):
                q, f = divmod(t, NDD)
                val = sh.read(q, at(0, 0, f), ("out", t))
                if mapped:
                    e, c = divmod(b0 + q, nc)
                    out[c, emap[e, f]] += val
                else:
                    out[b0 * NDD + t] = val
        sh.barrier()
    return out


# (dim, nd, nq): small enough for the model's Python loops
MODEL_SIZES = [(1, 4, 5), (2, 3, 5), (3, 3, 4)]
MODEL_CASES = [(dim, nd, nq, what, tr, nc, mapped, hs)
               for dim, nd, nq in MODEL_SIZES for what in ("values", "gradients", "both")
               for tr in (False, True) for nc, mapped in ((1, True), (2, False), (2, True))
               for hs in (0, 1)]


def _problem(dim, nd, nq, what, ncomp, E, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    B, G = rng.standard_normal((2, nq, nd)).astype(dtype)
    m, ndofs = mesh_map(dim, nd, E, rng)
    x = rng.standard_normal((ncomp, ndofs)).astype(dtype)
    V = np.moveaxis(x[:, m], 0, 1).reshape(E, ncomp, -1)
    S = 1 + dim if what == "both" else dim if what == "gradients" else 1
    H = rng.standard_normal((E, ncomp, S, nq ** dim)).astype(dtype)
    return B, (None if what == "values" else G), m, ndofs, x, V, H


@pytest.mark.parametrize("dim,nd,nq,what,transpose,ncomp,mapped,hstage", MODEL_CASES)
def test_the_kernels_plan_computes_the_oracle(dim, nd, nq, what, transpose, ncomp, mapped,
                                              hstage):
    """The model of the kernel (two items a group, threads for a few lines: partial groups,
    several loops a stage, H staged or not) against the dense oracle."""
    E = 5
    B, G, m, ndofs, x, V, H = _problem(dim, nd, nq, what, ncomp, E, seed=dim * 10 + nd)
    spec = _spec(dim, nd, nq, what, transpose, ncomp, mapped, E=E, ndofs=ndofs)
    ctx = BASIS.context(spec, dict(per_block=2, threads=64, hstage=hstage))
    assert ctx is not None
    Gd = np.zeros_like(B) if G is None else G
    if not transpose:
        got = emulate(spec, ctx, B, G, x if mapped else V, m if mapped else None)
        ref = interp_oracle(B, Gd, V, what, dim)
        assert rel_err(got, ref.reshape(-1)) < TOL["float64"]
        return
    U = integrate_oracle(B, Gd, H, what, dim)
    got = emulate(spec, ctx, B, G, H, m if mapped else None)
    if mapped:
        ref = np.zeros((ncomp, ndofs))
        for c in range(ncomp):
            np.add.at(ref[c], m.reshape(-1), U[:, c].reshape(-1))
    else:
        ref = U.reshape(-1)
    assert rel_err(got, ref) < TOL["float64"]


@pytest.mark.parametrize("dim,nd,nq,what", [(2, 17, 17, "both"), (3, 5, 6, "both"),
                                            (3, 2, 3, "gradients")])
def test_the_heuristics_plan_computes_the_oracle(dim, nd, nq, what):
    """The heuristic's own parameters (many items a group, larger sizes), both directions."""
    E = 3
    B, G, m, ndofs, x, V, H = _problem(dim, nd, nq, what, 1, E, seed=nd)
    for tr in (False, True):
        spec = _spec(dim, nd, nq, what, tr, E=E, ndofs=ndofs)
        got = emulate(spec, BASIS.context(spec), B, G, H if tr else x, m)
        if tr:
            ref = np.zeros(ndofs)
            np.add.at(ref, m.reshape(-1), integrate_oracle(B, G, H, what, dim).reshape(-1))
        else:
            ref = interp_oracle(B, G, V, what, dim).reshape(-1)
        assert rel_err(got, ref) < TOL["float64"]


# (dim, nd, nq, what, transpose, ncomp, map index dtype or None, dtype, E, params or None)
HOST_CASES = [
    (1, 4, 5, "both", False, 1, "int32", "float64", 10, dict(per_block=3, threads=32, hstage=1)),
    (2, 3, 4, "values", True, 2, "int64", "float64", 5, dict(per_block=2, threads=64,
                                                           hstage=0)),
    (2, 3, 5, "gradients", False, 2, None, "float32", 45, None),
    (3, 3, 4, "both", False, 1, "int32", "float64", 7, dict(per_block=2, threads=64, hstage=0)),
    (3, 3, 4, "both", True, 1, "int32", "float64", 7, dict(per_block=3, threads=96, hstage=1)),
    (3, 2, 3, "gradients", True, 3, None, "float32", 9, None),
    (1, 3, 3, "gradients", True, 1, "int32", "float64", 12, dict(per_block=4, threads=32,
                                                               hstage=0)),
]
_SHARED = "extern __shared__ __align__(16) unsigned char stc_smem_raw[];"


@pytest.mark.skipif(GXX is None, reason="g++ is not on the PATH")
def test_the_rendered_kernels_run_on_host_threads(tmp_path):
    """The rendered CUDA source itself, compiled by g++ with tests/data/cuda_host.h: one host
    thread a CUDA thread, two blocks striding over several groups (the last one partial),
    shared memory full of NaN at the start, the arguments in the signature's order; against
    the dense oracle. Then a map index out of range: the kernel reports it in ERR."""
    units, cases, runs = [HOST_H.read_text()], [], []
    for i, (dim, nd, nq, what, tr, nc, it, dt, E, params) in enumerate(HOST_CASES + [
            (3, 2, 3, "values", False, 1, "int64", "float64", 4, None)]):
        bad = i == len(HOST_CASES)
        B, G, m, ndofs, x, V, H = _problem(dim, nd, nq, what, nc, E, seed=i, dtype=dt)
        spec = _spec(dim, nd, nq, what, tr, nc, it is not None, E=E, dtype=dt,
                     index_dtype=it or "int32", ndofs=ndofs)
        ctx = BASIS.context(spec, params)
        src = RT.render("basis.cu.j2", dict(ctx, entry=f"stc_host_{i}"))
        assert _SHARED in src
        units.append(f"namespace h{i} {{\n{src.replace(_SHARED, 'STC_HOST_SMEM;')}\n}}\n")
        real = "double" if dt == "float64" else "float"
        d = tmp_path / f"case{i}"
        d.mkdir()
        mats = {"stc_cB": B, "stc_cG": G}
        load = "".join(f"auto {n} = stc_read<R>(dir, \"{n}\"); std::memcpy(h{i}::{n}, "
                       f"{n}.data(), {n}.size() * sizeof(R));\n" for n in ctx["mats"])
        for n in ctx["mats"]:
            mats[n].astype(dt).tofile(d / n)
        field = H if tr else (x if it else V)
        field.astype(dt).tofile(d / "field")
        if it:
            mm = m.astype(it)
            if bad:
                mm.reshape(-1)[3] = ndofs + 5
            mm.tofile(d / "map")
        out_n = (nc * ndofs if it else E * nc * nd ** dim) if tr else H.size
        np.full(out_n, 0.0 if (tr and it) else np.nan, dtype=dt).tofile(d / "out0")
        ityp = {"int32": "int", "int64": "long long"}.get(it)
        args = "F.data(), " + ("M.data(), " if it else "") + "O.data(), " + (
            f"(long long){ndofs}, ERR.data(), " if it else "") + f"(long long){E * nc}"
        cases.append(f"""    case {i}: {{
        using R = {real};
        {load}        auto F = stc_read<R>(dir, "field");
        {f'auto M = stc_read<{ityp}>(dir, "map");' if it else ''}
        auto O = stc_read<R>(dir, "out0");
        std::vector<long long> ERR(3, 0);
        stc_launch(2, {ctx["threads"]}, [&] {{ h{i}::stc_host_{i}({args}); }});
        stc_write(dir, "out", O);
        stc_write(dir, "err", ERR);
    }} break;
""")
        runs.append((i, d, spec, dt, B, G, m, ndofs, x, V, H, bad))
    units.append("int main(int argc, char** argv) {\n    const char* dir = argv[2];\n"
                 "    switch (atoi(argv[1])) {\n" + "".join(cases) + "    }\n}\n")
    cpp = tmp_path / "host.cpp"
    cpp.write_text("".join(units))
    exe = tmp_path / "host"
    res = subprocess.run([GXX, "-std=c++20", "-O1", "-w", "-pthread", "-o", str(exe), str(cpp)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[:4000]
    for i, d, spec, dt, B, G, m, ndofs, x, V, H, bad in runs:
        subprocess.run([str(exe), str(i), str(d)], check=True, timeout=120)
        got = np.fromfile(d / "out", dtype=dt).astype(np.float64)
        err = np.fromfile(d / "err", dtype=np.int64)
        if bad:
            assert err.tolist() == [1, ndofs + 5, ndofs], err
            continue
        assert err.tolist() == [0, 0, 0]
        Gd = np.zeros_like(B) if G is None else G
        if not spec.transpose:
            ref = interp_oracle(B, Gd, V, spec.what, spec.dim).reshape(-1)
        else:
            U = integrate_oracle(B, Gd, H, spec.what, spec.dim)
            if spec.ndofs is None:
                ref = U.reshape(-1)
            else:
                ref = np.zeros((spec.ncomp, ndofs))
                for c in range(spec.ncomp):
                    np.add.at(ref[c], m.reshape(-1), U[:, c].reshape(-1))
                ref = ref.reshape(-1)
        assert rel_err(got, ref) < TOL[dt], (i, spec)


# --- the choice, the fallback, the tuner's space (no GPU) ---------------------------------

def test_the_shared_partial_sums():
    """3D "both": 2, 3 and 4 tensors in the three stages (not 3 x 4), the transpose the
    mirror, with one barrier where a matrix's terms add to another's."""
    c = BASIS.context(_spec(3, 5, 6, "both"))
    assert [sum(len(lp["terms"]) for lp in st["loops"]) for st in c["stages"]] == [2, 3, 4]
    assert [lv["count"] for lv in c["levels"]] == [1, 2, 3, 4]
    t = BASIS.context(_spec(3, 5, 6, "both", transpose=True))
    assert [sum(len(lp["terms"]) for lp in st["loops"]) for st in t["stages"]] == [4, 3, 2]
    assert [[lp["sync"] for lp in st["loops"]] for st in t["stages"]] == [[0, 1]] * 3
    assert [st["axis"] for st in c["stages"]] == [2, 1, 0]
    assert [st["axis"] for st in t["stages"]] == [0, 1, 2]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_heuristic_fits_every_size_it_claims(dtype):
    """dim 1-3, p = 1..16 (nq = p+1, p+2), every what, both directions: a context for every
    size whose item fits the device; whole warps, at most 1024 threads, within the
    shared-memory target unless one item is larger; 2D up to nd = nq = 17 and 3D up to
    p = 8 (nq = p+2) always fit."""
    for dim in (1, 2, 3):
        for p in range(1, 17):
            for nq in (p + 1, p + 2):
                for what in ("values", "gradients", "both"):
                    for tr in (False, True):
                        spec = _spec(dim, p + 1, nq, what, tr, dtype=dtype)
                        c = BASIS.context(spec)
                        if max(p + 1, nq) > MAX_EXTENT:
                            assert c is None
                            continue
                        if dim < 3 or p <= 8:
                            assert c is not None, spec
                        if c is None:
                            continue
                        assert c["threads"] % 32 == 0 and 64 <= c["threads"] <= 1024
                        assert c["smem_bytes"] <= DEFAULT_DEVICE["smem_optin"]
                        assert c["smem_bytes"] <= SMEM_TARGET or c["per_block"] == 1
                        assert c["hstage"] == int(nq ** (dim - 1) < 32) or \
                            c["smem_bytes"] > SMEM_TARGET


def test_choose_and_params():
    dev = dict(DEFAULT_DEVICE)
    s = _spec(3, 4, 6, "gradients", index_dtype="int64")
    assert family_of(s) is BASIS
    c = choose(s, dev)
    assert (c.template, c.entry, c.source) == (
        "basis.cu.j2", "stc_basis_interp_gradients_3d_f64_nd4nq6c1_i64", "heuristic")
    c = choose(s, dev, dict(per_block=2, threads=64, hstage=1))
    assert (c.ctx["per_block"], c.ctx["threads"], c.source) == (2, 64, "params")
    assert c.entry.endswith("_hs")
    for bad in (dict(per_block=2, threads=48, hstage=0), dict(per_block=0, threads=64),
                dict(per_block=2, threads=64, hstage=2), dict(per_block=500, threads=64)):
        with pytest.raises(ValueError, match="do not fit"):
            choose(s, dev, bad)


def test_sizes_it_cannot_hold_fall_back_and_say_so(monkeypatch):
    """An extent above MAX_EXTENT or an item larger than the device's shared memory: the
    reference path, reported (specialized False, the reason in the kernel text); a size it
    holds: the family's executor. (The compile is faked: no GPU needed.)"""
    dev = dict(name="NVIDIA H100 80GB HBM3", cc="90", sms=132, smem_optin=232448)
    monkeypatch.setattr(RT, "get_kernel", lambda *a: types.SimpleNamespace(
        attributes={"local_size_bytes": 0, "num_regs": 40}))
    monkeypatch.setattr(RT, "current_device", lambda: (0, dev))
    monkeypatch.setattr(RT, "current_device_id", lambda: 0)
    be = CudaBackend()
    for spec in (_spec(2, MAX_EXTENT + 1, MAX_EXTENT + 1, "values"),
                 _spec(3, 17, 19, "both")):
        assert choose(spec, dev) is None
        ex = be.build(spec)
        assert not ex.specialized and "no basis kernel for this size" in ex.kernel
    ex = be.build(_spec(3, 5, 6, "both", transpose=True))
    assert ex.specialized and ex.kernel == "stc_basis_interp_t_both_3d_f64_nd5nq6c1_i32"
    assert ex.params["hstage"] in (0, 1) and ex.params["registers"] == 40


class _Arr:
    """An operand stand-in: a name and a device pointer."""

    def __init__(self, name, ptr):
        self.name, self.data = name, types.SimpleNamespace(ptr=ptr)


@pytest.mark.parametrize("what,transpose,mapped", [
    ("values", False, True), ("both", True, True), ("gradients", False, False),
    ("gradients", True, False)])
def test_the_executor_launches_with_the_kernels_signature(monkeypatch, what, transpose, mapped):
    """No GPU (compile, launch and the constant bank faked): the matrices the kernel reads go
    to its constant bank, the arrays and scalars in the order of the rendered signature,
    the global vector zeroed before the transpose adds into it, the error flag read first."""
    from smalltc.backends.cuda import basis as mod
    dev = dict(name="NVIDIA H100 80GB HBM3", cc="90", sms=132, smem_optin=232448)
    monkeypatch.setattr(RT, "get_kernel", lambda *a: types.SimpleNamespace(
        attributes={"local_size_bytes": 0, "num_regs": 40}))
    monkeypatch.setattr(RT, "current_device_id", lambda: 0)
    calls = []

    class Bank:
        def __init__(self, template, entry, ctx, smem, names):
            calls.append(("bank", tuple(names)))

        def load(self, *arrays):
            calls.append(("load", tuple(a.name for a in arrays)))

        def launched(self):
            calls.append(("launched",))
    monkeypatch.setattr(RT, "ConstantBank", Bank)
    monkeypatch.setattr(mod, "_flag", lambda m, n: calls.append(("flag", m.name, n)) or 99)
    monkeypatch.setattr(mod, "_zero", lambda y: calls.append(("zero", y.name)))
    monkeypatch.setattr(RT, "direct_launcher", lambda kern, fmt, groups, threads, smem, mb: (
        lambda *args: calls.append(("launch", fmt, args))))
    dim = 1 if what == "gradients" else 2
    spec = _spec(dim, 3, 4, what, transpose, ncomp=2, mapped=mapped, E=6, ndofs=20)
    ex = BASIS.executor(choose(spec, dev), dev)
    ops = [_Arr(o.name, 1000 * (i + 1)) for i, o in enumerate(spec.inputs)]
    ex.run(ops, _Arr("out", 7))
    src = RT.render("basis.cu.j2", dict(ex.ctx, entry=ex.kernel))
    sig = re.search(rf"{ex.kernel}\((.*)\)", src).group(1)
    params = [p.split()[-1] for p in sig.split(", ")]
    mats = [m for m in ("B1d", "G1d") if f"stc_c{m[0]}[" in src]
    assert calls[0] == ("bank", tuple(f"stc_c{m[0]}" for m in mats))
    assert ("load", tuple(mats)) in calls and calls[-1] == ("launched",)
    launch = next(c for c in calls if c[0] == "launch")
    names = {1000 * (i + 1): o.name for i, o in enumerate(spec.inputs)}
    names[7] = "out"
    got = [names.get(a, a) for a in launch[2]]
    field = {"x": "X", "V": "V", "H": "H"}[spec.inputs[1 + (what != "values")].name]
    out = ("Y" if mapped else "U") if transpose else "H"
    want = {"X": "x", "V": "V", "H": "H" if transpose else "out", "MAP": "elem_dofs",
            "Y": "out", "U": "out", "ndofs": 20, "ERR": 99, "nbatch": 12}
    assert params[0] == field and out in params
    assert got == [want[p] for p in params]
    assert (("zero", "out") in calls) == (transpose and mapped)
    assert (("flag", "elem_dofs", 20) in calls) == mapped
    if mapped:
        assert calls.index(("flag", "elem_dofs", 20)) < calls.index(launch)


def test_the_tuners_space():
    """The heuristic first, every kept candidate renders, the space has both H forms; an
    entry of another order carries over (items a block scaled by the lines)."""
    from smalltc.tuning.space import generate
    spec = _spec(3, 5, 6, "both")
    sp = generate(spec)
    assert sp.family is BASIS and sp.candidates[0].params == sp.heuristic
    assert {c.params["hstage"] for c in sp.candidates} == {0, 1}
    assert all(c.ctx["smem_bytes"] <= DEFAULT_DEVICE["smem_optin"] for c in sp.candidates)
    assert sp.pruned["threads"] > 0
    other = _spec(3, 3, 4, "both")
    p = BASIS.adapt(spec, other, dict(per_block=8, threads=128, hstage=0))
    assert p is not None and p["threads"] == 128 and p["per_block"] < 8
    assert BASIS.adapt(spec, _spec(3, 3, 4, "values"), dict(per_block=8, threads=128,
                                                            hstage=0)) is None


def test_a_tuned_table_answers_its_size_and_the_near_ones(tmp_path, monkeypatch):
    """A search (made-up times, no compile) of two sizes through the map, its table read by
    the runtime: the exact size (any batch) and a near order take the entry's parameters;
    the tuner's problems are box meshes of >= 256 MB."""
    from smalltc import tables as core
    from smalltc.tuning import tables as T
    from smalltc.tuning.measure import DryRunDevice, FOOTPRINT, box_map, sized
    from smalltc.tuning.search import Search
    specs = [sized(_spec(3, 5, 6, "both", transpose=True, E=1, ndofs=125)),
             sized(_spec(2, 3, 5, "values", E=1, ndofs=9))]
    for s in specs:
        n = round(s.batch ** (1 / s.dim))
        assert n ** s.dim == s.batch and s.ndofs == (n * (s.nd - 1) + 1) ** s.dim
        assert roofline.counts(s).bytes >= FOOTPRINT
    assert box_map(_spec(1, 3, 4, "values", E=2, ndofs=5)).tolist() == [[0, 1, 2], [2, 3, 4]]
    dev = DryRunDevice("float64")
    search = Search("basis", "float64", specs, dev, compiler="none", jobs=1, progress=False,
                    log=lambda m: None)
    assert search.run() == "done"
    table = T.add_results(T.new_table(dev.info(), "float64"), search.results, "basis", 1.0)
    monkeypatch.setenv("SMALLTC_TUNING_TABLES", str(tmp_path))
    monkeypatch.setattr(core, "shipped_dir", lambda: tmp_path / "no-shipped-tables")
    T.save(table, tmp_path / "sm90-float64.json")
    entry = table["entries"][specs[0].size_key]
    h100 = dict(name="NVIDIA H100 80GB HBM3", cc="90", sms=132, smem_optin=232448)
    c = choose(specs[0].with_batch(7), h100)
    assert c.source == "table-exact" and c.family is BASIS
    assert {k: c.ctx[k] for k in entry["params"]} == entry["params"]
    near = choose(_spec(3, 6, 7, "both", transpose=True, E=7, ndofs=300), h100)
    assert near.source == "table-nearest" and near.ctx["threads"] == entry["params"]["threads"]
    assert choose(_spec(3, 5, 6, "both", E=7, ndofs=300), h100).source == "heuristic"


def test_the_bound_counts_field_points_and_map():
    s = _spec(3, 5, 6, "both", E=10, ndofs=700)
    c = roofline.counts(s)
    assert c.bytes == 8 * 700 + 4 * 10 * 125 + 8 * 10 * 4 * 216 + 8 * 2 * 30
    assert c.flops == 10 * 2 * 5 * (2 * 6 * 25 + 3 * 36 * 5 + 4 * 216)
    t = roofline.counts(_spec(2, 3, 4, "values", transpose=True, mapped=False, E=7))
    assert t.bytes == 8 * 7 * (9 + 16) + 8 * 12 and t.dofs == 7 * 9


def test_tune_sizes_parse_the_basis_forms():
    from smalltc.tuning.sizes import parse
    s = parse("basis", ["2:3:p+2:c2:gradients+t+m"], "float32")[0]
    assert (s.dim, s.nd, s.nq, s.ncomp, s.what, s.transpose, s.ndofs) == (
        2, 4, 5, 2, "gradients", True, 16)
    with pytest.raises(ValueError, match="WHAT 'grad'"):
        parse("basis", ["2:3:p+2:grad"], "float64")


def test_plan_builds_the_basis_application():
    """``smalltc.plan("interpolate"/"integrate", ...)``: the operands of the public
    functions, ``what``, ``ndofs``, ``dim``; the reference backend on NumPy arrays."""
    rng = np.random.default_rng(3)
    B, G = rng.standard_normal((2, 4, 3))
    m, ndofs = mesh_map(2, 3, 6, rng)
    x = rng.standard_normal((2, ndofs))
    p = smalltc.plan("interpolate", B, G, x, m, what="both", backend="reference")
    H = p(B, G, x, m)
    assert H.shape == (6, 2, 3, 4, 4) and p.spec.op == "basis"
    V = np.moveaxis(x[:, m], 0, 1).reshape(6, 2, -1)
    assert rel_err(H, interp_oracle(B, G, V, "both", 2).reshape(H.shape)) < 1e-13
    q = smalltc.plan("integrate", B, G, H, m, what="both", ndofs=ndofs, backend="reference")
    assert q(B, G, H, m).shape == (2, ndofs) and q.spec.transpose
    with pytest.raises(ValueError, match="ndofs is needed"):
        smalltc.plan("integrate", B, G, H, m, what="both")
    with pytest.raises(TypeError, match="takes B1d, G1d"):
        smalltc.plan("interpolate", B, G)


# --- on a GPU ------------------------------------------------------------------------------

# (dim, nd, nq, what, transpose, ncomp, map index dtype or None, dtype, E, params or None)
GPU_CASES = [
    (1, 4, 5, "both", False, 1, "int32", "float64", 300, None),
    (1, 3, 5, "gradients", True, 2, None, "float32", 300, None),
    (2, 3, 5, "values", False, 3, "int64", "float64", 101, None),
    (2, 5, 6, "both", True, 1, "int32", "float64", 101, None),
    (2, 5, 6, "both", True, 1, "int32", "float64", 101, dict(per_block=3, threads=64,
                                                            hstage=0)),
    (2, 17, 17, "both", False, 1, None, "float64", 23, None),
    (2, 17, 17, "gradients", True, 2, "int64", "float64", 23, None),
    (3, 2, 3, "both", True, 3, "int64", "float32", 77, None),
    (3, 5, 6, "both", False, 1, "int32", "float64", 61, None),
    (3, 5, 6, "both", True, 1, "int32", "float64", 61, None),
    (3, 5, 6, "values", False, 1, None, "float32", 61, dict(per_block=3, threads=64,
                                                          hstage=1)),
    (3, 4, 6, "gradients", True, 1, "int32", "float64", 61, dict(per_block=1, threads=32,
                                                                hstage=1)),
    (3, 9, 10, "values", True, 1, "int32", "float64", 13, None),
    (3, 9, 10, "both", False, 3, "int32", "float64", 13, None),
]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "-".join(str(v) for v in c[:9])
                         + ("-params" if c[9] else ""))
def test_kernels_match_the_dense_oracle(case):
    """Through ``smalltc.plan`` on the cuda backend (the heuristic, or ``params``): the
    family's kernel runs (``specialized``), the output poisoned with NaN first, against the
    float64 oracle; y of the transpose is overwritten, not added to."""
    import cupy as cp
    dim, nd, nq, what, tr, nc, it, dt, E, params = case
    B, G, m, ndofs, x, V, H = _problem(dim, nd, nq, what, nc, E, seed=E, dtype=dt)
    mapped = it is not None
    m = m.astype(it or "int32")
    Gop = None if G is None else cp.asarray(G)
    Gd = np.zeros_like(B) if G is None else G
    comp = (nc,) if nc > 1 else ()
    S = H.shape[2]
    pts = (E,) + comp + ((S,) if what != "values" else ()) + (nq,) * dim
    kw = dict(what=what, backend="cuda", params=params, dim=dim if nc > 1 and not mapped
              else None)
    if not tr:
        field = (x if nc > 1 else x[0]) if mapped else V.reshape((E,) + comp + (nd,) * dim)
        ops = (cp.asarray(B), Gop, cp.asarray(field)) + ((cp.asarray(m),) if mapped else ())
        p = smalltc.plan("interpolate", *ops, **kw)
        ref = interp_oracle(B, Gd, V, what, dim).reshape(pts)
        out = cp.full(pts, np.nan, dtype=dt)
    else:
        ops = (cp.asarray(B), Gop, cp.asarray(H.reshape(pts))) + (
            (cp.asarray(m),) if mapped else ())
        p = smalltc.plan("integrate", *ops, ndofs=ndofs if mapped else None, **kw)
        U = integrate_oracle(B, Gd, H, what, dim)
        if mapped:
            ref = np.zeros((nc, ndofs))
            for c in range(nc):
                np.add.at(ref[c], m.reshape(-1), U[:, c].reshape(-1))
            ref = ref.reshape(comp + (ndofs,))
        else:
            ref = U.reshape((E,) + comp + (nd,) * dim)
        out = cp.full(ref.shape, np.nan, dtype=dt)
    assert p.specialized and p.kernel.startswith("stc_basis_interp"), p
    if params:
        assert {k: p.params[k] for k in params} == params
    for _ in range(2):                        # the second call: y overwritten, not added to
        got = p(*ops, out=out)
        assert got is out
        assert rel_err(got, ref) < TOL[dt] * (10 if dt == "float32" else 1), p


@pytest.mark.gpu
@needs_gpu
def test_no_elements_leaves_a_zero_vector():
    import cupy as cp
    B = cp.ones((3, 2))
    m = cp.zeros((0, 2, 2), dtype=cp.int32)
    y = cp.full(5, np.nan)
    smalltc.integrate(B, None, cp.ones((0, 3, 3)), m, ndofs=5, out=y, backend="cuda")
    assert float(abs(y).max()) == 0.0


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("transpose", [False, True])
def test_a_map_changed_after_first_use_raises(transpose):
    """The kernel checks every map entry it reads: an entry changed in place after the
    plan's first look at the map raises ValueError naming it (at the next call that reads
    a map, or smalltc.check_errors), and the process stays usable."""
    import cupy as cp
    B, G, m, ndofs, x, V, H = _problem(3, 3, 4, "both", 1, 9, seed=4)
    B, G, m = cp.asarray(B), cp.asarray(G), cp.asarray(m)
    field = cp.asarray(H.reshape(9, 4, 4, 4, 4)) if transpose else cp.asarray(x[0])

    def call():
        if transpose:
            return smalltc.integrate(B, G, field, m, what="both", ndofs=ndofs, backend="cuda")
        return smalltc.interpolate(B, G, field, m, what="both", backend="cuda")
    good = call()
    keep = int(m.reshape(-1)[5])
    for value in (ndofs, -1):
        m.reshape(-1)[5] = value
        with pytest.raises(ValueError, match=rf"elem_dofs holds indices \S*{value}\S*, "
                                             rf"outside \[0, {ndofs}\)"):
            call()
            smalltc.check_errors()
        m.reshape(-1)[5] = keep
        call()                                # the map seen again (a raise forgets it)
    again = call()
    assert float(abs(again - good).max()) <= 1e-12 * float(abs(good).max())
