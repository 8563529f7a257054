"""Ahead-of-time compilation (``smalltc.precompile``, ``smalltc precompile``): the kernels of a list of sizes, built into the disk caches.

The first call of each size compiles its kernel: a few seconds per Numba kernel
on a CPU, about a second per CUDA kernel on a GPU. :func:`precompile` (and
``smalltc precompile``) does it ahead, on the current device, for every
combination of operations, orders ``p``, quadrature sizes ``nq``, dimensions and
dtypes it is given: it plans each one (the backends' ``build``, which compiles)
and calls the plan once on a two-element problem, so kernels made at the first
launch compile too. What is compiled lands in the caches a later process reads:

* CPU: the rendered kernel modules and Numba's cache beside them
  (``$SMALLTC_CACHE_DIR/cpu``, default ``~/.cache/smalltc/cpu``);
* GPU: CuPy's kernel cache (``$CUPY_CACHE_DIR``, default ``~/.cupy/kernel_cache``).

On the CPU the builds run at once in compile processes, one a core (``jobs``,
``smalltc precompile --jobs N``; :mod:`smalltc.backends.cpu.compile_process`), each
taking the next build when its last one is done and writing the shared disk cache;
a later call here or in another process loads the kernels from it. The GPU's builds
run in this process, one after another.

Kernels do not depend on the element count (nor, for the FEM operator, on the
number of DoFs), so a tiny problem builds the kernel of any size. Each record says
whether the build wrote new files to the cache (it compiled) or found its kernel
there. :func:`cache_report` describes the caches (``smalltc info`` prints it).

Examples
--------
>>> import smalltc
>>> recs = smalltc.precompile(ops=["action"], p=[1], nq=[2], dims=[1], device="cpu")
>>> [(r["op"], r["dim"], r["p"], r["nq"], r["dtype"], r["device"]) for r in recs]
[('action', 1, 1, 2, 'float64', 'cpu')]
>>> sorted(cache_report())
['cpu', 'cuda']
"""
from __future__ import annotations

import importlib
import itertools
import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from queue import Queue

import numpy as np

import smalltc

from . import solver as _solver
from ._arrays import cupy_or_none, gpu_available
from .ops import OPS as _REGISTRY

__all__ = ["precompile", "cache_report", "cache_dirs", "OPS", "SOLVER_OPS", "parse_nq",
           "add_arguments", "run"]

log = logging.getLogger("smalltc")

#: the operations :func:`precompile` builds (names as for :func:`smalltc.plan`): the
#: entries of :mod:`smalltc.ops` with an ``example`` problem, in their registration order
OPS = tuple(name for name, entry in _REGISTRY.items() if entry.example is not None)
#: the solver kernels it builds too (:mod:`smalltc.solver`: what each depends on,
#: :data:`smalltc.solver.DEPENDS`, and its problems, :func:`smalltc.solver.examples`)
SOLVER_OPS = tuple(_solver.OPS)


def cache_dirs() -> dict:
    """``{"cpu": Path, "cuda": Path}``: the CPU kernels' cache and CuPy's kernel cache."""
    cpu = None
    # the CPU runtime's module (a package after the CPU backend's split, a module before)
    for name in ("smalltc.backends.cpu.runtime", "smalltc.backends._cpu_codegen"):
        try:
            cpu = importlib.import_module(name).cache_dir()
            break
        except ImportError:
            continue
    if cpu is None:                          # numba missing: the rule the runtime uses
        root = os.environ.get("SMALLTC_CACHE_DIR")
        cpu = (Path(root) if root else Path.home() / ".cache" / "smalltc") / "cpu"
    cuda = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")
    return {"cpu": Path(cpu), "cuda": Path(cuda)}


def _files(folder: Path) -> dict:
    """Every file under ``folder``: relative path -> (size, mtime in ns); not the CPU
    runtime's empty lock files (a process compiling a kernel holds one)."""
    out = {}
    if folder.is_dir():
        for root, _, names in os.walk(folder):
            for n in names:
                if n.endswith(".lock"):
                    continue
                p = Path(root) / n
                try:
                    st = p.stat()
                except OSError:                  # removed meanwhile
                    continue
                out[str(p.relative_to(folder))] = (st.st_size, st.st_mtime_ns)
    return out


def _numba_cache_of(folder: Path):
    """Where Numba keeps the machine code of the modules in ``folder`` when
    ``NUMBA_CACHE_DIR`` is set (its user-provided locator's folder), else None
    (Numba writes beside the modules)."""
    try:
        from numba.core import caching, config
    except ImportError:
        return None
    if not config.CACHE_DIR:
        return None
    sub = caching.UserProvidedCacheLocator.get_suitable_cache_subpath(str(folder / "m.py"))
    return Path(config.CACHE_DIR) / sub


def cache_report(kernels: bool = False) -> dict:
    """What the kernel caches hold.

    Returns
    -------
    dict
        ``"cpu"``: ``dir``, ``kernels`` (rendered kernel modules), ``compiled`` (those
        with Numba's cache of their machine code), ``files``, ``bytes`` and, with
        ``kernels=True``, ``names`` (the kernels' entry points). ``"cuda"``: ``dir``,
        ``modules`` (CuPy's cached binaries, one per compiled module), ``files``,
        ``bytes``, and ``in_memory`` when ``CUPY_CACHE_IN_MEMORY`` keeps them off disk.
    """
    dirs = cache_dirs()
    cpu = _files(dirs["cpu"])
    modules = sorted(Path(f).stem for f in cpu if "/" not in f and f.endswith(".py"))
    numba_dir = _numba_cache_of(dirs["cpu"])
    if numba_dir is not None:             # NUMBA_CACHE_DIR: the machine code is kept there
        cpu.update({f"<numba>/{k}": v for k, v in _files(numba_dir).items()})
    indexed = {Path(f).name.split(".")[0] for f in cpu if f.endswith(".nbi")}
    compiled = [m for m in modules if m in indexed]
    rep = {"cpu": dict(dir=str(dirs["cpu"]), kernels=len(modules), compiled=len(compiled),
                       files=len(cpu), bytes=sum(s for s, _ in cpu.values()))}
    if kernels:
        rep["cpu"]["names"] = sorted({m.rsplit("_", 1)[0] for m in compiled})
    cuda = _files(dirs["cuda"])
    rep["cuda"] = dict(dir=str(dirs["cuda"]), modules=sum(f.endswith(".cubin") for f in cuda),
                       files=len(cuda), bytes=sum(s for s, _ in cuda.values()))
    if os.environ.get("CUPY_CACHE_IN_MEMORY", "0") not in ("", "0"):
        rep["cuda"]["in_memory"] = True
    return rep


def parse_nq(spec, p: int) -> int:
    """A quadrature size: an int, or ``"p"``/``"p+K"``/``"p-K"`` relative to ``p``.

    >>> parse_nq("p+2", 3), parse_nq(5, 3), parse_nq("p", 4)
    (5, 5, 4)
    """
    if isinstance(spec, (int, np.integer)):
        return int(spec)
    text = str(spec).replace(" ", "")
    if text.startswith("p"):
        return p + (int(text[1:]) if len(text) > 1 else 0)
    return int(text)


def _module(device):
    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'gpu', got {device!r}")
    if device == "cpu" or (device == "auto" and not gpu_available()):
        return np
    if not gpu_available():
        raise RuntimeError("device='gpu' was requested but no CUDA device answers CuPy")
    return cupy_or_none()


def _items(ops, p, nq, dims, dtypes, ncomp, deterministic, index_dtypes):
    """Every build, once (the variants an operation ignores collapse)."""
    seen = []
    for op, dim, pp, q, dt, nc, det, it in itertools.product(
            ops, dims, p, nq if nq is not None else ("p+1", "p+2"), dtypes, ncomp,
            deterministic, index_dtypes):
        if op in SOLVER_OPS:
            depends = _solver.DEPENDS[op]
            item = dict(op=op, dim=int(dim) if "size" in depends else None,
                        p=int(pp) if "size" in depends else None, nq=None, dtype=str(dt),
                        ncomp=1, deterministic=False,
                        index_dtype=str(it) if "index" in depends else None)
        else:
            varies = _REGISTRY[op].varies
            item = dict(op=op, dim=int(dim), p=int(pp), nq=parse_nq(q, int(pp)), dtype=str(dt),
                        ncomp=int(nc) if "ncomp" in varies else 1,
                        deterministic=bool(det) if "deterministic" in varies else False,
                        index_dtype=str(it) if "index_dtype" in varies else None)
        if item not in seen:
            seen.append(item)
    return seen


def _builds(it, xp):
    """``[(operands, plan keywords, call keywords)]`` of one item."""
    if it["op"] in SOLVER_OPS:
        return _solver.examples(it["op"], it["dim"], it["p"], it["dtype"],
                                it["index_dtype"] or "int32", xp)
    entry = _REGISTRY[it["op"]]
    ops_, kw = entry.example(it["dim"], it["p"], it["nq"], it["dtype"], it["ncomp"],
                             it["index_dtype"], xp)
    if "deterministic" in entry.varies:
        kw["deterministic"] = it["deterministic"]
    return [(ops_, kw, {})]


def _build(it, xp, backend, folder, shared=False) -> dict:
    """Plan and call the item's problems; its record. ``shared``: other processes write
    the cache meanwhile, so the new files counted are those of the kernels this build
    loaded (their modules and Numba's files of them), not every change in the folder."""
    loaded = _cpu_compile_log() if shared else None
    start = len(loaded) if loaded is not None else 0
    before = _files(folder)
    t0 = time.perf_counter()
    plans = []
    for ops_, kw, call in _builds(it, xp):
        plan = smalltc.plan(it["op"], *ops_, backend=backend, **kw)
        if "free" in kw:
            ops_ = ops_ + (kw["free"],)
        plan(*ops_, **call)
        plans.append(plan)
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()
    seconds = time.perf_counter() - t0
    after = _files(folder)
    changed = [f for f, st in after.items() if before.get(f) != st]
    if loaded is not None:
        own = re.compile("^(" + "|".join(re.escape(e) for e, _ in loaded[start:]) +
                         r")_[0-9a-f]{16}\.") if len(loaded) > start else None
        changed = [f for f in changed if own is not None and own.match(Path(f).name)]
    new = len(changed)
    return dict(it, device="cpu" if xp is np else "gpu", backend=plan.backend,
                kernel=", ".join(dict.fromkeys(str(p.kernel) for p in plans)),
                specialized=all(p.specialized for p in plans), seconds=round(seconds, 4),
                new_files=new, compiled=new > 0,
                nothing_to_compile=all(str(p.kernel).startswith("reference") for p in plans))


def _cpu_compile_log():
    """The CPU runtime's list of kernels this process loaded (entry, seconds)."""
    try:
        from .backends.cpu import runtime  # optional: Numba
    except ImportError:                       # numba missing: nothing compiles
        return []
    return runtime.compile_log


def build_item(it, backend):
    """One item built in a precompile worker (a compile process, the CPU): its record."""
    return _build(it, np, backend, cache_dirs()["cpu"], shared=True)


#: builds a precompile worker runs before it is replaced by a fresh one (a compiled
#: kernel keeps 10-30 MB of its process: :mod:`smalltc.backends.cpu.compile_process`)
_WORKER_TASKS = 32


def _cost(it):
    """A rough order of an item's compile time: the larger ones start first."""
    return ((it["p"] or 0) + 1) ** (it["dim"] or 1) * (it["nq"] or 1) * (1 + (it["ncomp"] > 1))


def _parallel(items, backend, jobs, bar):
    """Build the items in ``jobs`` compile processes, each taking the next item when its
    last one is done (the largest first); the records in the items' order. An item a
    worker could not build is built here (its error raised here, as in one process)."""

    from .backends.cpu.compile_process import CompileProcess  # optional: Numba
    todo = sorted(range(len(items)), key=lambda i: -_cost(items[i]))
    lock, done = threading.Lock(), Queue()
    records = [None] * len(items)
    stop, procs = threading.Event(), []

    def worker():
        proc = CompileProcess(_WORKER_TASKS)
        procs.append(proc)
        try:
            while not stop.is_set():
                with lock:
                    if not todo:
                        return
                    i = todo.pop(0)
                try:
                    ok, answer = proc.call("smalltc.aot:build_item", items[i], backend)
                except Exception as err:      # (a pipe error): this process builds it
                    ok, answer = False, f"{type(err).__name__}: {err}"
                done.put((i, answer if ok else None, None if ok else answer))
        finally:
            proc.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(jobs)]
    for t in threads:
        t.start()
    folder = cache_dirs()["cpu"]
    finished = False
    try:
        for _ in range(len(items)):
            i, rec, err = done.get()
            if rec is None:                   # built here: the same error as in one process
                log.warning(
                    "smalltc: a precompile worker did not build %s (%s); building here",
                    items[i], err)
                rec = _build(items[i], np, backend, folder)
            records[i] = rec
            if bar is not None:
                it = items[i]
                bar.set_postfix_str(f"{it['op']} {it['dim']}d p={it['p']} nq={it['nq']} "
                                    f"{it['dtype']}")
                bar.update()
        finished = True
    finally:
        stop.set()
        if finished:
            for t in threads:
                t.join()
        else:                   # interrupted or raised: the builds under way end now
            with lock:
                todo.clear()
            for proc in procs:
                proc.stop()
    return records


def _jobs(jobs, n):
    """Compile processes for ``n`` CPU builds (``jobs`` None: one a core this process may
    run on)."""
    if jobs is None:
        try:
            jobs = len(os.sched_getaffinity(0))
        except AttributeError:
            jobs = os.cpu_count() or 1
    if int(jobs) < 1:
        raise ValueError(f"jobs must be a positive number of processes, got {jobs!r}")
    return min(int(jobs), n)


def precompile(ops=OPS, p=range(1, 9), nq=None, dims=(3,), dtypes=("float64",), *,
               ncomp=(1,), deterministic=(False,), index_dtypes=("int32",), device="auto",
               backend="auto", progress=False, jobs=None) -> list:
    """Build the kernels of every combination of the arguments on the current device.

    Parameters
    ----------
    ops : iterable of str
        The operations, named as for :func:`smalltc.plan`: those of :data:`OPS` (the
        entries of :mod:`smalltc.ops` with an ``example``: ``action``, ``assembly``,
        ``mass_apply``, ``mass_diagonal``) and the solver kernels of :data:`SOLVER_OPS`
        (:mod:`smalltc.solver`).
    p : iterable of int
        Polynomial orders (``nd = p + 1``).
    nq : iterable of int or str, optional
        Quadrature points per direction: numbers, or ``"p+K"`` relative to each ``p``.
        Default ``("p+1", "p+2")`` (Gauss-Lobatto collocation and the usual Gauss rule).
    dims : iterable of int
        1, 2, 3.
    dtypes : iterable of {"float64", "float32"}
    ncomp : iterable of int
        Components (the action's and the FEM operator's component axis; 1: none).
    deterministic : iterable of bool
        The FEM operators' forms (see :func:`smalltc.mass_apply`).
    index_dtypes : iterable of {"int32", "int64"}
        The element-to-DoF map's dtype (``H1Space.dof_map`` gives int32).
    device : {"auto", "cpu", "gpu"}
        "auto": the GPU when CuPy answers a device query, else the CPU. The GPU is
        CuPy's current device.
    backend : str
        As for :func:`smalltc.plan` ("auto": what a call would use).
    progress : bool
        A tqdm progress bar on stderr.
    jobs : int, optional
        On the CPU, the processes that compile at once (None: one a core this process
        may run on). With two or more builds each is planned and called in one of
        ``jobs`` compile processes (:mod:`smalltc.backends.cpu.compile_process`), which
        write the shared disk cache; this process then loads the kernels from it
        when it uses them. ``1``: every build in this process. The GPU's builds run
        in this process.

    Returns
    -------
    list of dict
        One record a build, in the items' order: the item (``op``, ``dim``, ``p``,
        ``nq``, ``dtype``, ``ncomp``, ``deterministic``, ``index_dtype``), ``device``,
        ``backend``, ``kernel``, ``specialized``, ``seconds`` (plan and first call),
        ``new_files`` (files it wrote to the device's kernel cache), ``compiled``
        (``new_files > 0``: it compiled; False: its kernels were cached) and
        ``nothing_to_compile`` (the reference backend ran it: no kernel of its own).

    Raises
    ------
    ValueError
        An unknown operation, dtype or device; sizes a plan refuses.
    RuntimeError
        ``device="gpu"`` without a GPU.
    """
    xp = _module(device)
    folder = cache_dirs()["cpu" if xp is np else "cuda"]
    for op in ops:
        if op not in OPS + SOLVER_OPS:
            raise ValueError(f"op must be one of {OPS + SOLVER_OPS}, got {op!r}")
    items = _items(list(ops), list(p), None if nq is None else list(nq), list(dims),
                   list(dtypes), list(ncomp), list(deterministic), list(index_dtypes))
    workers = _jobs(jobs, len(items)) if xp is np else 1
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(items), desc="precompile", unit="kernel")
    try:
        if workers > 1:
            return _parallel(items, backend, workers, bar)
        records = []
        for it in items:
            if bar is not None:
                bar.set_postfix_str(f"{it['op']} {it['dim']}d p={it['p']} nq={it['nq']} "
                                    f"{it['dtype']}")
            records.append(_build(it, xp, backend, folder))
            if bar is not None:
                bar.update()
        return records
    finally:
        if bar is not None:
            bar.close()


# ---- the CLI: smalltc precompile --------------------------------------------------------

def _ints(text):
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out


def _words(text):
    return [w.strip() for w in str(text).split(",") if w.strip()]


def add_arguments(parser):
    parser.add_argument("--ops", default=",".join(OPS),
                        help=f"operations, comma separated: {', '.join(OPS)} (the "
                             f"default: every entry of smalltc.ops with an example problem) "
                             f"and the solver kernels {', '.join(SOLVER_OPS)}")
    parser.add_argument("--p", default="1-8", help="polynomial orders, e.g. 1,2,3 or 1-8 "
                                                   "(default 1-8)")
    parser.add_argument("--nq", default="p+1,p+2",
                        help="quadrature points per direction: numbers or p+K (default "
                             "p+1,p+2)")
    parser.add_argument("--dims", default="3", help="dimensions, e.g. 2,3 (default 3)")
    parser.add_argument("--dtypes", default="float64", help="float64,float32 (default "
                                                            "float64)")
    parser.add_argument("--ncomp", default="1", help="components, e.g. 1,3 (default 1)")
    parser.add_argument("--deterministic", choices=("no", "yes", "both"), default="no",
                        help="the FEM operators' deterministic form (default no)")
    parser.add_argument("--index-dtypes", default="int32",
                        help="element-to-DoF map dtypes: int32,int64 (default int32)")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="auto: the GPU when there is one (default)")
    parser.add_argument("--backend", default="auto", help="as for smalltc.plan (default auto)")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="CPU builds at once, each in a compile process of its own "
                             "(default: one a core; 1: all in this process)")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="write the records (one a kernel) to FILE")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    det = {"no": [False], "yes": [True], "both": [False, True]}[args.deterministic]
    t0 = time.perf_counter()
    records = precompile(_words(args.ops), _ints(args.p), _words(args.nq), _ints(args.dims),
                         _words(args.dtypes), ncomp=_ints(args.ncomp), deterministic=det,
                         index_dtypes=_words(args.index_dtypes), device=args.device,
                         backend=args.backend, progress=not args.no_progress,
                         jobs=args.jobs)
    wall = time.perf_counter() - t0
    new = sum(r["compiled"] for r in records)
    none = sum(r["nothing_to_compile"] for r in records)
    total = sum(r["seconds"] for r in records)
    where = records[0]["device"] if records else args.device
    folder = cache_dirs()["cpu" if where == "cpu" else "cuda"]
    procs = _jobs(args.jobs, len(records)) if where == "cpu" and records else 1
    print(f"{len(records)} builds on the {where.upper()} in {wall:.1f} s"
          + (f" ({procs} compile processes, {total:.1f} s of builds)" if procs > 1 else "")
          + f": {new} compiled now, "
          f"{len(records) - new - none} already cached"
          + (f", {none} with nothing to compile (array code)" if none else "")
          + f"; cache: {folder}")
    for r in records:
        if not r["specialized"]:
            print(f"  generic kernel (no specialised one): {r['op']} {r['dim']}d p={r['p']} "
                  f"nq={r['nq']} {r['dtype']}: {r['kernel']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0
