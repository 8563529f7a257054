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

The heuristic, measured on an H100 (float64, notes/cuda.md): the line form from
T = :data:`LINE_FROM_T` on with ``prefetch`` :data:`LINE_PREFETCH` (from compute
capability :data:`BULK_FROM_CC` on the bulk form, measured on the H200 and the
H100: notes/cuda.md, "The bulk form, session 9"); below, the shared-memory form
with ~128 threads per block (T <= 4) and, from T = 5, a register cap for ~768
resident threads per SM; it never picks ``rb`` > 1. Tuning parameters:
``per_block, min_blocks, rb, line, prefetch, stages``.
"""
from __future__ import annotations

import math

from ..._arrays import cupy_or_none
from . import runtime as RT
from .family import (DEFAULT_DEVICE, DT, ITEMSIZE, MAX_LOCAL_BYTES, MAX_THREADS, MIN_THREADS,
                     SM_REGISTERS, SM_THREADS, SMEM_TARGET, THREADS, Family, KernelExecutor,
                     even)

__all__ = ["ACTION", "ActionFamily", "action_ctx", "action_line_ctx", "LINE_FROM_T",
           "LINE_PREFETCH", "BULK_FROM_CC"]

#: the 3D heuristic takes the line form from this T = max(nd, nq) on: on an H100 it ran
#: 1.13-1.46x the *tuned* register-blocked kernels at p = 5..8, float64, and lost at
#: p = 1 (0.77-0.86); notes/cuda.md, "Session 4"
LINE_FROM_T = 5
#: the line form's default ``prefetch``: 1 (V and D of the next group in registers) ran
#: 1.18-1.49x the plain line form (0) at the heuristic's own per_block, on an H100 at 3D
#: p = 4..8, nq = p+1, float64 (notes/cuda.md, "Session 5")
LINE_PREFETCH = 1
#: from this compute capability on, the line form's heuristic is the bulk form
#: (``prefetch`` 3, cp.async.bulk); on the H200 the tuner's winners at 3D p = 2..8 were
#: the bulk form at 11 of 16 sizes, 1.05-1.28x the register prefetch (prefetch 1); the
#: heuristic alone ran 1.073x the old one on the H200, 1.023x on the H100 (notes/cuda.md,
#: "The bulk form, session 9")
BULK_FROM_CC = 90
#: ``__launch_bounds__`` minimum blocks searched (0 and 1 give the same register cap)
_MIN_BLOCKS = (0, 1, 2, 3, 4, 5, 6, 8)
#: register blocking searched; an rb that the context normalises to a smaller one
#: (rb = 4 at T = 5 is 3) is a duplicate
_RB = (1, 2, 3, 4)


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
    # measured on H100, 3D float64 (notes/cuda.md, sweep 1): T <= 4 best at ~128 threads;
    # from T = 5 on, a register cap (min_blocks) for ~768 resident threads per SM;
    # from T = 8 on, ~128 threads per block as well.
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
    stride: conflict-free banks) and two T*T*TT buffers. ``params``: ``per_block``,
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
                min_blocks=min_blocks, rb=1, tb=T, line=1, prefetch=prefetch,
                **(bulk or dict(stages=0)))


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


class ActionFamily(Family):
    """The fused action; see the module docstring."""

    name = "action"
    templates = ("action.cu.j2", "action_rb.cu.j2", "action_line.cu.j2")
    params = ("per_block", "min_blocks", "rb", "line", "prefetch", "stages")
    optional = {"rb": 1, "line": 0, "prefetch": 0, "stages": 0}
    #: the ncomp=3 entries carried from the ncomp=1 ones (distance 1.58) won on the H100
    max_distance = 2.0

    def claims(self, spec):
        return spec.op == "action"

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        return action_ctx(spec.dim, spec.nd, spec.nq, spec.ncomp, spec.dtype,
                          device["smem_optin"], params, device.get("cc", "90"))

    def template(self, ctx):
        if ctx.get("line"):
            return "action_line.cu.j2"
        return "action.cu.j2" if ctx["rb"] == 1 else "action_rb.cu.j2"

    def entry(self, spec, ctx):
        return (f"stc_mass_action_{spec.dim}d_{DT[spec.dtype]}_nd{spec.nd}nq{spec.nq}"
                f"c{spec.ncomp}{'_line' if ctx.get('line') else ''}")

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

    def carry(self, spec, entry_spec, params, device):
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
        self._slots = {}                     # device id -> get_global's shared slot of stc_cB

    def _unaligned(self):
        if self.unaligned is None:
            fam, spec = self.choice.family, self.choice.spec
            params = dict({k: self.ctx[k] for k in fam.params}, prefetch=1, stages=0)
            ctx = fam.context(spec, params, self._device)
            self.unaligned = ActionExecutor(self.choice._replace(
                ctx=ctx, entry=fam.entry(spec, ctx), template=fam.template(ctx),
                source=f"{self.choice.source}, unaligned operands"), self._device)
        return self.unaligned

    def run(self, operands, out, **_):
        B1d, D, V = operands
        if not self._line:
            self._run_arrays(self.nbatch, (B1d, D, V, out))
            return
        if self._bulk and (D.data.ptr | V.data.ptr) & 15:
            self._unaligned().run(operands, out)
            return
        self._load_constant_bank(B1d)
        self._run_arrays(self.nbatch, (D, V, out))
        self._after_launch()

    def _load_constant_bank(self, B1d):
        """Copy B1d into the module's ``stc_cB`` on the current stream, after the last
        launch of this module on another stream (then launch, then :meth:`_after_launch`)."""
        cp = cupy_or_none()
        # one slot per module and device: [stc_cB pointer, event after the last launch,
        # that launch's stream], shared with every other executor of this kernel
        dev = cp.cuda.runtime.getDevice()
        slot = self._slots.get(dev)
        if slot is None:
            slot = self._slots[dev] = RT.get_global(self.template, self.kernel, self.ctx,
                                                    self.smem, "stc_cB")
        if slot[1] is None:
            slot[1] = cp.cuda.Event(disable_timing=True)
        ptr, event, last = slot
        stream = cp.cuda.get_current_stream()
        if last is not None and last != stream.ptr and not stream.is_capturing():
            stream.wait_event(event)
        cp.cuda.runtime.memcpyAsync(ptr.ptr, B1d.data.ptr, B1d.nbytes,
                                    cp.cuda.runtime.memcpyDeviceToDevice, stream.ptr)

    def _after_launch(self):
        """Record that this module's launches on the current stream read ``stc_cB``."""
        cp = cupy_or_none()
        slot = self._slots[cp.cuda.runtime.getDevice()]
        stream = cp.cuda.get_current_stream()
        slot[1].record(stream)
        slot[2] = stream.ptr
