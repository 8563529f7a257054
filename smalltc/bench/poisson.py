"""The ``poisson`` suite: a user's Poisson solve from the mesh to the VTU file, phase by phase.

Usage::

    smalltc bench --suite poisson                          # both meshes, p = 2, 4, 7,
                                                           # Jacobi and p-multigrid
    smalltc bench --suite poisson --device cpu --p 4 --mesh kershaw --precond pmg
    smalltc bench --suite poisson --quick --ndofs 20000    # smaller problems

The problem: ``-laplace u = f`` on the unit cube, ``u = 0`` on its boundary, with the
exact solution ``u = sin(pi x) sin(pi y) sin(pi z)`` (``f = 3 pi^2 u``), on two meshes
(``--mesh``: ``box``, :func:`smalltc.fem.box_mesh`'s ``n^3`` affine elements;
``kershaw[:eps]``, :func:`smalltc.fem.kershaw_mesh`, the CEED benchmarks' mesh, eps 0.3
unless given; default both) at p = 2, 4, 7 with ``nq = p + 2`` Gauss points, CG
preconditioned by Jacobi or by the p-multigrid V-cycle (``--precond``: ``jacobi``,
``pmg``; default both; ``pmg`` needs pyamg and its cases are skipped with a note without
it). Each phase is one or a few calls of the public API, timed on its own (synchronised
on a GPU):

============  ========================================================================
phase         calls
============  ========================================================================
mesh          ``fem.box_mesh`` / ``fem.kershaw_mesh``
space         ``fem.H1Space``
operator      ``fem.diffusion_operator``: the geometry (``Q`` at the points) and the
              matrix-free operator
load+bc       ``fem.load_vector``, ``fem.dirichlet_bc``, ``fem.ConstrainedOperator``
              and the lifted right-hand side (``bc.lift``)
precond       ``fem.jacobi(A.diagonal())`` or ``fem.pmg(A)``
solve         ``PoissonProblem.solve``: CG to a relative residual of :data:`TOL`; the
              iterations and the seconds an iteration recorded (on a GPU the
              p-multigrid's first application, which captures its CUDA graph, is in
              here: the user's call pays it)
errors        ``fem.l2_error`` and ``fem.h1_error`` with ``exact=(u, grad u)`` on the
              solution's device
output        ``fem.write_vtu`` of the solution where it lives (on a GPU the points and
              the field sampled there, the samples copied back; a temporary file, its
              size recorded)
============  ========================================================================

These are the pieces :func:`smalltc.fem.poisson_problem` calls (no Neumann data,
``kappa = 1``); after the warm run the whole ``fem.poisson_problem`` call is timed once
more (``poisson_problem_s``, its right-hand side compared with the pieces' in
``poisson_problem_b_diff``), so the pieces stay honest should it change. Each case runs
twice in one process: ``cold`` (its first run: plans built, kernels compiled or loaded;
an earlier case of the same order in the run has compiled most of them, which
``first_of_order`` says) and ``warm`` (the same again); ``compile_s`` is the difference
of their totals. Per run: the peak host RSS (``VmHWM``, reset before the run through
``/proc/self/clear_refs``; where that fails the process's peak, ``rss_scope``), and on a
GPU the CuPy memory pool's high-water mark (the pool is emptied before the run and
returns no block within it, so the bytes it holds at the end) and the device memory in
use at the end of each phase above the run's start (``cudaMemGetInfo``: the pool, CUDA
graphs, library workspaces). Sizes: about 2M DoFs on a GPU, 200k on a CPU (``quick``:
50k / 3k); ``--ndofs`` sets them.
"""
from __future__ import annotations

import gc
import importlib.util
import os
import resource
import tempfile
import traceback

import numpy as np

from .. import fem
from .._arrays import array_module
from .._timing import synchronize, time_once
from .cases import Case
from .plots import save_figure
from .runner import case_record
from .solve import KERSHAW_EPS, _kershaw_shape, kershaw_eps  # noqa: F401 (KERSHAW_EPS)

__all__ = ["cases", "run_case", "table", "plot", "parse_meshes", "PHASES", "PRECONDS",
           "TOL", "exact_u", "exact_grad", "source"]

#: the phases of a run, in order
PHASES = ("mesh", "space", "operator", "load+bc", "precond", "solve", "errors", "output")
#: the preconditioners, in table order
PRECONDS = ("jacobi", "pmg")
#: CG's relative residual target (the solve suite's)
TOL = 1e-8
#: the orders of a run without ``--p``
ORDERS = (2, 4, 7)
#: unique DoFs a case: (GPU, CPU), and with ``quick``
TARGET = ((2_000_000, 200_000), (50_000, 3_000))


def exact_u(x):
    """The exact solution ``sin(pi x) sin(pi y) sin(pi z)``, ``x`` of shape (3, ...)."""
    xp = array_module(x)      # its own ufuncs: CuPy's first NumPy ufunc imports cupyx.scipy
    return xp.sin(np.pi * x[0]) * xp.sin(np.pi * x[1]) * xp.sin(np.pi * x[2])


def exact_grad(x):
    """The gradient of :func:`exact_u`, shape (3, ...)."""
    xp = array_module(x)
    s = xp.sin(np.pi * x)
    c = np.pi * xp.cos(np.pi * x)
    return xp.stack([c[0] * s[1] * s[2], s[0] * c[1] * s[2], s[0] * s[1] * c[2]])


def source(x):
    """``f = -laplace u = 3 pi^2 u``."""
    return 3 * np.pi ** 2 * exact_u(x)


def parse_meshes(spec=None):
    """``--mesh`` for this suite: ``box``, ``kershaw[:eps]``, or both comma separated
    (None: both) -> ``[(name, parameter)]``.

    Examples
    --------
    >>> parse_meshes(), parse_meshes("kershaw:0.5")
    ([('box', None), ('kershaw', 0.3)], [('kershaw', 0.5)])
    """
    out = []
    for part in (spec or "box,kershaw").split(","):
        name, _, value = part.strip().lower().partition(":")
        if name == "box" and not value:
            out.append(("box", None))
        elif name == "kershaw":
            out.append(("kershaw", kershaw_eps(value, part)))
        else:
            raise ValueError(f"the poisson suite's --mesh takes 'box' and 'kershaw[:eps]' "
                             f"(comma separated), got {part!r}")
    return out


def _preconds(names):
    names = list(names or PRECONDS)
    bad = [n for n in names if n not in PRECONDS]
    if bad:
        raise ValueError(f"--precond takes {', '.join(PRECONDS)}, got {', '.join(bad)}")
    return names


def cases(dtype, kind, ps=None, quick=False, ndofs=None, mesh=None, preconds=None) -> list:
    """The cases for ``dtype`` on a device of ``kind`` ("cpu"/"gpu"): per mesh, order and
    preconditioner. ``ndofs``: about that many DoFs a case instead of :data:`TARGET`.

    >>> for c in cases("float64", "cpu", ps=[2], quick=True):
    ...     print(c.id, c.sizes["shape"], c.sizes["ndofs"])
    poisson box jacobi dim=3 p=2 nq=4 float64 [7, 7, 7] 3375
    poisson box pmg dim=3 p=2 nq=4 float64 [7, 7, 7] 3375
    poisson kershaw jacobi dim=3 p=2 nq=4 float64 [6, 8, 8] 3757
    poisson kershaw pmg dim=3 p=2 nq=4 float64 [6, 8, 8] 3757
    """
    if dtype != "float64":
        raise ValueError(f"the poisson suite runs in float64 (fem's solvers), not {dtype}")
    target = int(ndofs) if ndofs else TARGET[1 if quick else 0][0 if kind == "gpu" else 1]
    seen, out = set(), []
    for name, param in parse_meshes(mesh):
        for p in ps or ORDERS:
            if name == "kershaw":
                shape = list(_kershaw_shape(target, p))
            else:
                shape = [max(2, round((target ** (1 / 3) - 1) / p))] * 3
            for pc in _preconds(preconds):
                sizes = dict(label=f"{name} {pc}", dim=3, p=p, nq=p + 2,
                             mesh=name if param is None else f"{name}:{param:g}",
                             shape=shape, batch=int(np.prod(shape)),
                             ndofs=int(np.prod([k * p + 1 for k in shape])), precond=pc,
                             first_of_order=(p, pc) not in seen)
                seen.add((p, pc))
                out.append(Case("poisson", "poisson", sizes, dtype,
                                "" if kind == "gpu" else f"CPU sizes: ~{target // 1000}k DoFs"))
    return out


class _Memory:
    """Peak host RSS and GPU memory of one run (see the module's docstring)."""

    def __init__(self, on_gpu):
        self.on_gpu = on_gpu
        gc.collect()
        self.rss_scope = "run" if _reset_rss_peak() else "process"
        self.after = {}
        if on_gpu:
            import cupy
            self.cp = cupy
            self.pool = cupy.get_default_memory_pool()
            synchronize(True)
            self.pool.free_all_blocks()
            self.base = self._used()

    def _used(self):
        free, total = self.cp.cuda.runtime.memGetInfo()
        return int(total - free)

    def mark(self, phase):
        if self.on_gpu:
            self.after[phase] = self._used() - self.base

    def result(self) -> dict:
        out = dict(rss_peak_bytes=_rss_peak(), rss_scope=self.rss_scope)
        if self.on_gpu:
            out.update(gpu_pool_peak_bytes=int(self.pool.total_bytes()),
                       gpu_used_peak_bytes=max(self.after.values(), default=0),
                       gpu_used_after_bytes=dict(self.after))
        return out


def _reset_rss_peak() -> bool:
    """Reset the process's ``VmHWM`` (Linux: ``5`` to ``/proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _rss_peak() -> int:
    """Peak resident set in bytes: ``VmHWM`` where there is one, else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if os.uname().sysname == "Darwin" else peak * 1024)


def _build_mesh(s):
    name, _, eps = s["mesh"].partition(":")
    if name == "kershaw":
        return fem.kershaw_mesh(tuple(s["shape"]), float(eps))
    return fem.box_mesh(3, tuple(s["shape"]))


def _run(case, xp, folder) -> tuple:
    """One run of the case's phases; ``(record, problem)`` (the problem for the
    comparison with ``fem.poisson_problem``)."""
    on_gpu = xp.__name__ == "cupy"
    device = "gpu" if on_gpu else "cpu"
    s = case.sizes
    p, nq = s["p"], s["nq"]
    phases = {}
    mem = _Memory(on_gpu)
    rec = dict(status="error", phases_s=phases)

    def phase(name, fn):
        res, phases[name] = time_once(fn, on_gpu=on_gpu)
        mem.mark(name)
        return res

    try:
        mesh = phase("mesh", lambda: _build_mesh(s))
        space = phase("space", lambda: fem.H1Space(mesh, p))
        K = phase("operator", lambda: fem.diffusion_operator(space, nq, None, device=device))

        def load_bc():
            load = fem.load_vector(space, source, nq=nq, device=device)
            bc = fem.dirichlet_bc(space, {None: 0.0})
            A = fem.ConstrainedOperator(K, bc)
            return load, bc, A, bc.lift(K, xp.asarray(load))
        load, bc, A, b = phase("load+bc", load_bc)
        P = phase("precond", lambda: fem.jacobi(A.diagonal()) if s["precond"] == "jacobi"
                  else fem.pmg(A))
        prob = fem.PoissonProblem(space, K, load, bc, A, b, P, device)
        sol = phase("solve", lambda: prob.solve(tol=TOL))

        def errors():                 # on the solution's device: one float back each
            return (fem.l2_error(space, sol.x, exact_u),
                    fem.h1_error(space, sol.x, (exact_u, exact_grad)))
        l2, h1 = phase("errors", errors)
        path = os.path.join(folder, "u.vtu")
        phase("output", lambda: fem.write_vtu(path, space, u=sol.x))
        its = int(sol.iterations)
        rec.update(status="ok", total_s=sum(phases.values()), iterations=its,
                   per_iteration_s=phases["solve"] / max(1, its),
                   residual=float(sol.residuals[-1]), true_residual=float(sol.true_residual),
                   converged=bool(sol.converged), l2_error=float(l2), h1_error=float(h1),
                   vtu_bytes=os.path.getsize(path), operator=repr(K).splitlines()[0],
                   precond=str(P).splitlines()[0])
        if getattr(P, "setup_times", None):
            rec["precond_parts_s"] = dict(P.setup_times)
        os.remove(path)
    except Exception as err:   # a run that fails is recorded, the suite goes on
        rec.update(error=repr(err), trace=traceback.format_exc(limit=-8))
        prob = None
    rec["memory"] = mem.result()
    return rec, prob


def run_case(case, *, xp) -> dict:
    """Run the case cold, then warm, then ``fem.poisson_problem`` whole; the record has the
    bench's layout (``impls``: ``cold`` and ``warm``, each with ``phases_s``)."""
    s = case.sizes
    rec = case_record(case, suite="poisson", op="poisson", tol=TOL, phases=list(PHASES))
    if s["precond"] == "pmg" and importlib.util.find_spec("pyamg") is None:
        rec["skipped"] = "pmg needs pyamg (pip install pyamg): not installed here"
        return rec
    on_gpu = xp.__name__ == "cupy"
    with tempfile.TemporaryDirectory(prefix="smalltc-poisson-") as folder:
        cold = _run(case, xp, folder)[0]          # its problem freed before the warm run
        rec["impls"]["cold"] = cold
        if cold["status"] == "ok":
            warm, prob = _run(case, xp, folder)
            rec["impls"]["warm"] = warm
            if warm["status"] == "ok":
                rec["compile_s"] = cold["total_s"] - warm["total_s"]
                try:
                    _whole(rec, prob, case, xp, on_gpu)
                except Exception as err:
                    rec["poisson_problem_error"] = repr(err)
            del prob
    if on_gpu:
        xp.get_default_memory_pool().free_all_blocks()
    return rec


def _whole(rec, prob, case, xp, on_gpu):
    """``fem.poisson_problem`` in one call (the warm run's space .. precond phases), and
    its right-hand side against the pieces'."""
    s = case.sizes
    mesh = prob.space.mesh
    pp, t = time_once(lambda: fem.poisson_problem(mesh, s["p"], source, nq=s["nq"],
                                                  precond=s["precond"],
                                                  device="gpu" if on_gpu else "cpu"),
                      on_gpu=on_gpu)
    ph = rec["impls"]["warm"]["phases_s"]
    rec["poisson_problem_s"] = t
    rec["pieces_s"] = sum(ph[k] for k in ("space", "operator", "load+bc", "precond"))
    rec["poisson_problem_b_diff"] = float(xp.linalg.norm(pp.b - prob.b)
                                          / xp.linalg.norm(prob.b))


def _mib(n):
    return f"{n / 2 ** 20:7.0f}" if n is not None else f"{'-':>7s}"


def table(rows, file) -> None:
    """The warm run's phases (seconds) per case, the cold run's total, the iterations, the
    errors and the peak memory."""
    gpu = any("gpu_pool_peak_bytes" in (c.get("impls", {}).get("warm") or {}).get(
        "memory", {}) for c in rows)
    print(f"\n== poisson (a user's Poisson solve by phase, warm run, seconds; cold: the "
          f"first run's total; its: CG iterations to {TOL:g}, s/it: seconds an iteration; "
          "RSS: peak host memory" + (", GPU: the pool's peak" if gpu else "")
          + ", MiB) ==", file=file)
    short = {"load+bc": "load", "precond": "prec", "operator": "oper", "errors": "err",
             "output": "out"}
    head = (f"{'case':30s} {'ndofs':>8s} " + " ".join(f"{short.get(k, k):>7s}" for k in PHASES)
            + f" {'total':>7s} {'cold':>7s} {'its':>5s} {'s/it':>8s} {'L2 err':>8s} "
            + f"{'RSS':>7s}" + (f" {'GPU':>7s}" if gpu else ""))
    print(head, file=file)
    for c in rows:
        label = c["id"].replace(f" {c['dtype']}", "").replace("poisson ", "")
        if c.get("skipped"):
            print(f"{label:30s} skipped: {c['skipped']}", file=file)
            continue
        w, cold = c["impls"].get("warm") or {}, c["impls"].get("cold") or {}
        bad = w if w.get("status") != "ok" else None
        if cold.get("status") != "ok":
            bad = cold
        if bad is not None or c.get("error"):
            print(f"{label:30s} error: {c.get('error') or bad.get('error')}", file=file)
            continue
        mem = w["memory"]
        line = (f"{label:30s} {c['sizes']['ndofs']:8d} "
                + " ".join(f"{w['phases_s'][k]:7.3g}" for k in PHASES)
                + f" {w['total_s']:7.3g} {cold['total_s']:7.3g} {w['iterations']:5d} "
                f"{w['per_iteration_s']:8.2e} {w['l2_error']:8.1e} {_mib(mem['rss_peak_bytes'])}")
        if gpu:
            line += f" {_mib(mem.get('gpu_pool_peak_bytes'))}"
        print(line, file=file)
    checks = [c for c in rows if "poisson_problem_s" in c]
    if checks:
        worst = max(c["poisson_problem_b_diff"] for c in checks)
        ratio = [c["poisson_problem_s"] / c["pieces_s"] for c in checks if c["pieces_s"] > 0]
        print(f"fem.poisson_problem in one call: {min(ratio):.2f}-{max(ratio):.2f}x the "
              f"pieces' space..precond time; its right-hand side within {worst:.1e} of "
              "theirs", file=file)


def plot(doc, path, plt):
    """One bar per case, the warm run's phases stacked: seconds (above; the iterations and
    the cold run's total written over each bar) and each phase's share (below)."""
    cs = [c for c in doc["cases"] if c["suite"] == "poisson"
          and (c.get("impls", {}).get("warm") or {}).get("status") == "ok"]
    if not cs:
        return None
    x = np.arange(len(cs))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.8 * len(cs) + 4), 8.5), sharex=True,
                             gridspec_kw=dict(height_ratios=(3, 2)))
    bottom, share = np.zeros(len(cs)), np.zeros(len(cs))
    totals = np.array([c["impls"]["warm"]["total_s"] for c in cs])
    for i, k in enumerate(PHASES):
        v = np.array([c["impls"]["warm"]["phases_s"][k] for c in cs])
        axes[0].bar(x, v, bottom=bottom, color=f"C{i}", width=0.7, label=k)
        axes[1].bar(x, 100 * v / totals, bottom=share, color=f"C{i}", width=0.7)
        bottom += v
        share += 100 * v / totals
    for i, c in enumerate(cs):
        axes[0].annotate(f"{c['impls']['warm']['iterations']} its\ncold "
                         f"{c['impls']['cold']['total_s']:.3g} s", (i, bottom[i]),
                         textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    axes[0].set_ylim(0, 1.18 * bottom.max())
    axes[0].set_ylabel("seconds (warm run)")
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="phase",
                   title_fontsize=8)
    axes[0].grid(True, axis="y", alpha=0.3)
    axes[1].set_ylabel("share of the warm run (%)")
    axes[1].set_ylim(0, 100)
    axes[1].set_xticks(x)
    axes[1].set_xticklabels([f"{c['sizes']['mesh'].split(':')[0]} p={c['sizes']['p']}\n"
                             f"{c['sizes']['precond']}\n{c['sizes']['ndofs']:,}" for c in cs],
                            fontsize=8)
    axes[1].set_xlabel("case (mesh, order, preconditioner, DoFs)")
    fig.suptitle(f"{doc['device']['name']}: a Poisson solve by phase, mesh to VTU "
                 f"(CG to {TOL:g}, nq = p + 2; cold: the first run, compiles included)",
                 fontsize=11)
    return save_figure(fig, path, plt)
