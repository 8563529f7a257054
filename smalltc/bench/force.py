"""The ``force`` suite: BLAST's corner force ``F`` (H1^d <- L2) and ``F^T`` (L2 <- H1^d)
at Laghos' sizes (docs/math.md section 7): 3D p = 1..4 (and up to 8, which Laghos does
not reach), 2D p = 1..5, ``nq = 2p``, the L2 space of order ``p - 1``. One case per
(dimension, p, direction) on a box mesh (the kinematic DoF map of an order-p H1 space),
random ``A`` (the operator is linear in it: its values do not change the time). Each case
measures, in one process, on the same arrays:

``smalltc``     the element level (:func:`smalltc.force_apply` /
                :func:`smalltc.force_apply_transpose`: E-vectors in and out)
``fused``       the kinematic side through the map (``elem_dofs=``: ``F`` adds into
                the global ``(d, ndofs)`` vector, ``F^T`` gathers from it)
``einsum``      the reference backend's NumPy/CuPy einsum chain of the element level
                (one chain per (c, a): the code a Python user would write)

``smalltc:NAME``, ``fused:NAME``   with ``--variants`` (CUDA): the element level and the
                fused form with the force family's parameters forced (:data:`VARIANTS`
                or a parameter set), so one run sweeps every kernel variant

Each is checked against the einsum chain (relative error) before it is timed. Bounds
(:mod:`smalltc.roofline`): ``A`` read once (``d^2 nq^d`` an element), the L2 field once
(``p^d``), the kinematic side once (``d (p+1)^d`` an element, or the global vector and the
map for the fused form). Rates are kinematic DoFs per second (element DoFs ``E d
(p+1)^d``; for the fused form the unique ``d ndofs``). Sizes: about 2M kinematic element
DoFs on a GPU, 200k on a CPU (``quick``: 100k / 20k).
"""
from __future__ import annotations

import math
import traceback

import numpy as np

import smalltc

from .. import roofline
from .._timing import time_calls, time_once
from ..fem import H1Space, basis_1d, box_mesh
from ..spec import ActionSpec, MassApplySpec
from .cases import Case
from .plots import bound_line, p_panel, save_figure
from .report import case_rows
from .runner import case_record, ok_record

__all__ = ["cases", "run_case", "table", "plot", "SIZES", "VARIANTS", "parse_variants"]

#: the named variants of the CUDA force family (``--variants``): its forms and options
VARIANTS = {"line": dict(line=1), "line-apre0": dict(line=1, apre=0),
            "line-apre1": dict(line=1, apre=1), "line-mb1": dict(line=1, min_blocks=1),
            "shared": dict(line=0), "shared-warp": dict(line=0, tpi=8)}


def parse_variants(text):
    """``--variants`` as ``[(name, params)]``: ``all``, names of :data:`VARIANTS`, or
    parameter sets ``key=value,...`` (integers), separated by ``;``.

    >>> parse_variants("line;line=1,per_block=2")
    [('line', {'line': 1}), ('line=1,per_block=2', {'line': 1, 'per_block': 2})]
    >>> len(parse_variants("all")) == len(VARIANTS)
    True
    """
    out = []
    for tok in (text or "").split(";"):
        tok = tok.strip()
        if not tok:
            continue
        if tok == "all":
            out += list(VARIANTS.items())
        elif "=" in tok:
            try:
                out.append((tok, {k.strip(): int(v) for k, v in
                                  (kv.split("=") for kv in tok.split(","))}))
            except ValueError:
                raise ValueError(f"--variants: {tok!r} is not key=integer,... "
                                 f"(e.g. line=1,per_block=2)") from None
        elif tok in VARIANTS:
            out.append((tok, VARIANTS[tok]))
        else:
            raise ValueError(f"--variants: unknown variant {tok!r}; known: all, "
                             f"{', '.join(VARIANTS)}, or key=value,...")
    return out

#: dim -> the orders measured (Laghos: 3D p <= 4, 2D p <= 5; 3D up to 8 beyond it)
SIZES = {3: tuple(range(1, 9)), 2: tuple(range(1, 6))}
#: kinematic element DoFs a case on a GPU, on a CPU; ``quick``: a GPU's, a CPU's
TARGET = ((2_000_000, 200_000), (100_000, 20_000))
#: a GPU case's bytes (A and both element fields, float64) without ``quick``: the point
#: matrices' share of a case grows from 40% (2D p = 1) to 97% (3D p = 8), so a DoF count
#: made kernels of 10-40 us at low p, where the launch and the last wave are a fraction of
#: the time (on the H100: 2D p = 1 at 53% of the bound with 2M DoFs, the
#: tuner's 256 MiB runs at 84%); 384 MiB is past any L2
GPU_BYTES = 384 * 2 ** 20


def cases(dtype, kind, ps=None, quick=False, dims=None) -> list:
    """The cases of the suite for ``dtype`` on a device of ``kind`` ("cpu"/"gpu"): per
    dimension (3, then 2) and order, ``F`` then ``F^T``.

    >>> [c.id for c in cases("float64", "cpu", ps=[2], dims=[3])]
    ['force F dim=3 p=2 nq=4 n=14 float64', 'force FT dim=3 p=2 nq=4 n=14 float64']
    """
    target = TARGET[1 if quick else 0][0 if kind == "gpu" else 1]
    out = []
    for dim in dims or (3, 2):
        for p in ps or SIZES.get(dim, ()):
            if kind == "gpu" and not quick:      # bytes an element, and the case's
                per = 8 * (dim * dim * (2 * p) ** dim + dim * (p + 1) ** dim + p ** dim)
                total = GPU_BYTES
            else:                                # kinematic DoFs an element, and the case's
                per, total = dim * (p + 1) ** dim, target
            n = max(1, round((total / per) ** (1 / dim)))
            for direction in ("F", "FT"):
                out.append(Case("force", "force", dict(label=direction, dim=dim, p=p,
                                                       nq=2 * p, n=n, batch=n ** dim,
                                                       direction=direction),
                                dtype, "" if kind == "gpu" else
                                f"CPU sizes: ~{TARGET[0][1] // 1000}k kinematic DoFs"))
    return out


def run_case(case, bound_args, *, xp, backend="auto", repeats=20, warmup=2,
             variants=None) -> dict:
    """Measure one case; the record has the bench's layout (``impls``, ``bound``; the
    fused form's bound under ``fused_bound``). ``variants``: ``--variants``' text (CUDA
    only; each variant a pair of implementations ``smalltc:NAME``, ``fused:NAME``; one
    whose parameters do not fit the size is recorded as skipped)."""
    on_gpu = xp.__name__ == "cupy"
    s = case.sizes
    dim, p, nq, n, t = s["dim"], s["p"], s["nq"], s["n"], s["direction"] == "FT"
    rec = case_record(case)
    try:
        dt = case.dtype
        space = H1Space(box_mesh(dim, n), p)
        E = space.nelements
        h1 = basis_1d(p, nq)
        L = np.ones((nq, 1)) if p == 1 else basis_1d(p - 1, nq).B1d
        rng = np.random.default_rng(0)
        L, B, G = (xp.asarray(a.astype(dt)) for a in (L, h1.B1d, h1.G1d))
        A = xp.asarray(rng.standard_normal((E, dim, dim) + (nq,) * dim).astype(dt))
        e = xp.asarray(rng.standard_normal((E,) + (p,) * dim).astype(dt))
        w = xp.asarray(rng.standard_normal((E, dim) + (p + 1,) * dim).astype(dt))
        emap = space.dof_map(xp)
        wg = xp.asarray(rng.standard_normal((dim, space.ndofs)).astype(dt))
        q = "force_t" if t else "force"
        common = dict(dim=dim, nq=nq, nd=p + 1, batch=E, dtype=dt, ncomp=dim, comp_axis=True,
                      qfunc=q)
        b = roofline.bound(ActionSpec(**common), **bound_args)
        bf = roofline.bound(MassApplySpec(ndofs=space.ndofs,
                                          index_dtype=np.dtype(emap.dtype).name, **common),
                            **bound_args)
        rec.update(bound=b.as_dict(), fused_bound=bf.as_dict(),
                   footprint_bytes=int(A.nbytes + e.nbytes + w.nbytes + emap.nbytes))
        fn = smalltc.force_apply_transpose if t else smalltc.force_apply
        field = w if t else e
        tol = 1e-12 if dt == "float64" else 1e-5
        ref, first_e = time_once(lambda: fn(L, B, G, A, field, backend="reference"),
                                 on_gpu=on_gpu)
        times = time_calls(lambda: fn(L, B, G, A, field, backend="reference"),
                           repeats=max(3, repeats // 4), warmup=1, on_gpu=on_gpu)
        rec["impls"]["einsum"] = ok_record(b, times, f"{xp.__name__} einsum chain (the "
                                           "reference backend)", first_call_s=first_e)
        if t:
            Wg = xp.moveaxis(wg[:, emap], 0, 1)
            ref_fused = fn(L, B, G, A, Wg, backend="reference")
            fused_ops = (L, B, G, A, wg, emap)
        else:
            ref_fused = smalltc.force_apply(L, B, G, A, e, elem_dofs=emap, ndofs=space.ndofs,
                                            backend="reference")
            fused_ops = (L, B, G, A, e, emap)
        op_name = "force_apply_transpose" if t else "force_apply"
        runs = [("smalltc", (L, B, G, A, field), ref, b, None),
                ("fused", fused_ops, ref_fused, bf, None)]
        for vname, prm in parse_variants(variants):
            runs += [(f"smalltc:{vname}", (L, B, G, A, field), ref, b, prm),
                     (f"fused:{vname}", fused_ops, ref_fused, bf, prm)]
        for name, ops, want, bb, prm in runs:
            y = xp.full(want.shape, math.nan, dtype=dt)
            if prm is not None and not (on_gpu and backend in ("auto", "cuda")):
                rec["impls"][name] = dict(status="skipped", params=prm,
                                          error="variants are CUDA parameters")
                continue

            def first_call():
                pl = smalltc.plan(op_name, *ops, backend=backend, params=prm,
                                  ndofs=None if t or name.startswith("smalltc")
                                  else space.ndofs)
                pl(*ops, out=y)
                return pl
            try:
                plan, first = time_once(first_call, on_gpu=on_gpu)
            except ValueError as err:       # a variant's parameters that do not fit
                if prm is None:
                    raise
                rec["impls"][name] = dict(status="skipped", params=prm, error=str(err))
                continue
            err = float(xp.linalg.norm(y - want) / xp.linalg.norm(want))
            info = dict(rel_err=err, tolerance=tol, first_call_s=first, backend=plan.backend,
                        kernel=str(plan.kernel), specialized=bool(plan.specialized),
                        params={k: v for k, v in dict(plan.params or {}).items()
                                if isinstance(v, (int, float, str))})
            if not (err <= tol and bool(xp.isfinite(y).all())):
                rec["impls"][name] = dict(info, status="failed",
                                          error=f"relative error {err:.3e} > {tol:g}")
                continue
            times = time_calls(lambda: plan(*ops, out=y), repeats=repeats, warmup=warmup,
                               on_gpu=on_gpu)
            rec["impls"][name] = ok_record(bb, times, f"smalltc.{op_name} ({plan.backend}"
                                           + (", elem_dofs" if name.startswith("fused") else "")
                                           + (f", params {prm})" if prm else ")"), **info)
    except Exception as err:   # a case that cannot run is recorded, the suite goes on
        rec["error"] = repr(err)
        rec["traceback"] = traceback.format_exc()
    return rec


def table(rows, file) -> None:
    """One line per case: GDoF/s and the fraction of its bound per implementation, and the
    element level over the einsum chain."""
    print("\n== force (kinematic GDoF/s; %bound: fraction of the roofline bound, A and the "
          "fields read or written once; x einsum = smalltc / the einsum chain) ==", file=file)
    print(f"{'case':34s} {'smalltc':>9s} {'%bound':>7s} {'fused':>9s} {'%bound':>7s} "
          f"{'einsum':>9s} {'x einsum':>9s}  kernel", file=file)
    for c, label in case_rows(rows, file, 34):
        cells = []
        for name in ("smalltc", "fused", "einsum"):
            r = c["impls"].get(name) or {}
            if r.get("status") == "ok":
                cells.append(f"{r['dofs_per_s'] * 1e-9:9.3g}" + (
                    f" {100 * r['fraction']:6.1f}%" if name != "einsum" else ""))
            else:
                cells.append(f"{r.get('status', '-'):>9s}" + ("" if name == "einsum"
                                                               else f" {'':>7s}"))
        me, ein = c["impls"].get("smalltc") or {}, c["impls"].get("einsum") or {}
        ratio = (f"{ein['median_s'] / me['median_s']:9.2f}" if me.get("status") == "ok"
                 and ein.get("status") == "ok" else f"{'-':>9s}")
        kernel = me.get("kernel", "")
        print(f"{label:34s} {' '.join(cells)} {ratio}  {kernel[:60]}", file=file)
        for v in [k.split(":", 1)[1] for k in c["impls"] if k.startswith("smalltc:")]:
            cells = []
            for name in (f"smalltc:{v}", f"fused:{v}"):
                r = c["impls"].get(name) or {}
                cells.append(f"{r['dofs_per_s'] * 1e-9:9.3g} {100 * r['fraction']:6.1f}%"
                             if r.get("status") == "ok" else f"{r.get('status', '-'):>17s}")
            r = c["impls"].get(f"smalltc:{v}") or {}
            prm = r.get("params") or {}
            what = " ".join(f"{k}={prm[k]}" for k in ("line", "tpi", "per_block", "apre",
                                                      "min_blocks", "registers") if k in prm)
            print(f"{'  ' + v:34s} {' '.join(cells)} {'':9s} {'':>9s}  {what}", file=file)


def plot(doc, path, plt):
    """Kinematic DoFs/s against p with the bounds: a panel per dimension, both directions,
    the element level, the fused form and the einsum chain."""
    cs = [c for c in doc["cases"] if c["suite"] == "force" and not c.get("error")]
    if not cs:
        return None
    dims = sorted({c["sizes"]["dim"] for c in cs}, reverse=True)
    fig, axes = plt.subplots(1, len(dims), figsize=(6 * len(dims), 4.6), squeeze=False)
    for ax, dim in zip(axes[0], dims):
        for k, (direction, label) in enumerate((("F", "F"), ("FT", "F^T"))):
            sub = sorted((c for c in cs if c["sizes"]["dim"] == dim
                          and c["sizes"]["direction"] == direction),
                         key=lambda c: c["sizes"]["p"])
            ps = [c["sizes"]["p"] for c in sub]
            for name, style in (("smalltc", "-"), ("fused", ":"), ("einsum", "-.")):
                pts = [(c["sizes"]["p"], c["impls"][name]["dofs_per_s"] * 1e-9) for c in sub
                       if (c["impls"].get(name) or {}).get("status") == "ok"]
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", ms=3, color=f"C{2 * k}",
                            label=f"{label} {name}")
            bound_line(ax, ps, [c["bound"]["dofs_per_s"] * 1e-9 for c in sub],
                       color=f"C{2 * k + 1}", label=f"{label} bound (element level)")
        p_panel(ax, "kinematic DoFs / s (x 1e9)", f"{dim}D",
                "kinematic order p (nq = 2p, L2 order p - 1)")
    bw = doc["probes"]["bandwidth"]["value"] * 1e-9
    fig.suptitle(f"{doc['device']['name']} {doc['options']['dtype']}: the corner force "
                 f"F and F^T (BW = {bw:.0f} GB/s)", fontsize=11)
    return save_figure(fig, path, plt)
