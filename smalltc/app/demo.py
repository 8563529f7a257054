"""``smalltc demo``: two FEM problems solved matrix-free, then a roofline report.

1. L2 projection: builds a distorted 3D hex mesh (quadratic element maps),
   L2-projects ``sin(pi x) cos(pi y) exp(z)`` with matrix-free CG and Jacobi
   (the mass action is :func:`smalltc.batched_contract`; order ``--p``, mesh
   ``--n``) and prints the error, the iteration count and the DoFs/s of a CG
   iteration beside its roofline bound (:func:`smalltc.fem.projection_demo`).
2. Poisson: reads the shipped curved quarter-annulus mesh (a gmsh ``.msh``
   file, cubic element maps on the arcs), solves ``-laplace(u) = f`` for the
   manufactured ``u = sin(2x) exp(y)`` at p = 4 with Dirichlet data on the arcs
   and Neumann data on the straight sides, prints the CG iterations, the L2 and
   H1 errors and the L2 convergence rates of p = 1..4 under two uniform
   refinements, and writes ``poisson.vtu`` (for ParaView) with
   ``poisson-solution.png`` and ``poisson-convergence.png``
   (:func:`smalltc.fem.poisson_demo`; with ``--quick``: p = 3, rates of p = 1, 2
   under one refinement).
3. Roofline: times :func:`smalltc.batched_contract` (3D, nq = p+2, p = 1..8) and
   :func:`smalltc.assemble_mass` (3D, p = 1..6) on the best available
   backend, each checked against the float64 einsum reference first, and
   prints element-DoFs/s beside the roofline bound of docs/math.md section 4 (with
   the bandwidth measured at start) and the fraction reached.
4. Writes ``demo.json`` and the plots (when matplotlib is there) into ``--out``.

Sized to finish in well under two minutes on a 2-core CPU, Numba compile
included; ``--quick`` is a smoke test of a few seconds.

``mpiexec -n R smalltc demo --mpi`` runs step 1 distributed over the ``R`` ranks
(:mod:`smalltc.fem.distributed`; on GPUs one per rank, node-local rank modulo the
device count): a first, untimed solve on a small mesh of the same kind compiles the
kernels (the first rank of each node compiles, the others load them from the disk
cache), then the timed one with the per-phase timers on; it prints the communication
path (NCCL, CUDA-aware MPI, staged through host memory, or plain MPI on the CPU, and
why), each rank's elements, DoFs, iterations, error, DoF/s per CG iteration and warm
phase times (setup, solve, operator applications, halo exchanges, reductions), and the
total, writes ``demo-mpi.json``, and skips the Poisson problem and the roofline report.
``--weak N`` gives every rank ``N^3`` elements (the mesh is ``N x N x RN``): the same
command at 1, 2, ... ranks measures weak scaling.
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import threading
import time

import numpy as np

from .. import roofline
from ..aot import precompile
from .._arrays import gpu_available
from ..bench.bp1 import _cg_bound
from ..bench.cases import Case
from ..bench.plots import plot_fem, pyplot_or_say
from ..bench.report import environment, format_rate, rate_unit, write_json
from ..bench.runner import run_case
from ..fem import poisson_demo, projection_demo
from ..fem.distributed import load_mpi
from ..fem.distributed.comm import quiet_barrier
from ..plan import SMALL_JOB
from ..spec import MassApplySpec
from .cli import plain_text

__all__ = ["add_arguments", "run", "timing_cases"]

log = logging.getLogger("smalltc")


def add_arguments(parser):
    parser.add_argument("--backend", default="auto", help="smalltc backend (default auto)")
    parser.add_argument("--device", default=None, choices=("cpu", "gpu"),
                        help="where the timed arrays live (default: the GPU if there is one)")
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed calls per case (default 10, 3 with --quick)")
    parser.add_argument("--out", default="smalltc-demo",
                        help="folder for demo.json, poisson.vtu and the plots (default "
                             "./smalltc-demo)")
    parser.add_argument("--no-plot", action="store_true",
                        help="skip the plots (the roofline's and the Poisson problem's)")
    parser.add_argument("--mpi", action="store_true",
                        help="run the L2 projection distributed over MPI.COMM_WORLD (launch "
                             "with mpiexec -n R; needs pip install 'smalltc[mpi]'); no Poisson "
                             "problem, no roofline report")
    parser.add_argument("--p", type=int, default=None,
                        help="polynomial order of the L2 projection (default 4; 2 with "
                             "--quick); the Poisson problem runs at p = 4 (3 with --quick)")
    parser.add_argument("--n", default=None,
                        help="elements per direction of the L2 projection's mesh: N or N0,N1,N2 "
                             "(default 6 on a CPU, 30 on a GPU; 3 with --quick)")
    parser.add_argument("--weak", type=int, default=None, metavar="N",
                        help="with --mpi: N^3 elements per rank, the mesh N x N x (N * ranks)")
    parser.add_argument("--budget", type=float, default=110.0,
                        help="seconds: cases not started by then are skipped and listed "
                             "(kernels compile once and are cached on disk, so a second "
                             "run gets further; default 110; 0 for no limit)")


def timing_cases(kind, dtype, quick=False):
    """The demo's cases: 3D action p = 1..8 and 3D assembly p = 1..6, nq = p+2."""
    gpu = kind == "gpu"
    # CPU: just beyond a 32 MiB L3, so the DRAM bound applies
    dofs = (2 ** 24 if gpu else 2 ** 20) // (256 if quick else 1)
    asm_bytes = (256 * 2 ** 20 if gpu else 64 * 2 ** 20) // (256 if quick else 1)
    s = 8 if dtype == "float64" else 4
    ps_a = [1, 2, 4] if quick else list(range(1, 9))
    ps_m = [1, 2] if quick else list(range(1, 7))
    note = "" if gpu else "demo sizes (CPU)"
    out = []
    for p in ps_a:
        nd, nq = p + 1, p + 2
        out.append(Case("action", "action", dict(dim=3, p=p, nq=nq, ncomp=1,
                                                 batch=max(8, dofs // nd ** 3)), dtype, note))
    for p in ps_m:
        nd, nq = p + 1, p + 2
        E = max(8, asm_bytes // (s * (nq ** 3 + nd ** 6)))
        out.append(Case("assembly", "assembly", dict(dim=3, p=p, nq=nq, batch=E), dtype, note))
    return out


def _mesh_n(args, kind, nranks=1):
    """Elements per direction of the projection's mesh (an int or a 3-tuple)."""
    if args.weak is not None:
        return (args.weak, args.weak, args.weak * nranks)
    if args.n is not None:
        parts = [int(k) for k in str(args.n).split(",")]
        if len(parts) not in (1, 3) or min(parts) < 1:
            raise SystemExit(f"smalltc demo: --n takes N or N0,N1,N2 (positive), got {args.n!r}")
        return parts[0] if len(parts) == 1 else tuple(parts)
    return 3 if args.quick else (30 if kind == "gpu" else 6)


def _projection(args, kind, comm=None, timings=None, warmup=False):
    """Step 1; returns the fem layer's report (a dict). On a GPU the mesh is large enough
    (1.7M DoFs) for the solve to be measured, not its launches. ``warmup``: the same
    solve on a mesh of :func:`_warmup_n` elements a rank (its kernels, not its answer)."""
    p = args.p if args.p is not None else (2 if args.quick else 4)
    nranks = 1 if comm is None else comm.Get_size()
    n = _mesh_n(args, kind, nranks)
    if warmup:
        n = _warmup_n(n, p, nranks, kind)
    extra = {} if comm is None else {"timings": timings}
    return projection_demo(dim=3, p=p, n=n, distortion=0.05, geom_order=2, backend=args.backend,
                           device=kind, comm=comm, **extra)


def _warmup_n(n, p, nranks, kind):
    """The elements a direction of a warm-up solve's mesh, at most the full mesh's: on a
    GPU 4 a rank; on the CPU a rank's block holding just over :data:`smalltc.plan.SMALL_JOB`
    points (below it the setup's one-shot evaluations run NumPy's reference path, not the
    kernels the full mesh compiles: :func:`smalltc.evaluation_job`)."""
    k = 4
    if not (kind == "gpu" or (kind == "auto" and gpu_available())):
        points = (p + 2) ** 3                               # the projection's nq = p + 2
        k = int(math.ceil((SMALL_JOB / points) ** (1 / 3))) + 1
    full = (n, n, n) if isinstance(n, int) else tuple(n)
    return tuple(min(f, k * (nranks if i == 2 else 1)) for i, f in enumerate(full))


def _poisson(args, kind):
    """Step 1b: the Poisson solve on the shipped curved .msh mesh, its VTU and PNGs (a dict;
    None, said why, when this build has no diffusion operator or meshio is missing)."""
    quick = bool(args.quick)
    try:
        return poisson_demo(args.out, p=3 if quick else 4, ps=(1, 2) if quick else (1, 2, 3, 4),
                            refinements=1 if quick else 2, device=kind, plot=not args.no_plot)
    except (RuntimeError, ImportError) as err:     # no diffusion operator; no meshio
        print(f"  skipped: {err}")
        return None


def _solve_rate(proj, bandwidth, peak):
    """The CG solve's unique DoFs per second per iteration, and its roofline bound (the fused
    operator's traffic plus the fused iteration's vector passes: :mod:`smalltc.bench.bp1`)."""
    spec = MassApplySpec(dim=proj["dim"], nq=proj["nq"], nd=proj["p"] + 1,
                         batch=proj["elements"], dtype="float64", ndofs=proj["dofs"])
    b = roofline.bound(spec, bandwidth=bandwidth, peak=peak)
    bcg = _cg_bound(b, proj["dofs"], 8)
    rate = proj["dofs"] * proj["iterations"] / proj["time_solve_s"]
    return rate, bcg.dofs_per_s


def _compile_report_kernels(kind, args):
    """On the CPU, the roofline report's kernels compile in compile processes (a thread
    waits on them) while the FEM problems run in this process, which compiles theirs: on
    a machine with empty caches the demo waits for both at once, not one after the other.
    The thread is joined before anything is timed (the bandwidth probe, the warm solve,
    the report, which loads the kernels); a build that fails here is built (and its
    error shown) by the report. None where nothing is started."""
    if kind != "cpu" or args.backend not in ("auto", "cpu"):
        return None
    cases = timing_cases(kind, args.dtype, args.quick)

    def build():
        try:
            for op in ("action", "assembly"):
                ps = sorted({c.sizes["p"] for c in cases if c.op == op})
                precompile(ops=[op], p=ps, nq=["p+2"], dims=[3], dtypes=[args.dtype],
                           device="cpu", jobs=2)
        except Exception as err:          # the report builds what is missing itself
            log.info("smalltc demo: the report's kernels were not built ahead (%s)", err)

    worker = threading.Thread(target=build, name="smalltc-demo-precompile", daemon=True)
    worker.start()
    return worker


def run(args) -> int:
    if args.mpi:
        return run_mpi(args)
    if args.weak is not None:
        raise SystemExit("smalltc demo: --weak goes with --mpi")

    t_start = time.perf_counter()
    kind = args.device or ("gpu" if gpu_available() else "cpu")
    if kind == "gpu" and not gpu_available():
        raise SystemExit("smalltc demo: --device gpu asked for, but no CUDA device answers here")
    if kind == "gpu":
        import cupy as xp
    else:
        xp = np
    repeats = args.repeats or (3 if args.quick else 10)
    ahead = _compile_report_kernels(kind, args)

    # 1. the L2 projection
    print("smalltc demo: L2 projection of sin(pi x) cos(pi y) exp(z) on a distorted "
          "3D hex mesh (quadratic element maps), matrix-free CG with Jacobi")
    proj = _projection(args, kind)
    print(f"  p={proj['p']}, {proj['elements']} elements ({proj['n']}^3), {proj['dofs']} DoFs, "
          f"nq={proj['nq']}, on the {proj['device'].upper()}: {proj['iterations']} CG iterations "
          f"to relative residual {proj['residual']:.1e}")
    print(f"  L2 error {proj['l2_error']:.3e} (relative {proj['relative_l2_error']:.3e}); "
          f"setup {proj['time_setup_s']:.2f} s, solve {proj['time_solve_s']:.2f} s")
    # 2. the Poisson problem
    print("smalltc demo: Poisson -laplace(u) = f on a curved quarter-annulus mesh read from a "
          ".msh file (Dirichlet on the arcs, Neumann on the straight sides)")
    poisson = _poisson(args, kind)
    if poisson is not None:
        rates = ", ".join(f"p={q}: {c['rate_l2']:.2f}" for q, c in poisson["convergence"].items()
                          if "rate_l2" in c)
        print(f"  p={poisson['p']}, {poisson['elements']} elements, {poisson['dofs']} DoFs: "
              f"{poisson['iterations']} CG iterations, L2 error {poisson['l2_error']:.2e}, "
              f"H1 error {poisson['h1_error']:.2e}; L2 rates under refinement {rates}")
        print(f"  wrote {poisson['vtu']} (open in ParaView)"
              + "".join(f", {p}" for p in poisson["pngs"]))
    if ahead is not None:               # nothing compiles beside what is timed from here
        ahead.join()
    probes = roofline.probe(kind, dtypes=(args.dtype,))
    bw = probes["bandwidth"]["value"]
    pk = probes["peak"][args.dtype]["value"]
    warm = _projection(args, kind)          # the same solve again, its kernels compiled
    rate, bound = _solve_rate(warm, bw, pk)
    proj.update(cg_dofs_per_s=rate, cg_bound_dofs_per_s=bound,
                time_solve_warm_s=warm["time_solve_s"])
    print(f"  L2 projection solve: {format_rate(rate)} per CG iteration (unique DoFs), bound "
          f"{format_rate(bound)} ({100 * rate / bound:.2g}%: the fused operator's bytes "
          f"and 13 vector passes at {bw * 1e-9:.0f} GB/s; timed on a second solve, "
          f"{warm['time_solve_s']:.3f} s, its kernels compiled by the first, and including "
          f"the final residual)")

    # 3. roofline report
    print(f"\nroofline on {probes['name']}: measured bandwidth {bw * 1e-9:.1f} GB/s "
          f"(copy, read + write), {args.dtype} peak {pk * 1e-9:.1f} GFLOP/s")
    print(f"{'operation':28s} {'E':>8s} {'element DoFs/s':>14s} {'bound':>12s} "
          f"{'%bound':>7s} {'first call':>10s}  kernel")
    records, skipped = [], []
    for case in timing_cases(kind, args.dtype, args.quick):
        if args.budget and time.perf_counter() - t_start > args.budget:
            skipped.append(case)
            continue
        rec = run_case(case, dict(bandwidth=bw, peak=pk), xp=xp, backend=args.backend,
                       repeats=repeats, warmup=1, with_baselines=False)
        records.append(rec)
        name = ("batched_contract" if case.op == "action" else "assemble_mass") + \
            f" p={case.sizes['p']} nq={case.sizes['nq']}"
        st = rec["impls"].get("smalltc", {})
        bound = format_rate(rec["bound"]["dofs_per_s"])
        if st.get("status") == "ok":
            print(f"{name:28s} {case.batch:8d} {format_rate(st['dofs_per_s']):>14s} "
                  f"{bound:>12s} {100 * st['fraction']:6.1f}% {st['first_call_s']:9.2f}s  "
                  f"{st.get('backend', '?')}: {str(st.get('kernel', '?'))[:40]}")
        else:
            err = rec.get("error") or st.get("error", "?")
            print(f"{name:28s} {case.batch:8d} {'FAILED':>14s} {bound:>12s}  {err}")

    if skipped:
        print(f"skipped (time budget of {args.budget:.0f} s spent, mostly compiling kernels; "
              "they are cached now, run again): "
              + ", ".join(f"{c.op} p={c.sizes['p']}" for c in skipped))

    # 4. record and plots
    doc = environment(kind, probes)
    doc["options"] = dict(backend=args.backend, dtype=args.dtype, repeats=repeats,
                          quick=bool(args.quick), demo=True)
    doc["projection"] = proj
    if poisson is not None:
        doc["poisson"] = {k: v for k, v in poisson.items() if k != "convergence"}
        doc["poisson"]["convergence"] = {str(k): v for k, v in poisson["convergence"].items()}
    doc["cases"] = records
    doc["skipped_for_time"] = [c.id for c in skipped]
    path = write_json(os.path.join(args.out, "demo.json"), doc)
    print(f"\nwrote {path}")
    if not args.no_plot:
        plt = pyplot_or_say()
        if plt is not None:
            p = plot_fem(doc, os.path.join(args.out, f"demo-dofs-{args.dtype}.png"), plt)
            print(f"plot: {p}")
    print(f"demo done in {time.perf_counter() - t_start:.1f} s")
    bad = [r for r in records if r.get("error") or
           r["impls"].get("smalltc", {}).get("status") != "ok"]
    return 1 if bad else 0


def run_mpi(args) -> int:
    """``smalltc demo --mpi``: the projection over MPI.COMM_WORLD; rank 0 prints and writes."""
    try:
        MPI = load_mpi()
    except RuntimeError as err:
        _stderr(f"smalltc demo --mpi: {err}")
        return 2
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    kind = args.device or "auto"
    try:
        first = _projection(args, kind, comm, warmup=True)   # untimed: the kernels compiled
        quiet_barrier(comm)
        rec = _projection(args, kind, comm, timings="phases")
        rec["first_call_s"] = first["time_total_s"]
    except (ValueError, TypeError, RuntimeError) as err:   # the fem layer raises these on every rank
        _stderr(f"smalltc demo --mpi: rank {rank} of {size}: {type(err).__name__}: {err}")
        return 1
    except BaseException as err:                          # unforeseen: do not leave ranks waiting
        _stderr(f"smalltc demo --mpi: rank {rank} of {size}: {type(err).__name__}: {err}; "
                "aborting every rank")
        comm.Abort(1)
    every = comm.gather(rec, root=0)
    if rank != 0:
        return 0
    _print_mpi(every)
    doc = {"schema": "smalltc-demo-mpi/1", "command": " ".join(sys.argv),
           "mpi": MPI.Get_library_version().splitlines()[0].strip(), "ranks": every}
    path = write_json(os.path.join(args.out, "demo-mpi.json"), doc)
    print(f"wrote {path}")
    return 0


def _stderr(line):
    """One line to stderr in one write (the ranks' lines do not interleave)."""
    os.write(2, (line + "\n").encode())


def _print_mpi(every):
    """The per-rank table and the total of a distributed projection (rank 0)."""
    r0 = every[0]
    n = " x ".join(map(str, [r0["n"]] * 3 if isinstance(r0["n"], int) else r0["n"]))
    on = "GPU" if r0["device"] == "gpu" else "CPU"
    print(f"smalltc demo --mpi: L2 projection of sin(pi x) cos(pi y) exp(z) on a distorted 3D "
          f"hex mesh ({n} elements, quadratic maps), p={r0['p']}, {r0['dofs']:,} DoFs, over "
          f"{r0['ranks']} ranks (grid {' x '.join(map(str, r0['grid']))}) on the {on}: fused "
          f"matrix-free operator, CG with Jacobi")
    print(f"  communication: {r0['comm_path']} ({r0['comm_path_reason']}); halo buffers: "
          f"{r0['transport']}")
    print(f"  kernels compiled by a first, untimed solve on a small mesh "
          f"({r0['first_call_s']:.2f} s on rank 0); the times below are the second solve's, "
          "per rank, with its phases timed")
    ulabel, uscale = rate_unit([r["rank_dofs_per_s"] for r in every])
    print(f"  {'rank':>4s} {'gpu':>3s} {'elements':>9s} {'local DoFs':>11s} {'owned DoFs':>11s} "
          f"{'iters':>5s} {'L2 error':>9s} {'setup s':>8s} {'solve s':>8s} {ulabel + '/it':>9s} "
          f"{'apply s':>8s} {'halo s':>7s} {'(wait)':>7s} {'allred s':>8s} {'other s':>8s}")
    for r in every:
        gpu = "-" if r["gpu"] is None else str(r["gpu"])
        ph = r["phases_s"]
        print(f"  {r['rank']:4d} {gpu:>3s} {r['local_elements']:9d} {r['local_dofs']:11,d} "
              f"{r['owned_dofs']:11,d} {r['iterations']:5d} {r['l2_error']:9.3e} "
              f"{r['time_setup_s']:8.3f} {r['time_solve_s']:8.3f} "
              f"{r['rank_dofs_per_s'] * uscale:9.3g} {ph['apply']:8.3f} "
              f"{r['time_halo_s']:7.3f} {r['time_halo_wait_s']:7.3f} {r['time_allreduce_s']:8.3f} "
              f"{ph['cg_other']:8.3f}")
    solve = max(r["time_solve_s"] for r in every)
    rate = r0["dofs"] * r0["iterations"] / solve
    print(f"  all: {r0['iterations']} CG iterations to relative residual {r0['residual']:.1e}, "
          f"L2 error {r0['l2_error']:.3e} (relative {r0['relative_l2_error']:.3e}); solve "
          f"{solve:.3f} s: {format_rate(rate)} per CG iteration, "
          f"{format_rate(rate / len(every))} per rank")


if __name__ == "__main__":  # pragma: no cover
    ap = argparse.ArgumentParser(prog="smalltc demo", description=plain_text(__doc__),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    sys.exit(run(ap.parse_args()))
