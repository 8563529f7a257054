"""The fused-action family: ``U_e = B^T D_e B V_e`` for every element in one kernel.

Three forms of one design (a batch item is an (element, component) pair; all
steps (3a)-(4f) run on an item staged in shared memory, D applied between the
halves):

=====================  =========================  ===================================
form                   template                   entry point (example)
=====================  =========================  ===================================
shared-memory (rb=1)   ``action.cu.j2``           ``stc_mass_action_3d_f64_nd3nq4c1``
register-blocked rb>1  ``action_rb.cu.j2``        ``stc_mass_action_3d_f64_nd9nq10c1``
line (3D, line=1)      ``action_line.cu.j2``      ``stc_mass_action_3d_f64_nd6nq7c1_line``
=====================  =========================  ===================================

- shared-memory form: T = max(nd, nq); an item gets T*T threads in 3D, T in 2D
  and 1D, and two T^dim buffers, about one shared load per FMA.
- ``rb`` > 1: each thread computes ``rb`` outputs along the contracted axis of
  the x and y steps (T*ceil(T/rb) threads per item in 3D).
- line form (3D only): every step by whole 1D lines, a thread per line, B1d in
  the constant bank (``stc_cB``, copied there before each launch), about nd
  FMAs per shared load; ``prefetch`` 1 loads the next group's V and D into
  registers during the current group's steps, 2 copies V by ``cp.async``, 3 (the
  *bulk* form, sm_90 on) copies the V and D slabs of the next ``stages - 1`` groups
  into shared-memory slots by ``cp.async.bulk``, no registers held.

The operator family's diffusion and helmholtz instances (``spec.qfunc``,
``spec.collocated``) are the same templates with the pointwise stage of
``qfunc.cuh.j2`` (:func:`qfunc_ctx`): the shared-memory form in 1D-3D and the line form
in 3D (``stc_diffusion_action_3d_f64_nd5nq6c1_line``, ``..._co_line`` when collocated),
G1d beside B1d in the constant bank; their heuristic is :func:`qfunc_line_heuristic`
(notes/cuda.md, section 7c).

The heuristic, measured on an H100 (float64, notes/cuda.md): the line form from
T = :data:`LINE_FROM_T` on with ``prefetch`` :data:`LINE_PREFETCH` (from compute
capability :data:`BULK_FROM_CC` on the bulk form, measured on the H200 and the
H100: notes/cuda.md, "The bulk form"); below, the shared-memory form
with ~128 threads per block (T <= 4) and, from T = 5, a register cap for ~768
resident threads per SM; it never picks ``rb`` > 1. Tuning parameters:
``per_block, min_blocks, rb, line, prefetch, stages`` and, for the line form, ``qmode``
(the operator family) and ``layout`` (:data:`LAYOUTS`).
"""
from __future__ import annotations

import math

from ...quadrature import rule_1d
from . import runtime as RT
from .family import (DEFAULT_DEVICE, DT, ITEMSIZE, MAX_LOCAL_BYTES, MAX_THREADS, MIN_THREADS,
                     SM_REGISTERS, SM_THREADS, SMEM_TARGET, THREADS, Family, KernelExecutor,
                     even)
from .smem_layout import LAYOUTS, qfunc_line_layout

__all__ = ["ACTION", "ActionFamily", "action_ctx", "action_line_ctx", "qfunc_ctx", "qfunc_of",
           "point_data_f32", "vertex_ctx", "VERTEX_FORMS",
           "LINE_FROM_T", "LINE_PREFETCH", "BULK_FROM_CC", "QFUNCS"]

#: the 3D heuristic takes the line form from this T = max(nd, nq) on: on an H100 it ran
#: 1.13-1.46x the *tuned* register-blocked kernels at p = 5..8, float64, and lost at
#: p = 1 (0.77-0.86); notes/cuda.md, "The line form's threshold T >= 5"
LINE_FROM_T = 5
#: the line form's default ``prefetch``: 1 (V and D of the next group in registers) ran
#: 1.18-1.49x the plain line form (0) at the heuristic's own per_block, on an H100 at 3D
#: p = 4..8, nq = p+1, float64 (notes/cuda.md, "Prefetch")
LINE_PREFETCH = 1
#: from this compute capability on, the line form's heuristic is the bulk form
#: (``prefetch`` 3, cp.async.bulk); on the H200 the tuner's winners at 3D p = 2..8 were
#: the bulk form at 11 of 16 sizes, 1.05-1.28x the register prefetch (prefetch 1); the
#: heuristic alone ran 1.073x the register-prefetch heuristic on the H200, 1.023x on the
#: H100 (notes/cuda.md, "The bulk form")
BULK_FROM_CC = 90
#: ``__launch_bounds__`` minimum blocks searched (0 and 1 give the same register cap)
_MIN_BLOCKS = (0, 1, 2, 3, 4, 5, 6, 8)
#: register blocking searched; an rb that the context normalises to a smaller one
#: (rb = 4 at T = 5 is 3) is a duplicate
_RB = (1, 2, 3, 4)


#: the pointwise stages: "mass" is the family's first instance
QFUNCS = ("mass", "diffusion", "helmholtz")
#: threads a block the new instances' heuristic aims at (shared-memory and line forms)
QFUNC_THREADS = 128
#: how the line form's z step reads Q (tuning parameter ``qmode``): "global" (loads in the
#: z step), "regs" (a thread's Q values into registers at the group's start: their latency
#: overlaps V's gather and the x, y steps), "smem" (the group's Q slab copied into shared
#: memory by the whole block at the group's start; ncomp 1 only)
QMODES = ("global", "regs", "smem")


def qfunc_line_heuristic(nd, nq, ncomp, colloc):
    """The line form's heuristic for the diffusion and helmholtz instances: ``(per_block,
    qmode)``. Measured on an H100 (BP3 and BP5: the fused diffusion apply, 3D, ~2M DoFs,
    float64, p = 1..8, one run: the variant sweep of notes/cuda.md section 7c): Gauss, Q in
    shared memory ("smem") from T = 4 on ("global" at T = 3), ~128 threads a block up to
    T = 6 and one item a block from T = 7 (p = 5..7: 1.03-1.16x two or three items);
    collocated, Q in registers ("regs") with ~128 threads up to T = 5, then Q in shared
    memory with one item a block (p = 5: 1.19x ``regs`` at 3 items). "smem" needs ncomp 1:
    with components, "global".

    >>> qfunc_line_heuristic(5, 6, 1, False), qfunc_line_heuristic(9, 9, 1, True)
    ((3, 'smem'), (1, 'smem'))
    """
    T = max(nd, nq)
    tpi = (T | 1) * T
    near128 = max(1, min(8, round(QFUNC_THREADS / tpi)))
    if colloc:
        pb, qmode = (near128, "regs") if T <= 5 else (1, "smem")
    else:
        pb, qmode = (near128, "global" if T <= 3 else "smem") if T <= 6 else (1, "smem")
    if qmode == "smem" and ncomp > 1:
        qmode = "global"
    return pb, qmode


def qfunc_of(spec):
    """``(qfunc, collocated)`` of a spec (``("mass", False)`` for a spec without the fields).

    >>> from smalltc.spec import ActionSpec
    >>> qfunc_of(ActionSpec(dim=3, nq=5, nd=5, batch=8, dtype="float64", qfunc="diffusion",
    ...                     collocated=True))
    ('diffusion', True)
    """
    return getattr(spec, "qfunc", "mass"), bool(getattr(spec, "collocated", False))


def qfunc_ctx(dim, nd, nq, ncomp, dtype, qfunc, colloc, smem_optin=227 * 1024, params=None,
              cc="90"):
    """Context of the diffusion and helmholtz instances of the action templates, or None.

    The shared-memory form (``action.cu.j2``: T*T threads an item in 3D, T in 2D and 1D;
    three T^dim buffers an item, two when collocated) or, in 3D, the line form
    (``action_line.cu.j2`` with ``prefetch`` 0: B1d and G1d in the constant bank, three
    T*T*TT buffers an item). ``colloc``: Gauss-Lobatto points on the nodes (nq == nd), no
    B1d. The pointwise stage is ``qfunc.cuh.j2``'s. ``params``: ``per_block``,
    ``min_blocks``, ``line`` (``rb`` 1 and ``prefetch`` 0 only), ``qmode`` (line form:
    where the z step reads Q from, :data:`QMODES`; missing means "global"). The
    heuristic: the line form in 3D (:func:`qfunc_line_heuristic`; the shared-memory form
    ran at 0.67-0.85x the best line variant at p = 1..4), the shared-memory form with ~128 threads a
    block in 1D and 2D.

    >>> c = qfunc_ctx(3, 5, 6, 1, "float64", "diffusion", False)
    >>> c["template"], c["line"], c["nbuf"], c["nsym"], c["per_block"], c["qmode"]
    ('action_line.cu.j2', 1, 3, 6, 3, 'smem')
    >>> c = qfunc_ctx(2, 5, 5, 1, "float32", "helmholtz", True)
    >>> c["template"], c["nbuf"], c["goff"], c["head"]
    ('action.cu.j2', 2, 0, 26)
    >>> qfunc_ctx(3, 4, 5, 1, "float64", "diffusion", True) is None    # collocated: nq == nd
    True
    """
    if qfunc not in QFUNCS[1:] or (colloc and nd != nq) or dim not in (1, 2, 3):
        return None
    params = dict(params) if params else None
    if params and (params.get("rb", 1) != 1 or params.get("prefetch", 0) != 0):
        return None
    s = ITEMSIZE[dtype]
    T = max(nd, nq)
    nsym = dim * (dim + 1) // 2
    line = params.get("line", 0) if params else int(dim == 3)
    common = dict(dim=dim, nd=nd, nq=nq, ncomp=ncomp, dtype=dtype, T=T, qfunc=qfunc,
                  colloc=int(colloc), nsym=nsym, rb=1, tb=T, prefetch=0, stages=0)
    if line:
        if dim != 3:
            return None
        ne, qmode = qfunc_line_heuristic(nd, nq, ncomp, colloc)
        min_blocks, layout = 0, "model"
        if params:
            ne, min_blocks = params["per_block"], params.get("min_blocks", 0)
            qmode, layout = params.get("qmode", "global"), params.get("layout", "odd")
        if (ne < 1 or qmode not in QMODES or (qmode == "smem" and ncomp > 1)
                or layout not in LAYOUTS):
            return None
        if layout == "odd":
            TT = LS = T | 1
            PS, istr = T * TT, 3 * T * T * TT | 1
        else:
            TT, LS, PS, istr = qfunc_line_layout(nd, nq, ne, bool(colloc), qmode == "smem",
                                                 s, nsym)
        tpi, buf, nbuf = TT * T, T * PS, 3
        smem = s * (ne * istr + 1)
        if smem > smem_optin or tpi * ne > MAX_THREADS:
            return None
        qsm = ne * nsym * nq ** 3 if qmode == "smem" else 0
        smem += s * qsm
        if smem > smem_optin:
            return None
        # "odd" renders the strides of the template's default (the kernels measured before)
        strides = dict(ls=LS, ps=PS) if layout == "model" else {}
        return dict(common, **strides, TT=TT, istr=istr, layout=layout, tpi=tpi,
                    per_block=ne, threads=tpi * ne, smem_bytes=smem, min_blocks=min_blocks,
                    line=1, nbuf=nbuf,
                    qpre=int(qmode == "regs"), qsmem=int(qmode == "smem"), qmode=qmode,
                    qoff=ne * istr + 1,
                    uoff=0 if colloc else 2 * buf, template="action_line.cu.j2")
    tpi = T * T if dim == 3 else T
    nbuf = 2 if colloc else 3
    goff = 0 if colloc else even(nq * nd)
    head = goff + even(nq * nd)
    ne = max(1, QFUNC_THREADS // tpi)
    min_blocks = 0
    if params:
        ne, min_blocks = params["per_block"], params.get("min_blocks", 0)

    def smem(ne):
        return s * (head + ne * (nbuf * T ** dim + 1))

    while params is None and ne > 1 and smem(ne) > SMEM_TARGET:
        ne -= 1
    if ne < 1 or smem(ne) > smem_optin or tpi * ne > MAX_THREADS:
        return None
    return dict(common, tpi=tpi, per_block=ne, threads=tpi * ne, smem_bytes=smem(ne),
                min_blocks=min_blocks, line=0, nbuf=nbuf, goff=goff, head=head,
                template="action.cu.j2")


def action_ctx(dim, nd, nq, ncomp, dtype, smem_optin=227 * 1024, params=None, cc="90"):
    """Context of ``action.cu.j2`` (``action_rb.cu.j2`` when ``rb > 1``), or None when
    one item does not fit in shared memory.

    T = max(nd, nq); an item gets T*T threads in 3D, T in 2D and 1D, and two
    T^dim buffers; items per block fill 256 threads within the target.

    ``params`` (a tuning table's answer): ``per_block``, ``min_blocks`` and
    ``rb``, the outputs each thread computes along the contracted axis of
    the x and y steps (register blocking; missing means 1). An item then has
    T*TB threads in 3D and TB in 2D, TB = ceil(T / rb); ``rb`` is normalised
    to ceil(T / TB), the fewest outputs per thread that TB threads need (rb = 4
    at T = 5 is rb = 3). 1D has no rb > 1. The heuristic (no params) takes rb = 1.

    ``line`` = 1 (3D only; the heuristic's choice from T = :data:`LINE_FROM_T` on):
    the line form, :func:`action_line_ctx`.

    >>> c = action_ctx(3, 3, 4, 1, "float64")
    >>> c["T"], c["tpi"], c["per_block"], c["line"]
    (4, 16, 8, 0)
    """
    s = ITEMSIZE[dtype]
    T = max(nd, nq)
    line = (params.get("line", 0) if params else int(dim == 3 and T >= LINE_FROM_T))
    if line:
        return action_line_ctx(dim, nd, nq, ncomp, dtype, smem_optin, params, cc)
    rb = params.get("rb", 1) if params else 1
    if rb < 1 or (dim == 1 and rb > 1):
        return None
    tb = math.ceil(T / rb)
    rb = math.ceil(T / tb)
    tpi = T * tb if dim == 3 else tb
    # measured on H100, 3D float64 (notes/cuda.md, "The launch-shape sweeps"): T <= 4
    # best at ~128 threads; from T = 5 on, a register cap (min_blocks) for ~768 resident
    # threads per SM; from T = 8 on, ~128 threads per block as well.
    ne = max(1, (THREADS // 2 if T <= 4 or T >= 8 else THREADS) // tpi)
    min_blocks = 0 if T <= 4 else min(6, math.ceil(768 / (ne * tpi)))
    if params:
        ne, min_blocks = params["per_block"], params.get("min_blocks", 0)

    def smem(ne):
        return s * (even(nq * nd) + ne * (2 * T ** dim + 1))

    while params is None and ne > 1 and smem(ne) > SMEM_TARGET:
        ne -= 1
    if smem(ne) > smem_optin or tpi * ne > 1024:
        return None
    return dict(dim=dim, nd=nd, nq=nq, ncomp=ncomp, dtype=dtype, T=T, tpi=tpi, per_block=ne,
                threads=tpi * ne, smem_bytes=smem(ne), min_blocks=min_blocks, rb=rb, tb=tb,
                line=0, prefetch=0, stages=0)


def action_line_ctx(dim, nd, nq, ncomp, dtype, smem_optin=227 * 1024, params=None, cc="90"):
    """Context of ``action_line.cu.j2``, the 3D action's *line* form, or None.

    Every step is done by whole 1D lines (a thread loads a line into registers and
    computes every output along the contracted axis) with B1d in the constant bank,
    so an FMA takes its B operand from there: about nd FMAs per shared-memory load
    instead of one. An item has TT*T threads (TT: T rounded up to odd, the line
    stride) and two T*T*TT buffers; with ``layout`` "model" (prefetch 0 and 1 only) TT
    and the strides of :func:`.smem_layout.qfunc_line_layout`. ``params``: ``per_block``,
    ``min_blocks`` and ``prefetch``: 1, the next group's V and D are loaded into
    registers during the current group's steps (blocks loop over groups); 2, the
    same with V copied straight into a third shared buffer by ``cp.async``; 0, no
    overlap; 3, the *bulk* form (compute capability 9.0 on: ``cc``): thread 0 copies
    each group's V and D slabs into one of ``stages`` (2 or 3) slots of shared memory
    by ``cp.async.bulk`` (no registers held, one instruction a slab), ``stages - 1``
    groups in flight while one computes. The bulk form needs whole elements in a group
    (``per_block`` a multiple of ``ncomp``) and slabs that are 16-byte multiples; the
    executor checks that V and D start 16-byte aligned. The heuristic: the bulk form
    from compute capability :data:`BULK_FROM_CC` on (2 stages, ~160 threads or the
    next count whose slabs fit, at most 512; a register cap for 2 blocks an SM where
    it leaves ~11 nd registers a thread), else ~160 threads with prefetch
    :data:`LINE_PREFETCH`.

    >>> c = action_line_ctx(3, 8, 9, 1, "float64", cc="80")
    >>> c["T"], c["TT"], c["tpi"], c["per_block"], c["line"], c["prefetch"]
    (9, 9, 81, 2, 1, 1)
    >>> c = action_line_ctx(3, 8, 9, 1, "float64")       # sm_90: the bulk form
    >>> c["per_block"], c["min_blocks"], c["prefetch"], c["stages"]
    (2, 2, 3, 2)
    >>> c["istr"], action_line_ctx(3, 8, 9, 1, "float64", params=dict(per_block=2, prefetch=2))["istr"]
    (1459, 2187)
    >>> action_line_ctx(2, 8, 9, 1, "float64") is None        # 3D only
    True
    >>> c = action_line_ctx(3, 9, 10, 1, "float64", params=dict(per_block=2, prefetch=3))
    >>> c["stages"], c["direct"], c["vst"], c["slot"], c["smem_bytes"]
    (2, 1, 1458, 3458, 90568)
    >>> action_line_ctx(3, 9, 10, 1, "float64", params=dict(per_block=1, prefetch=3)) is None
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
    if params is None and int(cc) >= BULK_FROM_CC:
        # the heuristic on sm_90: the bulk form, 2 stages, the fewest items from ~160
        # threads on whose slabs are 16-byte multiples, up to 512 threads; a register cap
        # for 2 blocks an SM where it leaves the ~11 * nd registers a thread needs (H200
        # tuning runs: p = 8 kernels hold 98-102, a tighter cap spilled and lost 1.34x)
        for n in range(max(2, ne), 512 // tpi + 1):
            mb = 2 if SM_REGISTERS // (2 * n * tpi) >= 11 * nd else 0
            ctx = action_line_ctx(dim, nd, nq, ncomp, dtype, smem_optin,
                                  dict(per_block=n, min_blocks=mb, prefetch=3, stages=2), cc)
            if ctx is not None:
                return ctx
    min_blocks, prefetch = 0, LINE_PREFETCH
    if params:
        ne, min_blocks = params["per_block"], params.get("min_blocks", 0)
        prefetch = params.get("prefetch", 0)
    if prefetch not in (0, 1, 2, 3) or ne < 1:
        return None
    nbuf = 3 if prefetch == 2 else 2         # the cp.async form stages V in a third buffer
    istr = nbuf * buf + 1 - (nbuf * buf) % 2     # odd: items start on different banks
    layout = params.get("layout", "odd") if params else "odd"
    strides = {}
    if layout not in LAYOUTS or (layout == "model" and prefetch > 1):
        return None
    if layout == "model":                    # the register and plain forms (the fused BP1)
        TT, LS, PS, istr = qfunc_line_layout(nd, nq, ne, False, False, s, mass=True)
        tpi, buf, strides = TT * T, T * PS, dict(ls=LS, ps=PS)
        if tpi * ne > 1024:
            return None
    bulk = {}
    head = 0                                 # reals before the items' buffers
    if prefetch == 3:
        stages = (params.get("stages") or 2) if params else 2
        per16 = 16 // s                      # reals in 16 bytes
        vst, dst = ne * nd ** 3, ne // ncomp * nq ** 3
        if (int(cc) < 90 or stages not in (2, 3) or ne % ncomp
                or vst % per16 or dst % per16):
            return None
        bar = -(-8 * stages // 16) * per16   # the mbarriers, 8 bytes each, 16-byte multiple
        head = bar + stages * (vst + dst)
        bulk = dict(stages=stages, bar_reals=bar, vst=vst, slot=vst + dst, direct=nd % 2)
    smem = s * (head + ne * istr + 1)
    if smem > smem_optin or tpi * ne > 1024:
        return None
    return dict(dim=dim, nd=nd, nq=nq, ncomp=ncomp, dtype=dtype, T=T, TT=TT, istr=istr,
                tpi=tpi, per_block=ne, threads=tpi * ne, smem_bytes=smem,
                min_blocks=min_blocks, rb=1, tb=T, line=1, prefetch=prefetch, layout=layout,
                **strides, **(bulk or dict(stages=0)))


def _threads_per_item(spec, rb, line):
    T = max(spec.nd, spec.nq)
    if line:
        return (T | 1) * T
    tb = -(-T // rb)
    return T * tb if spec.dim == 3 else tb


def _counts(upto):
    """Items per block searched: all up to 16, else 1, 2, 3, 4, 6, 8, 12, 16, ..."""
    if upto <= 16:
        return range(1, upto + 1)
    vals = {1}
    for p in (2 ** i for i in range(11)):
        vals.update(v for v in (p, 3 * p // 2 if p >= 2 else p) if v <= upto)
    return sorted(vals)


def _qfunc_space(spec):
    """The diffusion and helmholtz instances' search space: the shared-memory form and (3D)
    the line form, every items-per-block count, min_blocks 0, 2, 4; the line form with each
    ``qmode`` (:data:`QMODES`: where the z step reads Q; "smem" needs ncomp 1, float32
    point data takes "global" and "regs", the vertex geometry "global" and "smem": the
    others give no context and are pruned ``invalid``); no rb, no prefetch.

    >>> from smalltc.spec import ActionSpec
    >>> s = ActionSpec(dim=3, nq=6, nd=5, batch=1, dtype="float64", qfunc="diffusion")
    >>> sorted({p.get("qmode") for p, _ in _qfunc_space(s)}, key=str)
    [None, 'global', 'regs', 'smem']
    """
    T = max(spec.nd, spec.nq)
    for line in (0, 1) if spec.dim == 3 else (0,):
        tpi = (T | 1) * T if line else _threads_per_item(spec, 1, False)
        upto = MAX_THREADS // tpi
        for ne in _counts(upto):
            for mb in (0, 2, 4):
                why = ("threads" if ne * tpi < MIN_THREADS and ne < upto else
                       "resident" if mb * ne * tpi > SM_THREADS else None)
                base = dict(per_block=ne, min_blocks=mb, rb=1, line=line, prefetch=0, stages=0)
                for qm in QMODES if line else (None,):
                    for lay in LAYOUTS if line else (None,):
                        yield (base if qm is None else dict(base, qmode=qm, layout=lay)), why


def _meaningful(spec, params):
    """``params`` without a ``qmode`` or ``layout`` where they mean nothing (the mass
    instance's ``qmode``, the shared-memory form) or the default (a mass entry's "odd"
    layout): an entry's answer holds only the parameters its kernel has."""
    if params is not None and "qmode" in params and (
            qfunc_of(spec) == ("mass", False) or not params.get("line")):
        params = {k: v for k, v in params.items() if k != "qmode"}
    if params is not None and "layout" in params and (not params.get("line") or (
            qfunc_of(spec) == ("mass", False) and params["layout"] == "odd")):
        params = {k: v for k, v in params.items() if k != "layout"}
    return params


def _carry_qfunc(family, spec, entry_spec, params, device):
    """A diffusion or helmholtz entry's parameters carried to another size of the same
    instance (the table's nearest lookup only offers those: ``qfunc`` and ``+co`` are part
    of the key's variant): the same form and ``qmode`` ("smem" becomes "global" where
    there are components, as the heuristic does), about the same threads a block, the
    register cap lowered until it can be met, the item count lowered until it fits."""
    if qfunc_of(spec) != qfunc_of(entry_spec):
        return None
    line = int(bool(params.get("line", 0))) if spec.dim == 3 else 0
    t0 = _threads_per_item(entry_spec, 1, bool(params.get("line", 0)) and entry_spec.dim == 3)
    t1 = _threads_per_item(spec, 1, bool(line))
    if t1 > MAX_THREADS:
        return None
    ne = max(1, min(round(params["per_block"] * t0 / t1), MAX_THREADS // t1))
    mb = params.get("min_blocks", 0)
    while mb and mb * ne * t1 > SM_THREADS:
        mb -= 1
    got = dict(per_block=ne, min_blocks=mb, rb=1, line=line, prefetch=0, stages=0)
    if line:
        qm = params.get("qmode", "global")
        got["qmode"] = "global" if qm == "smem" and spec.ncomp > 1 else qm
        got["layout"] = params.get("layout", "odd")
    return family.first_valid(spec, {k: v for k, v in got.items()
                                     if k in family.params}, device)


#: the (qfunc, dim) instances with a vertex-geometry kernel (docs/math.md section 8)
VERTEX_FORMS = (("mass", 2), ("mass", 3), ("diffusion", 2), ("diffusion", 3))


def vertex_ctx(ctx, spec, rebuild):
    """The context for the vertex geometry (``spec.geometry == "vertices"``; ``vertex.cuh.j2``),
    or ``ctx`` unchanged for the other specs: the point data recomputed from XV and CF where
    the kernel read D or Q. The diffusion line form takes ``qmode`` "global" (Q computed at
    each point of the z step, in registers beside the step's) and "smem" (Q of the group
    computed at its start into the shared-memory slab the stored form copies Q into: the
    geometry's registers are not live during the steps; H200, BP3 p = 2: 1.04x "global",
    p = 1: 0.83x), as the stored form's heuristic chooses (smem from T = 4). The forms
    that read D or Q otherwise (the line form's prefetch 1-3 and ``qmode`` "regs", the
    register-blocked form) are not taken: given as parameters they give None; the
    heuristic's choice of one is replaced by ``rebuild(params)`` with the same form
    reading at the point (prefetch 0, rb 1). The 1D rule's values and weights become
    constants of the kernel."""
    if ctx is None or getattr(spec, "geometry", None) != "vertices":
        return ctx

    def bad(c):
        return (c is None or (c.get("qsmem") and not c.get("qfunc")) or c.get("qpre")
                or c.get("rb", 1) != 1 or c.get("prefetch", 0) != 0)
    if bad(ctx):
        if rebuild is None:
            return None
        if ctx.get("qfunc"):
            ctx = rebuild(dict(per_block=ctx["per_block"], min_blocks=ctx["min_blocks"],
                               line=ctx["line"], qmode="global"))
        else:
            line, new = int(ctx.get("line", 0)), None
            for ne in range(ctx["per_block"] * max(1, ctx.get("rb", 1)), 0, -1):
                new = rebuild(dict(per_block=ne, min_blocks=0, rb=1, line=line, prefetch=0,
                                   stages=0))
                if new is not None:
                    break
            ctx = new
        if bad(ctx):
            return None
    x, w = rule_1d(spec.nq, bool(getattr(spec, "collocated", False)))
    lit = (lambda v: [repr(float(a)) for a in v])
    return dict(ctx, geometry=1, vx_n0=lit((1 - x) / 2), vx_n1=lit((1 + x) / 2), vx_w=lit(w))


def _vertex_ok(spec):
    """True for stored point data, and for the vertex geometry where a form has it."""
    return getattr(spec, "geometry", None) is None or (
        spec.qfunc, spec.dim) in VERTEX_FORMS


def point_data_ctx(context_of, spec, params, device):
    """The context ``context_of(spec, params, device)`` gives, adapted to the spec's point
    data (float32 data: :func:`point_data_f32`; the vertex geometry: :func:`vertex_ctx`);
    without ``params`` (the heuristic's choice) a refused form is replaced by rebuilding
    with other parameters. The fused and element-level families share it."""
    ctx = context_of(spec, params, device)
    rebuild = None if params is not None else (lambda p: context_of(spec, p, device))
    return vertex_ctx(point_data_f32(ctx, spec, rebuild), spec, rebuild)


def point_data_f32(ctx, spec, rebuild):
    """The context for float32 point data with float64 vectors (``spec.qdtype``; docs/math.md
    section 8), or ``ctx`` unchanged for the other specs: the templates read D and Q
    through ``qt`` (``float``) pointers and compute in ``real_t``. The forms that copy D or
    Q as raw slabs into shared memory of ``real_t`` (the bulk form, ``prefetch`` 3; the
    line form's ``qmode`` "smem") and the register-blocked shared-memory form (``rb`` > 1,
    ``action_rb.cu.j2``) are not taken: given as parameters they give None; the heuristic's
    choice of one is replaced by ``rebuild(params)`` with the nearest form that reads
    through pointers (qmode "regs"; ``rb`` 1 with ``prefetch`` 1 on the line form)."""
    if ctx is None or not getattr(spec, "qdtype", None):
        return ctx
    if ctx.get("qsmem") or ctx.get("rb", 1) != 1 or ctx.get("prefetch", 0) == 3:
        if rebuild is None:
            return None
        if ctx.get("qfunc"):
            ctx = rebuild(dict(per_block=ctx["per_block"], min_blocks=ctx["min_blocks"],
                               line=ctx["line"], qmode="regs"))
        else:
            line = int(ctx.get("line", 0))
            for ne in range(ctx["per_block"] * max(1, ctx.get("rb", 1)), 0, -1):
                new = rebuild(dict(per_block=ne, min_blocks=0, rb=1, line=line,
                                   prefetch=1 if line else 0, stages=0))
                if new is not None:
                    break
            ctx = new
        if ctx is None or ctx.get("qsmem") or ctx.get("rb", 1) != 1 \
                or ctx.get("prefetch", 0) == 3:
            return None
    return dict(ctx, qt="float")


class ActionFamily(Family):
    """The fused action; see the module docstring."""

    name = "action"
    templates = ("action.cu.j2", "action_rb.cu.j2", "action_line.cu.j2")
    #: ``qmode``: the diffusion and helmholtz instances' line form only (mass entries lack it)
    params = ("per_block", "min_blocks", "rb", "line", "prefetch", "stages", "qmode", "layout")
    optional = {"rb": 1, "line": 0, "prefetch": 0, "stages": 0, "qmode": "global",
                "layout": "odd"}
    public_keys = Family.public_keys + ("qmode", "layout")
    #: the ncomp=3 entries carried from the ncomp=1 ones (distance 1.58) won on the H100
    max_distance = 2.0

    def claims(self, spec):
        return spec.op == "action"

    def supports(self, spec):
        """Every operator instance: mass, diffusion and helmholtz, Gauss or collocated, with
        stored point data (float64 or float32) or, mass and diffusion, the vertex
        geometry (:data:`VERTEX_FORMS`); not the corner force (its own family)."""
        return getattr(spec, "qfunc", "mass") not in ("force", "force_t") and _vertex_ok(spec)

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        return point_data_ctx(self._context, spec, params, device)

    def _context(self, spec, params, device):
        qf, co = qfunc_of(spec)
        if qf != "mass" or co:
            return qfunc_ctx(spec.dim, spec.nd, spec.nq, spec.ncomp, spec.dtype, qf, co,
                             device["smem_optin"], params, device.get("cc", "90"))
        return action_ctx(spec.dim, spec.nd, spec.nq, spec.ncomp, spec.dtype,
                          device["smem_optin"], params, device.get("cc", "90"))

    def template(self, ctx):
        if ctx.get("qfunc"):
            return ctx["template"]
        if ctx.get("line"):
            return "action_line.cu.j2"
        return "action.cu.j2" if ctx["rb"] == 1 else "action_rb.cu.j2"

    def entry(self, spec, ctx):
        q32 = "_q32" if ctx.get("qt") else "_vx" if ctx.get("geometry") else ""
        if ctx.get("qfunc"):
            return (f"stc_{ctx['qfunc']}_action_{spec.dim}d_{DT[spec.dtype]}_nd{spec.nd}"
                    f"nq{spec.nq}c{spec.ncomp}{'_co' if ctx['colloc'] else ''}"
                    f"{'_line' if ctx.get('line') else ''}{q32}")
        return (f"stc_mass_action_{spec.dim}d_{DT[spec.dtype]}_nd{spec.nd}nq{spec.nq}"
                f"c{spec.ncomp}{'_line' if ctx.get('line') else ''}{q32}")

    def executor(self, choice, device):
        """The executor; the heuristic's register cap (``min_blocks``) must not spill:
        local-memory traffic cost up to 2x (notes/cuda.md, ncu of nd6nq6), so it is
        relaxed until the kernel uses at most :data:`MAX_LOCAL_BYTES` of local memory."""
        ex = ActionExecutor(choice, device)
        while (choice.source == "heuristic" and ex.local_bytes > MAX_LOCAL_BYTES
               and choice.ctx["min_blocks"] > 0):
            choice = choice._replace(ctx=dict(choice.ctx, min_blocks=choice.ctx["min_blocks"] - 1))
            ex = ActionExecutor(choice, device)
        return ex

    def space(self, spec):
        """The shared-memory form with ``rb`` 1..4 (1 in 1D), every items-per-block count
        that fits (or 1, 2, 3, 4, 6, 8, 12, ... above 16), min_blocks 0..8; in 3D also
        the line form with min_blocks 0, 2, 4 and prefetch 0, 1, 2, and its bulk form
        (prefetch 3, stages 2 and 3; sm_90 on). Pruned: ``threads`` (under 64 per block
        where more items would fit), ``resident`` (min_blocks x threads over the SM's
        2048); the bulk form's sizes that are not 16-byte multiples are ``invalid``."""
        T = max(spec.nd, spec.nq)
        if qfunc_of(spec) != ("mass", False):
            yield from _qfunc_space(spec)
            return
        for rb in _RB if spec.dim > 1 else (1,):
            tpi = _threads_per_item(spec, rb, False)
            upto = MAX_THREADS // tpi
            for ne in _counts(upto):
                threads = ne * tpi
                for mb in _MIN_BLOCKS:
                    why = ("threads" if threads < MIN_THREADS and ne < upto else
                           "resident" if mb * threads > SM_THREADS else None)
                    yield dict(per_block=ne, min_blocks=mb, rb=rb, line=0, prefetch=0,
                               stages=0), why
        if spec.dim == 3:
            tpi = (T | 1) * T
            upto = MAX_THREADS // tpi
            for ne in _counts(upto):
                threads = ne * tpi
                for mb in (0, 2, 4):
                    why = ("threads" if threads < MIN_THREADS and ne < upto else
                           "resident" if mb * threads > SM_THREADS else None)
                    for pf, st in ((0, 0), (1, 0), (2, 0), (3, 2), (3, 3)):
                        yield dict(per_block=ne, min_blocks=mb, rb=1, line=1, prefetch=pf,
                                   stages=st), why

    def adapt(self, spec, entry_spec, params, device=DEFAULT_DEVICE):
        return _meaningful(spec, super().adapt(spec, entry_spec, params, device))

    def carry(self, spec, entry_spec, params, device):
        """Another size's entry: the diffusion and helmholtz instances by
        :func:`_carry_qfunc`, the mass instance by :meth:`_carry_mass` (never one
        instance's entry for another's spec: None)."""
        if qfunc_of(spec) != qfunc_of(entry_spec):
            return None
        if qfunc_of(spec) != ("mass", False):
            return _carry_qfunc(self, spec, entry_spec, params, device)
        return self._carry_mass(spec, entry_spec, params, device)

    def _carry_mass(self, spec, entry_spec, params, device):
        """The same threads per block, register blocking and form (the line form in 3D
        only), the register cap lowered until it can be met."""
        line0 = bool(params.get("line", 0)) and entry_spec.dim == 3
        line = line0 and spec.dim == 3
        rb0 = 1 if line0 else params.get("rb", self.optional["rb"])
        rb = rb0 if spec.dim > 1 else 1       # 1D has no register blocking
        t1 = _threads_per_item(spec, rb, line)
        if t1 > MAX_THREADS:
            return None
        ne = max(1, min(round(params["per_block"] * _threads_per_item(entry_spec, rb0, line0)
                              / t1), MAX_THREADS // t1))
        mb = params.get("min_blocks", 0)
        while mb and mb * ne * t1 > SM_THREADS:
            mb -= 1
        pf = params.get("prefetch", 0) if line else 0
        if pf == 3:    # the bulk form at a near item count whose slabs fit, else prefetch 1
            d = max(1, ne // 2)
            near = range(max(1, ne - d), min(MAX_THREADS // t1, ne + d) + 1)
            for n in sorted(near, key=lambda n: (abs(n - ne), -n)):
                got = dict(per_block=n, min_blocks=mb, rb=1, line=1, prefetch=3,
                           stages=params.get("stages", 2))
                if mb * n * t1 <= SM_THREADS and self.context(spec, got, device) is not None:
                    return got
        return self.first_valid(spec, dict(per_block=ne, min_blocks=mb, rb=rb, line=int(line),
                                           prefetch=int(bool(pf)), stages=0), device)


ACTION = ActionFamily()


class ActionExecutor(KernelExecutor):
    """The fused action. The line form reads B1d from its module's constant bank
    (``stc_cB``): each call first copies B1d there on the current stream, after the
    previous launch of this kernel on any other stream has finished (an event), so
    calls on several streams with different B1d do not race. (Inside a CUDA-graph
    capture that wait is left out: the graph orders its own nodes.)

    The bulk form (``prefetch`` 3) copies V and D by 16-byte-aligned slabs: a call whose
    V or D does not start on 16 bytes (a view at an odd offset) runs the same
    parameters with ``prefetch`` 1 instead (:attr:`unaligned`, built on first need)."""

    def __init__(self, choice, device):
        super().__init__(choice, device)
        spec = choice.spec
        self.nbatch = spec.batch * spec.ncomp
        self._line = bool(self.ctx.get("line"))
        self._bulk = self.ctx.get("prefetch") == 3
        self._device = device
        self.unaligned = None                # the prefetch-1 executor for unaligned V or D
        self._bank = None                    # RT.ConstantBank of the line form's matrices
        self._qfunc = self.ctx.get("qfunc")  # None: the mass instance
        self._colloc = bool(self.ctx.get("colloc"))

    def _split(self, ops):
        """Diffusion/helmholtz operands (B1d absent when collocated): (B1d or None, G1d,
        the arrays the kernel takes after the constant bank's, in call order)."""
        if self._colloc:
            return None, ops[0], ops[1:]
        return ops[0], ops[1], ops[2:]

    def _run_qfunc(self, ops, out):
        B1d, G1d, rest = self._split(ops)
        if not self._line:
            head = ((B1d,) if B1d is not None else ()) + (G1d,)
            self._run_arrays(self.nbatch, head + tuple(rest) + (out,))
            return
        self._load_constant_bank(B1d, G1d)
        self._run_arrays(self.nbatch, tuple(rest) + (out,))
        self._after_launch()

    def _unaligned(self):
        if self.unaligned is None:
            fam, spec = self.choice.family, self.choice.spec
            params = dict({k: self.ctx[k] for k in fam.params if k in self.ctx}, prefetch=1,
                          stages=0)
            ctx = fam.context(spec, params, self._device)
            self.unaligned = ActionExecutor(self.choice._replace(
                ctx=ctx, entry=fam.entry(spec, ctx), template=fam.template(ctx),
                source=f"{self.choice.source}, unaligned operands"), self._device)
        return self.unaligned

    def run(self, operands, out, **_):
        if self._qfunc:
            self._run_qfunc([o for o in operands if o is not None], out)
            return
        B1d, *data, V = operands          # data: D, or X and coef (the vertex geometry)
        if not self._line:
            self._run_arrays(self.nbatch, (B1d, *data, V, out))
            return
        if self._bulk and (data[0].data.ptr | V.data.ptr) & 15:
            self._unaligned().run(operands, out)
            return
        self._load_constant_bank(B1d)
        self._run_arrays(self.nbatch, (*data, V, out))
        self._after_launch()

    def _load_constant_bank(self, B1d, G1d=None):
        """Copy B1d into the module's ``stc_cB`` (and G1d into ``stc_cG``: the diffusion and
        helmholtz instances; B1d None when collocated) on the current stream, after the last
        launch of this module on another stream (then launch, then :meth:`_after_launch`;
        :class:`.runtime.ConstantBank`)."""
        if self._bank is None:
            names = ("stc_cG",) if self._colloc else \
                ("stc_cB",) + (("stc_cG",) if G1d is not None else ())
            self._bank = RT.ConstantBank(self.template, self.kernel, self.ctx, self.smem, names)
        self._bank.load(*((G1d,) if self._colloc else (B1d, G1d)))

    def _after_launch(self):
        """Record that this module's launches on the current stream read its bank."""
        self._bank.launched()
