"""Render the CPU kernel templates, compile them with Numba, cache them (the CPU runtime).

A kernel is a Jinja2 template under ``templates/cpu/`` rendered with every
size a constant into a small Python module, written to the cache directory
(``$SMALLTC_CACHE_DIR/cpu``, default ``~/.cache/smalltc/cpu``) under a name
that hashes the source, and imported from there: Numba's own on-disk cache
(``cache=True``) then works, because the function lives in a file. An
in-process dictionary keyed by (template, entry, params) avoids re-rendering.

Specialised kernels carry an explicit signature, so they compile when their
module is imported. They compile with LLVM's SLP vectoriser on and its loop
vectoriser off (Numba's defaults are the opposite): the templates spell out
one statement per SIMD lane and leave the vector packing to SLP, while the
loop vectoriser would otherwise turn the fixed-trip outer loops into gathers.
What they compile for is Numba's target for the process (:mod:`.target`);
Numba's disk cache keys on it, so AVX2 and AVX-512 builds of one source
coexist.

Processes that need one kernel at once (MPI ranks of a node, a test suite's workers)
compile it once: the first takes a lock file beside the module (``fcntl.flock``, where
the platform has it) while it compiles, the others wait for it and load Numba's cache.

A kernel found in Numba's disk cache (and smalltc's other Numba functions) is loaded
without the target context's refresh that Numba's cache makes before every load
(:func:`_load_overload`): the refresh imports Numba's whole library of lowerings (and
SciPy's BLAS for ``np.dot``), 0.3 s of CPU the first time in a process, of which
loading cached machine code needs only the runtime's (NRT's) symbols. A kernel that is
not in the cache compiles as before: Numba's compiler refreshes the context itself.

A process that builds hundreds of kernels (a test suite's worker) can
compile them in a helper process instead (``SMALLTC_COMPILE_PROCESS=N``,
:mod:`.compile_process`): a kernel compiled here keeps 10-30 MB of this
process to its end, one loaded from Numba's disk cache about 2 MB.
"""
from __future__ import annotations

import atexit
import hashlib
import importlib.util
import logging
import os
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, nullcontext
from importlib.resources import files
from pathlib import Path

import jinja2
import numba
from numba.core import caching, config
from numba.core.runtime import rtsys

from ..._jinja import environment
from .compile_process import CompileProcess

try:                                    # POSIX only: elsewhere each process compiles its own
    import fcntl
except ImportError:                     # pragma: no cover
    fcntl = None

__all__ = ["render", "load_kernel", "cache_dir", "compile_log", "CompileError", "signature",
           "NB_TYPES", "SHORT"]

log = logging.getLogger("smalltc")

#: bump when the generated code changes meaning without its text changing
CODEGEN_VERSION = "2"
#: the kernels import the intrinsics of simd.py and native.py, whose code Numba's cache
#: does not see: a changed one is a new kernel module (a new name), never a stale cached one
_INTRINSICS = hashlib.sha256(b"".join(
    (Path(__file__).with_name(f)).read_bytes() for f in ("simd.py", "native.py"))).hexdigest()[:16]
#: Numba type and entry-name tag of each dtype
NB_TYPES = {"float64": "float64", "float32": "float32"}
SHORT = {"float64": "f64", "float32": "f32"}

_ENV = environment(jinja2.FileSystemLoader(str(files("smalltc.templates") / "cpu")))
_KERNELS: dict = {}
_LOCK = threading.RLock()
#: (entry, seconds to import it: compile, or load from Numba's disk cache)
compile_log: list = []


_NUMBA_LOAD_OVERLOAD = caching.Cache.load_overload
#: modules whose Numba functions load from Numba's cache without the context refresh
_OWN_MODULES = ("smalltc.", "_smalltc_cpu_")


def _load_overload(self, sig, target_context):
    """Numba's ``Cache.load_overload``, which refreshes ``target_context`` (imports and
    installs every registry of lowerings and typing templates) and then loads the
    cached overload of ``sig``; for smalltc's own functions (the kernel modules, the
    solver loops, the element colouring), without the refresh. Rebuilding cached
    machine code needs none of the registries, only the runtime's (NRT's) symbols
    (``rtsys.initialize``). A miss returns None as before, and the compile that
    follows refreshes the context itself (``numba.core.compiler.CompilerBase``).
    Every other function gets Numba's own method."""
    module = getattr(getattr(self, "_py_func", None), "__module__", None) or ""
    if not module.startswith(_OWN_MODULES):
        return _NUMBA_LOAD_OVERLOAD(self, sig, target_context)
    rtsys.initialize(target_context)
    with self._guard_against_spurious_io_errors():
        return self._load_overload(sig, target_context)


if all(hasattr(caching.Cache, name) for name in ("_load_overload",
                                                  "_guard_against_spurious_io_errors")):
    caching.Cache.load_overload = _load_overload


class CompileError(RuntimeError):
    """A rendered kernel failed to compile; carries the source path and log."""


def cache_dir() -> Path:
    """Where rendered kernels (and Numba's cache beside them) are kept."""
    root = os.environ.get("SMALLTC_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "smalltc"
    return base / "cpu"


def signature(dtype, n_arrays, tail) -> str:
    """A Numba signature string: ``n_arrays`` 2D C-contiguous arrays of ``dtype``, then
    the types ``tail`` (``"int64"``, ``"int32[::1]"``, ...)."""
    a = f"{NB_TYPES[dtype]}[:, ::1]"
    return f"void({', '.join([a] * n_arrays + list(tail))})"


def render(template: str, **params) -> str:
    """Render ``templates/cpu/<template>`` with ``params`` (missing ones raise)."""
    return _ENV.get_template(template).render(template=template, **params)


@contextmanager
def _vectoriser_flags(slp: bool):
    """LLVM pass options for compiles inside this block (restored after)."""
    cfg = numba.config
    old = cfg.SLP_VECTORIZE, cfg.LOOP_VECTORIZE
    if slp:
        cfg.SLP_VECTORIZE, cfg.LOOP_VECTORIZE = 1, 0
    try:
        yield
    finally:
        cfg.SLP_VECTORIZE, cfg.LOOP_VECTORIZE = old


def _write(path: Path, text: str):
    """Write the module once: a file that holds ``text`` already is left as it is (its
    modification time is the stamp of Numba's cache of it), also when another process
    (a precompile worker) writes it at the same moment."""
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    try:
        os.link(tmp, path)                   # only where there is no file yet
    except FileExistsError:
        if path.read_text() != text:         # a partial or foreign file: replace it
            os.replace(tmp, path)
            return
    except OSError:                          # no hard links here
        os.replace(tmp, path)
        return
    tmp.unlink()


_HELPER = None


@contextmanager
def _compiling(path: Path):
    """Hold ``<module>.lock`` beside the kernel module while it compiles, so that other
    processes asking for the same kernel wait and then load Numba's disk cache instead
    of compiling it again (no lock where the platform or the folder does not allow one)."""
    handle = None
    if fcntl is not None:
        try:
            handle = open(path.with_suffix(".lock"), "a")
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            if handle is not None:
                handle.close()
            handle = None
    try:
        yield
    finally:
        if handle is not None:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


def _compile_process_tasks() -> int:
    """Kernels per compile process (``SMALLTC_COMPILE_PROCESS``; 0: compile here)."""
    try:
        return max(0, int(os.environ.get("SMALLTC_COMPILE_PROCESS", "0") or 0))
    except ValueError:
        return 0


def _in_numba_cache(path: Path) -> bool:
    """Whether Numba's disk cache holds an index for the kernel module at ``path`` (in
    ``NUMBA_CACHE_DIR``'s folder for it, else ``__pycache__`` beside it)."""
    if config.CACHE_DIR:
        folder = Path(config.CACHE_DIR) / \
            caching.UserProvidedCacheLocator.get_suitable_cache_subpath(str(path))
    else:
        folder = path.parent / "__pycache__"
    return any(folder.glob(f"{path.stem}.*.nbi"))


def _compile_elsewhere(template, entry, slp, params, tasks):
    """Compile the kernel in the helper process (:mod:`.compile_process`), which fills
    Numba's disk cache; an error there is logged, and the kernel compiles here."""
    global _HELPER
    if _HELPER is None or _HELPER.tasks != tasks:
        if _HELPER is not None:
            _HELPER.close()
        _HELPER = CompileProcess(tasks)
        atexit.register(_HELPER.close)          # the child ends (and is waited for) with us
    err = _HELPER.compile(template, entry, slp, params)
    if err:
        log.warning("smalltc: the compile process did not build %s (%s); compiling here",
                    entry, err)


def load_kernel(template: str, entry: str, slp: bool = True, _here: bool = False, **params):
    """The compiled function ``entry`` of ``template`` rendered with ``params``.

    Returns ``(function, seconds)``: seconds spent importing (compiling, or
    loading Numba's disk cache; with ``SMALLTC_COMPILE_PROCESS``, the compile
    process's time too) on the first request, 0.0 on later ones.
    """
    key = (template, entry, slp, repr(sorted(params.items())))
    with _LOCK:
        hit = _KERNELS.get(key)
        if hit is not None:
            return hit, 0.0
        # (a kernel without Numba's disk cache, numba_cache=False, has nothing to load)
        tasks = 0 if _here or not params.get("numba_cache", True) else _compile_process_tasks()
        source = render(template, entry=entry, **params)
        digest = hashlib.sha256(
            f"{CODEGEN_VERSION}|{_INTRINSICS}|{numba.__version__}|{slp}|{source}".encode()).hexdigest()[:16]
        path = cache_dir() / f"{entry}_{digest}.py"
        try:
            _write(path, source)
        except OSError as err:   # read-only home: a private temporary directory
            fallback = Path(tempfile.gettempdir()) / f"smalltc-{os.getuid()}" / "cpu"
            log.warning("smalltc: cannot write %s (%s); using %s", path, err, fallback)
            path = fallback / path.name
            _write(path, source)
        modname = f"_smalltc_cpu_{entry}_{digest}"
        t0 = time.perf_counter()
        # (the compile process, _here, builds for a caller that holds the lock already)
        with _compiling(path) if params.get("numba_cache", True) and not _here \
                else nullcontext():
            if tasks and not _in_numba_cache(path):
                _compile_elsewhere(template, entry, slp, params, tasks)
            try:
                with _vectoriser_flags(slp):
                    spec = importlib.util.spec_from_file_location(modname, path)
                    module = importlib.util.module_from_spec(spec)
                    sys.modules[modname] = module
                    spec.loader.exec_module(module)
            except Exception as err:
                sys.modules.pop(modname, None)
                raise CompileError(f"compiling {entry} from {path} (template {template}, "
                                   f"params {params}) failed: {err}") from err
        seconds = time.perf_counter() - t0
        fn = getattr(module, entry)
        compile_log.append((entry, seconds))
        log.info("smalltc: cpu kernel %s ready in %.2f s (%s)", entry, seconds, path)
        _KERNELS[key] = fn
        return fn, seconds
