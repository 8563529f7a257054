"""Fused PCG iterations: the vector updates of an iteration in few passes.

:func:`smalltc.fem.cg` runs here for real float vectors (unless asked for the plain
loop), through :func:`smalltc.pcg_iterate` (the ``pcg`` kernel family of each
backend):

* GPU (CuPy vectors): the kernels of ``templates/cuda/cg.cu.j2``. Every scalar of
  the iteration (``rz``, ``pAp``, ``alpha``, ``beta``, the residual history, the
  stop flag) stays in a device array, so the host queues iterations without
  waiting. With None or a :class:`~smalltc.fem.solvers.Jacobi` preconditioner
  (``z = r / diag`` folded into the updates) it reads the state every
  ``check_every`` iterations; kernels after the stop return at once, so the iterate
  is the one the stop test chose, as if the host had checked every iteration. With
  any other preconditioner (a V-cycle, hundreds of launches or a graph an
  application) the host queues one iteration ahead of the device and reads each
  iteration's state from pinned memory behind it; it waits for the device only where
  the residuals' rate says the next iteration may stop.
* CPU (NumPy vectors): Numba loops, ``x``, ``r`` updated and ``r.r``, ``r.z``
  summed in one pass, ``p`` in another.

Per iteration, besides the operator: ``p.Ap`` (reads 2 vectors), the update
(reads x, r, p, Ap and the inverse diagonal, writes x and r: 7 passes), the new
direction (reads r, the inverse diagonal and p, writes p: 4 passes): 13 vector
passes, against 18 for the unfused NumPy/CuPy expressions of
:func:`smalltc.fem.solvers.cg` (``x += alpha p`` alone reads two and writes one).

Distributed (``red``: a :class:`smalltc.fem.distributed.Reducer`): each rank runs
the same iteration on its local part; on the CPU the scalars ``p.Ap`` and ``(r.r,
r.z)`` are summed across the ranks, on the GPU the per-block partial sums before
the one-block kernels reduce them, so every rank's device takes the same stop
decision.
"""

import smalltc

__all__ = ["iterate", "VECTOR_PASSES"]

#: vector reads + writes of one fused iteration besides the operator (see the docstring)
VECTOR_PASSES = 13


def iterate(apply, b, x, r, inv, tol, maxiter, bnorm, history, check_every=8, red=None,
            precond=None):
    """Iterate on flat views ``x``, ``r`` (``apply`` and ``precond`` take ``b``'s shape)
    until the stop test; returns ``(iterations, code, value)``: the stop code and the
    scalar that caused it. ``check_every``: GPU iterations between reads of the device
    state (Jacobi or no preconditioner)."""
    return smalltc.pcg_iterate(apply, x, r, inv, tol=tol, maxiter=maxiter, bnorm=bnorm,
                               history=history, shape=b.shape, check_every=check_every,
                               reducer=red, precond=precond)
