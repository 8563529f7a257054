"""The CEED bake-off suites: ``bp1`` (the mass operator), ``bp3`` (diffusion, Gauss
points, nq = p + 2) and ``bp5`` (diffusion, collocated: Gauss-Lobatto points on the
nodes, nq = p + 1), the operators a FEM code runs, one family of cases
(:data:`PROBLEMS`). BP1 below; BP3 and BP5 differ in the operator
(:func:`smalltc.diffusion_apply` with the packed ``Q`` of
:func:`smalltc.fem.diffusion_data`), their sizes (about 4M unique DoFs on a GPU) and one
more implementation measured in the same run, ``einsum`` (the reference backend's
NumPy/CuPy einsum chain with its gather and scatter-add), and the CG iteration is
Jacobi-preconditioned (the diagonal of :func:`smalltc.diffusion_diagonal`).

For p = 1..8 on a curved 3D box mesh (quadratic element maps, distortion
0.05) with a continuous order-p space: the quadrature ``nq = p + 2`` on Gauss
points, and ``nq = p + 1`` on Gauss-Lobatto points. Sizes: about 3M unique
DoFs on a GPU, 200k on a CPU (``quick``: 100k / 20k). Each case measures, in
one process, on the same vectors:

``smalltc``          the fused apply ``y = M x`` (:func:`smalltc.mass_apply`: gather
                     through the DoF map, action, scatter-add; atomics on a GPU)
``deterministic``    the same with ``deterministic=True`` (a pass per element colour)
``unchecked``        the fused apply rendered without the map's bounds check, timed
                     alternately with the checked one (9 pairs); ``check_cost`` is the
                     median over the pairs of the checked median over this one's, minus
                     1 (the check is always on otherwise)
``unfused``          gather, :func:`smalltc.batched_contract`, scatter-add apart (the
                     ``MassOperator(fused=False)`` path FEM users ran before)
``cg``               one CG iteration (:func:`smalltc.fem.cg`: the fused operator and
                     the fused vector updates), from the time of ``maxiter`` = 5 + K
                     minus that of 5, over K iterations: Jacobi-preconditioned for
                     Gauss points; without a preconditioner for Gauss-Lobatto points
                     with nq = p+1, where the mass matrix is diagonal and Jacobi its
                     exact inverse (it would stop after one iteration)
``cg (unfused)``     the same with the unfused operator and the plain CG loop

Rates are unique DoFs per second (``ndofs / t``). Bounds (docs/math.md section 4, the
bandwidth measured in the run): the apply's reads ``x``, ``D`` and the DoF map
once and writes ``y`` once; a CG iteration adds the 13 vector passes of the fused
updates (:data:`smalltc.fem._cg_fused.VECTOR_PASSES`: ``p.Ap`` reads 2 vectors,
the update reads x, r, p, Ap and the inverse diagonal and writes x and r, the new
direction reads r, the inverse diagonal and p and writes p; 11 without the
preconditioner). The apply is checked against the unfused path (relative error)
before it is timed. Every implementation records ``first_call_s``: its first call in
the process (the plan, compiling or loading its kernels, one run; for CG a 2-iteration
solve), which ``smalltc precompile`` shortens.
"""
from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np

import smalltc

from .. import fem, roofline
from .._timing import median, synchronize, time_calls, time_once
from ..fem import (H1Space, Operator, basis_1d, box_mesh, diffusion_data, jacobi,
                   mass_data)
from ..fem._cg_fused import VECTOR_PASSES
from ..spec import MassApplySpec
from ..vertices import vertices_of_mesh
from .cases import Case
from .report import case_rows, rate_unit
from .runner import case_record, ok_record, recorded

__all__ = ["cases", "run_case", "CG_BASE", "CG_EXTRA", "PROBLEMS"]

#: the short solve of the per-iteration CG time, and the batch of the fused GPU loop
CG_BASE = 8
#: the fewest and most iterations timed beyond the short solve's (multiples of CG_BASE),
#: and the time they should take
CG_EXTRA, CG_EXTRA_MAX, CG_SPAN_S = 16, 1600, 0.05

#: suite -> (qfunc, the quadrature rules ``(nq - p, rule)``, unique DoFs on a GPU, on a
#: CPU; ``quick``: a GPU's, a CPU's)
PROBLEMS = {
    "bp1": ("mass", ((2, "gauss"), (1, "lobatto")), (3_000_000, 200_000), (100_000, 20_000)),
    "bp3": ("diffusion", ((2, "gauss"),), (4_000_000, 200_000), (100_000, 20_000)),
    "bp5": ("diffusion", ((1, "lobatto"),), (4_000_000, 200_000), (100_000, 20_000)),
}


def cases(dtype, kind, ps=None, quick=False, suite="bp1") -> list:
    """The cases of a bake-off ``suite`` for ``dtype`` on a device of ``kind``
    ("cpu"/"gpu")."""
    _, rules, full, small = PROBLEMS[suite]
    target = (small if quick else full)[0 if kind == "gpu" else 1]
    out = []
    for p in ps or range(1, 9):
        n = max(2, round(target ** (1 / 3) / p))
        for dq, quad in rules:
            ndofs = (n * p + 1) ** 3
            out.append(Case(suite, suite, dict(dim=3, p=p, nq=p + dq, quadrature=quad, n=n,
                                               batch=n ** 3, ndofs=ndofs), dtype,
                            "" if kind == "gpu" else
                            f"CPU sizes: ~{full[1] // 1000}k DoFs"))
    return out


def _cg_bound(apply_bound, ndofs, s, jacobi=True):
    """The bound of one fused CG iteration: the apply plus the vector passes (13 with the
    Jacobi preconditioner, 11 without: the inverse diagonal is not read)."""
    nbytes = apply_bound.bytes + (VECTOR_PASSES - (0 if jacobi else 2)) * s * ndofs
    flops = apply_bound.flops + 12 * ndofs
    tmin = max(nbytes / apply_bound.bandwidth, flops / apply_bound.peak)
    return roofline.Bound("cg_iteration", apply_bound.dtype, nbytes, flops, apply_bound.items,
                          ndofs, apply_bound.bandwidth, apply_bound.peak, tmin, flops / tmin)


def _cg_per_iteration(M, rhs, P, fused, on_gpu, repeats):
    """Seconds per CG iteration: the median over ``repeats`` pairs of solves of
    ``CG_BASE`` and ``CG_BASE + K`` iterations of ``(t_long - t_short) / K``.

    ``K`` (a multiple of :data:`CG_BASE`, :data:`CG_EXTRA` to :data:`CG_EXTRA_MAX`) is
    chosen from a pilot difference so that the K iterations take about :data:`CG_SPAN_S`:
    a solve's own host work (setup, the final residual) cancels in the difference, and
    the odd slow call of a millisecond is small against the span. Both lengths are
    multiples of :data:`CG_BASE`, the fused GPU iteration's ``check_every``: that loop
    queues iterations in batches of it, so another length would time applications past
    the stop (lengths of 5 and 25 iterations, K = 20 whatever the iteration's time, were
    off by up to 3.6x). Where the difference is not positive (a
    tiny problem) the figure is ``t_long / (CG_BASE + K)``, which includes the solve's
    setup: an upper bound. A solve whose residual reaches exactly zero stops early (the
    Jacobi-preconditioned mass matrix at high p: 446 iterations at BP1 p = 8, nq = 10,
    on the H200), so K is capped at 80% of the iterations beyond ``CG_BASE`` that the long
    solve reached. Returns the per-iteration seconds (one per repeat), the iterations of
    the long solve and the seconds of the first (warm-up) solve. Raises RuntimeError when a
    timed solve stopped before its ``maxiter`` (a time of fewer iterations is no
    iteration's time)."""

    def solve(n, probe=False):
        r, t = time_once(lambda: fem.cg(M, rhs, tol=1e-300, maxiter=n, precond=P,
                                        raise_on_failure=False, fused=fused,
                                        check_every=CG_BASE), on_gpu=on_gpu)
        if probe:
            return r.iterations
        if r.iterations != n:
            raise RuntimeError(f"CG stopped after {r.iterations} of {n} iterations "
                               f"(relative residual {r.residuals[-1]:.1e})")
        return t
    first = solve(CG_BASE)                               # warm-up: compiles, pools
    pilot = (solve(CG_BASE + CG_EXTRA) - solve(CG_BASE)) / CG_EXTRA
    extra = round(CG_SPAN_S / max(pilot, 1e-7) / CG_BASE) * CG_BASE
    extra = int(min(CG_EXTRA_MAX, max(CG_EXTRA, extra)))
    reached = solve(CG_BASE + extra, probe=True)
    if reached < CG_BASE + extra:                        # the residual reached zero
        extra = max(CG_EXTRA, int(0.8 * (reached - CG_BASE)) // CG_BASE * CG_BASE)
    per = []
    for i in range(max(1, repeats)):
        if i % 2 == 0:
            t0, t1 = solve(CG_BASE), solve(CG_BASE + extra)
        else:
            t1, t0 = solve(CG_BASE + extra), solve(CG_BASE)
        per.append((t1 - t0) / extra if t1 > t0 else t1 / (CG_BASE + extra))
    return per, CG_BASE + extra, first


def _unchecked(plan, b, ops, y, checked_times, repeats, warmup, on_gpu, op_name,
               alternations=9):
    """The fused apply rendered without the map's bounds check, timed in turn with the
    checked one (``alternations`` pairs, each ``repeats`` samples of either, the order of
    the pair swapped every time). ``check_cost``: the median over the pairs of the checked
    median over the unchecked one, minus 1 (a ratio per pair, so a drift of the machine
    between pairs cancels); ``check_cost_range``: the pairs' quartiles. ``ops``: the
    plan's operands (any qfunc)."""
    try:
        bare = copy.copy(plan)
        bare.executor = plan.executor.unchecked()
        checked, unchecked, ratios = list(checked_times), [], []
        run_bare = lambda: bare(*ops, out=y)          # noqa: E731
        run_plan = lambda: plan(*ops, out=y)          # noqa: E731
        time_calls(run_bare, repeats=1, warmup=warmup, on_gpu=on_gpu)
        for i in range(alternations):
            pair = {}
            for name, fn in ((("bare", run_bare), ("plan", run_plan)) if i % 2 == 0
                             else (("plan", run_plan), ("bare", run_bare))):
                pair[name] = time_calls(fn, repeats=repeats, warmup=1, on_gpu=on_gpu)
            unchecked += pair["bare"]
            checked += pair["plan"]
            ratios.append(median(pair["plan"]) / median(pair["bare"]))
    except Exception as err:
        return dict(what=f"smalltc.{op_name} without the bounds check", status="error",
                    error=repr(err))
    q1, q2, q3 = np.percentile(ratios, [25, 50, 75])
    return ok_record(b, unchecked,
                     f"smalltc.{op_name} without the map's bounds check (bench only)",
                     check_cost=float(q2) - 1, check_cost_range=[float(q1) - 1, float(q3) - 1],
                     kernel=bare.executor.kernel)


def _point_data_impls(rec, forms, *, qfunc, mesh, nq, collocated, B1d, G1d, data, x, emap,
                      ref, y, spec, bound_args, backend, xp, on_gpu, repeats, warmup, dtype):
    """The apply with less point data (``--point-data``; docs/math.md section 8), each
    against its own bound (``bound`` in its record): ``float32-data`` (D/Q in float32,
    checked against the float64 result to 1e-5: the data's rounding), ``vertices`` (the
    geometry from the element vertices and a coefficient of 1, to 1e-12)."""
    for form in forms:
        name = {"float32": "float32-data", "vertices": "vertices"}[form]
        if dtype != "float64":
            rec["impls"][name] = dict(what=name, status="skipped",
                                      error="float64 runs only (float64 vectors)")
            continue
        try:
            if form == "float32":
                kw = dict(qdtype="float32")
                args = (B1d, G1d, data.astype(np.float32))
                extra = {}
                tol = 1e-5
            else:
                kw = dict(geometry="vertices")
                # no check_nq: the result is checked against the stored-data apply
                # below (the check evaluates the mesh's map at every point on the host:
                # minutes at p = 1's 3M elements)
                X = xp.asarray(vertices_of_mesh(mesh))
                args = (B1d, G1d, None)
                extra = dict(vertices=X, coef=xp.ones(X.shape[0], dtype=dtype))
                tol = 1e-12
            b = roofline.bound(dataclasses.replace(spec, **kw), **bound_args)

            def call():
                return smalltc.operator_apply(qfunc, *args, x, emap, out=y, backend=backend,
                                              **extra)
            y.fill(math.nan)
            _, first = time_once(call, on_gpu=on_gpu)
            err = float(xp.linalg.norm(y - ref) / xp.linalg.norm(ref))
            info = dict(rel_err=err, tolerance=tol, first_call_s=first, bound=b.as_dict())
            if not (err <= tol and bool(xp.isfinite(y).all())):
                rec["impls"][name] = dict(info, what=name, status="failed",
                                          error=f"relative error {err:.3e} > {tol:g}")
                continue
            times = time_calls(call, repeats=repeats, warmup=warmup, on_gpu=on_gpu)
            rec["impls"][name] = ok_record(b, times, f"smalltc.operator_apply ({qfunc}, "
                                           f"{name}; fraction of its own bound)", **info)
        except Exception as err:
            rec["impls"][name] = dict(what=name, status="error", error=repr(err))


def run_case(case, bound_args, *, xp, backend="auto", repeats=20, warmup=2,
             point_data=()) -> dict:
    """Measure one bake-off case; the record has the bench's layout (``impls``,
    ``bound``) and the CG iteration's bound under ``cg_bound``; ``point_data``: the
    forms with less point data also timed (:func:`_point_data_impls`)."""
    on_gpu = xp.__name__ == "cupy"
    s = case.sizes
    p, nq, n = s["p"], s["nq"], s["n"]
    qfunc = PROBLEMS[case.suite][0]
    rec = case_record(case)
    with recorded(rec, xp):
        mesh = box_mesh(3, n, distortion=0.05)
        space = H1Space(mesh, p)
        where = "gpu" if on_gpu else "cpu"
        basis = basis_1d(p, nq, s["quadrature"])
        collocated = qfunc != "mass" and s["quadrature"] == "lobatto" and nq == p + 1
        B1d = None if collocated else xp.asarray(basis.B1d.astype(case.dtype))
        G1d = None if qfunc == "mass" else xp.asarray(basis.G1d.astype(case.dtype))
        if qfunc == "mass":
            data = mass_data(mesh, nq, quadrature=s["quadrature"], dtype=case.dtype,
                             device=where)
        else:
            data = diffusion_data(mesh, nq, quadrature=s["quadrature"], dtype=case.dtype,
                                  device=where)
        emap = space.dof_map(xp)
        x = xp.asarray(np.random.default_rng(0).random(space.ndofs).astype(case.dtype) + 0.5)
        spec = MassApplySpec(dim=3, nq=nq, nd=p + 1, batch=space.nelements, dtype=case.dtype,
                             ndofs=space.ndofs, index_dtype=np.dtype(emap.dtype).name,
                             qfunc=qfunc, collocated=collocated)
        b = roofline.bound(spec, **bound_args)
        lumped = qfunc == "mass" and s["quadrature"] == "lobatto" and nq == p + 1  # M diagonal
        bcg = _cg_bound(b, space.ndofs, np.dtype(case.dtype).itemsize, jacobi=not lumped)
        rec.update(bound=b.as_dict(), cg_bound=bcg.as_dict(),
                   footprint_bytes=int(data.nbytes + emap.nbytes + 6 * x.nbytes))
        rec["bound"]["dofs_per_s"] = b.dofs_per_s          # unique DoFs

        def operator(**kw):
            return Operator(space, data, B1d, G1d, qfunc=qfunc, backend=backend, **kw)
        fused, det, unfused = operator(), operator(deterministic=True), operator(fused=False)
        # the plan's operands: B1d (unless collocated), G1d (unless mass), the data, x, map
        ops = tuple(a for a in (B1d, G1d, data, x, emap) if a is not None)
        plan_args = (B1d, data, x, emap) if qfunc == "mass" else (B1d, G1d, data, x, emap)
        op_name = "mass_apply" if qfunc == "mass" else f"{qfunc}_apply"
        # first calls (first_call_s): plan, compile or load the kernels, run once
        ref, first_unfused = time_once(lambda: unfused(x), on_gpu=on_gpu)
        y = xp.empty_like(x)
        tol = 1e-12 if case.dtype == "float64" else 1e-5
        for name, op in (("smalltc", fused), ("deterministic", det)):
            y.fill(math.nan)

            def first_call():
                p = smalltc.plan(op_name, *plan_args, backend=backend,
                                 deterministic=op.deterministic)
                p(*ops, out=y)
                return p
            plan, first = time_once(first_call, on_gpu=on_gpu)
            err = float(xp.linalg.norm(y - ref) / xp.linalg.norm(ref))
            info = dict(rel_err=err, tolerance=tol, first_call_s=first, backend=plan.backend,
                        kernel=str(plan.kernel), source=str(plan.source),
                        table=str(getattr(plan.executor, "table", None)))
            if not (err <= tol and bool(xp.isfinite(y).all())):
                rec["impls"][name] = dict(info, status="failed",
                                          error=f"relative error {err:.3e} > {tol:g}")
                continue
            times = time_calls(lambda: plan(*ops, out=y), repeats=repeats,
                               warmup=warmup, on_gpu=on_gpu)
            rec["impls"][name] = ok_record(b, times, f"smalltc.{op_name} ({plan.backend}"
                                           + (", deterministic)" if op.deterministic else ")"),
                                           **info)
            if name == "smalltc" and hasattr(plan.executor, "unchecked"):
                rec["impls"]["unchecked"] = _unchecked(plan, b, ops, y, times, repeats,
                                                       warmup, on_gpu, op_name)
        if point_data:
            _point_data_impls(rec, point_data, qfunc=qfunc, mesh=mesh, nq=nq,
                              collocated=collocated, B1d=B1d, G1d=G1d, data=data, x=x,
                              emap=emap, ref=ref, y=y, spec=spec, bound_args=bound_args,
                              backend=backend, xp=xp, on_gpu=on_gpu, repeats=repeats,
                              warmup=warmup, dtype=case.dtype)
        times = time_calls(lambda: unfused(x), repeats=max(3, repeats // 4), warmup=1,
                           on_gpu=on_gpu)
        rec["impls"]["unfused"] = ok_record(b, times, "gather + batched_contract + scatter"
                                            if qfunc == "mass" else
                                            f"gather + operator_action ({qfunc}) + scatter",
                                            first_call_s=first_unfused)
        if qfunc != "mass":                # the einsum chain a Python user would write
            def einsum():
                return smalltc.operator_apply(qfunc, B1d, G1d, data, x, emap,
                                              backend="reference")
            _, first_e = time_once(einsum, on_gpu=on_gpu)
            times = time_calls(einsum, repeats=max(3, repeats // 4), warmup=1,
                               on_gpu=on_gpu)
            rec["impls"]["einsum"] = ok_record(b, times, f"{xp.__name__} einsum chain, "
                                               "gather, scatter-add (the reference backend)",
                                               first_call_s=first_e)
        P = None if lumped else jacobi(fused.diagonal())
        what = "CG iteration, no preconditioner (M diagonal)" if lumped else \
            "Jacobi-PCG iteration"
        rhs = fused(x)
        synchronize(on_gpu)
        for name, op, fuse, reps, how in (
                ("cg", fused, True, max(3, repeats // 4), "fused operator and updates"),
                ("cg (unfused)", unfused, False, 2, "unfused operator, plain loop")):
            try:
                per, its, first_cg = _cg_per_iteration(op, rhs, P, fuse, on_gpu, reps)
            except RuntimeError as err:
                rec["impls"][name] = dict(what=f"{what} ({how})", status="failed",
                                          error=str(err))
                continue
            rec["impls"][name] = ok_record(bcg, [max(1, round(t * 1e9)) for t in per],
                                           f"{what} ({how})",
                                           iterations=its, first_call_s=first_cg,
                                           vector_passes=VECTOR_PASSES - (2 if lumped else 0),
                                           preconditioner=None if lumped else "jacobi")
    return rec


def table(rows, file) -> None:
    """The table of a bake-off suite: GDoF/s (unique DoFs), the fraction of each bound
    (BP3/BP5 add the einsum chain and the apply's speed-up over it), and the map bounds
    check's cost (``check``: the checked apply's time over the unchecked one's)."""
    suite = rows[0]["suite"] if rows else "bp1"
    ein = suite != "bp1"
    u, scale = rate_unit([c["bound"]["dofs_per_s"] for c in rows if "bound" in c])
    print(f"\n== {suite} ({u}, unique DoFs; % of the apply's / the CG iteration's bound) ==",
          file=file)
    print(f"{'case':26s} {'ndofs':>9s} {'apply':>7s} {'%bnd':>5s} {'determ':>7s} "
          f"{'unfused':>7s} {'x unf':>6s} " + (f"{'einsum':>7s} {'x ein':>6s} " if ein else "")
          + f"{'CG it':>7s} {'%bnd':>5s} {'CG unf':>7s} {'bound':>6s} {'check':>6s}", file=file)
    for c, label in case_rows(rows, file, 26):
        im = c["impls"]

        def g(name, key="dofs_per_s"):
            r = im.get(name) or {}
            return r.get(key) if r.get("status") == "ok" else None

        def f(v, fmt="7.3g", scale=scale):
            return format(v * scale, fmt) if v is not None else f"{'-':>{fmt.split('.')[0]}}"
        a, u, e = g("smalltc"), g("unfused"), g("einsum")
        print(f"{label:26s} {c['sizes']['ndofs']:9d} {f(a)} {f(g('smalltc', 'fraction'), '5.0%', 1)} "
              f"{f(g('deterministic'))} {f(u)} "
              f"{(format(a / u, '6.2f') if a and u else '     -')} "
              + (f"{f(e)} {(format(a / e, '6.1f') if a and e else '     -')} " if ein else "")
              + f"{f(g('cg'))} "
              f"{f(g('cg', 'fraction'), '5.0%', 1)} {f(g('cg (unfused)'))} "
              f"{c['bound']['dofs_per_s'] * scale:6.3g} "
              f"{_cost(im.get('unchecked'))}" + _point_cols(im, scale), file=file)


def _point_cols(im, scale=1e-9):
    """The less-point-data columns (``--point-data``): DoFs/s times ``scale`` (the table's
    unit) and the fraction of the form's own bound, where the run has them."""
    out = ""
    for name, label in (("float32-data", "f32"), ("vertices", "vx")):
        r = im.get(name)
        if r is None:
            continue
        if r.get("status") != "ok":
            out += f"  {label} {r.get('status', '-')}"
            continue
        out += f"  {label} {r['dofs_per_s'] * scale:6.3g} {r['fraction']:4.0%}"
    return out


def _cost(rec):
    """The bounds check's cost column: the checked apply's time over the unchecked one's."""
    if not rec or rec.get("status") != "ok":
        return f"{'-':>6s}"
    return f"{rec['check_cost'] * 100:+5.1f}%"
