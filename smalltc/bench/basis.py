"""The ``basis`` suite: the basis application, :func:`smalltc.interpolate` and
:func:`smalltc.integrate`, against its roofline bound and what a user would run instead.

Usage::

    smalltc bench --suite basis                           # 3D p = 1..8, nq = p + 2
    smalltc bench --suite basis --device cpu --p 1-4 --footprint 1024
    smalltc bench --suite basis --quick

For 3D p = 1..8 with ``nq = p + 2`` Gauss points, on an order-p space of a box mesh (its
element-to-DoF map), one case per direction (``interpolate``: the global vector gathered
through the map and evaluated at the points; ``integrate``: its transpose, the point
values integrated against the basis and summed into the global vector) and ``what``
(``values``, ``gradients``: the three reference derivatives, ``both``). Each case
measures, in one process, on the same arrays:

``smalltc``     ``smalltc.interpolate`` / ``smalltc.integrate`` with ``--backend`` (auto:
                the size-specialised kernel where there is one); the plan's backend, its
                ``specialized`` flag and kernel recorded (:func:`smalltc.plan` of the
                same operands: the plan the function caches)
``reference``   the same with ``backend="reference"``: one-axis GEMMs by blocks of
                elements (NumPy's BLAS on the host, cuBLAS through CuPy on a GPU), the
                unfused path
``einsum``      the NumPy/CuPy einsum chain a user would write: the gather
                ``x[elem_dofs]``, three einsums a slot (one axis each), and for
                ``integrate`` the scatter-add (``bincount``)

Each is checked against a float64 NumPy oracle (one ``einsum`` a slot over the three
axes, ``optimize=True``; for ``interpolate`` on a sample of the elements, for
``integrate`` the whole vector) before it is timed. The bound (:mod:`smalltc.roofline`,
op ``"basis"``): the global vector and the map read once and the point values written
once (``integrate``: the point values read once, the vector read and written); the flops
of the sum factorisation with shared partial sums. Rates are unique DoFs per second
(``ndofs / t``). Sizes: about 384 MiB moved a case on a GPU, 32 MiB on a CPU
(``--footprint`` sets the CPU's), ``quick`` a sixteenth.
"""
from __future__ import annotations

import numpy as np

import smalltc

from .. import roofline
from ..fem import H1Space, basis_1d, box_mesh
from ..spec import BasisSpec
from .cases import Case
from .plots import p_panel, save_figure
from .report import impl_table
from .runner import TOLERANCE, _sample_indices, case_record, check, measure, recorded

__all__ = ["cases", "run_case", "table", "plot", "WHATS", "DIRECTIONS", "oracle"]

WHATS = ("values", "gradients", "both")
DIRECTIONS = ("interpolate", "integrate")
#: bytes a case moves: (GPU, CPU); ``quick`` divides by 16
BYTES = (384 * 2 ** 20, 32 * 2 ** 20)
SAMPLE = 256          # elements checked against the oracle (interpolate)


def target_bytes(kind, quick=False, footprint=None) -> int:
    """The bytes a case of this suite and of the geometry suite moves on a device of
    ``kind``: :data:`BYTES`, a sixteenth with ``quick``; on a CPU ``footprint`` where given.

    >>> target_bytes("cpu") >> 20, target_bytes("cpu", quick=True) >> 20
    (32, 2)
    >>> target_bytes("cpu", footprint=2 ** 30) >> 20, target_bytes("gpu", True, 2 ** 30) >> 20
    (1024, 24)
    """
    if footprint is not None and kind != "gpu":
        return int(footprint)
    return BYTES[0 if kind == "gpu" else 1] // (16 if quick else 1)


def cases(dtype, kind, ps=None, quick=False, footprint=None) -> list:
    """The cases for ``dtype`` on a device of ``kind`` ("cpu"/"gpu"): per order, ``what``
    and direction. ``footprint`` (bytes): a CPU case's bytes instead of :data:`BYTES`.

    >>> for c in cases("float64", "cpu", ps=[2], quick=True)[:3]:
    ...     print(c.id)
    basis interpolate values dim=3 p=2 nq=4 float64
    basis integrate values dim=3 p=2 nq=4 float64
    basis interpolate gradients dim=3 p=2 nq=4 float64
    """
    s = np.dtype(dtype).itemsize
    target = target_bytes(kind, quick, footprint)
    out = []
    for p in ps or ([1, 2, 4] if quick else range(1, 9)):
        nd, nq = p + 1, p + 2
        for what in WHATS:
            nslots = {"values": 1, "gradients": 3, "both": 4}[what]
            per = s * (nslots * nq ** 3 + p ** 3) + 4 * nd ** 3       # H, x, the map
            n = max(1, round((target / per) ** (1 / 3)))
            for direction in DIRECTIONS:
                out.append(Case("basis", "basis", dict(
                    label=f"{direction} {what}", dim=3, p=p, nq=nq, nx=n, batch=n ** 3,
                    ndofs=(n * p + 1) ** 3, what=what, direction=direction), dtype,
                    "" if kind == "gpu" else f"CPU sizes: ~{target >> 20} MiB a case"))
    return out


def _slots(B, G, evals):
    """The 1D matrices of each slot on the three axes (``G`` on the derivative's axis)."""
    return [tuple(G if a == e else B for a in range(3)) for e in evals]


def oracle(spec, B, G, field, emap, idx=None):
    """The float64 NumPy result of the case: ``interpolate`` on the elements ``idx``,
    ``integrate`` the whole vector (one einsum a slot over the three axes)."""
    mats = _slots(B, G, spec.evals())
    if not spec.transpose:
        V = field[emap[idx]]
        H = [np.einsum("ai,bj,ck,eijk->eabc", *m, V, optimize=True) for m in mats]
        return H[0] if spec.what == "values" else np.stack(H, axis=1)
    U = 0
    for j, m in enumerate(mats):
        h = field if spec.what == "values" else field[:, j]
        U = U + np.einsum("ai,bj,ck,eabc->eijk", *m, h, optimize=True)
    return np.bincount(emap.reshape(-1), weights=U.reshape(-1), minlength=spec.ndofs)


def _einsum_chain(xp, spec, mats, field, emap):
    """The einsum chain a user would write (see the module's docstring)."""
    if not spec.transpose:
        V = field[emap]
        out = []
        for m0, m1, m2 in mats:
            t = xp.einsum("ck,eijk->eijc", m2, V)
            t = xp.einsum("bj,eijc->eibc", m1, t)
            out.append(xp.einsum("ai,eibc->eabc", m0, t))
        return out[0] if spec.what == "values" else xp.stack(out, axis=1)
    U = None
    for j, (m0, m1, m2) in enumerate(mats):
        h = field if spec.what == "values" else field[:, j]
        t = xp.einsum("ai,eabc->eibc", m0, h)
        t = xp.einsum("bj,eibc->eijc", m1, t)
        t = xp.einsum("ck,eijc->eijk", m2, t)
        U = t if U is None else U + t
    return xp.bincount(emap.reshape(-1), weights=U.reshape(-1), minlength=spec.ndofs)


def _plan_info(plan):
    return dict(backend=plan.backend, kernel=str(plan.kernel),
                specialized=bool(plan.specialized),
                params={k: v for k, v in dict(plan.params or {}).items()
                        if isinstance(v, (int, float, str))},
                fallbacks=list(plan.fallbacks))


def run_case(case, bound_args, *, xp, backend="auto", repeats=20, warmup=2) -> dict:
    """Measure one case; the record has the bench's layout (``impls``, ``bound``)."""
    s = case.sizes
    p, nq, what, dt = s["p"], s["nq"], s["what"], case.dtype
    integ = s["direction"] == "integrate"
    rec = case_record(case)
    with recorded(rec, xp):
        space = H1Space(box_mesh(3, s["nx"]), p)
        emap, emap_h = space.dof_map(xp), space.dof_map(np)
        E, ndofs = space.nelements, space.ndofs
        b1 = basis_1d(p, nq)
        Bh = b1.B1d.astype(dt).astype(np.float64)      # the values the device sees
        Gh = b1.G1d.astype(dt).astype(np.float64)
        B = xp.asarray(Bh.astype(dt))
        G = None if what == "values" else xp.asarray(Gh.astype(dt))
        spec = BasisSpec(dim=3, nq=nq, nd=p + 1, batch=E, dtype=dt, what=what,
                         transpose=integ, ndofs=ndofs, index_dtype=np.dtype(emap.dtype).name)
        b = roofline.bound(spec, **bound_args)
        rec.update(bound=b.as_dict(), footprint_bytes=b.bytes, spec=str(spec))
        rng = np.random.default_rng(0)
        fh = rng.standard_normal(spec.points_shape if integ else (ndofs,)).astype(dt)
        field = xp.asarray(fh)
        fh = fh.astype(np.float64)
        idx = None if integ else _sample_indices(E, SAMPLE)
        ref = oracle(spec, Bh, Gh, fh, emap_h, idx)
        name = "integrate" if integ else "interpolate"
        fn = getattr(smalltc, name)
        kw = dict(what=what, ndofs=ndofs) if integ else dict(what=what)
        out = xp.empty(spec.out_shape, dtype=dt)
        mats = _slots(B, G, spec.evals())
        impls = [("smalltc", backend, lambda: fn(B, G, field, emap, out=out, backend=backend,
                                                  **kw),
                  f"smalltc.{name} (backend {backend}), through the map"),
                 ("reference", "reference", lambda: fn(B, G, field, emap, out=out,
                                                       backend="reference", **kw),
                  f"smalltc.{name} (backend reference), through the map"),
                 ("einsum", None, lambda: _einsum_chain(xp, spec, mats, field, emap),
                  f"{xp.__name__}.einsum chain, gather" + (", bincount" if integ else ""))]

        def check_result(res, be):
            finite, err = check(res, ref, idx, xp)
            return finite, err, ({} if be is None else _plan_info(
                smalltc.plan(name, B, G, field, emap, backend=be, **kw)))
        measure(rec, impls, check_result, bound=b, tol=TOLERANCE[dt], outs=(out,),
                on_gpu=xp.__name__ == "cupy", repeats=repeats, warmup=warmup)
        del out, field
    return rec


def table(rows, file) -> None:
    """One line per case: GDoF/s and the fraction of the bound for smalltc, the reference
    path and the einsum chain, smalltc's speed-up over each, and its kernel."""
    print("\n== basis (unique GDoF/s through the map; %bound: fraction of the roofline "
          "bound; x NAME: smalltc's speed over NAME's; sp: a size-specialised kernel) ==",
          file=file)
    impl_table(rows, file, suite="basis", baseline="einsum", width=40, specialized=True)


def plot(doc, path, plt):
    """Unique DoFs/s against p with the bound: a panel per direction (rows) and ``what``
    (columns), smalltc, the reference path and the einsum chain."""
    cs = [c for c in doc["cases"] if c["suite"] == "basis" and not c.get("error")]
    if not cs:
        return None
    dirs = [d for d in DIRECTIONS if any(c["sizes"]["direction"] == d for c in cs)]
    whats = [w for w in WHATS if any(c["sizes"]["what"] == w for c in cs)]
    fig, axes = plt.subplots(len(dirs), len(whats), figsize=(4.6 * len(whats),
                                                            3.8 * len(dirs)), squeeze=False)
    series = (("smalltc", "-", "C0"), ("reference", "--", "C1"), ("einsum", ":", "C2"))
    for row, direction in enumerate(dirs):
        for col, what in enumerate(whats):
            ax = axes[row, col]
            sub = sorted((c for c in cs if c["sizes"]["direction"] == direction
                          and c["sizes"]["what"] == what), key=lambda c: c["sizes"]["p"])
            ps = [c["sizes"]["p"] for c in sub]
            for name, style, color in series:
                pts = [(c["sizes"]["p"], c["impls"][name]["dofs_per_s"] * 1e-9) for c in sub
                       if (c["impls"].get(name) or {}).get("status") == "ok"]
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", ms=3, color=color, label=name)
            ax.plot(ps, [c["bound"]["dofs_per_s"] * 1e-9 for c in sub], "-", color="k",
                    lw=0.8, marker="_", ms=10, label="roofline bound")
            p_panel(ax, "unique DoFs / s (x 1e9)", f"{direction}, {what}",
                    "polynomial order p (nq = p + 2)", ticks=ps)
    bw = doc["probes"]["bandwidth"]["value"] * 1e-9
    fig.suptitle(f"{doc['device']['name']} {doc['options']['dtype']}: the basis application "
                 f"through the DoF map, 3D (BW = {bw:.0f} GB/s)", fontsize=11)
    return save_figure(fig, path, plt)
