"""The ``scaling`` suite: weak and strong scaling of the distributed Poisson solve over MPI ranks.

Usage::

    smalltc bench --suite scaling --ranks 1,2,4                  # weak and strong, p = 4
    smalltc bench --suite scaling --device gpu --ranks 1,2 --ndofs 10000000 --precond jacobi,pmg
    smalltc bench --suite scaling --mesh kershaw --scaling weak --ndofs 20000 --p 2

The problem is the poisson suite's (:mod:`.poisson`): ``-laplace u = f`` on the unit
cube, ``u = sin(pi x) sin(pi y) sin(pi z)`` on its boundary and as the exact solution,
CG to :data:`TOL` preconditioned by Jacobi or the distributed p-multigrid, solved by
:func:`smalltc.fem.distributed.poisson.solve_poisson_distributed` with the mesh built
per rank (:func:`~smalltc.fem.distributed.distributed_box_mesh`,
:func:`~smalltc.fem.distributed.distributed_kershaw_mesh`, eps 0.3 unless
``--mesh kershaw:EPS``).

* **weak** scaling: ``--ndofs`` DoFs a rank (default 2M on GPUs, 20k on a CPU): on ``R``
  ranks the box grows with the rank grid ``g`` (:func:`rank_grid`; the box ``[0, g]``,
  ``k^3`` elements a unit cell, a Kershaw mesh's map repeated in every cell:
  ``Kershaw(tiles=g)``), so every rank holds the one-rank mesh moved: the same elements
  and the same work, and a preconditioner whose iterations do not grow with the mesh
  keeps its count. (Refining the unit cube instead would flatten the elements, 2:1 at
  ``R = 2``, and the Kershaw problem would get harder as it grew: at p = 4 and 12^3
  elements a cell, p-multigrid's iterations go 55, 87, 107 on 1, 2, 4 cells that way
  against 55, 56, 56 tiled.) Efficiency ``t_1 / t_R``.
* **strong** scaling: a fixed mesh of ``--ndofs`` times the largest rank count DoFs
  (``--total-dofs`` to set it) over every rank count; efficiency ``t_1 / (R t_R)``.

``t_1`` is the time on the smallest rank count of the run (one rank when ``--ranks``
has 1; else efficiencies are relative to the smallest, scaled by its rank count for
strong scaling). Efficiencies are given for the solve (CG, the largest time over the
ranks) and for the whole call (``solve_poisson``: setup, solve and the error, between
barriers).

For each rank count the suite launches ``mpiexec -n R`` (the one beside this Python,
else on ``PATH``) of this module's worker (``python -m smalltc.bench.scaling worker``),
one rank a GPU with ``--device gpu`` (node-local rank modulo the device count), on a
CPU ``cores / R`` Numba threads a rank. Each worker builds its block of the mesh, calls
the solve once untimed (kernels compiled, caches warm; on GPUs on a small mesh of the same
kind, :func:`_warmup_shape`), then ``--repeats`` timed calls (default 1), each between
barriers and timed as a user's solve runs (nothing synchronises the device inside it):
rank 0 prints one ``RESULT`` line a case, with every phase's time on every rank
(``timings_ranks``) and the largest (``timings_max``): setup phases (space, bc,
operator, load, preconditioner), solve, halo and allreduce (the exchanges' and
reductions' host time), error. The fastest repeat is kept. Then one more solve with the
per-phase timers on (``timings="phases"``; ``--no-phases`` leaves it out) gives the
breakdown of the solve (``phases_ranks``, ``phases_max``): apply (operator applications
in CG, halo included), precond_apply (V-cycles; Jacobi is folded into the fused CG),
coarse, cg_other. Those timers synchronise the device around every application, which
stops the host from queueing ahead, so the breakdown's solve is slower than the timed one
and no efficiency comes from it.

``--precond`` takes ``jacobi``, ``pmg`` (the order-1 coarse level gathered to rank 0 and
solved by AMG there, where pyamg is installed) and ``pmg-cg`` (the distributed Jacobi-CG
coarse solve: nothing gathered).

The JSON (``schema: "smalltc-bench-scaling/1"``) holds the device, the rank counts,
every case and the efficiencies; the table is printed; ``scaling-efficiency.png`` plots
the efficiencies against the rank count (skipped with a line when matplotlib is
missing).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from .._arrays import cupy_or_none, gpu_available
from ..fem.distributed import distributed_box_mesh, distributed_kershaw_mesh, load_mpi
from ..fem.distributed.comm import quiet_barrier
from ..fem.distributed.poisson import solve_poisson_distributed
from ..roofline import device_name
from .plots import pyplot_or_say, save_figure
from .poisson import exact_grad, exact_u, source
from .report import environment, load_average, write_json
from .solve import KERSHAW_EPS, kershaw_eps

__all__ = ["SCHEMA", "TOL", "MODES", "plan_cases", "weak_shape", "strong_shape",
           "rank_grid", "find_mpiexec", "efficiencies", "table", "plot", "main", "worker"]

SCHEMA = "smalltc-bench-scaling/1"
#: CG's relative residual target (the poisson suite's)
TOL = 1e-8
MODES = ("weak", "strong")
#: the preconditioners: Jacobi, the p-multigrid (its coarse solve gathered to rank 0 and
#: solved by AMG there where pyamg is installed) and the p-multigrid with the distributed
#: Jacobi-CG coarse solve (no gathering)
PRECONDS = ("jacobi", "pmg", "pmg-cg")
#: DoFs a rank for weak scaling: (GPU, CPU), and with --quick
DOFS = ((2_000_000, 20_000), (200_000, 3_000))
#: the per-phase timings a table shows (the JSON has them all); apply and precond_apply
#: come from the breakdown solve (:data:`PHASE_KEYS`)
PHASES = ("setup", "solve", "apply", "precond_apply", "halo", "allreduce", "error")
#: what only the breakdown solve (``timings="phases"``, synchronised) measures
PHASE_KEYS = ("apply", "precond_apply", "coarse", "cg_other")


def rank_grid(nranks, dim=3):
    """A balanced factorisation of ``nranks`` into ``dim`` factors, largest last.

    Examples
    --------
    >>> rank_grid(1), rank_grid(2), rank_grid(4), rank_grid(8), rank_grid(6)
    ((1, 1, 1), (1, 1, 2), (1, 2, 2), (2, 2, 2), (1, 2, 3))
    """
    best = None
    for a in range(1, nranks + 1):
        if nranks % a:
            continue
        for b in range(a, nranks // a + 1):
            if (nranks // a) % b:
                continue
            c = nranks // (a * b)
            if c < b:
                continue
            g = (a, b, c)
            if best is None or max(g) - min(g) < max(best) - min(best):
                best = g
    return best if dim == 3 else best[3 - dim:]


def _kershaw_fit(shape):
    """Round ``shape`` up to what a Kershaw mesh takes: x a multiple of 6, the rest even."""
    return (6 * math.ceil(shape[0] / 6),) + tuple(2 * math.ceil(k / 2) for k in shape[1:])


def weak_shape(dofs_per_rank, p, nranks, mesh="box"):
    """The mesh (elements per direction) of a weak-scaling case: a ``k^3`` block a rank
    (``(k p)^3`` about ``dofs_per_rank``; a Kershaw mesh's rounded as it needs) times the
    rank grid (:func:`rank_grid`).

    Examples
    --------
    >>> weak_shape(20_000, 2, 1), weak_shape(20_000, 2, 2), weak_shape(20_000, 2, 4)
    ((14, 14, 14), (14, 14, 28), (14, 28, 28))
    >>> weak_shape(20_000, 2, 2, "kershaw")
    (18, 14, 28)
    """
    k = max(1, round(dofs_per_rank ** (1 / 3) / p))
    cell = _kershaw_fit((k, k, k)) if mesh == "kershaw" else (k, k, k)
    return tuple(c * g for c, g in zip(cell, rank_grid(nranks)))


def strong_shape(total_dofs, p, mesh="box"):
    """The mesh of a strong-scaling case: about ``total_dofs`` DoFs, the same on every
    rank count.

    Examples
    --------
    >>> strong_shape(80_000, 2), strong_shape(80_000, 2, "kershaw")
    ((22, 22, 22), (24, 22, 22))
    """
    k = max(1, round(total_dofs ** (1 / 3) / p))
    shape = (k, k, k)
    return _kershaw_fit(shape) if mesh == "kershaw" else shape


def parse_mesh(spec):
    """``--mesh`` for this suite: ``box`` or ``kershaw[:eps]`` -> ``(name, eps or None)``.

    Examples
    --------
    >>> parse_mesh(None), parse_mesh("kershaw:0.5")
    (('box', None), ('kershaw', 0.5))
    """
    name, _, value = (spec or "box").strip().lower().partition(":")
    if name == "box" and not value:
        return "box", None
    if name == "kershaw":
        return "kershaw", kershaw_eps(value, spec)
    raise ValueError(f"the scaling suite's --mesh takes 'box' or 'kershaw[:eps]', got {spec!r}")


def _names(value, allowed, flag, default):
    names = [v.strip() for v in str(value).split(",") if v.strip()] if value else list(default)
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise ValueError(f"{flag} takes {', '.join(allowed)} (comma separated), got {value!r}")
    return names


def plan_cases(ranks, *, p=4, dofs=20_000, total_dofs=None, mesh="box", preconds=("jacobi",),
               modes=MODES):
    """The cases of a run: one per mode, preconditioner and rank count (JSON-able dicts).

    Examples
    --------
    >>> cs = plan_cases([1, 2], p=2, dofs=3000, preconds=["jacobi"])
    >>> [(c["id"], c["shape"], c["dofs"]) for c in cs]
    ... # doctest: +NORMALIZE_WHITESPACE
    [('weak box jacobi p=2 R=1', [7, 7, 7], 3375), ('weak box jacobi p=2 R=2', [7, 7, 14], 6525),
     ('strong box jacobi p=2 R=1', [9, 9, 9], 6859), ('strong box jacobi p=2 R=2', [9, 9, 9], 6859)]
    """
    name, eps = parse_mesh(mesh)
    label = name if eps is None else f"{name}:{eps:g}"
    total = int(total_dofs) if total_dofs else int(dofs) * max(ranks)
    out = []
    for mode in modes:
        for pc in preconds:
            for r in ranks:
                shape = (weak_shape(dofs, p, r, name) if mode == "weak"
                         else strong_shape(total, p, name))
                tiles = rank_grid(r) if mode == "weak" else (1, 1, 1)
                out.append(dict(id=f"{mode} {name} {pc} p={p} R={r}", mode=mode, mesh=label,
                                precond=pc, p=int(p), ranks=int(r), shape=list(shape),
                                tiles=list(tiles),
                                elements=int(np.prod(shape)),
                                dofs=int(np.prod([k * p + 1 for k in shape]))))
    return out


def efficiencies(cases):
    """Add ``efficiency`` (``solve``, ``whole`` and, where the iterations are known,
    ``iteration``: the solve's time an iteration) to every successful case, against the
    smallest rank count of its mode, mesh, preconditioner and order (in place).

    Weak: ``t_ref / t_R``; strong: ``R_ref t_ref / (R t_R)``. A weak-scaling mesh
    grows with the ranks, and so do Jacobi-CG's iterations: ``iteration`` is the
    efficiency of the distributed iteration itself, ``solve`` that of the answer.

    Examples
    --------
    >>> cs = [dict(mode="strong", mesh="box", precond="jacobi", p=2, ranks=r, solve_s=t,
    ...            whole_s=2 * t) for r, t in ((1, 4.0), (2, 2.5))]
    >>> efficiencies(cs)[1]["efficiency"]
    {'solve': 0.8, 'whole': 0.8}
    """
    groups = {}
    for c in cases:
        if c.get("error") is None and c.get("solve_s"):
            groups.setdefault((c["mode"], c["mesh"], c["precond"], c["p"]), []).append(c)
    for group in groups.values():
        ref = min(group, key=lambda c: c["ranks"])
        for c in group:
            eff = {}
            for what in ("solve", "whole", "iteration"):
                if what == "iteration":         # the solve's time an iteration
                    if not (ref.get("iterations") and c.get("iterations")):
                        continue
                    t_ref = ref["solve_s"] / ref["iterations"]
                    t = c["solve_s"] / c["iterations"]
                else:
                    t_ref, t = ref[f"{what}_s"], c[f"{what}_s"]
                if c["mode"] == "weak":
                    eff[what] = t_ref / t
                else:
                    eff[what] = ref["ranks"] * t_ref / (c["ranks"] * t)
            c["efficiency"] = eff
            c["efficiency_reference_ranks"] = ref["ranks"]
    return cases


def find_mpiexec():
    """``[mpiexec, options...]``: the one beside this Python (the ``smalltc[mpi]``
    extra's MPICH), else on ``PATH``; ``SystemExit`` naming what is missing."""
    if importlib.util.find_spec("mpi4py") is None:
        raise SystemExit("smalltc bench --suite scaling: mpi4py is not installed here "
                         f"({sys.executable}): pip install 'smalltc[mpi]' (mpi4py and MPICH)")
    here = Path(sys.executable).parent / "mpiexec"
    exe = str(here) if here.exists() else shutil.which("mpiexec")
    if exe is None:
        raise SystemExit(f"smalltc bench --suite scaling: no mpiexec beside {sys.executable} nor "
                         "on PATH: pip install 'smalltc[mpi]' brings MPICH's, or put the "
                         "mpiexec of the MPI library mpi4py uses on PATH")
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
        text = (version.stdout + version.stderr).lower()
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SystemExit(f"smalltc bench --suite scaling: {exe} does not run ({err})") from None
    if "open mpi" in text or "openrte" in text:
        root = hasattr(os, "geteuid") and os.geteuid() == 0
        return [exe, "--oversubscribe"] + (["--allow-run-as-root"] if root else [])
    return [exe]


def _threads(kind, nranks):
    if kind == "gpu":
        return 1
    return max(1, (os.cpu_count() or 1) // nranks)


def _launch(mpiexec, nranks, spec, kind, on_result):
    """Run the worker over ``nranks`` ranks; ``on_result(dict)`` for every RESULT line.
    Returns ``(returncode, stderr tail)``."""
    threads = _threads(kind, nranks)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               NUMBA_NUM_THREADS=str(threads), SMALLTC_NUM_THREADS=str(threads))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        path = f.name
    cmd = mpiexec + ["-n", str(nranks), sys.executable, "-m", "smalltc.bench.scaling",
                     "worker", path]
    err_path = path + ".err"
    try:
        with open(err_path, "w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                    env=env, start_new_session=True)
            try:
                for line in proc.stdout:
                    if line.startswith("RESULT "):
                        on_result(json.loads(line[7:]))
                proc.wait()
            except BaseException:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
        with open(err_path) as err:
            tail = err.read()[-4000:]
        return proc.returncode, tail
    finally:
        for p in (path, err_path):
            try:
                os.remove(p)
            except OSError:
                pass


def _summary(rec):
    """A finished case in a line: its id, iterations, solve and whole-call seconds."""
    if rec.get("error"):
        return f"{rec['id']}: error: {str(rec['error'])[:200]}"
    return (f"{rec['id']}: {rec['iterations']} iterations, solve {rec['solve_s']:.3g} s, "
            f"whole call {rec['whole_s']:.3g} s, first call {rec['first_call_s']:.3g} s")


def _progress(total, enabled):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
        return tqdm(total=total, unit="case", file=sys.stderr, dynamic_ncols=True)
    except Exception:
        return None


def main(args) -> int:
    """``smalltc bench --suite scaling``: launch the rank counts, write the JSON, print the
    table, draw the plot; exit status 1 when a case failed."""
    kind = args.device or "cpu"
    quick = bool(args.quick)
    ranks = sorted({int(r) for r in str(args.ranks or "1,2").split(",") if r.strip()})
    if not ranks or ranks[0] < 1:
        raise SystemExit(f"smalltc bench: --ranks takes positive rank counts, got {args.ranks!r}")
    ps = [int(v) for v in str(args.p or "4").split(",") if v.strip()]
    dofs = args.ndofs or DOFS[1 if quick else 0][0 if kind == "gpu" else 1]
    try:
        modes = _names(args.scaling, MODES, "--scaling", MODES)
        preconds = _names(args.precond, PRECONDS, "--precond", ("jacobi",))
        todo = [c for p in ps for c in plan_cases(ranks, p=p, dofs=dofs,
                                                  total_dofs=args.total_dofs, mesh=args.mesh,
                                                  preconds=preconds, modes=modes)]
    except ValueError as err:
        raise SystemExit(f"smalltc bench: {err}") from None
    mpiexec = find_mpiexec()
    if kind == "gpu":
        if not gpu_available():
            raise SystemExit("smalltc bench: --device gpu asked for, but no CUDA device answers "
                             "here (see `smalltc info`)")
        ngpus = cupy_or_none().cuda.runtime.getDeviceCount()
        if max(ranks) > ngpus:
            print(f"  warning: {max(ranks)} ranks on {ngpus} GPUs: ranks share GPUs (node-local "
                  "rank modulo the device count), so the efficiencies beyond "
                  f"{ngpus} ranks are not one GPU a rank", file=sys.stderr, flush=True)
    doc = environment(kind, None)
    doc.update(schema=SCHEMA, ranks=ranks, mpiexec=mpiexec,
               options=dict(device=kind, ranks=ranks, p=ps, dofs_per_rank=int(dofs),
                            total_dofs=args.total_dofs, mesh=args.mesh or "box",
                            precond=preconds, scaling=modes, repeats=args.repeats or 1,
                            tol=TOL, quick=quick, dtype="float64",
                            phases=not args.no_phases),
               cases=[], launches=[])
    print(f"smalltc bench --suite scaling: {len(todo)} cases on {device_name(kind)}, ranks "
          f"{','.join(map(str, ranks))}, through {' '.join(mpiexec)}", file=sys.stderr, flush=True)
    bar = _progress(len(todo), not args.no_progress)
    done = {}
    out_dir = args.out or os.path.join("smalltc-bench", doc["device"]["slug"])
    tag = "-".join([kind, "r" + "_".join(map(str, ranks))] + [f"p{p}" for p in ps])
    path = os.path.join(out_dir, f"bench-scaling-{tag}.json")

    def on_result(rec):
        done[rec["id"]] = rec
        # the JSON holds every finished case as it comes (a run stopped midway keeps them)
        doc["cases"] = efficiencies([done[c["id"]] for c in todo if c["id"] in done])
        write_json(path, doc)
        if bar is not None:
            bar.set_description(rec["id"][:40])
            bar.update(1)
        else:
            print(f"[{len(done)}/{len(todo)}] {_summary(rec)}", file=sys.stderr, flush=True)

    for r in ranks:
        mine = [c for c in todo if c["ranks"] == r]
        spec = dict(cases=mine, device=kind, repeats=args.repeats or 1, tol=TOL,
                    phases=not args.no_phases)
        t0 = time.perf_counter()
        rc, tail = _launch(mpiexec, r, spec, kind, on_result)
        doc["launches"].append(dict(ranks=r, returncode=rc, seconds=time.perf_counter() - t0,
                                    threads_per_rank=_threads(kind, r),
                                    stderr_tail=tail if rc else ""))
        for c in mine:
            if c["id"] not in done:
                done[c["id"]] = dict(c, error=f"no result: mpiexec -n {r} exited with status "
                                              f"{rc}: {tail.strip()[-800:]}")
    if bar is not None:
        bar.close()
    doc["cases"] = efficiencies([done[c["id"]] for c in todo])
    doc["load_average_end"] = load_average()
    path = write_json(path, doc)
    table(doc)
    print(f"\nwrote {path}")
    if not args.no_plot:
        plt = pyplot_or_say()
        if plt is not None:
            made = plot(doc, os.path.join(out_dir, f"scaling-efficiency-{tag}.png"), plt)
            print(f"plots: {made}" if made else "plots: none (no case finished)")
    return 1 if any(c.get("error") for c in doc["cases"]) else 0


def table(doc, file=None):
    """One line a case: DoFs, iterations, the largest phase times over the ranks, the
    efficiencies."""
    file = file or sys.stdout
    print(f"\n== scaling ({doc['device']['name']}; seconds, the largest over the ranks; "
          f"eff: weak t1/tR, strong t1/(R tR), of the solve, of its iteration and of the "
          f"whole call) ==",
          file=file)
    head = (f"{'case':34s} {'DoFs':>10s} {'DoF/rank':>9s} {'its':>4s} "
            + " ".join(f"{k[:7]:>7s}" for k in PHASES)
            + f" {'whole':>7s} {'eff':>5s} {'effI':>5s} {'effW':>5s} {'L2 err':>8s}")
    print(head, file=file)
    for c in doc["cases"]:
        if c.get("error"):
            print(f"{c['id']:34s} error: {str(c['error'])[:200]}", file=file)
            continue
        t = dict(c["timings_max"])
        t.update({k: v for k, v in c.get("phases_max", {}).items() if k in PHASE_KEYS})
        eff = c.get("efficiency", {})
        print(f"{c['id']:34s} {c['dofs']:10d} {c['dofs'] / c['ranks']:9.0f} {c['iterations']:4d} "
              + " ".join(f"{t.get(k, float('nan')):7.3g}" for k in PHASES)
              + f" {c['whole_s']:7.3g} {100 * eff.get('solve', float('nan')):4.0f}%"
              f" {100 * eff.get('iteration', float('nan')):4.0f}%"
              f" {100 * eff.get('whole', float('nan')):4.0f}% {c['l2_error']:8.1e}", file=file)
    paths = {c.get("comm_path") for c in doc["cases"] if c.get("comm_path")}
    if paths:
        print("communication: " + "; ".join(sorted(paths)), file=file)


def plot(doc, path, plt):
    """Efficiency (solve solid, whole call dashed) against the rank count, one line per
    mode, mesh, preconditioner and order."""
    groups = {}
    for c in doc["cases"]:
        if "efficiency" in c:
            groups.setdefault((c["mode"], c["mesh"], c["precond"], c["p"]), []).append(c)
    if not groups:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, (key, cs) in enumerate(sorted(groups.items())):
        cs = sorted(cs, key=lambda c: c["ranks"])
        r = [c["ranks"] for c in cs]
        label = f"{key[0]} {key[1]} {key[2]} p={key[3]}"
        ax.plot(r, [100 * c["efficiency"]["solve"] for c in cs], "o-", color=f"C{i}",
                label=label + " (solve)")
        ax.plot(r, [100 * c["efficiency"]["whole"] for c in cs], "s--", color=f"C{i}",
                alpha=0.6, label=label + " (whole call)")
    ax.axhline(100, color="k", lw=0.8, alpha=0.4)
    ax.set_xscale("log", base=2)
    ax.set_xticks(doc["ranks"])
    ax.set_xticklabels([str(r) for r in doc["ranks"]])
    ax.set_xlabel("MPI ranks" + (" (one GPU each)" if doc["device"]["kind"] == "gpu" else ""))
    ax.set_ylabel("parallel efficiency (%)")
    ax.set_ylim(0, max(110, ax.get_ylim()[1]))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"{doc['device']['name']}: distributed Poisson solve, CG to {TOL:g}", fontsize=10)
    return save_figure(fig, path, plt)


# ---------------------------------------------------------------------------- the worker
def _build_mesh(case, comm, shape=None):
    """The case's mesh (or one of the same kind and ``shape``) on the box ``[0, tiles]``,
    a Kershaw mesh's map repeated in every unit cell."""
    name, _, eps = case["mesh"].partition(":")
    shape = tuple(case["shape"]) if shape is None else shape
    tiles = tuple(case.get("tiles", (1, 1, 1)))
    if name == "kershaw":
        return distributed_kershaw_mesh(shape, comm, float(eps or KERSHAW_EPS), tiles=tiles,
                                        upper=tiles)
    return distributed_box_mesh(3, shape, comm, upper=tiles)


def _warmup_shape(case, device):
    """The mesh of the untimed warm-up solve: on a GPU a small one of the same kind (6
    elements a direction of every cell, and the rank count along z with one cell: its
    kernels are the full mesh's, its setup and solve take a fraction of a second); on
    the CPU the case's own (below the small-evaluation threshold a smaller mesh would
    not compile the setup's kernels)."""
    shape = tuple(case["shape"])
    if device != "gpu":
        return shape
    tiles = tuple(case.get("tiles", (1, 1, 1)))
    small = tuple(6 * t for t in tiles) if any(t > 1 for t in tiles) else (6, 6, 6 * case["ranks"])
    return tuple(min(a, b) for a, b in zip(shape, small))


def _solve(case, mesh, device, tol, timings):
    precond, options = case["precond"], None
    if precond == "pmg-cg":              # the p-multigrid with the distributed coarse CG
        precond, options = "pmg", {"coarse": "cg"}
    return solve_poisson_distributed(mesh, case["p"], source, dirichlet=exact_u,
                                     exact=(exact_u, exact_grad), precond=precond,
                                     pmg_options=options, tol=tol, device=device,
                                     timings=timings)


def _timed(case, mesh, comm, device, tol, timings):
    """One solve between barriers on every rank: ``(whole-call seconds, every rank's
    timings on rank 0, the result)``."""
    quiet_barrier(comm)
    t0 = time.perf_counter()
    res = _solve(case, mesh, device, tol, timings)
    comm.Barrier()
    whole = time.perf_counter() - t0
    return whole, comm.gather(dict(res.timings), root=0), res


def _largest(every):
    return {k: max(t[k] for t in every) for k in every[0]}


def _by_rank(every):
    return {k: [t[k] for t in every] for k in every[0]}


def _run_case(case, comm, device, repeats, tol, phases=True):
    """One case on every rank; the record on rank 0 (None elsewhere).

    The timed solves run as a user's does (no timer synchronises the device); with
    ``phases`` one more solve with the per-phase timers on (:data:`PHASE_KEYS`, each
    application synchronised) gives the breakdown, kept apart from the timed figures."""
    rank = comm.Get_rank()
    t0 = time.perf_counter()
    mesh = _build_mesh(case, comm)
    t_mesh = time.perf_counter() - t0
    quiet_barrier(comm)
    t0 = time.perf_counter()
    shape = _warmup_shape(case, device)                   # untimed: kernels, caches
    _solve(case, mesh if shape == tuple(case["shape"]) else _build_mesh(case, comm, shape),
           device, tol, None)
    warm_s = time.perf_counter() - t0
    best = None
    for _ in range(max(1, repeats)):
        whole, every, res = _timed(case, mesh, comm, device, tol, None)
        if rank == 0:
            tmax = _largest(every)
            if best is None or tmax["solve"] < best[1]["solve"]:
                best = (whole, tmax, every, res)
    split = _timed(case, mesh, comm, device, tol, "phases")[1] if phases else None
    if rank != 0:
        return None
    whole, tmax, every, res = best
    d = res.distribution
    rec = dict(case, iterations=int(res.iterations), residual=float(res.residual),
               l2_error=float(res.l2_error), h1_error=float(res.h1_error),
               solve_s=tmax["solve"], whole_s=whole, first_call_s=warm_s, mesh_s=t_mesh,
               timings_max=tmax, timings_ranks=_by_rank(every),
               grid=list(d["grid"]), comm_path=f"{d['comm_path']} ({d['comm_path_reason']})",
               transport=d["transport"], device=res.device, error=None)
    if split is not None:
        rec.update(phases_max=_largest(split), phases_ranks=_by_rank(split))
    return rec


def worker(argv=None) -> int:
    """The per-rank entry point (``python -m smalltc.bench.scaling worker SPEC.json``)."""
    ap = argparse.ArgumentParser(prog="python -m smalltc.bench.scaling")
    ap.add_argument("role", choices=("worker",))
    ap.add_argument("spec")
    args = ap.parse_args(argv)
    with open(args.spec) as f:
        spec = json.load(f)
    MPI = load_mpi()
    comm = MPI.COMM_WORLD
    for case in spec["cases"]:
        try:
            rec = _run_case(case, comm, spec["device"], spec["repeats"], spec["tol"],
                            spec.get("phases", True))
        except Exception as err:         # the fem layer raises on every rank alike
            rec = dict(case, error=f"{type(err).__name__}: {err}",
                       trace=traceback.format_exc(limit=-6)) if comm.Get_rank() == 0 else None
        if rec is not None:
            os.write(1, ("RESULT " + json.dumps(rec, default=float) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(worker())
