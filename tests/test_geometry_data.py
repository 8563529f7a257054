"""The pointwise geometry (``smalltc.geometry_data``, :class:`smalltc.spec.GeometrySpec`).

A table of cases (dim, nq, what, coefficient, dtypes, ``absdet``) on random well-conditioned
Jacobians against a float64 oracle written with ``numpy.linalg.det``, ``numpy.linalg.inv``
and einsum (outputs and ``jmin`` poisoned with NaN first), on the reference and CPU
backends, and with CuPy arrays where a GPU answers; the element minimum and its NaN; the
errors. Without a GPU the CUDA sources of a table of contexts compile with nvcc for
sm_90 (no warning, no spill).
"""
import numpy as np
import pytest

import smalltc
from smalltc import roofline
from smalltc._arrays import gpu_available
from smalltc.backends.cuda import runtime as RT
from smalltc.backends.cuda.geometry import GEOMETRY as CUDA_GEOMETRY
from smalltc.backends.reference import cofactors
from smalltc.plan import build_plan
from smalltc.spec import GeometrySpec

from conftest import to_numpy, xp_of
from ptxas import NVCC, compiles_clean

def needs_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not gpu_available(), reason="no CUDA device")(test))
TOL = {"float64": 1e-12, "float32": 2e-6}


def jacobians(E, dim, nq, seed=0, jdtype="float64"):
    """Random well-conditioned Jacobians (E, dim, dim, nq^dim): a rotation-free scaling
    near the identity times a small perturbation, |J| well away from 0."""
    rng = np.random.default_rng(seed)
    pts = (nq,) * dim
    J = np.eye(dim).reshape((1, dim, dim) + (1,) * dim) * rng.uniform(0.5, 2.0, (E, 1, 1, 1)
                                                                       + (1,) * (dim - 1))
    J = J + 0.2 * rng.standard_normal((E, dim, dim) + pts)
    return J.astype(jdtype)


def oracle(spec, J, W, coef):
    """float64: |J| by numpy.linalg.det, J^-1 by numpy.linalg.inv, D and Q by einsum."""
    dim, E = spec.dim, spec.batch
    Jp = np.moveaxis(J.astype(np.float64).reshape(E, dim, dim, -1), 3, 1)   # (E, K, dim, dim)
    det = np.linalg.det(Jp)
    inv = np.linalg.inv(Jp)
    jmin = det.min(axis=1)
    pts = (spec.nq,) * dim
    if spec.what in ("det", "adjugate", "inverse"):
        if spec.what == "det":
            return det.reshape((E,) + pts), jmin
        m = inv * det[..., None, None] if spec.what == "adjugate" else inv
        res = np.concatenate([det[:, None], np.moveaxis(m.reshape(E, -1, dim * dim), 2, 1)],
                             axis=1)
        return res.reshape((E, 1 + dim * dim) + pts), jmin
    scale = W.reshape(1, -1) * (coef.reshape(E, -1) if coef is not None else 1.0)
    d = np.abs(det) if spec.absdet else det
    out = []
    if spec.what in ("mass", "both"):
        out.append(d * scale)
    if spec.what in ("diffusion", "both"):
        M = np.einsum("ekai,ekbi->ekab", inv, inv) * (d * scale)[..., None, None]
        iu = np.triu_indices(dim)
        out.extend(np.moveaxis(M[..., iu[0], iu[1]], 2, 0))
    res = np.stack(out, axis=1)
    if spec.what == "mass":
        res = res[:, 0]
    return res.reshape(spec.out_shape), jmin


# (dim, nq, what, coef, out dtype, J dtype, absdet)
CASES = [
    (1, 3, "mass", True, "float64", "float64", False),
    (1, 4, "diffusion", False, "float64", "float64", False),
    (2, 2, "det", False, "float64", "float64", False),
    (2, 3, "inverse", False, "float64", "float64", False),
    (2, 4, "both", True, "float32", "float64", False),
    (3, 2, "adjugate", False, "float64", "float64", False),
    (3, 3, "diffusion", True, "float64", "float64", False),
    (3, 4, "mass", False, "float32", "float64", True),
    (3, 5, "diffusion", False, "float64", "float32", True),
    (3, 3, "both", True, "float64", "float64", False),
]
IDS = [f"{d}d-nq{q}-{w}{'-c' if c else ''}-{o}-J{j[5:]}{'-abs' if a else ''}"
       for d, q, w, c, o, j, a in CASES]


def _run(case, xp, backend, E=13, sign=1.0):
    dim, nq, what, with_coef, dt, jdt, absdet = case
    J = jacobians(E, dim, nq, jdtype=jdt)
    J[::3, 0] *= sign                             # some elements mirrored when sign < 0
    spec = GeometrySpec(dim=dim, nq=nq, batch=E, dtype=dt, what=what, coef=with_coef,
                        jdtype=jdt, absdet=absdet)
    rng = np.random.default_rng(1)
    w1 = rng.uniform(0.1, 1.0, nq)
    W = w1
    for _ in range(dim - 1):
        W = np.multiply.outer(W, w1)
    coef = rng.uniform(0.5, 2.0, (E,) + (nq,) * dim).astype(jdt) if with_coef else None
    out = xp.full(spec.out_shape, np.nan, dtype=dt)
    jmin = xp.full(E, np.nan)
    weights = xp.asarray(w1) if spec.weighted else None
    res = smalltc.geometry_data(xp.asarray(J), weights, what=what,
                                coef=None if coef is None else xp.asarray(coef), jmin=jmin,
                                absdet=absdet, out=out, backend=backend)
    assert res is out
    return spec, to_numpy(res), to_numpy(jmin), oracle(spec, J, W, coef)


def _rel(a, b):
    return float(np.abs(a.astype(np.float64) - b).max() / np.abs(b).max())


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_against_the_oracle(case, backend):
    spec, res, jmin, (want, wmin) = _run(case, np, backend, sign=-1.0 if case[6] else 1.0)
    assert np.isfinite(res).all() and np.isfinite(jmin).all()
    assert _rel(res, want) < TOL[case[4]], case
    assert np.abs(jmin - wmin).max() <= 1e-13 * np.abs(wmin).max()


@pytest.mark.parametrize("backend, kernel", [("cpu", "stc_geometry_diffusion_3d_f32_nq4_c"),
                                             ("reference", "geometry (diffusion): closed")])
def test_plan_runs_the_family(backend, kernel):
    spec = GeometrySpec(dim=3, nq=4, batch=3, dtype="float32", what="diffusion", coef=True)
    p = build_plan(spec, np, backend)
    assert p.backend == backend and p.kernel.startswith(kernel) and p.specialized


@needs_gpu
@pytest.mark.parametrize("backend", ["reference", "cuda"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_against_the_oracle_on_a_gpu(case, backend):
    cp = xp_of("cupy")
    spec, res, jmin, (want, wmin) = _run(case, cp, backend, sign=-1.0 if case[6] else 1.0)
    assert np.isfinite(res).all() and np.isfinite(jmin).all()
    assert _rel(res, want) < TOL[case[4]], case
    assert np.abs(jmin - wmin).max() <= 1e-13 * np.abs(wmin).max()


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_element_minimum_inverted_and_nan(backend):
    """jmin is each element's smallest |J| (a NaN sticks); without jmin an inverted element
    raises, naming the first and counting them."""
    J = jacobians(6, 3, 3)
    J[2, :, :, 1, 1, 1] = np.diag([-1.0, 1.0, 1.0])                 # |J| = -1 at one point
    J[4, 0, 0, 0, 2, 1] = np.nan
    jmin = np.full(6, 7.0)
    det = smalltc.geometry_data(J, what="det", jmin=jmin, backend=backend)
    assert jmin[2] == -1.0 and np.isnan(jmin[4]) and np.isnan(det[4, 0, 2, 1])
    good = [0, 1, 3, 5]
    assert np.array_equal(jmin[good], det[good].reshape(4, -1).min(axis=1))
    with pytest.raises(ValueError, match=r"\|J\| <= 0 in element 2 \(min \|J\| = -1\); 2 "
                                         r"element\(s\) in all"):
        smalltc.geometry_data(J, np.ones(3), what="mass", backend=backend)


def test_constant_coefficient_scales_the_tensor_weights():
    J = jacobians(4, 2, 3)
    w = np.array([0.3, 0.5, 0.2])
    a = smalltc.geometry_data(J, w, what="both", coef=2.5, backend="reference")
    b = smalltc.geometry_data(J, np.multiply.outer(w, w) * 2.5, what="both",
                              backend="reference")
    assert np.array_equal(a, b)


def test_cofactors_are_the_adjugate():
    rng = np.random.default_rng(3)
    for dim in (1, 2, 3):
        A = rng.standard_normal((dim, dim))
        adj = np.empty((dim, dim))
        for a, row in enumerate(cofactors(dim)):
            for i, t in enumerate(row):
                adj[a, i] = (1.0 if t is None else t[1] * A[t[0]] if dim == 2 else
                             A[t[0]] * A[t[1]] - A[t[2]] * A[t[3]])
        assert np.allclose(A @ adj, np.linalg.det(A) * np.eye(dim), atol=1e-13)


_J = np.ones((2, 3, 3, 2, 2, 2))
ERRORS = [
    (dict(J=np.ones((2, 3, 2, 2, 2, 2))), ValueError,
     r"J has shape \(2, 3, 2, 2, 2, 2\), expected \(E, dim, dim, nq, ..., nq\)"),
    (dict(J=np.ones((2, 2, 2, 3, 4))), ValueError, r"J has shape \(2, 2, 2, 3, 4\)"),
    (dict(J=_J, what="volume"), ValueError, r"what must be one of \('det', 'adjugate'"),
    (dict(J=_J), ValueError, r"what='mass' needs weights, the tensor quadrature weights "
                             r"\(2, 2, 2\)"),
    (dict(J=_J, weights=np.ones(3)), ValueError,
     r"weights has shape \(3, 3, 3\), expected \(2, 2, 2\)"),
    (dict(J=_J, what="det", weights=np.ones(2)), ValueError,
     r"weights and coef are for what 'mass', 'diffusion' or 'both'"),
    (dict(J=_J, weights=np.ones(2), coef=np.ones((2, 2, 2))), ValueError,
     r"coef has shape \(2, 2, 2\), expected \(2, 2, 2, 2\)"),
    (dict(J=_J, weights=np.ones(2), coef=np.ones((2, 2, 2, 2), np.float32)), TypeError,
     r"coef has dtype float32, expected J's float64"),
    (dict(J=_J.astype(np.int64), what="det"), TypeError, r"J has dtype int64"),
    (dict(J=_J, what="det", jmin=np.ones(3)), ValueError,
     r"jmin has shape \(3,\) and dtype float64, expected \(2,\) float64"),
    (dict(J=_J, what="det", dtype=np.int32), TypeError,
     r"the outputs' dtype must be float64 or float32, got int32"),
    (dict(J=_J, what="det", out=np.ones((2, 2, 2))), ValueError,
     r"out has shape \(2, 2, 2\), expected \(2, 2, 2, 2\)"),
    (dict(J=_J, what="det", coef=2.0), ValueError, r"coef=2.0 scales the weights"),
]


@pytest.mark.parametrize("kw, exc, match", ERRORS)
def test_errors(kw, exc, match):
    kw = dict(kw)
    with pytest.raises(exc, match=match):
        smalltc.geometry_data(kw.pop("J"), kw.pop("weights", None), backend="reference", **kw)


def test_roofline_reads_j_once_and_writes_each_output_once():
    s = GeometrySpec(dim=3, nq=4, batch=10, dtype="float32", what="diffusion", coef=True)
    c = roofline.counts(s)
    K = 4 ** 3
    assert c.bytes == 10 * K * (8 * 9 + 8 + 4 * 6) + 8 * K + 8 * 10
    assert c.items == 10 and c.flops > 0


# --- the CUDA sources (no GPU) ----------------------------------------------------------------

COMPILED = [GeometrySpec(dim=d, nq=q, batch=1, dtype=dt, what=w, coef=c, jdtype=jd, absdet=a)
            for d, q, w, c, dt, jd, a in CASES + [(3, 6, "inverse", False, "float32",
                                                   "float64", False),
                                                  (3, 8, "both", True, "float64", "float64",
                                                   True)]]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_cuda_sources_compile_for_sm90_without_spills(tmp_path):
    kernels = {}
    for spec in COMPILED:
        for params in (None, dict(tpe=4, threads=128, min_blocks=0)):
            ctx = CUDA_GEOMETRY.context(spec, params)
            entry = f"{CUDA_GEOMETRY.entry(spec, ctx)}_{len(kernels)}"
            kernels[entry] = RT.render("geometry.cu.j2", dict(ctx, entry=entry))
    compiles_clean(tmp_path / "geometry_sm_90.cu", kernels)


def test_cuda_choice_and_params():
    s = GeometrySpec(dim=2, nq=2, batch=5, dtype="float64", what="det")
    c = CUDA_GEOMETRY.context(s)
    assert (c["tpe"], c["per_block"], c["smem_bytes"]) == (4, 64, 0)
    assert CUDA_GEOMETRY.context(s, dict(tpe=64, threads=256)) is None
    assert CUDA_GEOMETRY.context(s, dict(tpe=8, threads=100)) is None
    pruned = {why for _, why in CUDA_GEOMETRY.space(s)}
    assert pruned == {None, "points", "resident"}


def test_bench_suite_end_to_end(tmp_path, capsys):
    """``smalltc bench --suite geometry`` at p = 1: every output, smalltc (cpu), the
    reference path and linalg checked against the oracle and timed, against the bound."""
    import json

    from smalltc.bench import geometry as G
    from smalltc.bench.cases import Case, case_spec
    from smalltc.app.cli import main
    assert main(["bench", "--quick", "--repeats", "2", "--warmup", "1", "--no-progress",
                 "--device", "cpu", "--backend", "cpu", "--suite", "geometry", "--p", "1",
                 "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "bench-geometry-p1-float64.json").read_text())
    assert [c["sizes"]["label"] for c in doc["cases"]] == [w[0] for w in G.WHATS]
    for c in doc["cases"]:
        assert not c.get("error"), c.get("trace")
        spec = case_spec(Case(c["suite"], c["op"], c["sizes"], c["dtype"]))
        assert c["bound"]["bytes"] == roofline.counts(spec).bytes
        im = c["impls"]
        assert set(im) == {"smalltc", "reference", "linalg"}
        for name, r in im.items():
            assert r["status"] == "ok", (c["id"], name, r)
            assert r["rel_err"] <= 1e-12 and 0 < r["fraction"] and r["dofs_per_s"] > 0
        assert im["smalltc"]["poisoned"] and im["smalltc"]["backend"] == "cpu"
        assert im["smalltc"]["kernel"].startswith("stc_geometry_")
    assert "== geometry" in capsys.readouterr().out
