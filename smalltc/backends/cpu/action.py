"""The fused action family: ``U_e = B^T D_e B V_e``, in one of two forms (``form``).

``lanes``: ``action.py.j2`` with the macros of ``_lanes.j2`` vectorises across
elements: a chunk of ``lanes`` elements is copied into per-thread buffers
``buf[entry, lane]``, each sum-factorisation step is a fixed-trip loop nest
whose body is one statement per lane, and LLVM's SLP vectoriser packs the
lane statements into SIMD registers (notes/cpu.md, versions 1-9).

``inner``: one element at a time, SIMD within it (:func:`inner_steps`): each
step is a small GEMM with the vector along a contiguous run (the element's
rows of V and U read and written in place, no layout copies), the
intermediates in two per-thread buffers whose rows are padded to whole
vectors; the cache lines of the next element are prefetched, spread over the
steps (notes/cpu.md, version 22).

Tuning parameters (one set for both forms; an older table entry without
``form``, ``jb``, ``pf`` is the lanes form):

=========  =================================================================
``form``   ``"lanes"`` or ``"inner"``
``lanes``  elements per chunk: one vector register of them (8 float64 with
           AVX-512, 4 with AVX2, 2 with NEON) or two; 1 in the inner form
``rb``     outputs per register block in each step: each buffer load feeds
           ``rb`` FMAs (1-3; more needs ``rb * nin`` coefficients in registers)
``tr``     1: full chunks move between the arrays and the buffers in
           ``lanes x lanes`` block transposes (:func:`.simd.tr_block`); 0 in
           the inner form
``vbits``  the vector width asked of LLVM (:func:`.simd.vector_width`): 512 or
           256 on AVX-512 (LLVM's own choice on Intel cores is 256), 0
           elsewhere (the target's only width)
``jb``     the inner form: vectors per chunk of a run step (1, 2); 0 in lanes
``pf``     the inner form: prefetch the element ``pf`` ahead (0: none); 0 in
           lanes
=========  =================================================================

The heuristic (:data:`HEURISTIC`, per ISA and default vector width) was
measured on this project's machines: AVX-512 on an AMD Zen 5 (512-bit) and an
Intel Xeon (256-bit, LLVM's preference there), AVX2 as AVX2 code on the Intel
Xeon (notes/cpu.md); NEON's is a guess (no ARM machine). The inner form is
chosen where it measured faster (the Intel Xeon's AVX-512 and AVX2 code).
Sizes beyond ``nd <= 17, nq <= 24`` run the generic kernel (:mod:`.contract`).

Examples
--------
>>> from smalltc.spec import ActionSpec
>>> from smalltc.backends.cpu.target import TARGETS
>>> s = ActionSpec(dim=3, nq=8, nd=7, batch=100, dtype="float64")
>>> ACTION.heuristic_params(s, TARGETS["avx512"])          # Zen 5's profile, avx512/512
{'form': 'lanes', 'lanes': 8, 'rb': 3, 'tr': 1, 'vbits': 512, 'jb': 0, 'pf': 0}
>>> ACTION.heuristic_params(s, TARGETS["avx512"]._replace(vector_bits=256))   # Intel's
{'form': 'inner', 'lanes': 1, 'rb': 2, 'tr': 0, 'vbits': 512, 'jb': 1, 'pf': 1}
>>> ACTION.context(s, dict(lanes=3, rb=1, tr=0), TARGETS["avx2"]) is None   # not a vector multiple
True
>>> steps, buffers, ndp, nqp = inner_steps(3, 7, 8, vl=8, jb=8)
>>> [st["kind"] for st in steps], ndp, nqp
(['run', 'rows', 'inner', 'inner', 'rows', 'run'], 8, 8)
"""
from __future__ import annotations

import numpy as np

from ...quadrature import rule_1d

from ..reference import sym_index
from .family import CpuExecutor, Family
from .runtime import NB_TYPES, SHORT, signature
from .target import resolve

__all__ = ["ACTION", "ActionFamily", "action_steps", "operator_steps", "diagonal_steps",
           "inner_steps", "StepBuilder",
           "lanes_ctx", "lanes_space",
           "vector_bits", "simd_lanes", "MAX_ND", "MAX_NQ", "HEURISTIC"]

MAX_ND, MAX_NQ = 17, 24  # specialised kernels: p <= 16

def _inner_intel(dim, nd, nq, dt):
    """The inner form where it measured faster on the Intel Xeon (notes/cpu.md, version
    22; 1 GiB per call, interleaved with the lanes form): 3D with rows of at least 20
    bytes (float64 p >= 2, float32 p >= 4) and nq >= 4 (p = 2, nq = 3: the lanes form
    1.44x, version 23), 2D float64 from p = 4; vectors of 256 bits while a row fits in
    one, else 512; two outputs per register block; the next element's lines prefetched."""
    row = nd * np.dtype(dt).itemsize
    if not (dim == 3 and row >= 20 and nq >= 4 or dim == 2 and dt == "float64" and nd >= 5):
        return None
    return dict(rb=2, jb=1, pf=1, vbits=256 if row <= 32 else 512)


def _inner_avx2(dim, nd, nq, dt):
    """AVX2 code on the Xeon (version 22): the inner form for 3D float64 from p = 2 with
    nq >= 4 (p = 2, nq = 3: the lanes form 1.12x, version 23)."""
    return dict(rb=2, jb=1, pf=1, vbits=0) if dim == 3 and dt == "float64" and nd >= 3 \
        and nq >= 4 else None


#: the measured heuristic per target profile (:attr:`.target.Target.profile`: the ISA and
#: its default vector width). The lanes form: ``vectors`` per chunk (lanes = vectors x
#: the vector's scalars), ``rb(dim, nd, dtype)``, block transposes from ``tr_from``
#: entries per element (None: never). ``inner(dim, nd, nq, dtype)``: the inner form's
#: parameters where it is the better form (None: the lanes form)
HEURISTIC = {
    # AMD Zen 5, 512-bit (notes/cpu.md, versions 7-8): rb 2-3 for 3D float64 p = 5..8
    # (0.53-0.59 -> 0.70-0.79 of Pmax); float32 stays at rb = 1 (rb = 3 compiles in ~45 s
    # at p = 8); transposes from 64 entries per element. The inner form was not measured
    # there.
    "avx512/512": dict(vectors=1, tr_from=64,
                       rb=lambda dim, nd, dt: (1 if dim != 3 or dt != "float64"
                                               or not 6 <= nd <= 9 else 3 if nd >= 7 else 2)),
    # Intel Xeon, 256-bit (LLVM's preference there): the AVX-512 tuning of 3D float64
    # p = 1..8 (notes/cpu.md, version 18): one vector of elements; rb = 2 (within 0-6% of
    # rb = 3 at every p, rb = 1 4-28% slower) up to nd = 10 (rb x nd coefficients in
    # registers); transposes from 512 entries per element (3D p >= 7: 1.0 vs 0.86-0.88;
    # below, the scalar copies measured faster: 0.46 vs 0.34 of Pmax at p = 6). The
    # inner form where it measured faster (version 22)
    "avx512/256": dict(vectors=1, tr_from=512, inner=_inner_intel,
                       rb=lambda dim, nd, dt: (2 if dim == 3 and dt == "float64" and nd <= 10
                                               else 1)),
    "avx2/256": dict(vectors=1, tr_from=512, inner=_inner_avx2,
                     rb=lambda dim, nd, dt: (2 if dim == 3 and dt == "float64" and nd <= 7
                                             else 1)),
    # not measured (no ARM machine here): two vectors of elements, rb = 1 (rb = 2 left a
    # quarter of the FMAs scalar in the AArch64 build of the 3D p = 4 kernel)
    "neon/128": dict(vectors=2, tr_from=64, rb=lambda dim, nd, dt: 1),
    "sse/128": dict(vectors=2, tr_from=64, rb=lambda dim, nd, dt: 1),
}


def action_steps(dim, nd, nq, back_only=False):
    """The sum-factorisation steps of the fused action, as template data.

    Shapes are padded to 3 axes; buffers ping-pong between ``ta`` and ``tb``
    and the last step writes back into ``vt``. ``back_only``: only the
    transposed half, from ``dt`` (the quadrature data) with coefficients ``B2``
    (the diagonal: ``B^2`` applied along each axis).
    """
    shape = [1] * (3 - dim) + [nd if not back_only else nq] * dim
    steps, sizes = [], {"ta": 0, "tb": 0}
    axes = list(range(2, 2 - dim, -1))
    moves = [(a, True) for a in axes] if back_only else \
        [(a, False) for a in axes] + [(a, True) for a in axes]
    bufs = (["dt"] if back_only else ["vt"]) + ["ta", "tb"] * dim
    for n, (ax, back) in enumerate(moves):
        out = list(shape)
        out[ax] = nd if back else nq
        dst = "vt" if n == len(moves) - 1 else bufs[n + 1]
        if dst != "vt":
            sizes[dst] = max(sizes[dst], out[0] * out[1] * out[2])
        coef = ("B2[{s}, {i}]" if back_only else "B[{s}, {i}]") if back else "B[{i}, {s}]"
        steps.append(dict(src=bufs[n], dst=dst, out=tuple(out), inp=tuple(shape), axis=ax,
                          nin=shape[ax], coef=coef, scale=(not back_only and n == dim - 1)))
        shape = out
    return steps, [(b, sz) for b, sz in sizes.items() if sz]


class StepBuilder:
    """The one-axis contractions of a lanes sum factorisation (:func:`operator_steps`,
    :func:`.force.force_steps`), as template data: ``steps``, each ``dict(src, dst, out,
    inp, axis, nin, coef, scale, acc)`` between lane buffers whose shapes are padded to 3
    axes; ``new_buffer(rows)`` names a fresh intermediate."""

    def __init__(self, dim, nq, new_buffer):
        self.dim, self.nq, self.pad = dim, nq, 3 - dim
        self.steps = []
        self._new = new_buffer

    def contract(self, src, shape, ax, mat, back, n=None, dst=None, acc=False):
        """``mat`` along axis ``ax`` of ``src``: to the ``nq`` points, or (``back``) its
        transpose to ``n`` nodes; into ``dst`` (default a fresh buffer), added with
        ``acc``. Returns ``(dst, its shape)``."""
        out = list(shape)
        out[ax] = n if back else self.nq
        if dst is None:
            dst = self._new(out[0] * out[1] * out[2])
        coef = f"{mat}[{{s}}, {{i}}]" if back else f"{mat}[{{i}}, {{s}}]"
        self.steps.append(dict(src=src, dst=dst, out=tuple(out), inp=tuple(shape), axis=ax,
                               nin=shape[ax], coef=coef, scale=False, acc=acc))
        return dst, tuple(out)

    def gradients(self, src, shape, values=False):
        """The reference gradients ``g_a`` of the field in ``src`` (of ``shape``), over the
        axes last to first with shared partial sums: from the all-B node a B and a G
        contraction, from a node that already holds its G a B contraction; ``values``: the
        all-B node carried to the end too (the interpolated values). Returns ``(g, the
        values' buffer or None)``."""
        pad = self.pad
        nodes = [(src, shape, None)]
        for i, ax in enumerate(range(2, pad - 1, -1)):
            last = i == self.dim - 1
            new = []
            for buf, shape, g in nodes:
                if g is None and (not last or values):
                    new.append(self.contract(buf, shape, ax, "B", False) + (None,))
                if g is None:
                    new.append(self.contract(buf, shape, ax, "G", False) + (ax - pad,))
                else:
                    new.append(self.contract(buf, shape, ax, "B", False) + (g,))
            nodes = new
        return ([next(b for b, _, g in nodes if g == a) for a in range(self.dim)],
                next((b for b, _, g in nodes if g is None), None))

    def back_sum(self, hs, n, dst, values=None):
        """``dst = sum_a G_a^T hs[a]`` (``n`` nodes an axis), plus ``B^T`` on every axis of
        the buffer ``values`` where given; over the axes first to last with shared partial
        sums: a pending ``h_a`` takes B^T (G^T on its own axis, into the sum), the sum
        takes B^T; the contributions to the sum are added (``acc``), the last into
        ``dst``."""
        pad, qshape = self.pad, (1,) * self.pad + (self.nq,) * self.dim
        pending = [(hs[a], qshape, a) for a in range(self.dim)]
        total = None if values is None else (values, qshape)
        for i, ax in enumerate(range(pad, 3)):
            into_dst = dst if i == self.dim - 1 else None
            parts = [(buf, shape, "G" if a == ax - pad else "B", a) for buf, shape, a in pending]
            if total is not None:
                parts.insert(0, (total[0], total[1], "B", None))
            into = [p for p in parts if p[3] is None or p[2] == "G"]
            pending = [self.contract(buf, shape, ax, mat, True, n) + (a,)
                       for buf, shape, mat, a in parts if (buf, shape, mat, a) not in into]
            target = None
            for k, (buf, shape, mat, a) in enumerate(into):
                target, out = self.contract(buf, shape, ax, mat, True, n,
                                            dst=into_dst if k == 0 else target, acc=k > 0)
            total = (target, out)


def operator_steps(qfunc, collocated, dim, nd, nq):
    """The lanes form's steps of a diffusion or Helmholtz action (docs/math.md section 7):
    the direct sum factorisation, one-axis contractions between lane buffers, and the
    pointwise stage (kind ``"qfunc"``) between the halves.

    Forward, over the axes last to first: from the all-B node (``vt``, V) a B and a G
    contraction, from a node that already holds its G a B contraction, so that after
    the first axis the nodes are the reference gradients ``g_a`` (3D: 2 + 3 + 3 = 8
    contractions; Helmholtz keeps the all-B node, the interpolated values, for its mass
    term: 9). Pointwise: ``h_a = sum_b Q^ab g_b`` and ``u = D u``. Back, over the axes
    first to last: a pending ``h_j`` takes B^T (G^T on its own axis, into the sum), the
    sum takes B^T; the contributions to the sum are added (``acc``), the last into
    ``vt``. Collocated (B the identity): ``g_a = G_a V`` and ``U = sum_a G_a^T h_a``
    (+ D V).

    Returns ``(steps, buffers, qbuffers, gathers, data_args)``: ``buffers`` the
    intermediates ``[(name, rows)]``, ``qbuffers`` Q's lane buffers, ``gathers`` the
    data moved into lanes ``(buffer, array, rows, offset)``, ``data_args`` the kernel's
    leading arguments.

    >>> steps, bufs, qb, g, args = operator_steps("diffusion", False, 3, 3, 4)
    >>> sum(1 for st in steps if "axis" in st), args
    (16, 'B, G, Q')
    >>> steps, *_ = operator_steps("diffusion", True, 3, 4, 4)
    >>> sum(1 for st in steps if "axis" in st)
    6
    """
    pad = 3 - dim
    helm = qfunc == "helmholtz"
    nsym = dim * (dim + 1) // 2
    buffers = []
    fresh = iter(f"f{i}" for i in range(64))

    def new_buffer(rows):
        buffers.append((next(fresh), rows))
        return buffers[-1][0]

    sb = StepBuilder(dim, nq, new_buffer)
    steps = sb.steps
    vshape = (1,) * pad + (nd,) * dim
    # forward: the gradients (and, Helmholtz, the values) at the points
    if collocated:
        grads = [sb.contract("vt", vshape, pad + a, "G", False)[0] for a in range(dim)]
        u = "vt" if helm else None
    else:
        grads, u = sb.gradients("vt", vshape, values=helm)
    steps.append(dict(kind="qfunc", g=grads, u=u, sym=sym_index(dim), npts=nq ** dim))
    # back
    if collocated:
        qshape = (1,) * pad + (nq,) * dim
        for a in range(dim):
            sb.contract(grads[a], qshape, pad + a, "G", True, nd, dst="vt", acc=helm or a > 0)
    else:
        sb.back_sum(grads, nd, "vt", values=u)
    gathers = ([("dt", "D", nq ** dim, 0)] if helm else []) + \
        [(f"q{c}", "Q", nq ** dim, c * nq ** dim) for c in range(nsym)]
    data_args = ", ".join((["G"] if collocated else ["B", "G"]) + (["D"] if helm else [])
                          + ["Q"])
    return steps, buffers, [(f"q{c}", nq ** dim) for c in range(nsym)], gathers, data_args


def diagonal_steps(qfunc, dim, nd, nq):
    """The lanes steps of a diffusion or Helmholtz diagonal: for each packed pair
    ``c = (a, b)``, ``a <= b``, the back half of the action from Q's lane buffer ``q<c>``
    with the entrywise products of the pair's 1D matrices (``GG`` on axis a == b, else
    ``2 GB`` on axis a and ``GB`` on axis b, ``BB`` on the others: the pair (b, a) is the
    same sum), added into ``vt``; Helmholtz adds D's chain with ``BB``. Returns
    ``(steps, buffers)``.

    >>> steps, buffers = diagonal_steps("diffusion", 2, 3, 4)     # pairs 11, 12, 22
    >>> [st["coef"].split("[")[0] for st in steps]                # last axis first
    ['BB', 'GG', 'GB', 'GB2', 'GG', 'BB']
    """
    pad = 3 - dim
    chains = []
    c = 0
    for a in range(dim):
        for b in range(a, dim):
            mats = ["GG" if d == a == b else "GB2" if d == a else "GB" if d == b else "BB"
                    for d in range(dim)]
            chains.append((f"q{c}", mats))
            c += 1
    if qfunc == "helmholtz":
        chains.append(("dt", ["BB"] * dim))
    steps, sizes = [], {"ta": 0, "tb": 0}
    for n, (src, mats) in enumerate(chains):
        shape = [1] * pad + [nq] * dim
        bufs = [src] + ["ta", "tb"] * dim
        for i, ax in enumerate(range(2, pad - 1, -1)):
            out = list(shape)
            out[ax] = nd
            last = i == dim - 1
            dst = "vt" if last else bufs[i + 1]
            if not last:
                sizes[dst] = max(sizes[dst], out[0] * out[1] * out[2])
            steps.append(dict(src=bufs[i], dst=dst, out=tuple(out), inp=tuple(shape),
                              axis=ax, nin=shape[ax], coef=f"{mats[ax - pad]}[{{s}}, {{i}}]",
                              scale=False, acc=last and n > 0))
            shape = out
    return steps, [(b, sz) for b, sz in sizes.items() if sz]


def _round_up(n, m):
    return -(-n // m) * m


def inner_steps(dim, nd, nq, vl, jb, rb=1, pf=0, itemsize=8):
    """The steps of the inner form (SIMD within an element), as template data.

    Every intermediate is a per-thread buffer whose rows end in the vector axis: the
    innermost axis of the tensor, padded to ``ndp``/``nqp`` (multiples of ``vl``, the
    scalars of one vector), except where a run is read or written unpadded. Three
    kinds of step:

    ``run``    contract the outermost axis of a contiguous ``nin x R`` block (3D: V and
               U, R = nd^2): ``dst[i, r] = sum_s c(i, s) src[s, r]``, SIMD along r in
               chunks of ``jb`` scalars (the last one overlapping the one before);
    ``rows``   contract a non-innermost axis, SIMD along the rows' ``L`` entries:
               ``dst[z, i, :L] = sum_s c(i, s) src[z, s, :L]`` (rows may be read past
               their end into the next row or the buffer's slack: those lanes are
               padding, never read as data);
    ``inner``  contract the innermost axis, SIMD along the output index:
               ``dst[m, :L] = sum_s src[m, s] ct[s, :L]`` with ``ct`` the transposed or
               padded coefficients (``bt[s, t] = B[t, s]``, ``bp[s, t] = B[s, t]``,
               zero beyond the true extent).

    ``src``/``dst`` are format strings of a flat index; ``scale``: the step multiplies
    by D (its rows are the unpadded ``nq``-long runs of D). Each step works in blocks of
    ``rr`` (up to ``rb``) outputs, ``nb`` blocks of ``trip`` iterations of its innermost
    loop. With ``pf`` > 0, those iterations also prefetch the cache lines of the
    element (D) and row (V, U) ``pf`` ahead, spread evenly over all steps (``st["pf"]``:
    :func:`_prefetch_jobs`). Returns the steps, the buffers ``[(name, size)]`` (with
    slack for the reads past a row's end), ``ndp`` and ``nqp``.
    """
    ndp, nqp = _round_up(nd, vl), _round_up(nq, vl)
    src_v, dst_u = "V[ev, {}]", "U[ev, {}]"     # rows of (element, component)
    fwd, bwd = "B[{i}, {s}]", "bt[{i}, {s}]"     # both adjacent along s (SLP)
    slack = max(ndp - nd, nqp - nq, vl)
    # the intermediates ping-pong between two buffers, ta and tb (L1 footprint)
    if dim == 3:
        R = nd * nd
        w2_slab = nd * nd + ndp - nd        # B2's rows spill ndp - nd entries past a slab
        steps = [
            dict(kind="run", src=src_v, dst="ta[{}]", nin=nd, nout=nq, R=R, sstride=R,
                 dstride=R, coef=fwd, jb=min(jb, R)),
            dict(kind="rows", src="ta[{}]", dst="tb[{}]", nin=nd, nout=nq, nz=nq, sslab=R,
                 srow=nd, dslab=nq * ndp, drow=ndp, L=ndp, coef=fwd, scale=False,
                 zblock=False),
            dict(kind="inner", src="tb[{}]", dst="ta[{}]", nin=nd, M=nq * nq, srow=ndp,
                 drow=nq, L=nq, ct="bt", scale=True),
            dict(kind="inner", src="ta[{}]", dst="tb[{}]", nin=nq, M=nq * nq, srow=nq,
                 drow=ndp, L=ndp, ct="bp", scale=False),
            dict(kind="rows", src="tb[{}]", dst="ta[{}]", nin=nq, nout=nd, nz=nq,
                 sslab=nq * ndp, srow=ndp, dslab=w2_slab, drow=nd, L=ndp, coef=bwd,
                 scale=False, zblock=True),
            dict(kind="run", src="ta[{}]", dst=dst_u, nin=nq, nout=nd, R=R, sstride=w2_slab,
                 dstride=R, coef=bwd, jb=min(jb, R)),
        ]
        buffers = [("ta", max(nq * R, nq ** 3, nq * w2_slab) + slack), ("tb", nq * nq * ndp)]
    elif dim == 2:
        steps = [
            dict(kind="inner", src=src_v, dst="ta[{}]", nin=nd, M=nd, srow=nd, drow=nqp,
                 L=nqp, ct="bt", scale=False),
            dict(kind="rows", src="ta[{}]", dst="tb[{}]", nin=nd, nout=nq, nz=1, sslab=0,
                 srow=nqp, dslab=0, drow=nqp, L=nq, coef=fwd, scale=True, zblock=False),
            dict(kind="rows", src="tb[{}]", dst="ta[{}]", nin=nq, nout=nd, nz=1, sslab=0,
                 srow=nqp, dslab=0, drow=nqp, L=nqp, coef=bwd, scale=False, zblock=False),
            dict(kind="inner", src="ta[{}]", dst=dst_u, nin=nq, M=nd, srow=nqp, drow=nd,
                 L=nd, ct="bp", scale=False),
        ]
        buffers = [("ta", nd * nqp), ("tb", nq * nqp)]
    else:
        steps = [
            dict(kind="inner", src=src_v, dst="ta[{}]", nin=nd, M=1, srow=nd, drow=nq,
                 L=nq, ct="bt", scale=True),
            dict(kind="inner", src="ta[{}]", dst=dst_u, nin=nq, M=1, srow=nq, drow=nd,
                 L=nd, ct="bp", scale=False),
        ]
        buffers = [("ta", nqp)]
    for st in steps:
        blocked = st["nz"] if st.get("zblock") else st.get("nout", st.get("M"))
        st["rr"] = min(rb, blocked)
        st["nb"] = -(-blocked // st["rr"])
        st["trip"] = (-(-st["R"] // st["jb"]) if st["kind"] == "run" else
                      st["nout"] if st.get("zblock") else
                      st["nz"] if st["kind"] == "rows" else 1)
        st["pf"] = []
    if pf:
        _prefetch_jobs(steps, nd ** dim, nq ** dim, 64 // itemsize, pf)
    return steps, buffers, ndp, nqp


def _prefetch_jobs(steps, nv, nqd, ls, pf):
    """Spread the prefetches of the next rows over the steps' iterations: the lines of
    D's row ``e + pf``, V's and U's (write) rows ``ev + pf``, in that order, split in
    proportion to the steps' iterations; a job ``(arr, row, first, last, k, n, write)``
    prefetches lines ``first + it * k + i`` (``i < k``, at most ``last``) of a row of
    ``n`` scalars in iteration ``it`` (a line is ``ls`` scalars; a row's last scalar
    is its own line, rows are not aligned)."""
    rows = [("D", "e + %d" % pf, nqd, 0), ("V", "ev + %d" % pf, nv, 0),
            ("U", "ev + %d" % pf, nv, 1)]
    lines = [(a, r, n, w, j) for a, r, n, w in rows for j in range(-(-n // ls) + 1)]
    total = sum(st["nb"] * st["trip"] for st in steps)
    done = 0
    for st in steps:
        its = st["nb"] * st["trip"]
        lo, hi = len(lines) * done // total, len(lines) * (done + its) // total
        done += its
        for arr, row, n, write in {(a, r, n, w): 0 for a, r, n, w, _ in lines[lo:hi]}:
            js = [j for a, _, _, _, j in lines[lo:hi] if a == arr]
            k = -(-len(js) // its)
            st["pf"].append(dict(arr=arr, row=row, first=js[0], last=js[-1], k=k, n=n,
                                 write=write, ls=ls))


def vector_bits(params, target):
    """The ``vbits`` of ``params`` (the target's own when absent), or None when the target
    has no such choice: 512 or 256 with AVX-512, 0 elsewhere."""
    v = (params or {}).get("vbits", target.vector_bits)
    ok = (256, 512) if target.isa == "avx512" else (0,)
    return v if v in ok else None


def simd_lanes(target, vbits, dtype):
    """Scalars of ``dtype`` in one vector of ``vbits`` bits (0: the target's width)."""
    return (vbits // 8 if vbits else target.vector_bytes) // np.dtype(dtype).itemsize


def lanes_ctx(spec, params, target, heuristic):
    """``lanes``, ``rb``, ``tr``, ``vbits`` for an action-like spec (the heuristic's, or
    ``params`` checked), or None when they do not fit: lanes a multiple of the vector's
    scalars and a power of two (block transposes), 1 <= rb <= 4, tr 0 or 1, vbits as
    :func:`vector_bits` allows."""
    dim, nd, dt = spec.dim, spec.nd, spec.dtype
    h = heuristic[target.profile]
    if params is None:
        W = h["vectors"] * target.lanes(dt)
        tr = h["tr_from"] is not None and nd ** dim >= max(h["tr_from"], W)
        return dict(lanes=W, rb=h["rb"](dim, nd, dt), tr=int(tr), vbits=target.vector_bits)
    W, rb, tr = params.get("lanes"), params.get("rb"), params.get("tr")
    vbits = vector_bits(params, target)
    vl = simd_lanes(target, vbits, dt)
    if not (isinstance(W, int) and W >= vl and W % vl == 0 and W & (W - 1) == 0 and W <= 64
            and rb in (1, 2, 3, 4) and tr in (0, 1) and vbits is not None):
        return None
    return dict(lanes=W, rb=rb, tr=tr, vbits=vbits)


def _operator_heuristic(spec, target):
    """The diffusion and Helmholtz instances' departures from the mass heuristic: block
    transposes always (Q's nsym nq^d entries per element move into the lanes: 1.2-1.4x
    over scalar copies at p = 3), one output per register block, and two vectors of
    elements when collocated. Measured single-threaded on a loaded 2-core AMD Zen 3
    (AVX2 code), 3D p = 3, 300k DoFs: BP5 55 ms against 65-80 ms (one vector, tr = 1) and
    81-108 ms (the mass heuristic); BP3 78-86 ms against 100-114 and 120-179 ms. Noisy
    (load average 8-12): a tuning table should replace it."""
    vectors = 2 if spec.collocated else 1
    return dict(tr=1, rb=1, lanes=vectors * target.lanes(spec.dtype))


def _vertex_render(spec, data_args):
    """The template data of the vertex geometry (``_lanes.j2``'s ``vertex_data``): no data
    gathered, the arguments XV and CF in place of D or Q, the 1D rule's constants."""
    x, w = rule_1d(spec.nq, bool(spec.collocated))
    lit = (lambda v: [repr(float(a)) for a in v])
    args = data_args.replace("Q", "XV, CF") if spec.qfunc != "mass" else \
        data_args.replace("D", "XV, CF")
    return dict(gathers=[], data_args=args,
                vertex=dict(dim=spec.dim, nq=spec.nq, qfunc=spec.qfunc, n0=lit((1 - x) / 2),
                            n1=lit((1 + x) / 2), w=lit(w)))


class LanesFamily(Family):
    """The lane-vectorised families (the action, the FEM operator and its diagonal): one
    claim rule, parameters, context and search space; a subclass names its template and
    gives :meth:`signature` (and :attr:`back_only` for the diagonal's half action)."""

    params = ("lanes", "rb", "tr", "vbits")
    back_only = False

    def claims(self, spec):
        return spec.op == self.name and spec.nd <= MAX_ND and spec.nq <= MAX_NQ

    def signature(self, spec):
        raise NotImplementedError

    def supports(self, spec):
        """Every instance of the operator family (docs/math.md section 7) with stored point
        data (float64 or float32); the vertex geometry (docs/math.md section 8) in 2D and
        3D for the action and the fused apply (not the diagonal); not the corner force,
        whose kernels are :class:`ForceFamily`'s."""
        if getattr(spec, "qfunc", "mass") in ("force", "force_t"):
            return False
        if getattr(spec, "geometry", None) is None:
            return True
        return not self.back_only and spec.dim in (2, 3)

    def context(self, spec, params=None, target=None):
        target = resolve(target)
        p = lanes_ctx(spec, params, target, HEURISTIC)
        if p is None:
            return None
        if params is None and getattr(spec, "qfunc", "mass") != "mass":
            p = dict(p, **_operator_heuristic(spec, target))
        dim, nd, nq, dt = spec.dim, spec.nd, spec.nq, spec.dtype
        extra = {}
        if getattr(spec, "qfunc", "mass") == "mass":
            steps, buffers = action_steps(dim, nd, nq, back_only=self.back_only)
        elif self.back_only:                 # the diagonal: B1d given (identity: collocated)
            steps, buffers = diagonal_steps(spec.qfunc, dim, nd, nq)
            nsym = dim * (dim + 1) // 2
            buffers = buffers + [(f"q{c}", nq ** dim) for c in range(nsym)]
            helm = spec.qfunc == "helmholtz"
            extra = dict(gathers=([("dt", "D", nq ** dim, 0)] if helm else [])
                         + [(f"q{c}", "Q", nq ** dim, c * nq ** dim) for c in range(nsym)],
                         data_args="B, G, D, Q" if helm else "B, G, Q", diag_mats=True)
        else:
            steps, buffers, qbuffers, gathers, data_args = operator_steps(
                spec.qfunc, spec.collocated, dim, nd, nq)
            buffers = buffers + qbuffers
            extra = dict(gathers=gathers, data_args=data_args)
        if getattr(spec, "qdtype", None):
            # the point data moves into the lanes by scalar copies (a float32 -> float64
            # conversion each; the block transposes need one dtype)
            extra = dict(extra, qmixed=True)
        if getattr(spec, "geometry", None) == "vertices":
            # the point data computed into the lane buffers (dt, q<c>) from X and CF
            extra = dict(extra, **_vertex_render(spec, extra.get("data_args", "B, D")))
        render = dict(dtype=dt, W=p["lanes"], steps=steps, buffers=buffers, nv=nd ** dim,
                      nqd=nq ** dim, nd=nd, nq=nq, rb=p["rb"], tr=p["tr"], vbits=p["vbits"],
                      signature=self.signature(spec), inline_body=self.inline_body(spec, p),
                      **self.extra_render, **extra)
        return dict(p, dtype=dt, render=render)

    #: constants a subclass's template needs besides the lanes' (the action's form)
    extra_render: dict = {}

    def inline_body(self, spec, p):
        """Whether ``_run`` is inlined into the parallel loop (``base.py.j2``) rather than
        called through its native address: not by default (its body compiles once)."""
        return False

    def space(self, spec, target=None):
        """lanes: one or two vectors; rb 1-3 (pruned ``registers`` where the rb x nin
        coefficients and rb accumulators per vector exceed the register file); tr 0, 1
        (pruned ``small`` below one lanes x lanes block per element); vbits 512 and 256
        on AVX-512."""
        yield from lanes_space(spec, resolve(target))


class ActionFamily(LanesFamily):
    """The fused action (``action.py.j2``) in its two forms; see the module docstring."""

    name = "action"
    templates = ("action.py.j2",)
    params = ("form", "lanes", "rb", "tr", "vbits", "jb", "pf")
    #: an entry without them (older tables): the lanes form, which has no run chunks and
    #: no prefetch
    optional = {"form": "lanes", "jb": 0, "pf": 0}
    extra_render = dict(form="lanes")

    def inline_body(self, spec, p):
        """The 3D mass action that copies its D (nq^3 >= 64 values an element) into the
        lanes by scalar copies (``tr`` 0) runs inlined into the parallel loop, whose
        no-alias arguments let LLVM vectorise those copies. AMD EPYC Zen 4 (AVX-512), one
        thread, p = 2, nq = 4, 38,836 elements, best of 300 calls, three processes each:
        3.0-3.1 ms inlined against 3.3-4.1 ms called (the first call compiles in 3.2 CPU s
        instead of 1.8); p = 1..4 at the other nq of the bench: the same within the noise."""
        return (spec.dim == 3 and not p["tr"] and spec.nq ** 3 >= 64
                and getattr(spec, "qfunc", "mass") == "mass"
                and getattr(spec, "geometry", None) is None)

    def context(self, spec, params=None, target=None):
        target = resolve(target)
        if getattr(spec, "qfunc", "mass") != "mass" \
                or getattr(spec, "geometry", None):          # the lanes form only, so far
            if params is not None:
                params = dict(params)
                if params.pop("form", "lanes") != "lanes" or params.pop("jb", 0) != 0 \
                        or params.pop("pf", 0) != 0:
                    return None
            ctx = super().context(spec, params, target)
            return None if ctx is None else dict(ctx, form="lanes", jb=0, pf=0)
        if params is None:
            rule = HEURISTIC[target.profile].get("inner")
            inner = rule(spec.dim, spec.nd, spec.nq, spec.dtype) if rule else None
            if inner is not None:
                return self.inner_context(spec, dict(inner, form="inner"), target)
            ctx = super().context(spec, None, target)
            return None if ctx is None else dict(ctx, form="lanes", jb=0, pf=0)
        params = dict(params)
        form = params.pop("form", "lanes")
        if form == "inner":
            return self.inner_context(spec, params, target)
        if form != "lanes" or params.pop("jb", 0) != 0 or params.pop("pf", 0) != 0:
            return None
        ctx = super().context(spec, params, target)
        return None if ctx is None else dict(ctx, form="lanes", jb=0, pf=0)

    def carry(self, spec, entry_spec, params, target):
        """A nearer size's parameters where the heuristic takes the same form for ``spec``
        (the forms' boundary was measured; an entry refines its form), else None (the next
        entry, or the heuristic): an inner-form entry at p = 2, nq = 4 carried to nq = 3
        ran 1.44x slower than the lanes form there (notes/cpu.md, version 23)."""
        own = self.context(spec, None, target)
        if own is None or own["form"] != params.get("form", "lanes"):
            return None
        return super().carry(spec, entry_spec, params, target)

    def space(self, spec, target=None):
        """The lanes form's space (:func:`lanes_space`), then the inner form's: rb 1-3
        (pruned ``registers`` where ``rb`` rows of coefficients and accumulators exceed
        the register file), jb 1-2, the next element prefetched, vbits 512 and 256 on
        AVX-512."""
        target = resolve(target)
        for params, why in lanes_space(spec, target):
            yield dict(params, form="lanes", jb=0, pf=0), why
        nin = max(spec.nd, spec.nq)
        for vbits in ((512, 256) if target.isa == "avx512" else (0,)):
            vl = simd_lanes(target, vbits, spec.dtype)
            for rb in (1, 2, 3):
                for jb in (1, 2):
                    acc = rb * max(jb, -(-max(spec.nd, spec.nq) // vl))
                    why = "registers" if rb * nin + acc > target.registers + 8 else None
                    yield dict(form="inner", lanes=1, rb=rb, tr=0, vbits=vbits, jb=jb,
                               pf=1), why

    def inner_context(self, spec, params, target):
        """The inner form's context for ``params`` (``rb``, ``jb``, ``pf``, ``vbits``; and
        ``lanes`` 1, ``tr`` 0 where given: one element at a time, no transposes), or None
        when they do not fit: rb 1-4, jb 1 or 2 vectors, pf 0-8 elements, vbits as
        :func:`vector_bits` allows."""
        rb, jb, pf = params.get("rb"), params.get("jb"), params.get("pf", 0)
        vbits = vector_bits(params, target)
        if params.get("lanes", 1) != 1 or params.get("tr", 0) != 0 or rb not in (1, 2, 3, 4) \
                or jb not in (1, 2) or pf not in range(0, 9) or vbits is None:
            return None
        dim, nd, nq, dt = spec.dim, spec.nd, spec.nq, spec.dtype
        vl = simd_lanes(target, vbits, dt)
        steps, buffers, ndp, nqp = inner_steps(dim, nd, nq, vl, jb * vl, rb, pf,
                                               np.dtype(dt).itemsize)
        render = dict(dtype=dt, form="inner", W=1, tr=0, steps=steps, buffers=buffers,
                      nv=nd ** dim, nqd=nq ** dim, nd=nd, nq=nq, ndp=ndp, nqp=nqp, rb=rb,
                      pf=pf, vbits=vbits, signature=self.signature(spec))
        return dict(form="inner", lanes=1, rb=rb, tr=0, jb=jb, pf=pf, vbits=vbits, dtype=dt,
                    render=render)

    def signature(self, spec):
        sig = signature(spec.dtype, len(spec.inputs) + 1, ["int64"] * 4)
        if getattr(spec, "qdtype", None):      # float32 point data: its arrays typed so
            types = [NB_TYPES[o.dtype or spec.dtype] for o in spec.inputs] + [
                NB_TYPES[spec.dtype]]
            sig = "void(" + ", ".join([f"{t}[:, ::1]" for t in types] + ["int64"] * 4) + ")"
        return sig

    def entry(self, spec, ctx):
        # the action's kernel, named for the action (stc_mass_action_*), one per qfunc
        return (f"stc_{getattr(spec, 'qfunc', 'mass')}_action_{spec.dim}d_{SHORT[spec.dtype]}"
                f"_nd{spec.nd}_nq{spec.nq}{'_co' if getattr(spec, 'collocated', False) else ''}"
                f"{'_q32' if getattr(spec, 'qdtype', None) else ''}"
                f"{'_vx' if getattr(spec, 'geometry', None) else ''}")

    def executor(self, choice):
        return ActionExecutor(choice)


ACTION = ActionFamily()


def lanes_space(spec, target):
    """The search space of the lane-vectorised families (action, FEM operator)."""
    nin = max(spec.nd, spec.nq)
    widths = (512, 256) if target.isa == "avx512" else (0,)
    for vbits in widths:
        vl = simd_lanes(target, vbits, spec.dtype)
        for vectors in (1, 2):
            for rb in (1, 2, 3):
                for tr in (0, 1):
                    W = vectors * vl
                    why = ("registers" if rb * nin + rb * vectors > target.registers + 8 else
                           "small" if tr and spec.nd ** spec.dim < W else None)
                    yield dict(lanes=W, rb=rb, tr=tr, vbits=vbits), why


class ActionExecutor(CpuExecutor):
    """Chunks of ``lanes`` elements, split statically over the threads."""

    def __init__(self, choice):
        super().__init__(choice)
        self.W = choice.ctx["lanes"]                 # the inner form: one element an item
        self.inner = choice.ctx["form"] == "inner"

    def run(self, operands, out, **_):
        s = self.spec
        *data, V = operands                 # the bases (B1d, G1d) and the data (D, Q)
        E = V.shape[0]
        nch = -(-E // self.W)
        rows = E * s.ncomp if self.inner else E      # the inner form: a row per component
        data = [a if a.ndim == 2 else a.reshape(E, -1) for a in data]
        self.fn(*data, V.reshape(rows, -1), out.reshape(rows, -1), E, s.ncomp, nch,
                self.nparts(nch))
