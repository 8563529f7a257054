"""The CUDA solver executors' launches, without a GPU.

Each executor of :mod:`smalltc.backends.cuda.solver` runs here on NumPy arrays standing in
for CuPy's, its kernels replaced by a model: the model reads the kernel's rendered
``extern "C"`` signature, checks every argument the executor passes against it (count,
pointer or scalar, the C type's dtype, C-contiguous arrays) and then does what the kernel
does, by parameter name, in NumPy. The results are compared with the dense oracles of
tests/test_solver_kernels.py. A GPU run (tests/test_solver_kernels.py) checks the kernels
themselves.
"""
import math
import re
import sys
import types

import numpy as np
import pytest

from smalltc.backends.cuda import choose
from smalltc.backends.cuda import runtime as RT
from smalltc.backends.cuda.family import DEFAULT_DEVICE
from smalltc.backends.reference_solvers import apply_axes
from smalltc.spec import CsrSpmvSpec, PcgSpec, SchwarzSpec, TransferSpec, VectorUpdateSpec

from conftest import rel_err
from test_solver_kernels import (schwarz_oracle, transfer_oracle, vector_oracle,
                                 _mesh_map)

_CTYPES = {"double": np.float64, "float": np.float32, "int": np.int32,
           "long long": np.int64}


def signature(src, entry):
    """``[(name, C type, pointer)]`` of ``entry``'s parameters in ``src``."""
    typedefs = dict((n, t) for t, n in re.findall(r"typedef ([\w ]+?) (\w+);", src))
    m = re.search(rf"\b{entry}\(([^)]*)\)", src)
    assert m, entry
    out = []
    for p in m.group(1).split(","):
        p = p.replace("__restrict__", "").replace("const", "").strip()
        ptr = "*" in p
        words = p.replace("*", " ").split()
        name, ctype = words[-1], " ".join(words[:-1])
        out.append((name, typedefs.get(ctype, ctype), ptr))
    return out


class Kernel:
    """A kernel's model: checks the launch's arguments, then runs ``model(args, ctx)``."""

    def __init__(self, template, entry, ctx):
        self.template, self.entry, self.ctx = template, entry, ctx
        self.params = signature(RT.render(template, dict(ctx, entry=entry)), entry)

    def __call__(self, grid, block, args):
        assert len(args) == len(self.params), (self.entry, len(args), self.params)
        assert block == (self.ctx["threads"],)
        named = {}
        for (name, ctype, ptr), a in zip(self.params, args):
            want = _CTYPES[ctype]
            if ptr:
                assert isinstance(a, np.ndarray) and a.flags.c_contiguous, (self.entry, name)
                assert a.dtype == want, (self.entry, name, a.dtype, ctype)
            else:
                assert type(a) is want, (self.entry, name, type(a), ctype)
            named[name] = a
        MODELS[self.template](self.entry, named, self.ctx)


def _vector(entry, a, ctx):
    f, mode = a["f"], ctx["mode"]
    if mode == "start":
        a["d"][...] = a["c1"] * a["inv"] * a["r"]
        a["dm"][...] = f * a["d"]
    elif mode == "step":
        d = a["d"].copy()
        a["r"][...] = a["r"] - (f * a["y"] + (1 - f) * d)
        a["x"][...] = a["beta"] * d if a["xzero"] else a["x"] + a["beta"] * d
        a["d"][...] = a["c0"] * d + a["c1"] * a["inv"] * a["r"]
        a["dm"][...] = f * a["d"]
    elif mode == "residual":
        a["r"][...] = a["b"] - (f * a["y"] + (1 - f) * a["x"])
    else:
        a["x"][...] = a["beta"] * a["d"] if a["xzero"] else a["x"] + a["beta"] * a["d"]
        a["xm"][...] = f * a["x"]


def _transfer(entry, a, ctx):
    E, dim = int(a["nelem"]), ctx["dim"]
    nin, nout = ctx["nin"], ctx["nout"]
    im = a["in_map"].reshape((E,) + (nin,) * dim)
    om = a["out_map"].reshape((E,) + (nout,) * dim)
    U = apply_axes(a["M"].reshape(nout, nin), (a["in_w"] * a["x"])[im], dim)
    np.add.at(a["y"], om.reshape(-1), (a["out_w"][om] * U).reshape(-1))


def _csr(entry, a, ctx):
    ip = a["indptr"]
    for row in range(int(a["nrows"])):
        k = slice(ip[row], ip[row + 1])
        a["y"][row] = np.dot(a["data"][k], a["x"][a["indices"][k]])


def _schwarz(entry, a, ctx):
    E, n, dim, N = int(a["nelem"]), ctx["n"], ctx["dim"], int(a["n"])
    idx = a["idx"].reshape(E, -1)
    S = a["S"].reshape(E, dim, n, n)
    rp = np.zeros(N + 1, dtype=a["r"].dtype)
    rp[:N] = a["w"] * a["r"]
    wp = np.append(a["w"], 0)
    for e in range(E):
        u = rp[idx[e]].reshape((n,) * dim)
        for d in range(dim):
            u = np.moveaxis(np.tensordot(S[e, d].T, u, axes=([1], [d])), 0, d)
        u = u * a["inv"].reshape(E, -1)[e].reshape((n,) * dim)
        for d in range(dim):
            u = np.moveaxis(np.tensordot(S[e, d], u, axes=([1], [d])), 0, d)
        zp = np.zeros(N + 1, dtype=u.dtype)
        np.add.at(zp, idx[e], wp[idx[e]] * u.reshape(-1))
        a["z"][...] += zp[:N]


def _cg(entry, a, ctx):
    ST = a["ST"]
    if ST[9] != 0:
        return
    real = np.dtype(ctx["dtype"]).type
    if entry == "stc_cg_dot":
        a["part"][::a["stride"]] = 0
        a["part"][0] = np.dot(a["a"].astype(float), a["b"].astype(float))
    elif entry == "stc_cg_alpha":
        pAp = a["part"].sum()
        ST[1] = pAp
        if not pAp > 0:
            ST[9] = 3.0 if math.isfinite(pAp) else 5.0
        else:
            ST[2] = ST[0] / pAp
    elif entry == "stc_cg_update":
        alpha = real(ST[2])
        a["x"][...] += alpha * a["p"]
        a["r"][...] -= alpha * a["Ap"]
        r = a["r"].astype(float)
        z = r * a["inv"] if ctx["jacobi"] else r
        a["part"][...] = 0
        a["part"][0], a["part"][1] = r @ r, r @ z
    elif entry == "stc_cg_beta":
        rr, rz = a["part"][0::2].sum(), a["part"][1::2].sum()
        it = int(ST[8]) + 1
        res = math.sqrt(rr) / ST[5]
        a["hist"][(it - 1) % int(ST[10])] = res
        ST[8], ST[4] = it, rr
        if not math.isfinite(res):
            ST[9] = 5
        elif res <= ST[6]:
            ST[9] = 1
        elif it >= int(ST[7]):
            ST[9] = 2
        elif not rz > 0:
            ST[9] = 4
        ST[3] = rz / ST[0]
        ST[0] = rz
    else:
        z = a["r"] * a["inv"] if ctx["jacobi"] else a["r"]
        a["p"][...] = z + real(ST[3]) * a["p"]


MODELS = {"pmg_vector.cu.j2": _vector, "pmg_transfer.cu.j2": _transfer,
          "csr_spmv.cu.j2": _csr, "schwarz_fdm.cu.j2": _schwarz, "cg.cu.j2": _cg}


@pytest.fixture
def fake_gpu(monkeypatch):
    """NumPy as CuPy, the kernels' models as the compiled kernels."""
    cp = types.ModuleType("cupy")
    for name in ("empty_like", "empty", "zeros", "ones", "full", "asarray", "vdot",
                 "float64", "ndarray", "ascontiguousarray"):
        setattr(cp, name, getattr(np, name))
    cp.asnumpy = np.asarray
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(RT, "current_device_id", lambda: 0)
    monkeypatch.setattr(RT, "get_kernel", lambda t, e, ctx, smem=0: Kernel(t, e, ctx))
    monkeypatch.setattr(RT, "HostMirror", HostMirror)


class HostMirror:
    """:class:`RT.HostMirror` on NumPy (the fake device has done its work at once)."""

    def __init__(self, a, slots=2):
        self.a, self.copies = a, [None] * slots

    def queue(self, slot):
        assert self.copies[slot] is None, "a slot queued twice before it was read"
        self.copies[slot] = self.a.copy()

    def read(self, slot):
        out, self.copies[slot] = self.copies[slot], None
        return out


def _executor(spec, params=None):
    c = choose(spec, DEFAULT_DEVICE, params)
    assert c is not None, spec
    return c.family.executor(c, DEFAULT_DEVICE)


@pytest.mark.parametrize("mode, masked, xzero, beta", [
    ("start", True, False, 1.0), ("start", False, False, 1.0), ("step", True, True, 0.7),
    ("step", False, False, 1.0), ("residual", True, False, 1.0), ("last", True, False, 0.5),
    ("last", False, True, 1.0)])
def test_vector_update_launches(fake_gpu, mode, masked, xzero, beta):
    n = 23
    rng = np.random.default_rng(0)
    spec = VectorUpdateSpec(mode=mode, batch=n, dtype="float64", masked=masked)
    names = VectorUpdateSpec.OPERANDS[mode]
    v = {k: rng.standard_normal(n) for k in names}
    f = (rng.random(n) < 0.6).astype(float) if masked else None
    ref = vector_oracle(mode, {k: a.copy() for k, a in v.items()}, f, 0.3, 1.4, beta, xzero)
    ops = tuple(v[k] for k in names) + ((f,) if masked else ())
    res = _executor(spec, dict(threads=64, waves=2)).run(ops, None, c0=0.3, c1=1.4,
                                                         beta=beta, xzero=xzero)
    got = {"start": lambda: dict(d=res[0], dm=res[1]),
           "step": lambda: {k: v[k] for k in ("r", "x", "d", "dm")},
           "residual": lambda: dict(r=res), "last": lambda: dict(x=v["x"], xm=res[1])}[mode]()
    for k, want in ref.items():
        assert rel_err(got[k], want) < 1e-14, k


@pytest.mark.parametrize("add", [False, True])
def test_transfer_launches(fake_gpu, add):
    rng = np.random.default_rng(1)
    dim, nin, nout, E = 2, 2, 4, 3
    n_in, n_out = 10, 30
    M = rng.standard_normal((nout, nin))
    x, in_w = rng.standard_normal(n_in), rng.random(n_in)
    out_w = rng.random(n_out)
    im, om = _mesh_map(E, nin, dim, n_in, rng, "int32"), _mesh_map(E, nout, dim, n_out, rng,
                                                                   "int32")
    spec = TransferSpec(dim=dim, nin=nin, nout=nout, batch=E, dtype="float64", n_in=n_in,
                        n_out=n_out)
    base = rng.standard_normal(n_out)
    y = base.copy()
    _executor(spec).run((M, x, im, in_w, om, out_w), y, add=add)
    ref = transfer_oracle(M, x, im, in_w, om, out_w, n_out) + (base if add else 0)
    assert rel_err(y, ref) < 1e-14


def test_csr_launches(fake_gpu):
    ip = np.array([0, 2, 2, 5], np.int64)
    ix = np.array([0, 2, 1, 2, 0], np.int64)
    data, x = np.arange(1.0, 6.0), np.array([1.0, 2.0, 3.0])
    spec = CsrSpmvSpec(batch=3, ncols=3, nnz=5, dtype="float64", index_dtype="int64")
    y = _executor(spec).run((ip, ix, data, x))
    assert np.array_equal(y, [1 + 6, 0, 6 + 12 + 5])


@pytest.mark.parametrize("rdtype", [None, "float64"])
def test_schwarz_launches(fake_gpu, rdtype):
    rng = np.random.default_rng(2)
    dim, n, E, ndofs = 2, 4, 3, 20
    dt = "float64" if rdtype is None else "float32"
    S = rng.standard_normal((E, dim, n, n)).astype(dt)
    inv = (rng.random((E, n, n)) + 0.5).astype(dt)
    idx = _mesh_map(E, n, dim, ndofs + 1, rng, "int32")
    r, w = rng.standard_normal(ndofs), rng.random(ndofs).astype(dt)
    spec = SchwarzSpec(dim=dim, n=n, batch=E, dtype=dt, ndofs=ndofs, rdtype=rdtype)
    z = np.full(ndofs, np.nan, dtype=dt)
    _executor(spec).run((S, inv, idx, r if rdtype else r.astype(dt), w), z)
    ref = schwarz_oracle(S, inv, idx, r.astype(dt), w)
    assert rel_err(z, ref) < (1e-13 if rdtype is None else 1e-5)


@pytest.mark.parametrize("jacobi", [True, False])
def test_pcg_launches(fake_gpu, jacobi):
    rng = np.random.default_rng(3)
    n = 30
    Q = rng.standard_normal((n, n))
    A = Q @ Q.T / n + np.diag(rng.random(n) + 1)
    b = rng.standard_normal(n)
    x, r = np.zeros(n), b.copy()
    ops = (x, r, 1 / np.diag(A)) if jacobi else (x, r)
    hist = [1.0]
    spec = PcgSpec(batch=n, dtype="float64", jacobi=jacobi)
    it, code, _ = _executor(spec, dict(threads=64, blocks=16)).run(
        ops, apply=lambda v: A @ v, tol=1e-11, maxiter=200, bnorm=float(np.linalg.norm(b)),
        history=hist, check_every=4)
    assert code == 1 and len(hist) == it + 1 and hist[-1] <= 1e-11
    assert rel_err(x, np.linalg.solve(A, b)) < 1e-9


@pytest.mark.parametrize("tol, maxiter", [(1e-11, 200), (1e-3, 200), (1e-11, 3)])
def test_pcg_launches_with_a_preconditioner(fake_gpu, tol, maxiter):
    """Any preconditioner: the host queues one iteration ahead; the iterations, the
    residuals and the iterate are the reference loop's, and at most one iteration's
    operator and preconditioner run past the stop."""
    from smalltc.backends.reference_solvers import pcg_ref
    rng = np.random.default_rng(4)
    n = 40
    Q = rng.standard_normal((n, n))
    A = Q @ Q.T / n + np.diag(rng.random(n) * 3 + 1)
    b = rng.standard_normal(n)
    M = np.linalg.inv(np.diag(np.diag(A)) + 0.1 * np.eye(n))       # SPD, not Jacobi
    calls = {"apply": 0, "precond": 0}

    def apply(v):
        calls["apply"] += 1
        return A @ v

    def precond(v):
        calls["precond"] += 1
        return M @ v

    spec = PcgSpec(batch=n, dtype="float64", jacobi=False)
    x, r, hist = np.zeros(n), b.copy(), [1.0]
    it, code, _ = _executor(spec, dict(threads=64, blocks=16)).run(
        (x, r), apply=apply, precond=precond, tol=tol, maxiter=maxiter,
        bnorm=float(np.linalg.norm(b)), history=hist)
    x2, r2, hist2 = np.zeros(n), b.copy(), [1.0]
    it2, code2, _ = pcg_ref(spec, x2, r2, apply=lambda v: A @ v, precond=lambda v: M @ v,
                            tol=tol, maxiter=maxiter, bnorm=float(np.linalg.norm(b)),
                            history=hist2)
    assert (it, code) == (it2, code2) and code == (2 if maxiter == 3 else 1)
    assert len(hist) == it + 1 and rel_err(np.array(hist), np.array(hist2)) < 1e-10
    assert rel_err(x, x2) < 1e-10
    assert it <= calls["apply"] <= it + 1 and calls["precond"] == calls["apply"] + 1
    if maxiter == 3:
        assert calls["apply"] == 3            # nothing queued past the iteration limit


def test_the_host_waits_only_near_the_stop():
    """The host queues ahead unless the best of the last three residual ratios brings the
    next residual within twice the tolerance (or the first residual is there already)."""
    from smalltc.backends.cuda.solver import _near_stop
    assert not _near_stop([1.0], 1e-8) and _near_stop([1.5e-8], 1e-8)
    assert not _near_stop([1.0, 0.5, 0.25], 1e-8)
    assert _near_stop([1.0, 1e-4, 1e-7], 1e-8)            # ratio 1e-3: next ~1e-10
    assert _near_stop([1.0, 0.9, 1e-3, 5e-8], 1e-8)       # the best of three: 1e-3
    assert not _near_stop([1.0, 1e-6, 9e-7, 8e-7, 7e-7], 1e-9)  # older ratios drop out
    assert _near_stop([1.0, 0.0], 1e-8)                   # a zero residual
