"""The ``geometry`` suite: the pointwise geometry, :func:`smalltc.geometry_data`, against its
roofline bound and what a user would run instead.

Usage::

    smalltc bench --suite geometry                        # 3D p = 1..8, nq = p + 2
    smalltc bench --suite geometry --device cpu --p 1-4 --footprint 1024
    smalltc bench --suite geometry --quick

For 3D p = 1..8 with ``nq = p + 2`` points an axis, the Jacobians of the elements of a
distorted box mesh at the points (:func:`smalltc.interpolate` of its coordinates, the
layout the op reads), one case per output: ``det`` (|J|), ``adjugate`` (|J| and adj J),
``mass`` (``D = w |J|``), ``diffusion`` (the packed ``Q``) and ``diffusion coef`` (``Q``
with a coefficient at every point). Each case measures, in one process, on the same
arrays:

``smalltc``     ``smalltc.geometry_data`` with ``--backend`` (auto: the family's kernel);
                the plan's backend, kernel and parameters recorded
``reference``   the same with ``backend="reference"``: the closed form as elementwise
                NumPy/CuPy passes (what ``smalltc.fem`` ran before the op)
``linalg``      what a user would write: ``linalg.det`` and ``linalg.inv`` of the
                Jacobians moved to ``(E, K, dim, dim)``, then einsum

Each is checked against a float64 oracle (``numpy.linalg`` on a sample of the elements)
before it is timed. The bound (:mod:`smalltc.roofline`, op ``"geometry"``): ``J`` and the
coefficient read once, each output and each element's smallest ``|J|`` written once. Rates
are points per second. Sizes: about 384 MiB moved a case on a GPU, 32 MiB on a CPU
(``--footprint`` sets the CPU's), ``quick`` a sixteenth.
"""
from __future__ import annotations

import numpy as np

import smalltc

from .. import roofline
from ..fem import box_mesh
from ..fem.basis import lagrange_basis
from ..fem.quadrature import quadrature_rule
from ..plan import build_plan
from ..spec import GeometrySpec
from .basis import BYTES, _plan_info, target_bytes  # noqa: F401 (BYTES: the basis suite's)
from .cases import Case
from .report import impl_table
from .runner import (TOLERANCE, _sample_indices, _to_host, case_record, check, measure,
                     recorded)

__all__ = ["cases", "run_case", "table", "WHATS", "oracle"]

#: (label, what, with a coefficient)
WHATS = (("det", "det", False), ("adjugate", "adjugate", False), ("mass", "mass", False),
         ("diffusion", "diffusion", False), ("diffusion coef", "diffusion", True))
SAMPLE = 256          # elements checked against the oracle


def cases(dtype, kind, ps=None, quick=False, footprint=None) -> list:
    """The cases for ``dtype`` (the outputs'; J is float64) on a device of ``kind``
    ("cpu"/"gpu"): per order and output. ``footprint`` (bytes): a CPU case's bytes
    instead of :data:`BYTES`.

    >>> for c in cases("float64", "cpu", ps=[2], quick=True)[:2]:
    ...     print(c.id)
    geometry det dim=3 p=2 nq=4 float64
    geometry adjugate dim=3 p=2 nq=4 float64
    """
    target = target_bytes(kind, quick, footprint)
    out = []
    for p in ps or ([1, 2, 4] if quick else range(1, 9)):
        nq = p + 2
        for label, what, coef in WHATS:
            per = roofline.counts(GeometrySpec(dim=3, nq=nq, batch=1, dtype=dtype, what=what,
                                               coef=coef)).bytes
            n = max(1, round((target / per) ** (1 / 3)))
            out.append(Case("geometry", "geometry", dict(
                label=label, dim=3, p=p, nq=nq, nx=n, batch=n ** 3, what=what, coef=coef),
                dtype, "" if kind == "gpu" else f"CPU sizes: ~{target >> 20} MiB a case"))
    return out


def oracle(spec, J, W, coef):
    """float64 by ``numpy.linalg`` on the host arrays of the sampled elements: the case's
    output and each element's smallest ``|J|``."""
    E, dim = J.shape[0], spec.dim
    Jp = np.moveaxis(J.reshape(E, dim, dim, -1), 3, 1)
    det = np.linalg.det(Jp)
    if spec.what == "det":
        res = det
    elif spec.what == "adjugate":
        adj = np.linalg.inv(Jp) * det[..., None, None]
        res = np.concatenate([det[:, None], np.moveaxis(adj.reshape(E, -1, dim * dim), 2, 1)],
                             axis=1)
    else:
        scale = W.reshape(1, -1) * (coef.reshape(E, -1) if coef is not None else 1.0)
        if spec.what == "mass":
            res = det * scale
        else:
            inv = np.linalg.inv(Jp)
            M = np.einsum("ekai,ekbi->ekab", inv, inv) * (det * scale)[..., None, None]
            iu = np.triu_indices(dim)
            res = np.moveaxis(M[..., iu[0], iu[1]], 2, 1)
    return res.reshape((E,) + spec.out_shape[1:]), det.min(axis=1)


def _linalg(xp, spec, J, W, coef):
    """What a user would write (see the module docstring)."""
    E, dim = J.shape[0], spec.dim
    Jp = xp.moveaxis(J.reshape(E, dim, dim, -1), 3, 1)
    det = xp.linalg.det(Jp)
    if spec.what == "det":
        return det.reshape(spec.out_shape)
    inv = xp.linalg.inv(Jp)
    if spec.what == "adjugate":
        adj = inv * det[..., None, None]
        return xp.concatenate([det[:, None], xp.moveaxis(adj.reshape(E, -1, dim * dim), 2, 1)],
                              axis=1).reshape(spec.out_shape)
    scale = W.reshape(1, -1) * (coef.reshape(E, -1) if coef is not None else 1.0)
    if spec.what == "mass":
        return (det * scale).reshape(spec.out_shape)
    M = xp.einsum("ekai,ekbi->ekab", inv, inv) * (det * scale)[..., None, None]
    iu = np.triu_indices(dim)
    return xp.moveaxis(M[..., iu[0], iu[1]], 2, 1).reshape(spec.out_shape)


def run_case(case, bound_args, *, xp, backend="auto", repeats=20, warmup=2) -> dict:
    """Measure one case; the record has the bench's layout (``impls``, ``bound``)."""
    s, dt = case.sizes, case.dtype
    rec = case_record(case)
    with recorded(rec, xp):
        mesh = box_mesh(3, s["nx"], distortion=0.1)
        E, nq = mesh.nelements, s["nq"]
        pts, w1 = quadrature_rule(nq)
        Bg, Gg = (xp.asarray(m) for m in lagrange_basis(mesh.geom_nodes, pts))
        J = smalltc.interpolate(Bg, Gg, xp.asarray(mesh.nodes), what="gradients", dim=3)
        spec = GeometrySpec(dim=3, nq=nq, batch=E, dtype=dt, what=s["what"], coef=s["coef"])
        W = np.multiply.outer(np.multiply.outer(w1, w1), w1)
        Wx = xp.asarray(W) if spec.weighted else None
        coef = xp.asarray(1.0 + np.random.default_rng(0).random((E,) + (nq,) * 3)) \
            if spec.coef else None
        b = roofline.bound(spec, **bound_args)
        rec.update(bound=b.as_dict(), footprint_bytes=b.bytes, spec=str(spec))
        idx = _sample_indices(E, SAMPLE)
        ref, rmin = oracle(spec, _to_host(J[xp.asarray(idx)]), W,
                           None if coef is None else _to_host(coef[xp.asarray(idx)]))
        out, jmin = xp.empty(spec.out_shape, dtype=dt), xp.empty(E)
        impls = [("smalltc", backend, lambda: smalltc.geometry_data(
                     J, Wx, what=spec.what, coef=coef, jmin=jmin, out=out, backend=backend),
                  f"smalltc.geometry_data (backend {backend})"),
                 ("reference", "reference", lambda: smalltc.geometry_data(
                     J, Wx, what=spec.what, coef=coef, jmin=jmin, out=out,
                     backend="reference"), "smalltc.geometry_data (backend reference)"),
                 ("linalg", None, lambda: _linalg(xp, spec, J, Wx, coef),
                  f"{xp.__name__}.linalg det and inv, einsum")]

        def check_result(res, be):
            finite, err = check(res, ref, idx, xp)
            if be is None:
                return finite, err, {}
            merr = float(np.abs(_to_host(jmin)[idx] - rmin).max() / np.abs(rmin).max())
            return finite, err, dict(jmin_rel_err=merr,
                                     **_plan_info(build_plan(spec, xp, be)))  # the plan it runs
        measure(rec, impls, check_result, bound=b, tol=TOLERANCE[dt], outs=(out, jmin),
                on_gpu=xp.__name__ == "cupy", repeats=repeats, warmup=warmup)
        del out, J
    return rec


def table(rows, file) -> None:
    """One line per case: points/s and the fraction of the bound for smalltc and the
    reference path, the linalg baseline, smalltc's speed-up over each, and its kernel."""
    print("\n== geometry (G points/s; %bound: fraction of the roofline bound; x NAME: "
          "smalltc's speed over NAME's) ==", file=file)
    impl_table(rows, file, suite="geometry", baseline="linalg", width=34)
