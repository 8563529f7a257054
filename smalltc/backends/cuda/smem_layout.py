"""The shared-memory layout model of the line-form action kernels (``qfunc.cuh.j2``'s line
steps): the strides of the line, plane and item buffers that the ``layout`` tuning
parameter "model" picks, by the bank wavefronts each step's accesses cost.

Examples
--------
>>> qfunc_line_layout(5, 7, 1, False, True, 8)           # the odd layout: no better one
(7, 7, 49, 1029)
"""
from __future__ import annotations

import functools

import numpy as np

__all__ = ["LAYOUTS", "qfunc_line_layout"]

#: the line form's shared-memory layout (tuning parameter ``layout``): "odd" (TT = LS = T
#: rounded up to odd, what every table entry without the parameter was measured with),
#: "model" (:func:`qfunc_line_layout`, the heuristics'). H200 (notes/cuda.md, "The line
#: form's shared-memory layout"): the model's won 15 of 16 fused diffusion sizes in the
#: tuner (BP5 p = 5 kept "odd"); with that table BP3 ran 1.02-1.19x at p = 1..6, BP5
#: 1.10-1.15x at p = 1..3, the fused mass operator (BP1) 1.11-1.41x at p = 1, 2
LAYOUTS = ("odd", "model")


#: the line layouts :func:`qfunc_line_layout` compares: line strides from T on, plane
#: strides from T * LS on, item strides from nbuf * BUF on, each over this many values
_LAYOUT_LS, _LAYOUT_PS, _LAYOUT_ISTR = 4, 4, 16


def _wavefronts(addr, active, itemsize):
    """Shared-memory wavefronts of one access by every thread of a block, for each layout
    candidate: ``addr`` (candidates, threads) word addresses, ``active`` (threads,).

    The model (checked against Nsight Compute on an H100, BP3 p = 2: 125.5 modelled load
    wavefronts an element against 123.4 measured, 34 against 31.6 of them conflicts): 8-byte
    words are served a half warp at a time by 16 banks of 8 bytes, 4-byte words a whole warp
    at a time by 32 banks; a wavefront serves one word per bank, a word read by several
    lanes once.
    """
    g = 16 if itemsize == 8 else 32
    nc, nt = addr.shape
    pad = -nt % 32
    a = np.where(active, addr, -1)
    if pad:
        a = np.concatenate([a, np.full((nc, pad), -1, a.dtype)], axis=1)
    a = np.sort(a.reshape(nc, -1, g), axis=-1)
    valid = a >= 0
    valid[..., 1:] &= a[..., 1:] != a[..., :-1]              # a word once
    groups = a.shape[1]
    key = ((np.arange(nc)[:, None, None] * groups + np.arange(groups)[None, :, None]) * g
           + a % g)
    counts = np.bincount(key[valid], minlength=nc * groups * g).reshape(nc, groups, g)
    return counts.max(axis=-1).sum(axis=-1)


def _layout_costs(nd, nq, per_block, colloc, qsmem, itemsize, nsym=6, mass=False):
    """Every layout :func:`qfunc_line_layout` compares, ``(wavefronts, TT, LS, PS, istr)``:
    the modelled shared-memory wavefronts of one group's steps."""
    T = max(nd, nq)
    nbuf = 2 if mass else 3                       # S0, S1 (mass); S0, S1, S2
    NDD = nd ** 3
    # the instructions of each (pattern, mask): Gauss (qfunc.cuh.j2 line_steps): x and x^T
    # on lines a < nd, c < nd, y and y^T on a < nd, c < nq, z and z^T on a < nq, c < nq;
    # "line": c PS + a LS (+ k), "point": c LS + a (+ q PS), "col": c PS + a (+ k LS)
    if mass:                                      # action_line.cu.j2's own steps
        uses = [("line", (nd, nd), 2 * nd), ("point", (nd, nd), 2 * nq),
                ("line", (nd, nq), 2 * nd), ("point", (nd, nq), 2 * nq),
                ("line", (nq, nq), 2 * nd)]
        qmask, nqr, qsmem = (nq, nq), 0, False
    elif colloc:
        n = nd
        uses = [("line", (nd, nd), 5 * n), ("col", (nd, nd), 5 * n), ("point", (nd, nd), 6 * n)]
        qmask, nqr = (nd, nd), 6 * n
    else:
        uses = [("line", (nd, nd), 2 * nd), ("point", (nd, nd), 4 * nq),
                ("line", (nd, nq), 4 * nd), ("point", (nd, nq), 6 * nq),
                ("line", (nq, nq), 6 * nd + 6 * nq)]
        qmask, nqr = (nq, nq), nsym * nq
    for TT in dict.fromkeys((T | 1, T)):
        tpi = TT * T
        nt = tpi * per_block
        tid = np.arange(nt)
        w, l = tid // tpi, tid % tpi
        a, c = l % TT, l // TT
        for LS in range(T, T + _LAYOUT_LS):
            ps = np.arange(T * LS, T * LS + _LAYOUT_PS)
            cand = np.array([(P, nbuf * T * P + d) for P in ps for d in range(_LAYOUT_ISTR)])
            P, I = cand[:, :1], cand[:, 1:]
            cost = np.zeros(len(cand), dtype=np.int64)
            for pat, (ma, mc), cnt in uses:
                act = (a < ma) & (c < mc)
                addr = w * I + {"line": c * P + a * LS, "point": c * LS + a,
                                "col": c * P + a}[pat]
                cost += cnt * _wavefronts(addr, act, itemsize)
            if qsmem:
                addr = per_block * I + 1 + w * (nsym * nq ** 3) + c * nq + a
                cost += nqr * _wavefronts(addr, (a < qmask[0]) & (c < qmask[1]), itemsize)
            # V's gather and U's scatter: the group's values in order, thread by thread
            r = np.arange(-(-per_block * NDD // nt))[:, None] * nt + tid
            q, f = r // NDD, r % NDD
            gaddr = q * I[:, :, None] + ((f // (nd * nd)) * P[:, :, None]
                                         + ((f // nd) % nd) * LS + f % nd)
            for k in range(r.shape[0]):
                cost += 2 * _wavefronts(gaddr[:, k], r[k] < per_block * NDD, itemsize)
            for (P1, I1), cst in zip(cand, cost):
                yield int(cst), TT, LS, int(P1), int(I1)


@functools.lru_cache(maxsize=None)
def qfunc_line_layout(nd, nq, per_block, colloc, qsmem, itemsize, nsym=6, mass=False):
    """The line form's shared-memory layout (``mass``: action_line.cu.j2's own mass steps,
    two buffers; else the operator family's, three): ``(TT, LS, PS, istr)``, the threads
    along a line's fast index (a thread's line is ``(a, c)``, ``a < TT``, ``c < T``), the
    line, plane and item strides (reals).

    The layout with the fewest shared-memory wavefronts of a group's steps by the bank model
    of :func:`_wavefronts`, counted over the accesses of ``qfunc.cuh.j2``'s line steps
    (each step's lines are one pattern of addresses, shifted by a constant per
    instruction), the gather and scatter and, with ``qsmem``, the Q reads; among equal
    counts the first of: the odd layout (TT = LS = T rounded up to odd), then the least
    shared memory. On an H100 at BP3 p = 2 the odd layout's wavefronts were 27% bank
    conflicts (loads; stores 37%) and a fifth of its threads idle (TT = 5, T = 4).

    >>> qfunc_line_layout(3, 4, 6, False, True, 8)
    (4, 4, 17, 204)
    >>> qfunc_line_layout(5, 7, 1, False, True, 8)           # the odd layout: no better one
    (7, 7, 49, 1029)
    >>> qfunc_line_layout(4, 5, 4, False, False, 8, mass=True)   # the mass steps, two buffers
    (5, 5, 25, 264)
    """
    T = max(nd, nq)
    old = (T | 1, T | 1, T * (T | 1), (2 if mass else 3) * T * T * (T | 1) | 1)
    best = None
    for cst, *lay in _layout_costs(nd, nq, per_block, colloc, qsmem, itemsize, nsym, mass):
        key = (cst, tuple(lay) != old, lay[3], lay[0] != old[0])
        if best is None or key < best[0]:
            best = (key, tuple(lay))
    return best[1]
