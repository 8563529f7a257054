"""The basis family: ``smalltc.interpolate`` and ``smalltc.integrate`` in one kernel each.

CEED's ``EVAL_INTERP``/``EVAL_GRAD`` and their transposes (:class:`smalltc.spec.BasisSpec`,
docs/math.md section 7), from ``basis.cu.j2``:

==================  =====================================================================
spec                entry point (example)
==================  =====================================================================
evaluation          ``stc_basis_interp_both_3d_f64_nd5nq6c1_i32`` (through the map),
                    ``stc_basis_interp_values_2d_f32_nd4nq6c2`` (element vectors)
transpose           ``stc_basis_interp_t_gradients_3d_f64_nd5nq6c1_i64_hs`` (``_hs``: the
                    point values staged in shared memory)
==================  =====================================================================

A batch item is an (element, component) pair ``b = e * ncomp + c``; a block takes
``per_block`` items a group. Evaluation: the group's nodal values are gathered through the
map (every index checked: ``fem_io.cuh.j2``, the device's error flag, as the fused operator
:mod:`.mass_apply` does) or loaded as element vectors, coalesced, into shared memory; then
one stage a tensor axis, the last axis first, each stage a loop a 1D matrix over the 1D
*lines* of the tensors it applies to: a thread loads a line into registers and writes every
output along it. Evaluations that agree on the axes already contracted share those partial
sums (:func:`smalltc.backends.reference.mixed_interp`: 3D "both" makes 2, 3 and 4 tensors
in its three stages, not 3 x 4). B1d and G1d sit in the constant bank
(``stc_cB``, ``stc_cG``, copied before each launch as in the action's line form): with the
loops unrolled, every FMA takes its matrix entry from there. The point values ``H`` (E,
[ncomp,] [nslots,] nq^dim) are written by the last stage straight to global memory
(``hstage`` 0: a line's outputs are a plane apart, the lanes of a warp on consecutive
entries where a plane holds a warp) or staged in shared memory and stored by a flat,
coalesced copy (``hstage`` 1). The transpose mirrors it: ``H`` read (through shared memory
or by the lines), the first axis first, the terms that share their remaining matrices
added before they are contracted further (:func:`smalltc.backends.reference.mixed_interp_t`),
the element vectors stored coalesced or added into ``y`` through the map by atomics (the
executor zeroes ``y`` first). Shared memory holds two regions an item (the tensors of even
and of odd stages alternate), each tensor row-major with its last axis padded to an odd
stride so that the lanes of a warp fall on distinct banks.

The heuristic (reasoned, not yet measured: the op moves ``s (field + points)`` bytes an
element for a few flops a byte, so it aims at occupancy): ``hstage`` 1 where the last
stage's plane (``nq^(dim-1)``) is narrower than a warp (1D, 2D, 3D up to nq = 5: the
lanes would otherwise store to scattered entries) and the staged buffers fit, else 0;
``per_block`` for about :data:`BLOCK_THREADS` busy threads in the widest stage, lowered
until a block's shared memory is within :data:`~.family.SMEM_TARGET` (several blocks an
SM); ``threads`` that many lines, rounded up to whole warps; a launch bound of one block
an SM (``min_blocks`` 1: :data:`_MIN_BLOCKS`). Tuning parameters ``per_block``,
``threads``, ``hstage``, ``min_blocks``; ``smalltc tune --op basis`` walks :meth:`space`.
Sizes it cannot hold (an extent above :data:`MAX_EXTENT`, one item's buffers above the
device's shared memory) run the reference path, reported (``specialized=False``).
"""
from __future__ import annotations

import math

import numpy as np

from . import runtime as RT
from .action import _counts
from .family import (DEFAULT_DEVICE, DT, ITEMSIZE, MAX_THREADS, SM_THREADS, SMEM_TARGET,
                     Family, KernelExecutor)
from .mass_apply import _flag, _zero

__all__ = ["BASIS", "BasisFamily", "BasisExecutor", "basis_ctx", "patterns", "suffixes",
           "MAX_EXTENT", "BLOCK_THREADS"]

_ITYPE = {"int32": "int", "int64": "long long"}
#: the constant-bank arrays of the 1D matrices
_MAT = {"B": "stc_cB", "G": "stc_cG"}
#: the largest nd or nq a kernel is rendered for: a transposed line holds nd sums and nq
#: values in registers (fully unrolled), 2 x 20 doubles at this extent
MAX_EXTENT = 20
#: the heuristic's busy threads a block in the widest stage (several blocks an SM)
BLOCK_THREADS = 256
#: items a block, at most (1D: one line an item)
MAX_PER_BLOCK = 256
#: map entries (or element-vector values) a thread gathers or scatters in one unrolled
#: loop, at most: above, the entries held in registers would spill
MAX_UNROLL = 64
#: threads a block the space walks
_THREADS = (32, 64, 128, 256, 512, 1024)
#: a warp's lanes: the heuristic stages H where the last stage's plane holds fewer
_WARP = 32
#: ``__launch_bounds__`` minimum blocks the space walks. The heuristic's is 1, which only
#: tells ptxas the block size: with none, ptxas held some kernels at 64 registers and
#: spilled 12-16 bytes (2D nd = 12..17 "both", 96 and 128 threads, sm_90); with 1 they
#: took 74 and no spill
_MIN_BLOCKS = (1, 2, 4)


def _odd(n):
    return n | 1


def patterns(dim, evals):
    """Per evaluation (-1 the value, ``a`` the derivative along axis ``a``) the 1D matrix on
    each tensor axis.

    >>> patterns(2, (-1, 0, 1))
    [('B', 'B'), ('G', 'B'), ('B', 'G')]
    """
    return [tuple("G" if d == a else "B" for d in range(dim)) for a in evals]


def suffixes(pats, length):
    """The distinct suffixes of ``length`` matrices among ``pats``, in order of first
    appearance: the tensors an evaluation stage keeps (the last ``length`` axes
    contracted), or a transposed stage's terms (the last ``length`` axes still to go).

    >>> suffixes(patterns(3, (-1, 0, 1, 2)), 2)
    [('B', 'B'), ('G', 'B'), ('B', 'G')]
    """
    out = []
    for p in pats:
        s = p[len(p) - length:]
        if s not in out:
            out.append(s)
    return out


def _strides(shape, padded):
    """Row-major strides and size of a tensor of ``shape``, the last axis' stride (the row)
    padded to odd when ``padded``."""
    row = _odd(shape[-1]) if padded else shape[-1]
    strides, s = [1], row
    for n in reversed(shape[:-1]):
        strides.insert(0, s)
        s *= n
    return strides, s


def _levels(dim, nd, nq, pats, transpose, hstage):
    """The tensors of each level ``L`` (``L`` axes at the points): ``count`` of them,
    ``shape``, ``strides``, ``size`` (each), ``smem`` (in shared memory, else global H),
    ``region`` (0 or 1) and ``off`` (set by :func:`_place`)."""
    out = []
    for L in range(dim + 1):
        shape = (nd,) * (dim - L) + (nq,) * L
        smem = L < dim or bool(hstage)
        strides, size = _strides(shape, smem)
        region = (L if not transpose else dim - L) % 2
        out.append(dict(L=L, count=len(suffixes(pats, L)), shape=shape, strides=strides,
                        size=size, smem=smem, region=region, off=0,
                        nlast=shape[-1], row=strides[-2] if dim > 1 else size))
    return out


def _place(levels):
    """Offsets of the levels in an item's shared memory (region 0, then region 1; a region
    as large as its largest level) and the item stride (odd)."""
    reg = [0, 0]
    for lv in levels:
        if lv["smem"]:
            reg[lv["region"]] = max(reg[lv["region"]], lv["count"] * lv["size"])
    for lv in levels:
        lv["off"] = 0 if lv["region"] == 0 else reg[0]
    return _odd(reg[0] + reg[1])


def _stages(dim, pats, levels, transpose):
    """Each stage: the axis it contracts, its source and destination levels, the line
    decomposition (the other axes, the last fastest) and its *loops*, one a 1D matrix (B
    first where both), each over its terms: (source tensor, destination tensor, ``acc``).
    Evaluation: a term applies the matrix to a source (the tensors of the level before
    that differ only on this axis' matrix come from one source). Transpose: a destination
    sums the terms whose remaining matrices agree, at most one a matrix; ``acc`` marks a
    term that adds to what an earlier loop of the stage wrote (``sync``: a barrier before
    that loop).

    One loop a matrix keeps each constant-bank entry in one loop body: where two loops
    read the same entries (a loop a source tensor), ptxas kept them in registers across
    both (sm_90: 98 registers at 3D "both" p = 4, spills under a cap; 42 with one loop a
    matrix)."""
    out = []
    axes = range(dim) if transpose else range(dim - 1, -1, -1)
    for a in axes:
        Ls = dim - a if transpose else dim - a - 1
        Ld = Ls - 1 if transpose else Ls + 1
        src, dst = levels[Ls], levels[Ld]
        ss, ds = suffixes(pats, Ls), suffixes(pats, Ld)
        if transpose:    # source (m, *rest) is contracted by m into destination rest
            pairs = [(s[0], si, ds.index(s[1:])) for si, s in enumerate(ss)]
        else:            # destination (m, *rest) is m applied to source rest
            pairs = [(d[0], ss.index(d[1:]), di) for di, d in enumerate(ds)]
        loops, written = [], set()
        for m in dict.fromkeys(p[0] for p in pairs):
            terms = [dict(src=si, dst=di, acc=int(di in written)) for mm, si, di in pairs
                     if mm == m]
            loops.append(dict(mat=_MAT[m], terms=terms,
                              sync=int(any(t["acc"] for t in terms))))
            written.update(t["dst"] for t in terms)
        others = [b for b in range(dim) if b != a]
        ext = [src["shape"][b] for b in others]
        if len(others) == 2:
            index = (f"const int j{others[0]} = l / {ext[1]}, "
                     f"j{others[1]} = l % {ext[1]};")
        elif len(others) == 1:
            index = f"const int j{others[0]} = l;"
        else:
            index = "(void)l;"

        def offset(lv):
            return " + ".join(f"j{b} * {lv['strides'][b]}" for b in others) or "0"
        out.append(dict(axis=a, src=Ls, dst=Ld, nin=src["shape"][a], nout=dst["shape"][a],
                        ain=src["strides"][a], aout=dst["strides"][a],
                        nl=math.prod(ext), index=index, src_off=offset(src),
                        dst_off=offset(dst), loops=loops))
    return out


def _layout(spec, hstage):
    """``(levels, stages, istr)`` of ``spec`` with ``hstage``."""
    pats = patterns(spec.dim, spec.evals())
    levels = _levels(spec.dim, spec.nd, spec.nq, pats, spec.transpose, hstage)
    istr = _place(levels)
    return levels, _stages(spec.dim, pats, levels, spec.transpose), istr


def _lines(stages):
    """Lines a group of the widest stage has (an item's)."""
    return max(st["nl"] for st in stages)


def _warps(n):
    return -(-n // _WARP) * _WARP


def basis_ctx(spec, params=None, device=DEFAULT_DEVICE):
    """Context of ``basis.cu.j2`` for a :class:`smalltc.spec.BasisSpec`, or None when the
    parameters do not fit (``params`` None: the heuristic; see the module docstring).

    ``params``: ``per_block`` (items a block), ``threads`` (a multiple of 32 up to 1024),
    ``hstage`` (1: H through shared memory; 0: the lines read or write it in global memory),
    ``min_blocks`` (the launch bound's blocks an SM, 1 where missing).

    >>> from smalltc.spec import BasisSpec
    >>> s = BasisSpec(dim=3, nq=6, nd=5, batch=1, dtype="float64", what="both", ndofs=10)
    >>> c = basis_ctx(s)
    >>> c["hstage"], c["per_block"], c["threads"], c["smem_bytes"] <= 48 * 1024
    (0, 6, 224, True)
    >>> [[(lp["mat"], len(lp["terms"])) for lp in st["loops"]] for st in c["stages"]]
    [[('stc_cB', 1), ('stc_cG', 1)], [('stc_cB', 2), ('stc_cG', 1)], [('stc_cB', 3), ('stc_cG', 1)]]
    >>> basis_ctx(s, dict(per_block=2, threads=96, hstage=1))["istr"]
    1639
    >>> basis_ctx(s, dict(per_block=2, threads=100, hstage=1)) is None   # not whole warps
    True
    """
    dim, nd, nq = spec.dim, spec.nd, spec.nq
    if dim not in (1, 2, 3) or max(nd, nq) > MAX_EXTENT:
        return None
    s = ITEMSIZE[spec.dtype]
    ndd = nd ** dim
    if params is None:
        stage_h = int(nq ** (dim - 1) < _WARP)
        for hs in dict.fromkeys((stage_h, 0)):
            levels, stages, istr = _layout(spec, hs)
            lines = _lines(stages)
            pb = max(1, min(MAX_PER_BLOCK, round(BLOCK_THREADS / lines)))
            while pb > 1 and s * pb * istr > SMEM_TARGET:
                pb -= 1
            if s * pb * istr <= device["smem_optin"]:
                break
        threads = min(MAX_THREADS, max(64, _warps(pb * lines)))
        while pb > 1 and -(-pb * ndd // threads) > MAX_UNROLL:
            pb -= 1
        params = dict(per_block=pb, threads=threads, hstage=hs, min_blocks=1)
    pb, threads, hs = params.get("per_block"), params.get("threads"), params.get("hstage", 0)
    mb = params.get("min_blocks", 1)
    if (not isinstance(pb, int) or not isinstance(threads, int) or pb < 1
            or threads % _WARP or not _WARP <= threads <= MAX_THREADS or hs not in (0, 1)
            or mb not in range(0, 9)):
        return None
    levels, stages, istr = _layout(spec, hs)
    smem = s * pb * istr
    if smem > device["smem_optin"] or -(-pb * ndd // threads) > MAX_UNROLL:
        return None
    ctx = dict(dim=dim, nd=nd, nq=nq, dtype=spec.dtype, ncomp=spec.ncomp, nslots=spec.nslots,
               what=spec.what, transpose=int(spec.transpose), gather=int(spec.ndofs is not None),
               colored=0, per_block=pb, threads=threads,
               hstage=hs, smem_bytes=smem, min_blocks=mb, istr=istr, levels=levels,
               stages=stages, lines=_lines(stages),
               mats=[m for m in _MAT.values() if any(lp["mat"] == m for st in stages
                                                     for lp in st["loops"])])
    if spec.ndofs is not None:
        ctx["index_t"] = _ITYPE[spec.index_dtype]
    return ctx


class BasisFamily(Family):
    """The basis application and its transpose; see the module docstring."""

    name = "basis"
    templates = ("basis.cu.j2",)
    params = ("per_block", "threads", "hstage", "min_blocks")
    optional = {"min_blocks": 1}
    public_keys = Family.public_keys + ("hstage",)
    max_distance = 2.0

    def claims(self, spec):
        return spec.op == "basis"

    def supports(self, spec):
        """Every what, direction, component count, map and dtype (the size decides)."""
        return True

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        return basis_ctx(spec, params, device)

    def entry(self, spec, ctx):
        where = "" if spec.ndofs is None else f"_i{spec.index_dtype[3:]}"
        return (f"stc_basis_interp{'_t' if spec.transpose else ''}_{spec.what}_{spec.dim}d_"
                f"{DT[spec.dtype]}_nd{spec.nd}nq{spec.nq}c{spec.ncomp}{where}"
                f"{'_hs' if ctx['hstage'] else ''}")

    def executor(self, choice, device):
        return BasisExecutor(choice, device)

    def space(self, spec):
        """H staged or not, every items-per-block count that fits (1, 2, 3, 4, 6, 8, ...
        above 16), threads 32..1024 (powers of two), min_blocks 1, 2, 4. Pruned:
        ``threads`` where a block has more threads than the widest stage has lines (idle in
        every stage) or fewer than a sixteenth of them; ``resident`` where min_blocks
        blocks exceed an SM's threads."""
        s = ITEMSIZE[spec.dtype]
        for hs in (0, 1):
            _, stages, istr = _layout(spec, hs)
            lines = _lines(stages)
            upto = max(1, min(MAX_PER_BLOCK, DEFAULT_DEVICE["smem_optin"] // (s * istr)))
            for pb in _counts(upto):
                need = _warps(pb * lines)
                for nt in _THREADS:
                    for mb in _MIN_BLOCKS:
                        why = ("threads" if nt > need or 16 * nt < need else
                               "resident" if mb * nt > SM_THREADS else None)
                        yield dict(per_block=pb, threads=nt, hstage=hs, min_blocks=mb), why

    def carry(self, spec, entry_spec, params, device):
        """Another size's entry (the same variant: what, direction, map): its threads and
        ``hstage``, the items a block scaled by the widest stage's lines, lowered until
        they fit (the other ``hstage`` where none does)."""
        if (spec.what, spec.transpose, spec.ndofs is None, spec.dim) != (
                entry_spec.what, entry_spec.transpose, entry_spec.ndofs is None,
                entry_spec.dim):
            return None
        hs = params.get("hstage", 0)
        ratio = _lines(_layout(entry_spec, hs)[1]) / _lines(_layout(spec, hs)[1])
        pb = max(1, round(params["per_block"] * ratio))
        for h in (hs, 1 - hs):
            p = self.first_valid(spec, dict(params, per_block=pb, hstage=h), device)
            if p is not None:
                return p
        return None


BASIS = BasisFamily()


class BasisExecutor(KernelExecutor):
    """One launch over the (element, component) items. Through the map: the device's error
    flag first (a bad index a finished kernel read raises here, :func:`.mass_apply._flag`),
    ``y = 0`` for the transpose. B1d (and G1d) are copied into the module's constant bank on
    the current stream before the launch (:class:`.runtime.ConstantBank`, as the action's
    line form: the matrices the kernel reads, ``ctx["mats"]``; 1D gradients read no B1d)."""

    def __init__(self, choice, device):
        super().__init__(choice, device)
        spec = choice.spec
        self.nbatch = spec.batch * spec.ncomp
        self.ndofs = spec.ndofs
        self.mapped, self.transpose = spec.ndofs is not None, bool(spec.transpose)
        self._grad = int(spec.what != "values")
        self._mats = [("stc_cB", "stc_cG").index(m) for m in self.ctx["mats"]]
        self._bank = RT.ConstantBank(self.template, self.kernel, self.ctx, self.smem,
                                     self.ctx["mats"])

    def run(self, operands, out, **_):
        field = operands[1 + self._grad]
        mats = [operands[i] for i in self._mats]     # B1d, G1d: the operands' first two
        if not self.mapped:
            if self.nbatch:
                self._bank.load(*mats)
                self._run_arrays(self.nbatch, (field, out))
                self._bank.launched()
            return
        MAP = operands[2 + self._grad]
        err = _flag(MAP, self.ndofs)
        if self.transpose:
            _zero(out)
        if not self.nbatch:
            return
        self._bank.load(*mats)
        d = self._direct("PPPqPq", self.nbatch)
        if d is None:
            self._launch(self.nbatch, (field, MAP, out, np.int64(self.ndofs), np.uint64(err)))
        else:
            d(field.data.ptr, MAP.data.ptr, out.data.ptr, self.ndofs, err, self.nbatch)
        self._bank.launched()
