"""The layout family: batched GEMM and kernels (8a)/(8b), and the generic kernel.

``gemm.cu.j2`` computes ``Out = alpha * X . Y (+ beta * C)`` for one item per
group of threads, reading X and Y through the index formulas of (8a)/(8b)
(docs/math.md section 3), so a GEMM with any transposes and every action step on any
index run without transposes. Each item is staged in shared memory; a thread
computes a ``thr_m x thr_n`` register tile; a block holds ``per_block`` items.
``prefetch`` = 1 double-buffers the per-item operands with ``cp.async``
(``cp_async.cuh.j2``) and lets blocks loop over groups. ``generic.cu.j2``
takes every extent at run time: the path for what no specialised kernel fits,
reported as ``specialized=False``.

=================  ==========================  ===================================
spec               template                    entry point (example)
=================  ==========================  ===================================
GemmSpec           ``gemm.cu.j2`` (8a layout)  ``stc_gemm_nn_f64_m8n8k8``
ContractSpec 8a/b  ``gemm.cu.j2``              ``stc_contract8b_f64_i3s3j4k4l1``
anything too big   ``generic.cu.j2``           ``stc_generic8a_f64`` (run-time sizes)
=================  ==========================  ===================================

The heuristic (:func:`layout_ctx`) was measured on an H100 (notes/cuda.md,
sweep 1); tuning parameters ``dim_x, dim_y, per_block, prefetch``.
"""
from __future__ import annotations

import math

import numpy as np

from .family import (DEFAULT_DEVICE, DT, ITEMSIZE, MAX_THREADS, MIN_THREADS, POW2,
                     SCALAR_FMT, SMEM_TARGET, THREADS, Choice, Family, KernelExecutor, even)

__all__ = ["LAYOUT", "LayoutFamily", "layout_ctx", "generic_ctx", "gemm_extents",
           "generic_executor", "MAX_UNROLLED"]

#: largest extent a specialised layout kernel unrolls (above: generic kernel)
MAX_UNROLLED = 128
#: outputs per thread in the GEMM register tile, at most (search space)
MAX_TILE = 32
#: the prefetch form is searched from this many outputs per item on (below, an item's
#: arithmetic is too short to hide the next group's loads behind), and only where C is
#: read (beta != 0): with beta = 0 its best variant ran 2-10% slower than the best plain
#: one at every square GEMM n = 8..23, float64 and float32, on an H100 (notes/tuning.md)
PREFETCH_FROM_MN = 64


def gemm_extents(spec):
    """A GemmSpec as a (8a) layout contraction: dict(I, S, J, K, L)."""
    m, n, k = spec.m, spec.n, spec.k
    x = (1, k, m) if spec.trans_a else (m, k, 1)
    y = (n, k, 1) if spec.trans_b else (1, k, n)
    return dict(I=x[0], S=k, J=x[2], K=y[0], L=y[2])


def _extents(spec):
    if spec.op == "gemm":
        return gemm_extents(spec)
    return dict(I=spec.i, S=spec.s, J=spec.j, K=spec.k, L=spec.l)


def layout_ctx(kind, I, S, J, K, L, dtype, shared_x, shared_y, beta_zero=True,
               smem_optin=227 * 1024, params=None):
    """Context of ``gemm.cu.j2`` (kinds 8a/8b and GEMM), or None when it does not fit.

    Heuristic: outputs per thread grow with the item's output size (1 up to
    8x8, 8 above 24x24); threads per item cover the output in a DIM_X x DIM_Y
    grid whose x axis runs along the output's contiguous index; items per
    block fill 256 threads, within the shared-memory target.

    ``params`` (a tuning table's answer): ``dim_x``, ``dim_y``, ``per_block`` and
    ``prefetch`` (1: the per-item operands double-buffered, the next group's copied
    by cp.async while this group computes; blocks loop over groups).

    >>> c = layout_ctx("8a", 32, 32, 1, 1, 32, "float64", False, False, beta_zero=False,
    ...                params=dict(dim_x=16, dim_y=8, per_block=1, prefetch=1))
    >>> c["prefetch"], c["smem_bytes"]          # two sets of A and B: 4 * 32 * 32 * 8 bytes
    (1, 32768)
    """
    s = ITEMSIZE[dtype]
    M, N = I * J, K * L
    if max(M, N, S) > MAX_UNROLLED:
        return None
    fast, slow = (N, M) if kind == "8a" else (M, N)
    mn = M * N
    if params is None:
        # measured on H100 (notes/cuda.md, "The launch-shape sweep"): n=10 best at 10x3
        # threads x 4 items, n=16 at 8x8 x 2, n=32 at 16x8 x 1: 4-8 outputs per thread,
        # ~128 threads per block
        per_thread = 1 if mn <= 64 else 4 if mn <= 576 else 8
        thr_fast = 2 if per_thread >= 4 and fast >= 16 else 1
        thr_slow = max(1, min(slow, per_thread // thr_fast))
        dim_x, dim_y = math.ceil(fast / thr_fast), math.ceil(slow / thr_slow)
        while dim_x * dim_y > 512 and dim_y > 1:
            thr_slow *= 2
            dim_y = math.ceil(slow / thr_slow)
        nb = max(1, (THREADS if per_thread == 1 else THREADS // 2) // (dim_x * dim_y))
    else:
        dim_x, dim_y, nb = params["dim_x"], params["dim_y"], params["per_block"]
        thr_fast, thr_slow = math.ceil(fast / dim_x), math.ceil(slow / dim_y)
    prefetch = int(params.get("prefetch", 0)) if params else 0
    if prefetch not in (0, 1) or (prefetch and shared_x and shared_y):
        return None
    xs, ys = I * S * J, K * S * L
    nbuf = 2 if prefetch else 1              # cp.async double buffer of the per-item operands

    def smem(nb):
        return s * (even(xs if shared_x else nbuf * nb * xs) + (ys if shared_y else nbuf * nb * ys))

    if params is None:
        while nb > 1 and smem(nb) > SMEM_TARGET:
            nb -= 1
    if smem(nb) > smem_optin or dim_x * dim_y * nb > 1024:
        return None
    thr_m, thr_n = (thr_slow, thr_fast) if kind == "8a" else (thr_fast, thr_slow)
    return dict(kind=kind, I=I, S=S, J=J, K=K, L=L, dtype=dtype, shared_x=bool(shared_x),
                shared_y=bool(shared_y), beta_zero=bool(beta_zero), dim_x=dim_x, dim_y=dim_y,
                thr_m=thr_m, thr_n=thr_n, per_block=nb, threads=dim_x * dim_y * nb,
                smem_bytes=smem(nb), BLK_M=M, BLK_N=N, BLK_K=S, min_blocks=0, prefetch=prefetch)


def generic_ctx(kind, dtype, beta_zero=True):
    """Context of ``generic.cu.j2`` (run-time sizes)."""
    return dict(kind=kind, dtype=dtype, beta_zero=bool(beta_zero), per_block=1,
                threads=THREADS, smem_bytes=0, min_blocks=0)


def _covers(extent):
    """For each outputs-per-thread count t, the fewest threads ceil(extent / t)."""
    return sorted({math.ceil(extent / t) for t in range(1, extent + 1)})


class LayoutFamily(Family):
    """GEMM and kernels (8a)/(8b) through ``gemm.cu.j2``; see the module docstring."""

    name = "layout"
    templates = ("gemm.cu.j2",)
    params = ("dim_x", "dim_y", "per_block", "prefetch")
    optional = {"prefetch": 0}
    #: GEMM/layout kernels take a factor 2 at most: on the H100 square-GEMM entries carried
    #: 4x along one extent (m=4 n=8 k=16, m=8 n=16 k=4 from m=n=k=8) lost 2-14% in 5 of 9
    #: cases (tuned against untuned bench, 2026-11-21)
    max_distance = 1.0

    def claims(self, spec):
        return spec.op == "gemm" or (spec.op == "contract" and spec.kind in ("8a", "8b"))

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        if spec.op == "gemm":
            return layout_ctx("8a", **gemm_extents(spec), dtype=spec.dtype,
                              shared_x=spec.shared_a, shared_y=spec.shared_b,
                              beta_zero=spec.beta_zero, smem_optin=device["smem_optin"],
                              params=params)
        return layout_ctx(spec.kind, **_extents(spec), dtype=spec.dtype,
                          shared_x=spec.shared_x, shared_y=spec.shared_y,
                          smem_optin=device["smem_optin"], params=params)

    def entry(self, spec, ctx):
        dt = DT[spec.dtype]
        if spec.op == "gemm":
            t = ("t" if spec.trans_a else "n") + ("t" if spec.trans_b else "n")
            sh = ("_sa" if spec.shared_a else "") + ("_sb" if spec.shared_b else "")
            return (f"stc_gemm_{t}_{dt}_m{spec.m}n{spec.n}k{spec.k}{sh}"
                    f"{'' if spec.beta_zero else '_beta'}")
        sh = ("_sx" if spec.shared_x else "") + ("_sy" if spec.shared_y else "")
        return (f"stc_contract{spec.kind}_{dt}_i{spec.i}s{spec.s}j{spec.j}"
                f"k{spec.k}l{spec.l}{sh}")

    def executor(self, choice, device):
        return LayoutExecutor(choice, device)

    @staticmethod
    def axes(spec):
        """``(kind, fast, slow)`` extents: the x threads run along ``fast``."""
        e, kind = _extents(spec), ("8a" if spec.op == "gemm" else spec.kind)
        M, N = e["I"] * e["J"], e["K"] * e["L"]
        return (kind, N, M) if kind == "8a" else (kind, M, N)

    def space(self, spec):
        """Threads ``dim_x x dim_y`` covering the output with each outputs-per-thread count,
        items per block 1, 2, 4, ... 1024; ``prefetch`` 0, 1 for GEMM with beta != 0 from
        :data:`PREFETCH_FROM_MN` outputs per item. Pruned: ``tile`` (more than
        :data:`MAX_TILE` outputs per thread), ``threads`` (outside 64..1024 per block)."""
        _, fast, slow = self.axes(spec)
        prefetch = (0, 1) if (fast * slow >= PREFETCH_FROM_MN and spec.op == "gemm"
                              and not spec.beta_zero) else (0,)
        for dx in _covers(fast):
            for dy in _covers(slow):
                tile = math.ceil(fast / dx) * math.ceil(slow / dy)
                for nb in POW2:
                    threads = dx * dy * nb
                    why = ("tile" if tile > MAX_TILE else
                           "threads" if not MIN_THREADS <= threads <= MAX_THREADS else None)
                    for pf in prefetch:
                        yield dict(dim_x=dx, dim_y=dy, per_block=nb, prefetch=pf), why

    def carry(self, spec, entry_spec, params, device):
        """The same outputs per thread along each axis and threads per block."""
        _, f0, s0 = self.axes(entry_spec)
        _, f1, s1 = self.axes(spec)
        tf = min(math.ceil(f0 / params["dim_x"]), f1)
        ts = min(math.ceil(s0 / params["dim_y"]), s1)
        dx, dy = math.ceil(f1 / tf), math.ceil(s1 / ts)
        threads = params["dim_x"] * params["dim_y"] * params["per_block"]
        nb = max(1, min(round(threads / (dx * dy)), MAX_THREADS // (dx * dy)))
        if dx * dy > MAX_THREADS:
            return None
        return self.first_valid(spec, dict(dim_x=dx, dim_y=dy, per_block=nb), device)


LAYOUT = LayoutFamily()


class LayoutExecutor(KernelExecutor):
    """``Out = alpha * X . Y (+ beta * C)`` over the batch; C is ``out`` when not read."""

    def __init__(self, choice, device):
        super().__init__(choice, device)
        self.nbatch = choice.spec.batch
        s = SCALAR_FMT[self.ctx["dtype"]]
        self._fmt = "PPPP" + s + s + "q"     # X, Y, Out, C, alpha, beta, nbatch

    def run(self, operands, out, alpha=1.0, beta=0.0):
        X, Y = operands[0], operands[1]
        C = operands[2] if len(operands) > 2 and operands[2] is not None else out
        d = self._direct(self._fmt, self.nbatch)
        if d is not None:
            try:
                d(X.data.ptr, Y.data.ptr, out.data.ptr, C.data.ptr, alpha, beta, self.nbatch)
                return
            except OverflowError:                # a float32 alpha/beta beyond float32:
                pass                             # RawKernel's conversion gives inf, as NumPy
        self._launch(self.nbatch, (X, Y, out, C, self._scal(alpha), self._scal(beta)))


class GenericExecutor(KernelExecutor):
    """``generic.cu.j2``: every extent and batch stride passed at run time."""

    def __init__(self, choice, device, extents, strides):
        super().__init__(choice, device, specialized=False)
        self.nbatch, self._ext, self._strides = choice.spec.batch, extents, strides

    def run(self, operands, out, alpha=1.0, beta=0.0):
        X, Y = operands[0], operands[1]
        C = operands[2] if len(operands) > 2 and operands[2] is not None else out
        e = self._ext
        args = (X, Y, out, C, self._scal(alpha), self._scal(beta))
        args += tuple(np.int32(e[k]) for k in "ISJKL") + tuple(np.int64(s) for s in self._strides)
        total = self.nbatch * e["I"] * e["J"] * e["K"] * e["L"]
        self._launch(self.nbatch, args, ngroups=math.ceil(total / self.threads))


def generic_executor(spec, device):
    """The run-time-sized kernel for a GEMM or any contraction (8a), (8b), (9)."""
    if spec.op == "gemm":
        kind, beta_zero = "8a", spec.beta_zero
        strides = (0 if spec.shared_a else spec.m * spec.k, 0 if spec.shared_b else spec.k * spec.n)
    else:
        kind, beta_zero = spec.kind, True
        xs = spec.s * spec.i if spec.kind == "9" else spec.i * spec.s * spec.j
        strides = (0 if spec.shared_x else xs, 0 if spec.shared_y else spec.k * spec.s * spec.l)
    ctx = generic_ctx(kind, spec.dtype, beta_zero)
    entry = f"stc_generic{kind}_{DT[spec.dtype]}{'' if beta_zero else '_beta'}"
    choice = Choice(LAYOUT, spec, "generic.cu.j2", entry, ctx, "generic", None)
    return GenericExecutor(choice, device, _extents(spec), strides)
