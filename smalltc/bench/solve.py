"""The ``solve`` suite: Poisson solves to a relative residual of 1e-8, three preconditioners.

For each order p on a deformed 3D box mesh (``--mesh``: ``kershaw[:eps]``, the default,
is the Kershaw mesh of the CEED benchmarks (NekRS's BPS5), :func:`smalltc.fem.kershaw_mesh`,
eps 0.3 unless given, with a multiple of 6 elements along x and an even number along y
and z; ``sine[:amplitude]`` is :func:`smalltc.fem.box_mesh`'s sine distortion, 0.08 unless
given, on ``n^3`` elements; Dirichlet conditions on the whole boundary: the operator is the
identity there), the diffusion operator (:func:`smalltc.fem.diffusion_operator`,
matrix-free, ``nq = p + 2`` Gauss points; its plan's backend and kernel recorded) is
solved by :func:`smalltc.fem.cg` with

``jacobi``      the Jacobi preconditioner (the fused CG iteration)
``chebyshev``   Chebyshev (fourth kind, degree 4) of the Jacobi-preconditioned operator
``pmg``         the p-multigrid V-cycle (:func:`smalltc.fem.pmg`'s defaults: Chebyshev
                degree 3 (4 on the finest level from p = 6) on the levels p,
                ceil(p/2), ..., 1, the levels below the finest on
                ``nq = q + 1`` points; one AMG V-cycle on the order-1 level)

from the same right-hand side ``b = A x*`` (``x*`` random). Each records the
iterations, the setup time (the preconditioner's construction: eigenvalue estimates,
levels, AMG hierarchy), the solve time, the time to solution (their sum), the true
relative residual and the distance to the Jacobi-CG answer (pmg's setup is timed after a
pmg of the same orders on 10^3 elements has compiled every level's kernels, that one's
time in ``pmg_warmup_s``; the setup's parts in ``setup_parts``); for pmg also the V-cycle's
cost in finest-level applications, counted (by DoFs, :meth:`PMultigrid.cost`) and timed
(one V-cycle over one application of the constrained finest operator). Sizes: about 2M DoFs on a
GPU, 60k on a CPU (``quick``: 200k / 8k). The solves run once (``repeats`` > 1 on a
GPU: the median of that many solves), after a 2-iteration solve that compiles
and loads the kernels.
"""
from __future__ import annotations

import numpy as np

from .. import fem
from .._timing import median, synchronize, time_calls, time_once
from ..fem.multigrid import Constrained, _factory, boundary_mask
from .cases import Case
from .plots import p_axis, save_figure
from .report import case_rows
from .runner import case_record, recorded

__all__ = ["cases", "run_case", "table", "plot", "parse_mesh", "kershaw_eps", "mesh_label",
           "build_mesh", "resolve_pmg_options", "PRECONDS", "TOL", "DISTORTION", "KERSHAW_EPS", "DEFAULT_MESH"]

#: the preconditioners compared, in table order
PRECONDS = ("jacobi", "chebyshev", "pmg")
TOL = 1e-8
#: the sine mesh's default amplitude, the Kershaw mesh's default eps
DISTORTION = 0.08
KERSHAW_EPS = 0.3
#: the mesh of a run without ``--mesh``: the benchmark's (the solve targets are on it)
DEFAULT_MESH = "kershaw"
CHEBYSHEV_DEGREE = 4


def parse_mesh(spec=None):
    """``"kershaw[:eps]"`` or ``"sine[:amplitude]"`` (None: :data:`DEFAULT_MESH`) ->
    ``(name, parameter)``.

    Examples
    --------
    >>> parse_mesh("kershaw"), parse_mesh("kershaw:0.5"), parse_mesh("sine")
    (('kershaw', 0.3), ('kershaw', 0.5), ('sine', 0.08))
    """
    spec = DEFAULT_MESH if spec is None else str(spec).strip().lower()
    name, _, value = spec.partition(":")
    if name not in ("kershaw", "sine"):
        raise ValueError(f"--mesh must be 'kershaw[:eps]' or 'sine[:amplitude]', got {spec!r}")
    if name == "kershaw":
        return name, kershaw_eps(value, spec)
    if not value:
        return name, DISTORTION
    try:
        param = float(value)
    except ValueError:
        raise ValueError(f"--mesh {spec!r}: {value!r} is not a number") from None
    if not 0 <= param < 1 / (3 * np.pi):
        raise ValueError(f"--mesh {spec!r}: the sine amplitude must be in [0, 1/(3 pi)) "
                         "(larger ones tangle the mesh)")
    return name, param


def kershaw_eps(value, spec):
    """The Kershaw mesh's eps of a ``--mesh`` option ``spec`` (the solve, poisson and
    scaling suites'): ``value``, its text after the colon, a number in (0, 1]; empty:
    :data:`KERSHAW_EPS`.

    Examples
    --------
    >>> kershaw_eps("", "kershaw"), kershaw_eps("0.5", "kershaw:0.5")
    (0.3, 0.5)
    >>> kershaw_eps("2", "kershaw:2")
    Traceback (most recent call last):
    ...
    ValueError: --mesh 'kershaw:2': the Kershaw eps must be in (0, 1]
    """
    try:
        eps = float(value) if value else KERSHAW_EPS
    except ValueError:
        raise ValueError(f"--mesh {spec!r}: {value!r} is not a number") from None
    if not 0 < eps <= 1:
        raise ValueError(f"--mesh {spec!r}: the Kershaw eps must be in (0, 1]")
    return eps


def mesh_label(name, param):
    """The mesh in words, for the table and the plot.

    Examples
    --------
    >>> mesh_label("kershaw", 0.3), mesh_label("sine", 0.08)
    ('Kershaw eps=0.3 3D box', 'sine-distorted (0.08) 3D box')
    """
    return (f"Kershaw eps={param:g} 3D box" if name == "kershaw"
            else f"sine-distorted ({param:g}) 3D box")


def build_mesh(name, param, shape):
    """The case's mesh: ``shape`` elements per direction."""
    if name == "kershaw":
        return fem.kershaw_mesh(tuple(shape), param)
    return fem.box_mesh(3, tuple(shape), distortion=param)


def _kershaw_shape(target, p):
    """Elements ``(nx, ny, nz)``, ``nx`` a multiple of 6, ``ny = nz`` even, ``nx / ny``
    within [2/3, 3/2], with ``(nx p + 1)(ny p + 1)^2`` DoFs closest to ``target`` (in
    ratio)."""
    best = None
    n0 = target ** (1 / 3) / p
    for nx in range(6, 6 * (int(n0 / 6) + 3), 6):
        for ny in range(2, int(1.6 * nx) + 3, 2):
            if not (2 / 3 <= nx / ny <= 3 / 2) and (nx, ny) != (6, 2):
                continue
            nd = (nx * p + 1) * (ny * p + 1) ** 2
            score = abs(np.log(nd / target))
            if best is None or score < best[0]:
                best = (score, (nx, ny, ny))
    return best[1]


def cases(dtype, kind, ps=None, quick=False, ndofs=None, mesh=None) -> list:
    """The solve cases for ``dtype`` on a device of ``kind`` ("cpu"/"gpu"); ``ndofs``:
    about that many DoFs a case instead of the defaults; ``mesh``: ``"kershaw[:eps]"``
    (default) or ``"sine[:amplitude]"`` (:func:`parse_mesh`)."""
    name, param = parse_mesh(mesh)
    target = (200_000 if quick else 2_000_000) if kind == "gpu" else \
        (8_000 if quick else 60_000)
    target = int(ndofs) if ndofs else target
    ps = ps or ([2, 4] if quick else (list(range(2, 9)) if kind == "gpu" else [2, 3, 4, 5, 6]))
    out = []
    for p in ps:
        if name == "kershaw":
            shape = _kershaw_shape(target, p)
        else:
            shape = (max(2, round(target ** (1 / 3) / p)),) * 3
        n = shape[0] if len(set(shape)) == 1 else "x".join(map(str, shape))
        out.append(Case("solve", "solve", dict(
            dim=3, p=p, n=n, shape=list(shape), mesh=f"{name}:{param:g}",
            batch=int(np.prod(shape)),
            ndofs=int(np.prod([k * p + 1 for k in shape]))), dtype,
            "" if kind == "gpu" else f"CPU sizes: ~{target // 1000}k DoFs"))
    return out


def _operator_factory(device):
    return _factory("diffusion", None, device)


def _first_call(M, b):
    """``M`` after its first application (on a GPU it captures the V-cycle's CUDA graph:
    setup work, timed as such)."""
    M(b)
    return M


def resolve_pmg_options(options, p):
    """``fem.pmg`` keyword arguments for a case of order ``p``: a degree ``"p"`` (alone or
    in the per-level list) becomes ``max(3, p)``.

    Examples
    --------
    >>> resolve_pmg_options({"smoother": "fourth-opt", "degree": ["p", 3]}, 6)
    {'smoother': 'fourth-opt', 'degree': [6, 3]}
    >>> resolve_pmg_options({"degree": "p"}, 2), resolve_pmg_options(None, 4)
    ({'degree': 3}, {})
    """
    out = dict(options or {})
    if "degree" in out:
        p3 = max(3, int(p))
        deg = out["degree"]
        out["degree"] = [p3 if d == "p" else d for d in deg] if isinstance(deg, list) \
            else (p3 if deg == "p" else deg)
    return out


def run_case(case, *, xp, repeats=1, profile=False, pmg_options=None) -> dict:
    """Solve one case with each preconditioner; the record has the bench's layout.
    ``profile``: also :meth:`PMultigrid.profile` (a V-cycle's time per level and part)
    in the pmg record's ``profile``; ``pmg_options``: keyword arguments of
    :func:`smalltc.fem.pmg` (``smoother``, ``degree``), recorded as ``pmg_options``."""
    pmg_options = resolve_pmg_options(pmg_options, case.sizes["p"])
    on_gpu = xp.__name__ == "cupy"
    device = "gpu" if on_gpu else "cpu"
    s = case.sizes
    name, param = parse_mesh(s.get("mesh", "sine"))
    shape = tuple(s.get("shape", (s["n"],) * 3))
    rec = case_record(case, suite="solve", op="solve", tol=TOL, mesh=f"{name}:{param:g}",
                      mesh_label=mesh_label(name, param), pmg_options=pmg_options)
    if name == "sine":
        rec["distortion"] = param
    with recorded(rec, xp):
        mesh = build_mesh(name, param, shape)
        space = fem.H1Space(mesh, s["p"])
        make = _operator_factory(device)
        raw = make(space)
        A = Constrained(raw, xp.asarray(raw.diagonal()), ~boundary_mask(space))
        rec["operator"] = repr(raw)
        xstar = xp.asarray(np.random.default_rng(0).standard_normal(space.ndofs))
        b = A(xstar)
        synchronize(on_gpu)
        builders = {
            "jacobi": lambda: fem.jacobi(A.diagonal()),
            "chebyshev": lambda: fem.chebyshev(A, degree=CHEBYSHEV_DEGREE),
            "pmg": lambda: _first_call(fem.pmg(raw, constrained=boundary_mask(space),
                                                **pmg_options), b),
        }
        # the kernels of every level compile before the setup is timed (as the Jacobi
        # solve's do, in its untimed first solve): a pmg of the same orders on 10^3
        # elements (the order-1 level above the AMG's max_coarse, so that its levels'
        # kernels (CSR products, cupyx's sparse kernels) compile too), timed apart
        def warm():
            small = fem.H1Space(build_mesh(name, param, [min(a, b) for a, b in
                                                         zip(shape, (12, 10, 10))]), s["p"])
            M = fem.pmg(make(small), constrained=boundary_mask(small), **pmg_options)
            M(xp.ones(small.ndofs))
            return M
        _, warm_s = time_once(warm, on_gpu=on_gpu)
        rec["pmg_warmup_s"] = warm_s
        ref = None
        for name in PRECONDS:
            r = rec["impls"][name] = dict(status="error")
            with recorded(r):
                P, setup = time_once(builders[name], on_gpu=on_gpu)
                op = P.operator if name == "pmg" else A
                solve = lambda: fem.cg(op, b, tol=TOL, precond=P, maxiter=20000)  # noqa: E731
                fem.cg(op, b, tol=TOL, precond=P, maxiter=2, raise_on_failure=False)  # compiles
                res, t = time_once(solve, on_gpu=on_gpu)
                times = [t]
                for _ in range(max(0, repeats - 1)):
                    times.append(time_once(solve, on_gpu=on_gpu)[1])
                t = float(np.median(times[1:] if len(times) > 1 else times))
                x = res.x
                if ref is None:
                    ref = x
                dist = float(xp.linalg.norm(x - ref) / xp.linalg.norm(ref))
                r.update(status="ok", iterations=int(res.iterations), setup_s=setup, solve_s=t,
                         median_s=t, time_to_solution_s=setup + t,
                         per_iteration_s=t / max(1, res.iterations),
                         true_residual=float(res.true_residual), diff_to_jacobi=dist,
                         what=repr(P) if name != "pmg" else str(P).splitlines()[0])
                if name == "pmg":
                    c = P.cost()
                    t_apply = median(time_calls(lambda: op(b), repeats=3, warmup=1,
                                                on_gpu=on_gpu))
                    t_cycle = median(time_calls(lambda: P(b), repeats=3, warmup=1,
                                                on_gpu=on_gpu))
                    r.update(levels=[lev.space.p for lev in P.levels],
                             vcycle_fine_applications=c["fine_equivalent"],
                             vcycle_fine_relaxations=c.get("relaxations", 0.0),
                             vcycle_s=t_cycle, apply_s=t_apply,
                             vcycle_in_applications=t_cycle / t_apply,
                             coarse=P.coarse.describe(), hierarchy=str(P),
                             setup_parts=dict(getattr(P, "setup_times", {})))
                    if profile:
                        r["profile"] = P.profile(b, repeats=3)
    return rec


def table(rows, file) -> None:
    """Iterations and time to solution per preconditioner, and the speed-ups over Jacobi."""
    meshes = sorted({c.get("mesh_label", f"sine-distorted ({DISTORTION:g}) 3D box")
                     for c in rows})
    print(f"\n== solve (Poisson, {', '.join(meshes)}, relative residual {TOL:g}; its: CG "
          "iterations, tts: setup + solve seconds; x NAME: Jacobi's tts / NAME's; x solve: Jacobi's "
          "solve / pmg's solve (setups left out); V/A: the "
          "V-cycle in finest-level applications, counted by DoFs and timed) ==", file=file)
    head = f"{'case':24s} {'ndofs':>8s}"
    for name in PRECONDS:
        head += f" {name + ' its':>13s} {'tts':>8s}"
    head += f" {'x cheb':>7s} {'x pmg':>7s} {'x solve':>7s} {'V/A':>5s} {'V/A t':>5s}"
    print(head, file=file)
    for c, label in case_rows(rows, file, 24):
        im = c["impls"]
        line = f"{label:24s} {c['sizes']['ndofs']:8d}"
        tts = {}
        for name in PRECONDS:
            r = im.get(name, {})
            if r.get("status") == "ok":
                tts[name] = r["time_to_solution_s"]
                line += f" {r['iterations']:13d} {r['time_to_solution_s']:8.3g}"
            else:
                line += f" {'error':>13s} {'-':>8s}"
        for name in ("chebyshev", "pmg"):
            ok = "jacobi" in tts and name in tts
            line += f" {tts['jacobi'] / tts[name]:7.2f}" if ok else f" {'-':>7s}"
        ok = all(im.get(n, {}).get("status") == "ok" for n in ("jacobi", "pmg"))
        line += (f" {im['jacobi']['solve_s'] / im['pmg']['solve_s']:7.2f}" if ok
                 else f" {'-':>7s}")
        for key in ("vcycle_fine_applications", "vcycle_in_applications"):
            v = im.get("pmg", {}).get(key)
            line += f" {v:5.1f}" if v else f" {'-':>5s}"
        print(line, file=file)
    prof = [c for c in rows if c.get("impls", {}).get("pmg", {}).get("profile")]
    if prof:
        print("\n== solve: one p-multigrid V-cycle per level and part, ms (--profile; "
              "res: both residuals; setup: the setup's parts, s) ==", file=file)
        for c in prof:
            pm = c["impls"]["pmg"]
            pr = pm["profile"]
            print(f"{c['id'].replace(' ' + c['dtype'], '')}: V-cycle {pr['vcycle_s'] * 1e3:.3g}"
                  f" ms (parts {pr['parts_s'] * 1e3:.3g}), finest apply "
                  f"{pr['apply_s'] * 1e3:.3g} ms, V/A t {pr['vcycle_in_applications']:.1f}",
                  file=file)
            for row in pr["levels"]:
                parts = " ".join(f"{k[:5]} {v * 1e3:7.3f}" for k, v in row.items()
                                 if k not in ("p", "ndofs"))
                print(f"  p={row['p']:<2d} {row['ndofs']:>9d}  {parts}", file=file)
            if pm.get("setup_parts"):
                print("  setup: " + ", ".join(f"{k} {v:.3g}" for k, v in
                                              pm["setup_parts"].items())
                      + (f"; the warm-up pmg on 10^3 elements (compiles): "
                         f"{c['pmg_warmup_s']:.3g}" if c.get("pmg_warmup_s") else ""),
                      file=file)


def plot(doc, path, plt):
    """Iterations against p (left) and time to solution against p (right)."""
    cs = sorted((c for c in doc["cases"] if c["suite"] == "solve" and not c.get("error")),
                key=lambda c: c["sizes"]["p"])
    if not cs:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), squeeze=False)
    for i, name in enumerate(PRECONDS):
        pts = [(c["sizes"]["p"], c["impls"][name]) for c in cs
               if c["impls"].get(name, {}).get("status") == "ok"]
        if not pts:
            continue
        ps = [p for p, _ in pts]
        axes[0, 0].plot(ps, [r["iterations"] for _, r in pts], "-o", ms=3, color=f"C{i}",
                        label=name)
        axes[0, 1].plot(ps, [r["time_to_solution_s"] for _, r in pts], "-o", ms=3,
                        color=f"C{i}", label=name)
    axes[0, 0].axhline(30, color="k", lw=0.8, ls="--", label="target (pmg <= 30)")
    axes[0, 0].set_ylabel("CG iterations to 1e-8")
    axes[0, 1].set_ylabel("time to solution (s)")
    for ax in axes[0]:
        ax.set_yscale("log")
        p_axis(ax)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    op = "diffusion"
    meshes = ", ".join(sorted({c.get("mesh_label", f"sine-distorted ({DISTORTION:g}) 3D box")
                               for c in cs}))
    fig.suptitle(f"{doc['device']['name']}: Poisson ({op}), {meshes}, "
                 f"~{cs[-1]['sizes']['ndofs']:,} DoFs", fontsize=10)
    return save_figure(fig, path, plt)
