"""The CPU kernels' threads, and the BLAS threads beside them.

The CPU kernels split their work statically over ``numba.get_num_threads()``
threads (one per core by default; ``SMALLTC_NUM_THREADS`` sets it at import,
:func:`smalltc.backends.cpu.set_num_threads` later). A static split waits for
its slowest thread, so it needs every core.

A multithreaded BLAS (OpenBLAS, which NumPy ships; MKL; BLIS) keeps its worker
threads spinning for a while after each call (OpenBLAS: 2^28 cycles, about
0.1 s, unless ``OPENBLAS_THREAD_TIMEOUT`` was set before it loaded). A
smalltc call within that time has one core fewer than threads: the kernel's
thread on the busy core waits for the scheduler (milliseconds), and the call
runs several times slower than with one thread. Measured on the 2-core
development machine (AMD EPYC, AVX2; ``fem.cg`` on 35,937 DoFs at p = 4,
Jacobi-CG per iteration, medians of 5 solves of 40 iterations): 1.75 ms with
two threads against 0.78 ms with one (``fused=False``, an ``np.vdot`` between
the kernels: 18.5 against 0.56 ms); the mass operator after a 200 x 200
``A @ A``: 4.0 ms against 0.30 ms back to back. Limiting OpenBLAS to one
thread *during* smalltc's calls (``threadpoolctl``) does not help (its
spinning worker is already running); Numba's ``workqueue`` layer is as slow
(1.3-1.6 ms), and ``OMP_WAIT_POLICY=passive`` halves the loss only.

So, while its CPU kernels use more than one thread, smalltc limits the BLAS
libraries loaded in the process to one thread (through ``threadpoolctl``),
from the first CPU kernel it builds on: the workers then sleep for good, and
smalltc's kernels keep all the cores (the same solve: 0.45 ms per iteration,
``fused=False`` 0.51 ms; the operator after ``A @ A``: 0.46 ms). The process's
large BLAS calls (a matrix product of thousands) then run on one core:
``SMALLTC_BLAS_THREADS=N`` asks for N threads instead, ``keep`` leaves the BLAS
alone (then set ``OPENBLAS_THREAD_TIMEOUT=4`` before NumPy loads).

The same happens with the kernels' own OpenMP workers (Numba's ``omp`` layer,
GNU OpenMP): after each parallel region they spin-wait for the next, and where
the machine has fewer free cores than threads (another process running, as on a
shared machine) the spinning worker takes the core the calling thread needs; a
loop alternating kernels (CG: the operator, ``p.Ap``, the updates) then paid a
scheduler time slice, 12 ms, per parallel region (a CG iteration 100x slower
with two threads than with one, load ~6 on 2 cores). Waiting passively
(``OMP_WAIT_POLICY=passive``) removes it: so smalltc sets that at import where it
is not set (``SMALLTC_OMP_WAIT_POLICY=keep`` leaves it; it takes effect where
OpenMP starts after smalltc's import, as Numba's does at its first parallel
kernel).

Examples
--------
>>> from smalltc.backends.cpu import threads
>>> threads.blas_policy({"SMALLTC_BLAS_THREADS": "keep"}, 2) is None
True
>>> threads.blas_policy({}, 2), threads.blas_policy({}, 1)
(1, None)
"""
from __future__ import annotations

import logging
import os
import threading

__all__ = ["blas_policy", "coordinate", "blas_threads", "passive_openmp"]

log = logging.getLogger("smalltc")
_LOCK = threading.Lock()
_DONE: set = set()            # (library path, limit) pairs already set


def passive_openmp(environ=os.environ):
    """Set ``OMP_WAIT_POLICY=passive`` where neither it nor ``GOMP_SPINCOUNT`` is set and
    ``SMALLTC_OMP_WAIT_POLICY`` is not ``keep`` (called when the CPU backend is imported);
    returns the policy OpenMP will read.

    >>> passive_openmp({}), passive_openmp({"OMP_WAIT_POLICY": "active"})
    ('passive', 'active')
    >>> passive_openmp({"SMALLTC_OMP_WAIT_POLICY": "keep"}) is None
    True
    """
    if environ.get("SMALLTC_OMP_WAIT_POLICY", "").strip().lower() == "keep":
        return environ.get("OMP_WAIT_POLICY")
    if "OMP_WAIT_POLICY" not in environ and "GOMP_SPINCOUNT" not in environ:
        environ["OMP_WAIT_POLICY"] = "passive"
    return environ.get("OMP_WAIT_POLICY")


def blas_policy(environ, numba_threads):
    """The BLAS thread count smalltc sets (None: leave the BLAS alone)."""
    want = environ.get("SMALLTC_BLAS_THREADS", "").strip().lower()
    if want == "keep":
        return None
    if want:
        try:
            n = int(want)
        except ValueError:
            raise ValueError(f"SMALLTC_BLAS_THREADS must be an integer or 'keep', got "
                             f"{want!r}") from None
        return max(1, n)
    return 1 if numba_threads > 1 else None


def coordinate():
    """Apply :func:`blas_policy` to the BLAS libraries loaded now (called when a CPU
    kernel is built: a library loaded later is limited at the next build)."""
    import numba
    limit = blas_policy(os.environ, numba.get_num_threads())
    if limit is None:
        return
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:                                  # pragma: no cover - a dependency
        return
    with _LOCK:
        ctl = ThreadpoolController().select(user_api="blas")
        todo = [lib for lib in ctl.lib_controllers
                if (lib.filepath, limit) not in _DONE or lib.num_threads != limit]
        for lib in todo:
            if lib.num_threads != limit:
                log.info("smalltc: %s limited to %d thread(s) while the CPU kernels run on "
                         "%d (SMALLTC_BLAS_THREADS)", lib.filepath, limit,
                         numba.get_num_threads())
                lib.set_num_threads(limit)
            _DONE.add((lib.filepath, limit))


def blas_threads():
    """``{library path: threads}`` of the BLAS libraries loaded in the process."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:                                  # pragma: no cover
        return {}
    return {lib.filepath: lib.num_threads
            for lib in ThreadpoolController().select(user_api="blas").lib_controllers}
