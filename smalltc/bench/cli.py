"""``smalltc bench``: suites against the roofline bound and the baselines.

Examples of use::

    smalltc bench                               # all suites, best backend, float64
    smalltc bench --suite gemm --sizes 2,4,8,16,32 --repeats 30
    smalltc bench --suite action --p 1,2,3 --dtype float32 --quick
    smalltc bench --compare A/bench-float64.json B/bench-float64.json.gz
    smalltc bench --suite gemm; smalltc bench --suite action   # e.g. under a time limit,
    smalltc bench --merge X/bench-gemm-float64.json X/bench-action-float64.json
    smalltc bench --suite poisson --p 4 --mesh kershaw --precond pmg   # a Poisson solve by phase
    smalltc bench --suite basis --p 1-8        # smalltc.interpolate / integrate
    smalltc bench --suite geometry --p 1-8     # smalltc.geometry_data
    smalltc bench --suite scaling --ranks 1,2,4   # the distributed Poisson solve under mpiexec

A full run writes ``bench-<dtype>.json``; a run of some suites or with
filters ``bench-<suite>[+<suite>][-n..][-p..][-dim..]-<dtype>.json`` (and
plots named alike), so runs split across several commands do not overwrite
each other; ``--merge`` joins them
into ``bench-<dtype>.json`` with its table and plots.
"""
from __future__ import annotations

import os
import re
import sys

import numpy as np

from .. import roofline
from .._arrays import gpu_available
from .basis import run_case as run_basis
from .baselines import skipped
from .bp1 import run_case as run_bp1
from .cases import footprint as case_bytes
from .compare import compare_files
from .force import run_case as run_force
from .geometry import run_case as run_geometry
from .plots import plot_all
from .poisson import run_case as run_poisson
from .report import environment, load, load_average, table, write_json
from .runner import run_case
from .solve import run_case as run_solve
from .suites import BP_SUITES, DEFAULT_SUITES, SUITES, cases

__all__ = ["add_arguments", "run", "main_run"]


def add_arguments(parser):
    parser.add_argument("--backend", default="auto",
                        help="smalltc backend to time: auto, cpu, cuda, reference (default auto)")
    parser.add_argument("--method", default="auto", choices=("auto", "fused", "pairwise"),
                        help="action/assembly path (default auto)")
    parser.add_argument("--device", default=None, choices=("cpu", "gpu"),
                        help="arrays on the host (NumPy) or the GPU (CuPy); default: the GPU "
                             "when there is one (or what --backend implies)")
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    parser.add_argument("--suite", action="append", default=None,
                        help="gemm, action, assembly, pairwise, bp1, bp3, bp5, solve, force, "
                             "poisson, basis, geometry, scaling (repeatable; default: the four "
                             "kernel suites; scaling: weak and strong scaling of the "
                             "distributed Poisson solve over --ranks, launched with mpiexec, "
                             "run on its own; "
                             "bp1, bp3, bp5 are the CEED bake-off problems: the FEM operators "
                             "and CG; solve: Jacobi-CG, Chebyshev and p-multigrid solves; "
                             "force: BLAST's corner force F and F^T; poisson: a user's "
                             "Poisson solve from mesh to VTU, phase by phase, cold and warm, "
                             "with the peak memory; basis: smalltc.interpolate and "
                             "smalltc.integrate against the bound, the reference path and the "
                             "einsum chain; geometry: smalltc.geometry_data against the bound, "
                             "the reference path and linalg)")
    parser.add_argument("--sizes", default=None,
                        help="square GEMM sizes n, comma separated; add 'rect' to keep the "
                             "rectangular cases (default: n = 2..32 and rectangular)")
    parser.add_argument("--p", default=None, help="polynomial orders, e.g. 1,2,3 or 1-4")
    parser.add_argument("--dim", default=None, help="dimensions for action/assembly, e.g. 3")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed calls per implementation (median reported; default 20, "
                             "5 with --quick)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first (default 2)")
    parser.add_argument("--footprint", type=float, default=None, metavar="MIB",
                        help="CPU: bytes each case moves, in MiB, instead of the default "
                             "sizes (which a large last-level cache can hold: then the "
                             "bandwidth bound does not apply and the bench says so), "
                             "e.g. --footprint 1024")
    parser.add_argument("--quick", action="store_true",
                        help="few sizes, small batches, 5 repeats: a smoke test")
    parser.add_argument("--threads", type=int, default=None,
                        help="Numba threads for the cpu backend (numba.set_num_threads; "
                             "default: all cores)")
    parser.add_argument("--point-data", default=None, metavar="FORMS",
                        help="bp1, bp3, bp5: also time the apply with less point data, each "
                             "against its own bound (docs/math.md section 8): 'float32' (D/Q "
                             "stored in float32, float64 vectors), 'vertices' (the geometry "
                             "recomputed in the kernel from the element vertices); comma "
                             "separated, e.g. float32,vertices (float64 runs only)")
    parser.add_argument("--qfunc", default=None, metavar="FORMS",
                        help="assembly suite: the element matrices of these operators, comma "
                             "separated: mass (the default), diffusion, helmholtz, and "
                             "diffusion+co, helmholtz+co (collocated, nq = p+1)")
    parser.add_argument("--no-baselines", action="store_true", help="time smalltc only")
    parser.add_argument("--out", default=None,
                        help="folder for the JSON and PNGs (default smalltc-bench/<device-slug> in the "
                             "current folder; the repository's benchmarks/ only when named)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG plots")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), default=None,
                        help="print per-case speed-ups of run B over run A and exit")
    parser.add_argument("--merge", nargs="+", metavar="RUN.json", default=None,
                        help="join runs of one device and dtype (e.g. one suite each) into "
                             "bench-<dtype>.json in --out (default: the first file's folder), "
                             "print the table, redo the plots, and exit")
    parser.add_argument("--ndofs", type=int, default=None,
                        help="solve and poisson suites: about this many DoFs per case "
                             "(default: solve 2M on a GPU, 60k on a CPU; poisson 2M, 200k); "
                             "scaling suite: DoFs a rank for weak scaling (default 2M on GPUs, "
                             "20k on a CPU), and strong scaling solves this times the largest "
                             "rank count in total unless --total-dofs")
    parser.add_argument("--mesh", default=None, metavar="SPEC",
                        help="solve suite: 'kershaw[:eps]' (the default: the CEED benchmarks' "
                             "Kershaw mesh, eps 0.3) or 'sine[:amplitude]' (the mild sine "
                             "distortion, 0.08); poisson suite: 'box', 'kershaw[:eps]' or "
                             "both comma separated (the default); scaling suite: 'box' (the "
                             "default) or 'kershaw[:eps]'")
    parser.add_argument("--precond", default=None, metavar="LIST",
                        help="poisson suite: the preconditioners, comma separated: jacobi, "
                             "pmg (default both; pmg needs pyamg); scaling suite: the same "
                             "and pmg-cg (the p-multigrid with the distributed Jacobi-CG "
                             "coarse solve; default jacobi)")
    parser.add_argument("--pmg-smoother", default=None, choices=("fourth", "first", "fourth-opt"),
                        help="solve suite: the p-multigrid's Chebyshev kind (default: "
                             "fem.pmg's, fourth)")
    parser.add_argument("--pmg-relaxation", default=None, choices=("jacobi", "schwarz"),
                        help="solve suite: what the p-multigrid's Chebyshev smoother "
                             "accelerates: point Jacobi or overlapping Schwarz with FDM local "
                             "solves (default: fem.pmg's, jacobi)")
    parser.add_argument("--pmg-degree", default=None, metavar="K[,K..]",
                        help="solve suite: the p-multigrid's Chebyshev degree, one or one per "
                             "level finest first; 'p' is the case's order, at least 3 (e.g. "
                             "'p,3': degree p on the finest level, 3 below; default: fem.pmg's)")
    parser.add_argument("--variants", default=None, metavar="LIST",
                        help="force suite, CUDA: also time the kernels with forced parameters, "
                             "each variant as implementations 'smalltc:NAME' and 'fused:NAME' "
                             "beside the heuristic's: 'all' (every named variant: line, "
                             "line-apre0, line-apre1, line-mb1, shared, shared-warp), names, "
                             "or parameter sets such as 'line=1,per_block=2'; ';' between "
                             "variants, e.g. --variants 'line;shared;line=1,apre=0'")
    parser.add_argument("--profile", action="store_true",
                        help="solve suite: break one p-multigrid V-cycle's time down per level "
                             "and part (smoothing, residuals, transfers, coarse solve; CUDA "
                             "events around each part on a GPU, only in this mode) into the "
                             "JSON and the table")
    parser.add_argument("--ranks", default=None, metavar="R[,R..]",
                        help="scaling suite: the MPI rank counts, one mpiexec launch each "
                             "(default 1,2; one GPU a rank with --device gpu)")
    parser.add_argument("--total-dofs", type=int, default=None,
                        help="scaling suite: the strong-scaling problem's DoFs")
    parser.add_argument("--scaling", default=None, metavar="weak,strong",
                        help="scaling suite: weak, strong or both (default both)")
    parser.add_argument("--no-phases", action="store_true",
                        help="scaling suite: leave out the extra solve with per-phase timers "
                             "(each application synchronised) that breaks a case's solve down")
    parser.add_argument("--impl", default="smalltc",
                        help="with --compare: the implementation to compare (default smalltc)")


def _ints(text):
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def _sizes(text):
    if text is None:
        return None
    out = []
    for part in text.split(","):
        part = part.strip()
        if part == "rect":
            out.append("rect")
        elif part:
            out.extend(_ints(part))
    return out


def _progress(items, enabled):
    items = list(items)
    if not enabled:
        return items
    try:                 # here: without tqdm (a broken install) the fallback prints lines
        from tqdm import tqdm
        return tqdm(items, unit="case", file=sys.stderr, dynamic_ncols=True)
    except Exception:
        return _SimpleProgress(items)


class _SimpleProgress:
    """Fallback when tqdm is missing: one line per case on stderr."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        n = len(self.items)
        for i, item in enumerate(self.items, 1):
            print(f"[{i}/{n}] {getattr(item, 'id', item)}", file=sys.stderr, flush=True)
            yield item

    def set_description(self, text):
        pass


def _set_threads(n):
    """Set (when asked) and return the Numba thread count, or None without Numba.

    The CPU backend is imported first: its import sets ``OMP_WAIT_POLICY=passive``
    (:mod:`smalltc.backends.cpu.threads`), which OpenMP reads once, when Numba's thread
    pool starts, as ``numba.get_num_threads`` does here; started before it, the workers
    spin between parallel regions and on a busy host each region can wait a scheduler
    time slice (a Jacobi-CG solve 10-50x slower, load ~6 on 2 cores)."""
    try:
        from ..backends import cpu  # noqa: F401  optional (Numba): its wait policy first
        import numba
    except Exception:
        return None
    if n:
        numba.set_num_threads(n)
    return numba.get_num_threads()


def _numba_state():
    """Numba's thread count and threading layer (after the run: the layer is chosen lazily)."""
    try:
        import numba
    except Exception:
        return None
    state = {"threads": numba.get_num_threads(),
             "NUMBA_THREADING_LAYER": os.environ.get("NUMBA_THREADING_LAYER")}
    try:
        state["threading_layer"] = numba.threading_layer()
    except ValueError:            # no parallel function has run yet
        state["threading_layer"] = None
    return state


def _kind(args):
    if args.device:
        return args.device
    if args.backend == "cuda":
        return "gpu"
    if args.backend == "cpu":
        return "cpu"
    return "gpu" if gpu_available() else "cpu"


def main_run(args) -> dict:
    """Run the suites of ``args``; return the JSON document (also written)."""
    kind = _kind(args)
    threads = _set_threads(args.threads)
    if kind == "gpu" and not gpu_available():
        raise SystemExit("smalltc bench: --device gpu / --backend cuda asked for, but no CUDA "
                         "device answers here (see `smalltc info`)")
    if kind == "gpu":
        import cupy as xp
    else:
        xp = np
    quick = bool(args.quick)
    repeats = args.repeats or (5 if quick else 20)
    suites = args.suite or list(DEFAULT_SUITES)
    for s in suites:
        if s not in SUITES:
            raise SystemExit(f"smalltc bench: unknown suite {s!r}; known: {', '.join(SUITES)}")
    ps = _ints(args.p) if args.p else None
    dims = _ints(args.dim) if args.dim else None
    footprint = None if args.footprint is None else int(args.footprint * 2 ** 20)
    todo = [c for s in suites for c in cases(s, args.dtype, kind, sizes=_sizes(args.sizes),
                                             ps=ps, dims=dims, quick=quick,
                                             footprint=footprint,
                                             ndofs=getattr(args, "ndofs", None),
                                             mesh=getattr(args, "mesh", None),
                                             qfuncs=_names(getattr(args, "qfunc", None)),
                                             preconds=_names(getattr(args, "precond",
                                                                     None)))]
    print(f"smalltc bench: {len(todo)} cases on {roofline.device_name(kind)} ({args.dtype}, "
          f"backend {args.backend}, {repeats} repeats); measuring bandwidth and peak ...",
          file=sys.stderr, flush=True)
    load = load_average()
    if kind == "cpu" and load and load[0] > 0.5 * (os.cpu_count() or 1):
        print(f"  warning: load average {load[0]:.1f} on {os.cpu_count()} cores: other work "
              "will skew CPU timings (recorded in the JSON)", file=sys.stderr, flush=True)
    probes = roofline.probe(kind, dtypes=(args.dtype,))
    bound_args = dict(bandwidth=probes["bandwidth"]["value"],
                      peak=probes["peak"][args.dtype]["value"])
    print(f"  bandwidth {bound_args['bandwidth'] * 1e-9:.1f} GB/s, {args.dtype} peak "
          f"{bound_args['peak'] * 1e-9:.1f} GFLOP/s", file=sys.stderr, flush=True)
    doc = environment(kind, probes)
    doc["options"] = dict(backend=args.backend, method=args.method, dtype=args.dtype,
                          suites=suites, sizes=args.sizes, p=args.p, dim=args.dim,
                          qfunc=getattr(args, "qfunc", None),
                          repeats=repeats, warmup=args.warmup, quick=quick, threads=threads,
                          baselines=not args.no_baselines, footprint_mib=args.footprint,
                          point_data=list(_point_data_forms(getattr(args, "point_data", None))),
                          mesh=getattr(args, "mesh", None), pmg=_pmg_options(args),
                          precond=getattr(args, "precond", None))
    _warn_in_cache(kind, todo, doc)
    doc["equivalent_command"] = _equivalent_command(args)
    doc["cases"] = []
    bar = _progress(todo, not args.no_progress)
    for case in bar:
        if hasattr(bar, "set_description"):
            bar.set_description(case.id[:40])
        if case.op in BP_SUITES:
            doc["cases"].append(run_bp1(case, bound_args, xp=xp, backend=args.backend,
                                        repeats=repeats, warmup=args.warmup,
                                        point_data=_point_data_forms(
                                            getattr(args, "point_data", None))))
            continue
        if case.op == "force":
            doc["cases"].append(run_force(case, bound_args, xp=xp, backend=args.backend,
                                          repeats=repeats, warmup=args.warmup,
                                          variants=getattr(args, "variants", None)))
            continue
        if case.op == "poisson":
            doc["cases"].append(run_poisson(case, xp=xp))
            continue
        if case.op == "basis":
            doc["cases"].append(run_basis(case, bound_args, xp=xp, backend=args.backend,
                                          repeats=repeats, warmup=args.warmup))
            continue
        if case.op == "geometry":
            doc["cases"].append(run_geometry(case, bound_args, xp=xp, backend=args.backend,
                                             repeats=repeats, warmup=args.warmup))
            continue
        if case.op == "solve":
            doc["cases"].append(run_solve(case, xp=xp, repeats=1 if kind == "cpu" or quick
                                          else 3, profile=getattr(args, "profile", False),
                                          pmg_options=_pmg_options(args)))
            continue
        doc["cases"].append(run_case(case, bound_args, xp=xp, backend=args.backend,
                                     method=args.method, repeats=repeats, warmup=args.warmup,
                                     with_baselines=not args.no_baselines))
    doc["skipped_baselines"] = skipped()
    doc["load_average_end"] = load_average()
    doc["numba"] = _numba_state()
    out_dir = args.out or os.path.join("smalltc-bench", doc["device"]["slug"])
    tag = _tag(args, suites, DEFAULT_SUITES)
    _finish(doc, out_dir, tag, plot=not args.no_plot)
    return doc


def _point_data_forms(value):
    """``--point-data``'s forms as a tuple (empty when not given); ValueError for others."""
    if not value:
        return ()
    forms = tuple(f.strip() for f in str(value).split(",") if f.strip())
    bad = [f for f in forms if f not in ("float32", "vertices")]
    if bad:
        raise ValueError(f"--point-data takes 'float32' and 'vertices', got {', '.join(bad)}")
    return forms


def _pmg_options(args) -> dict:
    """``--pmg-smoother``, ``--pmg-relaxation`` and ``--pmg-degree`` as keyword arguments
    of ``fem.pmg``."""
    out = {}
    if getattr(args, "pmg_smoother", None):
        out["smoother"] = args.pmg_smoother
    if getattr(args, "pmg_relaxation", None):
        out["relaxation"] = args.pmg_relaxation
    if getattr(args, "pmg_degree", None):
        d = [t.strip() if t.strip() == "p" else int(t) for t in
             str(args.pmg_degree).split(",") if t.strip()]
        out["degree"] = d[0] if len(d) == 1 else d
    return out


def _names(value):
    """A list option's names (``--precond``, ``--qfunc``: comma separated) as a tuple, or
    None where not given (the suite's default: both preconditioners, the mass matrices).

    >>> _names("jacobi, pmg"), _names(None)
    (('jacobi', 'pmg'), None)
    """
    if not value:
        return None
    return tuple(f.strip() for f in str(value).split(",") if f.strip())


def _tag(args, suites, all_suites) -> str:
    """File-name prefix of a partial run: its suites and filters (empty for a full run)."""
    parts = [] if set(suites) == set(all_suites) else ["+".join(suites)]
    for flag, value in (("n", args.sizes), ("p", args.p), ("dim", args.dim),
                        ("mesh", getattr(args, "mesh", None)),
                        ("sm", getattr(args, "pmg_smoother", None)),
                        ("rx", getattr(args, "pmg_relaxation", None)),
                        ("deg", getattr(args, "pmg_degree", None)),
                        ("q", getattr(args, "qfunc", None)),
                        ("pc", getattr(args, "precond", None))):
        if value:
            parts.append(flag + re.sub(r"[^0-9a-z]+", "_", str(value).lower()).strip("_"))
    return "-".join(parts) + "-" if parts else ""


def _finish(doc, out_dir, tag, plot=True):
    """Write the JSON, print the table, draw the plots."""
    path = write_json(os.path.join(out_dir, f"bench-{tag}{doc['options']['dtype']}.json"), doc)
    table(doc)
    print(f"\nwrote {path}")
    if plot:
        made = plot_all(doc, out_dir, prefix=tag)
        if made:
            print("plots: " + ", ".join(made))
        else:
            print("plots: skipped (matplotlib not importable)")


def merge(paths, out_dir=None, plot=True) -> dict:
    """Join bench runs of one device and dtype; later runs win for a repeated case id."""
    docs = [load(p) for p in paths]
    first = docs[0]
    for p, d in zip(paths, docs):
        same = (d["device"]["name"] == first["device"]["name"]
                and d["options"]["dtype"] == first["options"]["dtype"])
        if not same:
            raise ValueError(f"{p}: {d['device']['name']} {d['options']['dtype']} does not match "
                             f"{paths[0]}: {first['device']['name']} {first['options']['dtype']}")
    doc = dict(first)
    cases = {}
    for d in docs:
        for c in d["cases"]:
            cases[c["id"]] = c
    doc["cases"] = list(cases.values())
    doc["merged_from"] = [dict(path=os.path.abspath(p), date=d["date"], command=d["command"],
                               equivalent_command=d.get("equivalent_command"),
                               probes=d["probes"]) for p, d in zip(paths, docs)]
    doc["options"] = dict(first["options"],
                          suites=list(dict.fromkeys(s for d in docs for s in d["options"]["suites"])))
    _finish(doc, out_dir or os.path.dirname(os.path.abspath(paths[0])), "", plot=plot)
    return doc


def _warn_in_cache(kind, todo, doc):
    """On a CPU: say when cases fit in the last-level cache (their fraction of the DRAM
    copy bound can then exceed 1) and record it in the JSON (``in_cache_cases``)."""
    if kind != "cpu":
        return
    llc = _llc_bytes(doc["device"].get("properties", {}).get("l3"))
    if not llc:
        return
    small = [c.id for c in todo if c.op not in BP_SUITES + ("solve", "force", "poisson")
             and case_bytes(c) < llc]
    doc["in_cache_cases"] = dict(llc_bytes=llc, cases=len(small))
    if small:
        print(f"  note: {len(small)} of {len(todo)} cases fit in the {llc >> 20} MiB last-level "
              "cache: their fraction of the bandwidth bound (a DRAM copy) can exceed 100%; "
              f"--footprint {2 * (llc >> 20)} sizes them beyond it", file=sys.stderr, flush=True)


def _llc_bytes(text):
    """'480M' / '32768K' / '1048576' (sysfs cache size) -> bytes, None if unreadable."""
    if not text:
        return None
    text = str(text).strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    try:
        return int(float(text.rstrip("KMG")) * mult)
    except ValueError:
        return None


def _equivalent_command(args) -> str:
    """A ``smalltc bench`` command line that redoes this run (from the parsed options)."""
    parts = ["smalltc", "bench"]
    for key, value in sorted(vars(args).items()):
        if key in ("command", "verbose", "compare", "impl", "func") or value in (None, False):
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif isinstance(value, list):
            parts += [x for v in value for x in (flag, str(v))]
        elif not (key == "warmup" and value == 2) and not (key in ("backend", "method")
                                                            and value == "auto"):
            parts += [flag, str(value)]
    return " ".join(parts)


def run(args) -> int:
    if args.compare:
        return compare_files(*args.compare, impl=args.impl)
    if args.merge:
        merge(args.merge, args.out, plot=not args.no_plot)
        return 0
    if "scaling" in (args.suite or []):
        if args.suite != ["scaling"]:
            raise SystemExit("smalltc bench: --suite scaling runs on its own (it launches "
                             "mpiexec once per rank count); give it alone")
        from .scaling import main as run_scaling  # loaded when the suite runs (the MPI layer)
        return run_scaling(args)
    doc = main_run(args)
    bad = [c for c in doc["cases"] if c.get("error") or any(
        r.get("status") == "failed" for r in c["impls"].values())]
    return 1 if bad else 0
