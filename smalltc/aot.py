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
import os
import time
from pathlib import Path

import numpy as np

from ._arrays import cupy_or_none, gpu_available

__all__ = ["precompile", "cache_report", "cache_dirs", "OPS", "SOLVER_OPS", "parse_nq",
           "add_arguments", "run"]

#: the operations :func:`precompile` builds (names as for :func:`smalltc.plan`)
OPS = ("action", "assembly", "mass_apply", "mass_diagonal")
#: the solver kernels it builds too (:mod:`smalltc.solver`): the vector updates (every
#: mode), the PCG iteration and the CSR product do not depend on ``p`` or ``dim``; the
#: transfers are built for the p-multigrid's first coarsening from ``p``
#: (``ceil(p/2)``, both ways), the Schwarz solve for the extended elements of ``p``
#: (``p + 3`` nodes a direction: overlap 1)
SOLVER_OPS = ("vector_update", "pcg", "pmg_transfer", "csr_spmv", "schwarz_fdm")
_SIZELESS = ("vector_update", "pcg", "csr_spmv")
_E = 2                                       # elements of the problem each build runs


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
    """Every file under ``folder``: relative path -> (size, mtime in ns)."""
    out = {}
    if folder.is_dir():
        for root, _, names in os.walk(folder):
            for n in names:
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


def _problem(op, dim, p, nq, dtype, ncomp, index_dtype, xp):
    """``(operands, plan keywords)`` of a two-element problem of ``op``."""
    nd = p + 1
    rng = np.random.default_rng(0)

    def rand(*shape):
        return xp.asarray(rng.random(shape).astype(dtype) + 0.5)
    B1d, D = rand(nq, nd), rand(_E, *(nq,) * dim)
    if op == "action":
        V = rand(_E, ncomp, *(nd,) * dim) if ncomp > 1 else rand(_E, *(nd,) * dim)
        return (B1d, D, V), {}
    if op == "assembly":
        return (B1d, D), {}
    ndofs = _E * nd ** dim                               # elements apart: any map will do
    emap = xp.asarray(np.arange(ndofs, dtype=index_dtype).reshape(_E, *(nd,) * dim))
    if op == "mass_apply":
        x = rand(ncomp, ndofs) if ncomp > 1 else rand(ndofs)
        return (B1d, D, x, emap), {}
    if op == "mass_diagonal":
        return (B1d, D, emap), {"ndofs": ndofs}
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


def _solver_problems(op, dim, p, dtype, index_dtype, xp):
    """``[(operands, plan keywords, call keywords)]``: the builds of solver op ``op``."""
    rng = np.random.default_rng(0)

    def rand(*shape):
        return xp.asarray(rng.random(shape).astype(dtype) + 0.5)
    n = 8
    if op == "vector_update":
        v = [rand(n) for _ in range(7)]
        f = xp.ones(n, dtype=dtype)
        names = {"start": 2, "step": 6, "residual": 3, "last": 2}
        return [(tuple(v[:k]), dict(mode=m, free=f), dict(c0=0.5, c1=0.5))
                for m, k in names.items()]
    if op == "pcg":
        return [((rand(n), rand(n), rand(n)), {},
                 dict(apply=lambda x: x, tol=0.0, maxiter=1, bnorm=1.0, history=[1.0]))]
    if op == "csr_spmv":
        ip = xp.asarray(np.arange(n + 1, dtype=index_dtype))
        return [((ip, xp.asarray(np.arange(n, dtype=index_dtype)), rand(n), rand(n)), {}, {})]
    if op == "pmg_transfer":
        q = (p + 1) // 2
        nf, nc = p + 1, q + 1
        emap = {k: xp.asarray(np.arange(_E * k ** dim, dtype=index_dtype).reshape(
            (_E,) + (k,) * dim)) for k in (nc, nf)}
        ndof = {k: _E * k ** dim for k in (nc, nf)}
        M = rand(nf, nc)
        MT = xp.ascontiguousarray(M.T)
        return [((M, rand(ndof[nc]), emap[nc], rand(ndof[nc]), emap[nf], rand(ndof[nf])), {},
                 {}),
                ((MT, rand(ndof[nf]), emap[nf], rand(ndof[nf]), emap[nc], rand(ndof[nc])), {},
                 {})]
    if op == "schwarz_fdm":
        if xp is np:          # the host's Schwarz keeps an intp map (numpy.bincount's index)
            index_dtype = "int64"
        k = p + 3
        ndofs = _E * k ** dim
        idx = xp.asarray(np.arange(ndofs, dtype=index_dtype).reshape((_E,) + (k,) * dim))
        return [((rand(_E, dim, k, k), rand(_E, *(k,) * dim), idx, rand(ndofs), rand(ndofs)),
                 {}, {})]
    raise ValueError(f"op must be one of {OPS + SOLVER_OPS}, got {op!r}")


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
        fem = op in ("mass_apply", "mass_diagonal")
        if op in SOLVER_OPS:
            sizeless = op in _SIZELESS
            item = dict(op=op, dim=None if sizeless else int(dim),
                        p=None if sizeless else int(pp), nq=None, dtype=str(dt), ncomp=1,
                        deterministic=False,
                        index_dtype=str(it) if op != "vector_update" and op != "pcg"
                        else None)
            if item not in seen:
                seen.append(item)
            continue
        item = dict(op=op, dim=int(dim), p=int(pp), nq=parse_nq(q, int(pp)), dtype=str(dt),
                    ncomp=int(nc) if op in ("action", "mass_apply") else 1,
                    deterministic=bool(det) if fem else False,
                    index_dtype=str(it) if fem else None)
        if item not in seen:
            seen.append(item)
    return seen


def precompile(ops=OPS, p=range(1, 9), nq=None, dims=(3,), dtypes=("float64",), *,
               ncomp=(1,), deterministic=(False,), index_dtypes=("int32",), device="auto",
               backend="auto", progress=False) -> list:
    """Build the kernels of every combination of the arguments on the current device.

    Parameters
    ----------
    ops : iterable of str
        The operations, named as for :func:`smalltc.plan` (:data:`OPS`:
        ``batched_contract``, ``assemble_mass``, ``mass_apply``, ``mass_diagonal``; and
        the solver kernels of :data:`SOLVER_OPS`, :mod:`smalltc.solver`).
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

    Returns
    -------
    list of dict
        One record a build: the item (``op``, ``dim``, ``p``, ``nq``, ``dtype``,
        ``ncomp``, ``deterministic``, ``index_dtype``), ``device``, ``backend``,
        ``kernel``, ``specialized``, ``seconds`` (plan and first call), ``new_files``
        (files it wrote to the device's kernel cache), ``compiled``
        (``new_files > 0``: it compiled; False: its kernels were cached) and
        ``nothing_to_compile`` (the reference backend ran it: no kernel of its own).

    Raises
    ------
    ValueError
        An unknown operation, dtype or device; sizes a plan refuses.
    RuntimeError
        ``device="gpu"`` without a GPU.
    """
    import smalltc
    xp = _module(device)
    where = "cpu" if xp is np else "gpu"
    folder = cache_dirs()["cpu" if xp is np else "cuda"]
    for op in ops:
        if op not in OPS + SOLVER_OPS:
            raise ValueError(f"op must be one of {OPS + SOLVER_OPS}, got {op!r}")
    items = _items(list(ops), list(p), None if nq is None else list(nq), list(dims),
                   list(dtypes), list(ncomp), list(deterministic), list(index_dtypes))
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(items), desc="precompile", unit="kernel")
    records = []
    try:
        for it in items:
            label = f"{it['op']} {it['dim']}d p={it['p']} nq={it['nq']} {it['dtype']}"
            if bar is not None:
                bar.set_postfix_str(label)
            if it["op"] in SOLVER_OPS:
                builds = _solver_problems(it["op"], it["dim"], it["p"], it["dtype"],
                                          it["index_dtype"] or "int32", xp)
            else:
                ops_, kw = _problem(it["op"], it["dim"], it["p"], it["nq"], it["dtype"],
                                    it["ncomp"], it["index_dtype"], xp)
                if it["index_dtype"] is not None:
                    kw["deterministic"] = it["deterministic"]
                builds = [(ops_, kw, {})]
            before = _files(folder)
            t0 = time.perf_counter()
            plans = []
            for ops_, kw, call in builds:
                plan = smalltc.plan(it["op"], *ops_, backend=backend, **kw)
                if "free" in kw:
                    ops_ = ops_ + (kw["free"],)
                plan(*ops_, **call)
                plans.append(plan)
            if xp is not np:
                xp.cuda.get_current_stream().synchronize()
            seconds = time.perf_counter() - t0
            after = _files(folder)
            new = sum(1 for f, st in after.items() if before.get(f) != st)
            records.append(dict(it, device=where, backend=plan.backend,
                                kernel=", ".join(dict.fromkeys(str(p.kernel) for p in plans)),
                                specialized=all(p.specialized for p in plans),
                                seconds=round(seconds, 4),
                                new_files=new, compiled=new > 0,
                                nothing_to_compile=all(str(p.kernel).startswith("reference")
                                                       for p in plans)))
            if bar is not None:
                bar.update()
    finally:
        if bar is not None:
            bar.close()
    return records


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
                        help=f"operations, comma separated (default {','.join(OPS)}; the "
                             f"solver kernels: {','.join(SOLVER_OPS)})")
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
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="write the records (one a kernel) to FILE")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    import json
    det = {"no": [False], "yes": [True], "both": [False, True]}[args.deterministic]
    records = precompile(_words(args.ops), _ints(args.p), _words(args.nq), _ints(args.dims),
                         _words(args.dtypes), ncomp=_ints(args.ncomp), deterministic=det,
                         index_dtypes=_words(args.index_dtypes), device=args.device,
                         backend=args.backend, progress=not args.no_progress)
    new = sum(r["compiled"] for r in records)
    none = sum(r["nothing_to_compile"] for r in records)
    total = sum(r["seconds"] for r in records)
    where = records[0]["device"] if records else args.device
    folder = cache_dirs()["cpu" if where == "cpu" else "cuda"]
    print(f"{len(records)} builds on the {where.upper()} in {total:.1f} s: {new} compiled now, "
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
