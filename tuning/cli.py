"""``smalltc tune``: search kernel variants on this GPU and write its lookup table.

Examples (one H100/H200, or ``--device cpu``; each command stops cleanly at its
budget and ``--resume`` continues it)::

    smalltc tune --op gemm --dtype float64 --budget-seconds 480 --resume
    smalltc tune --op action --dtype float64 --sizes 3:1-8:p+1,p+2 --resume --plot
    smalltc tune --op assembly --dtype float32 --dry-run --out /tmp/t   # no GPU: made-up times
    smalltc tune --op gemm --dtype float32 --reconfirm   # re-time the best few in every form
    smalltc tune --device cpu --op action --sizes 3:1-8:p+2 --resume   # cpu-<isa>-float64.json
    smalltc tune --op mass_apply --sizes 3:1-8:p+2:diffusion 3:1-8:p+1:diffusion+co --resume

Exit status: 0 when every size is done (the table is written), 3 when the
budget ran out first (the checkpoint holds the work; run again with
``--resume``), 2 on bad arguments.
"""
from __future__ import annotations

import pathlib
import re
import shutil
import sys

from smalltc.tables import shipped_dir

from . import tables as T
from .measure import FOOTPRINT, DryRunDevice, GpuDevice, sized
from .plot import pick_size, plot_search
from .search import Search
from .sizes import DEFAULT_SIZES, OPS, parse
from .space import MAX_LOCAL_BYTES

__all__ = ["add_arguments", "run"]

EXIT_BUDGET = 3


def add_arguments(parser):
    parser.add_argument("--device", default="gpu", choices=("gpu", "cpu"),
                        help="tune the CUDA backend on this GPU (default) or the CPU backend "
                             "on this CPU (its ISA's table, cpu-avx512-float64.json; "
                             "compiled for Numba's target, NUMBA_CPU_NAME to choose another)")
    parser.add_argument("--op", required=True, choices=OPS,
                        help="what to tune (pairwise: the reshaped kernels of the "
                             "catalogue's steps)")
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    parser.add_argument("--sizes", nargs="+", metavar="TOKEN",
                        help="sizes to tune; gemm: 8, 2-32, 4x8x3, 8:nt+sb+beta; action/"
                             "mass_apply: DIM:P:NQ[:cNCOMP][:FORM], assembly: "
                             "DIM:P:NQ[:FORM], such as 3:1-8:p+1,p+2 or "
                             "3:1-8:p+1:diffusion+co (FORM: mass, diffusion or helmholtz, "
                             "+co collocated, +q32 float32 point data, +vx the vertex "
                             "geometry); pairwise: "
                             "action:DIM:P:NQ; basis: DIM:P:NQ[:cNCOMP][:WHAT] (WHAT: values, "
                             "gradients or both, +t the transpose, +m through a map) (default: "
                             + "; ".join(f"{k}: {' '.join(v)}" for k, v in DEFAULT_SIZES.items())
                             + ")")
    parser.add_argument("--budget-seconds", type=float, default=None, metavar="N",
                        help="stop cleanly after N seconds (checkpoint written; --resume goes on)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="where the table goes (default: the package's tuning/tables; "
                             "for --dry-run: --work)")
    parser.add_argument("--evidence", default=None, metavar="DIR",
                        help="where the search's evidence of the table goes (every entry's "
                             "time, runner-up and heuristic, the runs; <table>.json.gz): "
                             "default benchmarks/tuning of the source tree for the package's "
                             "tables, else <out>/evidence")
    parser.add_argument("--arch-table", action="store_true",
                        help="write the architecture's table (sm90-float64.json, read by every "
                             "device of it after its own) instead of this device model's "
                             "(sm90-<device>-float64.json, the default)")
    parser.add_argument("--work", default="smalltc-tune", metavar="DIR",
                        help="checkpoints and plots (default: ./smalltc-tune)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the checkpoint in --work")
    parser.add_argument("--plot", nargs="?", const="auto", default=None, metavar="KEY",
                        help="plot the search of one size (default: the size with most "
                             "timed variants) to --work")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: compile with nvcc (resources, pruning) and make up "
                             "times; the table is marked dry_run and never used")
    parser.add_argument("--cc", default="90", help="compute capability of a --dry-run (90)")
    parser.add_argument("--compiler", choices=("cuda", "cpu", "nvcc", "none"), default=None,
                        help="cuda: NVRTC through the CUDA backend (default on a GPU); nvcc: "
                             "ptxas resources only (default of --dry-run when nvcc exists)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="compile processes (default: all cores)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per variant (>= 20)")
    parser.add_argument("--footprint-mb", type=float, default=FOOTPRINT / 2 ** 20,
                        help="MiB read + written per timed call (>= 256)")
    parser.add_argument("--confirm-top", type=int, default=3,
                        help="best variants re-timed against the heuristic")
    parser.add_argument("--max-local-bytes", type=int, default=MAX_LOCAL_BYTES,
                        help="variants using more local memory (spills) per thread are not "
                             "timed (default %(default)s, the CUDA backend's own limit)")
    parser.add_argument("--reconfirm", action="store_true",
                        help="re-decide the finished sizes of the checkpoint in --work whose "
                             "winner was not timed in every form (twice the batch; GEMM beta "
                             "!= 0 also in place): the best few and the heuristic re-timed in "
                             "every form, nothing recompiled; run again after a budget stop")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _slug(key):
    return re.sub(r"[^0-9a-zA-Z]+", "-", key).strip("-")


def _fail(msg):
    print(f"smalltc tune: error: {msg}", file=sys.stderr)
    return 2


def run(args, device=None, clock=None) -> int:
    """Run ``smalltc tune``. ``device``/``clock``: stand-ins for tests."""
    if args.repeats < 20 and not args.dry_run and device is None:
        return _fail(f"--repeats {args.repeats}: docs/math.md section 5 asks for >= 20")
    if args.footprint_mb < 256 and not args.dry_run and device is None:
        return _fail(f"--footprint-mb {args.footprint_mb}: docs/math.md section 5 asks for >= 256 MB")
    work = pathlib.Path(args.work)
    shipped = shipped_dir().resolve()
    out = pathlib.Path(args.out) if args.out else (work if args.dry_run else shipped)
    if args.dry_run and out.resolve() == shipped:
        return _fail("a --dry-run table never goes into the package's tables (made-up times)")
    try:
        specs = parse(args.op, args.sizes, args.dtype)
    except ValueError as err:
        return _fail(str(err))
    footprint = int(args.footprint_mb * 2 ** 20)
    if device is None:
        if args.device == "cpu":
            if args.dry_run:
                return _fail("--dry-run is for the GPU tuner; --device cpu measures")
            from .cpu import CpuDevice     # the CPU backend, Numba: loaded for --device cpu
            device = CpuDevice(args.dtype, repeats=args.repeats, footprint=footprint)
        elif args.dry_run:
            device = DryRunDevice(args.dtype, cc=args.cc, repeats=args.repeats,
                                  footprint=footprint)
        else:
            try:
                device = GpuDevice(args.dtype, repeats=args.repeats, footprint=footprint)
            except RuntimeError as err:
                return _fail(f"{err}")
            except ImportError as err:               # no CuPy at all
                return _fail(f"no CUDA device: {err} (--device cpu tunes the CPU backend)")
    compiler = args.compiler or getattr(device, "compiler", "cuda")
    if compiler == "nvcc" and shutil.which("nvcc") is None:
        compiler = "none"
    specs = [sized(s, footprint) for s in specs]
    info = device.info()
    arch = info.get("arch") or f"sm{info['cc']}"
    ckpt = work / f"{arch}-{args.op}-{args.dtype}.checkpoint.json"
    if args.reconfirm and not ckpt.exists():
        return _fail(f"--reconfirm: no checkpoint {ckpt} to re-decide")
    if args.reconfirm:
        args.resume = True
    elif ckpt.exists() and not args.resume:
        return _fail(f"{ckpt} exists: pass --resume to continue it, or delete it to start over")
    kw = dict(compiler=compiler, jobs=args.jobs, budget_s=args.budget_seconds,
              checkpoint=str(ckpt), resume=args.resume, confirm_top=args.confirm_top,
              progress=not args.no_progress, max_local_bytes=args.max_local_bytes)
    if clock is not None:
        kw["clock"] = clock
    try:
        search = Search(args.op, args.dtype, specs, device, **kw)
    except ValueError as err:                     # a checkpoint of another search
        return _fail(str(err))
    where = arch if info.get("arch") else f"sm_{info['cc']}"
    print(f"smalltc tune: {args.op} {args.dtype} on {info['name']} ({where}), "
          f"{len(specs)} sizes, {len(search.results)} done before, compiler {compiler}, "
          f"{search.jobs} jobs", file=sys.stderr)
    if args.reconfirm:
        status = search.reconfirm()
        if status == "done" and len(search.results) < len(specs):
            return _fail(f"--reconfirm: {len(specs) - len(search.results)} sizes of {ckpt} are "
                         f"not tuned yet; finish them with --resume first")
    else:
        status = search.run()
    keys = [r for r in search.state["sizes"] if r in search.results]
    _summary(search, keys)
    if status == "done":
        dry = bool(getattr(device, "dry_run", False))       # made-up times: no device model
        path = out / T.table_name(info, args.dtype, arch=args.arch_table or dry)
        evidence = (pathlib.Path(args.evidence) / (path.name + ".gz") if args.evidence
                    else T.evidence_path(path))
        table = _load_or_new(path, evidence, info, args.dtype,
                             bool(getattr(device, "dry_run", False)))
        # every finished size of the checkpoint: also those an earlier run with other
        # --sizes finished (a search resumed for a few sizes must not drop the rest)
        results = {k: r for k, r in search.results.items() if r.get("winner")}
        seconds = sum(r.get("seconds", 0) for r in search.state["runs"])
        T.add_results(table, results, args.op, seconds)
        T.save(table, path, evidence)
        print(f"table: {path} ({len(table['entries'])} entries); evidence: {evidence}")
    if args.plot and search.results:
        try:
            res = pick_size(search.results, args.plot)
            png = work / f"search-{arch}-{args.dtype}-{_slug(res['key'])}.png"
            work.mkdir(parents=True, exist_ok=True)
            plot_search(res, png, info["name"])
            print(f"plot: {png}")
        except (ImportError, ValueError) as err:
            print(f"smalltc tune: no plot: {err}", file=sys.stderr)
    return 0 if status == "done" else EXIT_BUDGET


def _load_or_new(path, evidence, info, dtype, dry_run):
    """The record of the table at ``path`` (with its evidence), or a new one."""
    if path.exists():
        t = T.load(path, evidence)
        if bool(t.get("dry_run")) != dry_run:
            raise SystemExit(f"smalltc tune: {path} is {'a dry-run' if t.get('dry_run') else 'a'}"
                             f" table; refusing to mix in {'dry-run' if dry_run else 'measured'}"
                             f" results")
        if t["device"].get("name") != info["name"]:
            print(f"smalltc tune: note: {path} was tuned on {t['device'].get('name')}, "
                  f"adding results of {info['name']}", file=sys.stderr)
        fresh = T.new_table(info, dtype, dry_run)
        for k in ("device", "versions", "date", "bandwidth", "peak"):
            t[k] = fresh[k]
        return t
    return T.new_table(info, dtype, dry_run)


def _summary(search, keys):
    tot = dict(generated=0, pruned=0, compiled=0, timed=0)
    for k in keys:
        r = search.results[k]
        sp = r.get("space", {})
        tot["generated"] += sp.get("generated", 0)
        tot["pruned"] += sum((sp.get("pruned") or {}).values())
        tot["compiled"] += sp.get("compiled", 0)
        tot["timed"] += sp.get("timed", 0)
        w = r.get("winner")
        if w:
            sp_h = r.get("speedup_vs_heuristic")
            vs = f"x{sp_h:.3f} vs heuristic" if sp_h else "heuristic failed"
            print(f"{k:32s} {w['time_s'] * 1e3:9.4f} ms  {100 * r['fraction_of_pmax']:5.1f}% "
                  f"Pmax  {vs}  {w['label']}  [{r.get('compile_s', 0):.0f}+"
                  f"{r.get('measure_s', 0):.0f} s]")
        else:
            print(f"{k:32s} (no tunable kernel)")
    secs = sum(r.get("seconds", 0) for r in search.state["runs"])
    print(f"{len(keys)}/{len(search.specs)} sizes; generated {tot['generated']}, pruned "
          f"{tot['pruned']}, compiled {tot['compiled']}, timed {tot['timed']}; "
          f"{secs:.0f} s over {len(search.state['runs'])} run(s)")
