"""Kernel parameters (tile sizes, thread layout, items per block) for the CUDA backend.

Pure Python, no device: the heuristics here are what runs when no tuning
table answers, and they are what the template tests render. The autotuner
(``smalltc.tuning``) overrides them with :func:`set_table_lookup`: a callable
``lookup(spec, device_cc) -> dict | None``; a dict it returns replaces the
heuristic's parameters and the executor's ``source`` becomes ``"table"``.

Every function returns the *rendering context* of one template: sizes and
parameters, all compile-time constants in the kernel, plus ``threads``,
``per_block`` and ``smem_bytes`` for the launch.
"""
from __future__ import annotations

import math

__all__ = ["layout_ctx", "contract9_ctx", "fold_k9", "bb_stride", "generic_ctx", "action_ctx",
           "action_line_ctx", "action_template", "assembly_ctx", "gemm_extents",
           "set_table_lookup", "get_table_lookup", "on_table_change", "lookup", "ITEMSIZE", "SMEM_TARGET"]

ITEMSIZE = {"float64": 8, "float32": 4}
#: shared memory a block aims to stay under (several blocks per multiprocessor)
SMEM_TARGET = 48 * 1024
#: largest extent a specialised layout kernel unrolls (above: generic kernel)
MAX_UNROLLED = 128
THREADS = 256

_LOOKUP = None
_DEFAULT_INSTALLED = False


def _install_default():
    """On first use, consult the shipped tuning tables (``smalltc.tuning``).

    ``SMALLTC_TUNING=off`` (read by the tuning package) turns them off; a
    lookup set with :func:`set_table_lookup` before this runs is kept.
    """
    global _DEFAULT_INSTALLED
    _DEFAULT_INSTALLED = True
    if _LOOKUP is None:
        try:
            from smalltc.tuning import install
        except ImportError:        # tuning package absent: heuristics only
            return
        install()


def get_table_lookup():
    """The ``lookup(spec, cc)`` callable in effect (the shipped tables by default), or None.

    Installs the default first, so that a caller who swaps in its own lookup
    and restores this one afterwards (the autotuner) does not have the default
    installed behind its back in between.
    """
    if not _DEFAULT_INSTALLED:
        _install_default()
    return _LOOKUP


def set_table_lookup(fn):
    """Install ``fn(spec, cc) -> dict | None`` (the autotuner's table); None removes it.

    A change drops the cached plans (:func:`on_table_change`): a plan built before it
    holds the kernel the old lookup chose.
    """
    global _LOOKUP
    if fn is not _LOOKUP:
        _LOOKUP = fn
        for hook in _ON_CHANGE:
            hook()


_ON_CHANGE = []


def on_table_change(hook):
    """Call ``hook()`` whenever :func:`set_table_lookup` installs another lookup."""
    _ON_CHANGE.append(hook)


def lookup(spec, cc):
    """Parameters from the installed table for ``spec`` on compute capability ``cc``."""
    if not _DEFAULT_INSTALLED:
        _install_default()
    return None if _LOOKUP is None else _LOOKUP(spec, cc)


def _even(n):
    return n + (n % 2)


def gemm_extents(spec):
    """A GemmSpec as a (8a) layout contraction: dict(I, S, J, K, L)."""
    m, n, k = spec.m, spec.n, spec.k
    x = (1, k, m) if spec.trans_a else (m, k, 1)
    y = (n, k, 1) if spec.trans_b else (1, k, n)
    return dict(I=x[0], S=k, J=x[2], K=y[0], L=y[2])


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
        # measured on H100 (notes/cuda.md, sweep 1): n=10 best at 10x3 threads x 4 items,
        # n=16 at 8x8 x 2, n=32 at 16x8 x 1: 4-8 outputs per thread, ~128 threads per block
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
        return s * (_even(xs if shared_x else nbuf * nb * xs) + (ys if shared_y else nbuf * nb * ys))

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


def contract9_ctx(S, N, K, L, dtype, smem_optin=227 * 1024, params=None):
    """Context of ``contract9.cu.j2``, or None when one item does not fit."""
    s = ITEMSIZE[dtype]
    if max(S, N, K * L) > 4 * MAX_UNROLLED or S > MAX_UNROLLED:
        return None
    ys, os_ = K * S * L, K * N * L * N
    nb = params["per_block"] if params else max(1, min(64, math.ceil(1024 / os_)))
    sb = bb_stride(S, N, s)

    def smem(nb):
        return s * (_even(N * N * sb) + nb * ys)

    while params is None and nb > 1 and smem(nb) > SMEM_TARGET:
        nb -= 1
    if smem(nb) > smem_optin:
        return None
    return dict(kind="9", S=S, N=N, K=K, L=L, SB=sb, dtype=dtype, per_block=nb, threads=THREADS,
                smem_bytes=smem(nb), unroll=min(8, math.ceil(nb * os_ / THREADS)), min_blocks=0)


def bb_stride(S, N, itemsize):
    """Row stride (in items) of kernel (9)'s ``BB(i, j, :)`` table in shared memory.

    In one load instruction a warp reads row ``(i, j)`` for up to N different j
    (the output's fastest index). Rows S items apart start on banks S*itemsize/4
    apart; at S*itemsize = 64 bytes (float64 S = 8, float32 S = 16) or 32 bytes
    (float32 S = 8) the N rows fall on two or four banks and the loads replay
    (step (2c) p = 6, float64: 30% of its bound, S = 7 next to it: 89%). The
    stride is the smallest one from S on whose N rows use distinct banks,
    stepping by whole 16-byte vectors when S allows 128-bit loads, so they stay.

    >>> bb_stride(8, 7, 8), bb_stride(7, 6, 8), bb_stride(8, 7, 4), bb_stride(6, 5, 8)
    (10, 7, 12, 6)
    """
    vec = 16 if (S * itemsize) % 16 == 0 else itemsize    # bytes one load reads per row
    step = vec // itemsize
    words = vec // 4
    allowed = max(1, math.ceil(N * words / 32))
    for sb in range(S, S + 8 * step + 1, step):
        banks = [0] * 32
        for j in range(N):
            for w in range(words):
                banks[(j * sb * itemsize // 4 + w) % 32] += 1
        if max(banks) <= allowed:
            return sb
    return S


def fold_k9(spec):
    """The kernel-(9) spec that runs ``spec``: ``spec`` itself, or with K folded into the batch.

    ``A[b](k,i,l,j)`` needs only the slab ``C[b](k,:,:)``, and k is the slowest
    index of both C and the output, so element b of K slabs is K consecutive
    elements of one slab each: the same memory read as ``(batch*K, 1, S, L)``
    in, ``(batch*K, 1, N, L, N)`` out. When one item's ``K*L`` is past what
    :func:`contract9_ctx` unrolls (3D assembly step (2c) from p = 4 on: K = L =
    (p+2)^2), the folded spec keeps the specialised kernel instead of the
    generic one (notes/cuda_step2c.md). Other specs come back unchanged.

    >>> from smalltc.spec import ContractSpec
    >>> s = ContractSpec(kind="9", batch=10, i=5, s=6, j=5, k=36, l=36, dtype="float64",
    ...                  shared_x=True)
    >>> f = fold_k9(s); (f.batch, f.k, f.l)
    (360, 1, 36)
    >>> fold_k9(f.with_batch(1)) == f.with_batch(1)
    True
    """
    if (spec.op != "contract" or spec.kind != "9" or not spec.shared_x or spec.shared_y
            or spec.k == 1 or spec.k * spec.l <= 4 * MAX_UNROLLED):
        return spec
    from dataclasses import replace
    return replace(spec, k=1, batch=spec.batch * spec.k)


def generic_ctx(kind, dtype, beta_zero=True):
    """Context of ``generic.cu.j2`` (run-time sizes)."""
    return dict(kind=kind, dtype=dtype, beta_zero=bool(beta_zero), per_block=1,
                threads=THREADS, smem_bytes=0, min_blocks=0)


#: (dim, nd, nq) -> (items per block, min_blocks): sweep points far better than the
#: rule below (notes/cuda.md, sweep 2: nd=6 nq=6 at 62.5% of its bound vs 23.8%)
_ACTION_MEASURED = {(3, 6, 6): (3, 4)}


def action_ctx(dim, nd, nq, ncomp, dtype, smem_optin=227 * 1024, params=None):
    """Context of ``action.cu.j2`` (``action_rb.cu.j2`` when ``rb > 1``), or None when
    one item does not fit in shared memory.

    T = max(nd, nq); an item gets T*T threads in 3D, T in 2D and 1D, and two
    T^dim buffers; items per block fill 256 threads within the target.

    ``params`` (a tuning table's answer): ``per_block``, ``min_blocks`` and
    ``rb``, the outputs each thread computes along the contracted axis of
    the x and y steps (register blocking; missing means 1, today's kernel).
    An item then has T*TB threads in 3D and TB in 2D, TB = ceil(T / rb);
    ``rb`` is normalised to ceil(T / TB), the fewest outputs per thread
    that TB threads need (rb = 4 at T = 5 is rb = 3). 1D has no rb > 1.
    The heuristic (no params) takes rb = 1.

    ``line`` = 1 (3D only; the heuristic's choice from T = 5 on): the *line* form,
    ``action_line.cu.j2`` (:func:`action_line_ctx`).
    """
    s = ITEMSIZE[dtype]
    T = max(nd, nq)
    line = (params.get("line", 0) if params else int(dim == 3 and T >= LINE_FROM_T))
    if line:
        return action_line_ctx(dim, nd, nq, ncomp, dtype, smem_optin, params)
    rb = params.get("rb", 1) if params else 1
    if rb < 1 or (dim == 1 and rb > 1):
        return None
    tb = math.ceil(T / rb)
    rb = math.ceil(T / tb)
    tpi = T * tb if dim == 3 else tb
    # measured on H100, 3D float64 (notes/cuda.md, sweep 1): T <= 4 best at ~128 threads;
    # from T = 5 on, a register cap (min_blocks) for ~768 resident threads per SM;
    # from T = 8 on, ~128 threads per block as well.
    ne = max(1, (THREADS // 2 if T <= 4 or T >= 8 else THREADS) // tpi)
    min_blocks = 0 if T <= 4 else min(6, math.ceil(768 / (ne * tpi)))
    if (dim, nd, nq) in _ACTION_MEASURED and dtype == "float64":
        ne, min_blocks = _ACTION_MEASURED[dim, nd, nq]
    if params:
        ne, min_blocks = params["per_block"], params.get("min_blocks", 0)

    def smem(ne):
        return s * (_even(nq * nd) + ne * (2 * T ** dim + 1))

    while params is None and ne > 1 and smem(ne) > SMEM_TARGET:
        ne -= 1
    if smem(ne) > smem_optin or tpi * ne > 1024:
        return None
    return dict(dim=dim, nd=nd, nq=nq, ncomp=ncomp, dtype=dtype, T=T, tpi=tpi, per_block=ne,
                threads=tpi * ne, smem_bytes=smem(ne), min_blocks=min_blocks, rb=rb, tb=tb,
                line=0, prefetch=0)


#: the 3D action's heuristic takes the line form from this T = max(nd, nq) on: on an H100
#: it ran 1.13-1.46x the *tuned* register-blocked kernels at p = 5..8, float64, and lost
#: at p = 1 (0.77-0.86); notes/cuda.md, "Session 4"
LINE_FROM_T = 5

#: the line form's default ``prefetch``: 1 (V and D of the next group in registers) ran
#: 1.18-1.49x the plain line form (0) at the heuristic's own per_block, on an H100 at 3D
#: p = 4..8, nq = p+1, float64 (notes/cuda.md, "Session 5")
LINE_PREFETCH = 1


def action_line_ctx(dim, nd, nq, ncomp, dtype, smem_optin=227 * 1024, params=None):
    """Context of ``action_line.cu.j2``, the 3D action's *line* form, or None.

    Every step is done by whole 1D lines (a thread loads a line into registers and
    computes every output along the contracted axis) with B1d in the constant bank,
    so an FMA takes its B operand from there: about nd FMAs per shared-memory load
    instead of one. An item has TT*T threads (TT: T rounded up to odd, the line
    stride: conflict-free banks) and two T*T*TT buffers. ``params``: ``per_block``,
    ``min_blocks`` and ``prefetch``: 1, the next group's V and D are loaded into
    registers during the current group's steps (blocks loop over groups); 2, the
    same with V copied straight into a third shared buffer by ``cp.async``; 0, no
    overlap. The heuristic fills ~160 threads, prefetch :data:`LINE_PREFETCH`.

    >>> c = action_line_ctx(3, 8, 9, 1, "float64")
    >>> c["T"], c["TT"], c["tpi"], c["per_block"], c["line"], c["prefetch"]
    (9, 9, 81, 2, 1, 1)
    >>> c["istr"], action_line_ctx(3, 8, 9, 1, "float64", params=dict(per_block=2, prefetch=2))["istr"]
    (1459, 2187)
    >>> action_line_ctx(2, 8, 9, 1, "float64") is None        # 3D only
    True
    """
    if dim != 3:
        return None
    s = ITEMSIZE[dtype]
    T = max(nd, nq)
    TT = T | 1
    tpi = TT * T
    buf = T * T * TT
    ne = max(1, round(160 / tpi))
    min_blocks, prefetch = 0, LINE_PREFETCH
    if params:
        ne, min_blocks = params["per_block"], params.get("min_blocks", 0)
        prefetch = params.get("prefetch", 0)
    if prefetch not in (0, 1, 2):
        return None
    nbuf = 3 if prefetch == 2 else 2         # the cp.async form stages V in a third buffer
    istr = nbuf * buf + 1 - (nbuf * buf) % 2     # odd: items start on different banks
    smem = s * (ne * istr + 1)
    if ne < 1 or smem > smem_optin or tpi * ne > 1024:
        return None
    return dict(dim=dim, nd=nd, nq=nq, ncomp=ncomp, dtype=dtype, T=T, TT=TT, istr=istr,
                tpi=tpi, per_block=ne, threads=tpi * ne, smem_bytes=smem,
                min_blocks=min_blocks, rb=1, tb=T, line=1, prefetch=prefetch)


def action_template(ctx):
    """The template of an action context: ``action_rb.cu.j2`` for rb > 1,
    ``action_line.cu.j2`` for the line form."""
    if ctx.get("line"):
        return "action_line.cu.j2"
    return "action.cu.j2" if ctx["rb"] == 1 else "action_rb.cu.j2"


def assembly_ctx(dim, nd, nq, dtype, smem_optin=227 * 1024, params=None):
    """Context of ``assembly.cu.j2``, or None when one unit does not fit.

    A unit is (element, i1) in 2D/3D and an element in 1D; units per block
    aim at ~2048 outputs per block of 256 threads.

    ``params``: ``per_block`` (units per block) and, 3D only, ``rows``: 0 (or
    absent) for the flat final stage (every thread any output, 256 threads),
    R >= 1 for the *rows* form: ``nd^3 * R`` threads, thread (i3, j2, j3)
    keeps ``BB(i3, j3, :)`` in registers and walks R-strided rows (unit, i2,
    j1), one shared load per FMA instead of two; ``pad`` = 1: rows of BB and
    A2 an odd stride (nq + 1) apart when nq is even, against bank conflicts
    (both not yet measured on a GPU; the heuristic keeps rows 0, pad 0).
    """
    s = ITEMSIZE[dtype]
    out_u = nd ** (2 * dim - 1) if dim > 1 else nd * nd
    a1u = nd * nq ** (dim - 1) if dim > 1 else 0
    nu = params["per_block"] if params else max(1, min(64, math.ceil(2048 / out_u)))
    rows = int((params or {}).get("rows", 0) or 0)
    # pad: BB and A2 rows nq + 1 apart when nq is even (odd stride: no bank conflicts
    # between the rows that the lanes of a warp read); nothing to do for odd nq
    pad = int(bool((params or {}).get("pad", 0)) and nq % 2 == 0)
    nqp = nq + pad
    a2u = nd ** 3 * nqp if dim == 3 else 0
    bb = _even(nd * nd * nqp)
    threads = THREADS
    if rows:
        threads = nd ** 3 * rows
        if dim != 3 or rows < 0 or threads > 1024:
            return None

    def smem(nu):
        return s * (bb + nu * (a1u + a2u))

    while params is None and nu > 1 and smem(nu) > SMEM_TARGET:
        nu -= 1
    if smem(nu) > smem_optin:
        return None
    return dict(dim=dim, nd=nd, nq=nq, dtype=dtype, out_u=out_u, bb_pad=bb, per_block=nu,
                threads=threads, smem_bytes=smem(nu), unroll=4, min_blocks=0, rows=rows,
                pad=pad, nqp=nqp, nqs="NQP" if pad else "NQ", a2s="A2P" if pad else "A2U")
