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

import math
import traceback

import numpy as np

from .. import roofline
from .._timing import median, time_calls, time_once
from .basis import _plan_info
from .cases import Case

__all__ = ["cases", "run_case", "table", "WHATS", "oracle"]

#: (label, what, with a coefficient)
WHATS = (("det", "det", False), ("adjugate", "adjugate", False), ("mass", "mass", False),
         ("diffusion", "diffusion", False), ("diffusion coef", "diffusion", True))
#: bytes a case moves: (GPU, CPU); ``quick`` divides by 16
BYTES = (384 * 2 ** 20, 32 * 2 ** 20)
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}
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
    from ..spec import GeometrySpec
    target = BYTES[0 if kind == "gpu" else 1] // (16 if quick else 1)
    if footprint is not None and kind != "gpu":
        target = int(footprint)
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


def _rec(b, times, what, **extra):
    t = median(times)
    return dict(what=what, status="ok", repeats=len(times), times_ns=times, median_s=t,
                min_s=min(times) * 1e-9, fraction=b.tmin / t, dofs_per_s=b.dofs / t,
                gbytes_per_s=b.bytes / t * 1e-9, gflops=b.flops / t * 1e-9, **extra)


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def run_case(case, bound_args, *, xp, backend="auto", repeats=20, warmup=2) -> dict:
    """Measure one case; the record has the bench's layout (``impls``, ``bound``)."""
    import smalltc
    from ..fem import box_mesh
    from ..fem.basis import lagrange_basis
    from ..fem.quadrature import quadrature_rule
    from ..plan import build_plan
    from ..spec import GeometrySpec
    from .runner import _sample_indices
    on_gpu = xp.__name__ == "cupy"
    s, dt = case.sizes, case.dtype
    rec = dict(id=case.id, suite=case.suite, op=case.op, dtype=dt, sizes=dict(s),
               batch=case.batch, note=case.note, impls={})
    try:
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
        ref, rmin = oracle(spec, _host(J[xp.asarray(idx)]), W,
                           None if coef is None else _host(coef[xp.asarray(idx)]))
        out, jmin = xp.empty(spec.out_shape, dtype=dt), xp.empty(E)
        impls = [("smalltc", backend, lambda: smalltc.geometry_data(
                     J, Wx, what=spec.what, coef=coef, jmin=jmin, out=out, backend=backend)),
                 ("reference", "reference", lambda: smalltc.geometry_data(
                     J, Wx, what=spec.what, coef=coef, jmin=jmin, out=out,
                     backend="reference")),
                 ("linalg", None, lambda: _linalg(xp, spec, J, Wx, coef))]
        tol = TOLERANCE[dt]
        for label, be, call in impls:
            r = rec["impls"][label] = dict(status="error")
            try:
                out.fill(math.nan)
                jmin.fill(math.nan)
                res, first = time_once(call, on_gpu=on_gpu)
                got = _host(res[xp.asarray(idx)]).astype(np.float64)
                finite = bool(xp.isfinite(res).all())
                err = float(np.linalg.norm(got - ref) / (np.linalg.norm(ref) or 1.0))
                info = dict(rel_err=err, tolerance=tol, first_call_s=first,
                            poisoned=res is out)
                if be is not None:
                    merr = float(np.abs(_host(jmin)[idx] - rmin).max() / np.abs(rmin).max())
                    info["jmin_rel_err"] = merr
                    err = max(err, merr)
                    info.update(_plan_info(build_plan(spec, xp, be)))   # the plan it runs
                del res
                if not finite or not err <= tol:
                    r.update(info, status="failed",
                             error="non-finite entries in the result (unwritten?)"
                             if not finite else f"relative error {err:.3e} > {tol:g}")
                    continue
                times = time_calls(call, repeats=repeats if be else max(3, repeats // 4),
                                   warmup=warmup, on_gpu=on_gpu)
                text = (f"smalltc.geometry_data (backend {be})" if be else
                        f"{xp.__name__}.linalg det and inv, einsum")
                rec["impls"][label] = _rec(b, times, text, **info)
            except Exception as err:
                r.update(error=repr(err), trace=traceback.format_exc(limit=-8))
        del out, J
    except Exception as err:   # a case that cannot run is recorded, the suite goes on
        rec["error"] = repr(err)
        rec["trace"] = traceback.format_exc(limit=-8)
    if on_gpu:
        xp.get_default_memory_pool().free_all_blocks()
    return rec


def table(rows, file) -> None:
    """One line per case: points/s and the fraction of the bound for smalltc and the
    reference path, the linalg baseline, smalltc's speed-up over each, and its kernel."""
    print("\n== geometry (G points/s; %bound: fraction of the roofline bound; x NAME: "
          "smalltc's speed over NAME's) ==", file=file)
    print(f"{'case':34s} {'smalltc':>8s} {'%bound':>7s} {'refer.':>8s} {'%bound':>7s} "
          f"{'linalg':>8s} {'x ref':>6s} {'x lin':>6s} {'backend':>9s}  kernel", file=file)
    for c in rows:
        label = c["id"].replace(f" {c['dtype']}", "").replace("geometry ", "")
        if c.get("error"):
            print(f"{label:34s} error: {c['error']}", file=file)
            continue
        im = c["impls"]
        ok = {k: (im.get(k) or {}).get("status") == "ok" for k in ("smalltc", "reference",
                                                                  "linalg")}
        cells = []
        for k in ("smalltc", "reference", "linalg"):
            r = im.get(k) or {}
            if ok[k]:
                cells.append(f"{r['dofs_per_s'] * 1e-9:8.3g}" + (
                    f" {100 * r['fraction']:6.1f}%" if k != "linalg" else ""))
            else:
                st = {"failed": "FAILED"}.get(r.get("status"), r.get("status", "-"))
                cells.append(f"{st:>8s}" + (f" {'':>7s}" if k != "linalg" else ""))
        ratios = [f"{im[k]['median_s'] / im['smalltc']['median_s']:6.2f}"
                  if ok["smalltc"] and ok[k] else f"{'-':>6s}" for k in ("reference", "linalg")]
        me = im.get("smalltc") or {}
        print(f"{label:34s} {' '.join(cells)} {' '.join(ratios)} "
              f"{me.get('backend', '-'):>9s}  {me.get('kernel', '')[:60]}", file=file)
