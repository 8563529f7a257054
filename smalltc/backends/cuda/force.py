"""The corner force family (docs/math.md section 7): BLAST's ``F`` (H1^d <- L2) and ``F^T``
(L2 <- H1^d) in one kernel each, element level and with the kinematic side fused with its
DoF map, from ``force.cu.j2``.

=================  ==========================================================
spec               entry point (example)
=================  ==========================================================
ActionSpec         ``stc_force_action_3d_f64_nd5nq8_line``, ``stc_force_t_action_...``
                   (``_line``: the line form)
MassApplySpec      ``stc_force_op_3d_f64_nd5nq8_i32`` (atomic), ``..._ev`` (the
                   deterministic form: the element kernel into an E-vector, then
                   ``scatter_sum.cu.j2`` through the transposed map, as the
                   mass_apply family's), ``stc_force_t_op_...`` (gather)
=================  ==========================================================

Two forms (the tuning parameter ``line``; ``notes/cuda.md``, "The corner force"):

- the line form (2D and 3D; the heuristic's there): one thread a 1D line of the element,
  every contraction step by whole lines, the 1D matrices in the constant bank
  (``stc_cL``, ``stc_cB``, ``stc_cG``, copied by the executor before each launch); the
  thread of a line along the slowest axis does the last ``B_l2`` step, the pointwise
  stage with ``A`` (its entries of a component loaded one component ahead: ``apre``) and
  the first gradient step in registers. 8 barriers an element in 3D, 3 in 2D; ``T^(d-1)``
  threads an element (``T = max(nd, nq)``, rounded up to a power of two up to 32: the
  barriers of an element that fits a warp are ``__syncwarp``), several elements a block
  (``per_block``) up to 256 threads and 48 KiB.
- the shared-memory form (1D-3D): the CPU family's steps
  (:func:`smalltc.backends.cpu.force.force_steps` with ``per_comp``), each a loop of an
  element's ``tpi`` threads over the step's outputs between shared buffers (which share
  slots where their lives do not overlap: :func:`slots`), ``A`` read where it multiplies.

Tuning parameters ``line``, ``per_block``, ``tpi`` (shared form), ``apre`` (line form),
``min_blocks`` (the launch bound). The heuristic takes the line form in 2D and 3D with A one
component ahead up to nq = 8: on the H100 it was the best variant or within ~2% of it at
3D p = 2..4 (``smalltc bench --suite force --variants all``; notes/cuda.md, "The corner
force"), and no choice of it spills under ptxas (sm_90).
"""
from __future__ import annotations

import numpy as np

from ..._arrays import cupy_or_none
from ..._memory import guard
from ...maps import map_info
from . import runtime as RT
from .family import (DEFAULT_DEVICE, DT, ITEMSIZE, POW2, SMEM_TARGET, Family,
                     KernelExecutor)
from .mass_apply import _flag, _scatter_sum, _zero

__all__ = ["FORCE", "ForceFamily", "force_ctx", "slots"]

_ITYPE = {"int32": "int", "int64": "long long"}


def slots(steps, sizes):
    """Offsets of the buffers ``sizes`` (name -> values) in an item's shared memory: a
    buffer lives from the first step that names it to the last, and takes the lowest
    offset free of every buffer whose life overlaps its own. Returns ``(offsets, total)``.

    >>> slots([dict(src="a", dst="b"), dict(src="b", dst="c")], dict(a=4, b=2, c=4))
    ({'a': 0, 'b': 4, 'c': 0}, 6)
    """
    life = {}
    for i, st in enumerate(steps):
        names = [st.get("src"), st.get("dst"), st.get("u")] + list(st.get("a", ())) \
            + list(st.get("g", ()))
        if st.get("kind") in ("in", "out"):
            names.append("vt")
        for n in names:
            if n in sizes:
                lo, hi = life.get(n, (i, i))
                life[n] = (min(lo, i), max(hi, i))
    for n in sizes:                       # named by no step (et, vt of the element I/O)
        life.setdefault(n, (-1, len(steps)))
    for n in ("et", "vt"):                # read or written outside the steps
        if n in life:
            life[n] = (-1, len(steps)) if n == "et" else life[n]
    placed, offs = [], {}
    for n in sorted(sizes, key=lambda n: (life[n][0], -sizes[n], n)):
        lo, hi = life[n]
        busy = sorted((o, o + sizes[m]) for m, o in offs.items()
                      if not (life[m][1] < lo or hi < life[m][0]))
        at = 0
        for a, b in busy:
            if at + sizes[n] <= a:
                break
            at = max(at, b)
        offs[n] = at
        placed.append(n)
    total = max((o + sizes[n] for n, o in offs.items()), default=0)
    return offs, total


#: the line form's register budget: a thread holds A's entries of a component along its
#: axis-0 line (``dim * nq`` values) one component ahead (``apre``) up to this ``nq``
#: (beyond, ptxas spills: 2D p = 5 fused F^T float64, 3D p = 7, 8 F^T float64)
APRE_MAX_NQ = 8
#: from this ``nq`` the float32 3D line form gets a launch bound of one block an SM
#: (``min_blocks`` 1): without it ptxas spilled 4-16 bytes at p = 5, 7, 8 to keep an
#: occupancy step (ptxas -v, sm_90; notes/cuda.md, "The corner force")
MB1_FROM_NQ_F32 = 10
#: the heuristic's threads a block (several elements a block where an element has fewer)
BLOCK_THREADS = 256


def _odd(n):
    return n + 1 - n % 2


def line_sizes(qfunc, dim, nd, nq):
    """The line form's shared values an item: ``(region 1, region 2, row stride)``, in
    reals (the template's buffers, ``force.cu.j2``; the row stride is ``nq`` rounded up to
    odd).

    >>> line_sizes("force", 3, 5, 8)
    (1080, 450, 9)
    """
    nl, r = nd - 1, _odd(nq)
    if dim == 3:
        if qfunc == "force":
            return max(3 * nd * nq, nl * nl) * r, max(2 * nd * nd, nl * nq) * r, r
        return max(2 * nd * nd, nl * nq) * r, max(3 * nd * nq, nl * nl) * r, r
    if qfunc == "force":
        return 2 * nd * r, max(2 * nd, nl) * r, r
    return max(2 * nd, nl) * r, 2 * nd * r, r


def _warp_sync(tpi, pb):
    """Whether an item's barriers can be ``__syncwarp``: no item spans two warps, and every
    warp of the block is whole (``__syncwarp``'s full mask names 32 lanes)."""
    return int(32 % tpi == 0 and tpi * pb % 32 == 0)


def line_tpi(dim, nd, nq):
    """Threads an item of the line form: one a line, ``T^(dim-1)`` with ``T = max(nd,
    nq)``; rounded up to a power of two up to 32, so that an item never spans two warps
    (its barriers are then ``__syncwarp``).

    >>> line_tpi(3, 3, 4), line_tpi(3, 4, 6), line_tpi(2, 6, 10)
    (16, 36, 16)
    """
    n = max(nd, nq) ** (dim - 1)
    if n <= 32:
        return 1 << (n - 1).bit_length()
    return n


def _line_ctx(spec, params, device):
    """The line form's context (2D and 3D), or None when it does not fit."""
    dim, nd, nq, dt = spec.dim, spec.nd, spec.nq, spec.dtype
    r1, r2, r = line_sizes(spec.qfunc, dim, nd, nq)
    istr = _odd(r1 + r2)
    tpi = line_tpi(dim, nd, nq)
    s = ITEMSIZE[dt]
    pb = params.get("per_block")
    if pb is None:
        pb = max(1, BLOCK_THREADS // tpi)
        while pb > 1 and s * pb * istr > SMEM_TARGET:
            pb -= 1
    apre = params.get("apre", int(nq <= APRE_MAX_NQ))
    if not isinstance(pb, int) or pb < 1 or tpi * pb > 1024 or apre not in (0, 1):
        return None
    if s * pb * istr > device["smem_optin"]:
        return None
    return dict(line=1, tpi=tpi, per_block=pb, threads=tpi * pb, istr=istr, r1=r1, rs=r,
                smem_bytes=s * pb * istr, apre=apre, warp_sync=_warp_sync(tpi, pb),
                steps=[], slots=[], head=0)


def _shared_ctx(spec, params, device):
    """The shared-memory form's context (1D-3D), or None when it does not fit."""
    from ..cpu.force import force_steps
    dim, nd, nq, dt = spec.dim, spec.nd, spec.nq, spec.dtype
    steps, buffers = force_steps(spec.qfunc, dim, nd, nq, per_comp=True)
    sizes = dict(buffers)
    sizes["vt"] = nd ** dim
    sizes["et"] = (nd - 1) ** dim
    offs, total = slots(steps, sizes)
    istr = total + 1 - total % 2           # odd: items start on distinct banks
    head = nq * (nd - 1) + 2 * nq * nd
    head += head % 2
    s = ITEMSIZE[dt]
    biggest = max([nq ** dim] + [st["out"][0] * st["out"][1] * st["out"][2]
                                 for st in steps if "out" in st and "axis" in st])
    tpi, pb = params.get("tpi"), params.get("per_block")
    if tpi is None:
        tpi = 4
        while tpi < min(256, biggest):
            tpi *= 2
    if pb is None:
        pb = max(1, BLOCK_THREADS // tpi)
        while pb > 1 and s * (head + pb * istr) > SMEM_TARGET:
            pb -= 1
    if tpi not in POW2 or tpi < 4 or not isinstance(pb, int) or pb < 1 or tpi * pb > 1024:
        return None
    smem = s * (head + pb * istr)
    if smem > device["smem_optin"]:
        return None
    return dict(line=0, steps=steps, slots=sorted(offs.items(), key=lambda kv: kv[1]),
                istr=istr, head=head, tpi=tpi, per_block=pb, threads=tpi * pb,
                smem_bytes=smem, warp_sync=_warp_sync(tpi, pb), apre=0)


def default_line(spec):
    """The heuristic's form: the line form in 2D and 3D (fewer barriers and shared
    traffic, the matrices in the constant bank: ``notes/cuda.md``, "The corner force"),
    the shared-memory form in 1D.

    >>> from smalltc.spec import ActionSpec
    >>> default_line(ActionSpec(dim=3, nq=8, nd=5, batch=1, dtype="float64", ncomp=3,
    ...                         comp_axis=True, qfunc="force"))
    1
    """
    return int(spec.dim in (2, 3))


def force_ctx(spec, params=None, device=DEFAULT_DEVICE):
    """Context of ``force.cu.j2`` for a corner-force spec, or None when the parameters do
    not fit. ``params`` (None: the heuristic; a key left out: its heuristic value):
    ``line`` (1: the line form, 2D and 3D; 0: the shared-memory form), ``per_block``
    (elements a block), ``tpi`` (threads an element, the shared-memory form: a power of two
    from 4; given without ``line``, it means the shared-memory form), ``min_blocks`` (the
    launch bound's blocks an SM, 0: none; ptxas may then spill a few bytes to keep an
    occupancy step, ``notes/cuda.md``, "The corner force"), ``apre`` (the line form: A's
    entries of the next component loaded during the current one).

    >>> from smalltc.spec import ActionSpec
    >>> s = ActionSpec(dim=3, nq=8, nd=5, batch=1, dtype="float64", ncomp=3,
    ...                comp_axis=True, qfunc="force")
    >>> c = force_ctx(s)
    >>> c["line"], c["tpi"], c["per_block"], c["warp_sync"], c["smem_bytes"] <= 48 * 1024
    (1, 64, 4, 0, True)
    >>> c = force_ctx(s, dict(line=0))
    >>> c["tpi"], c["per_block"], c["threads"]
    (256, 1, 256)
    """
    params = dict(params or {})
    line = params.get("line", 0 if "tpi" in params else default_line(spec))
    if line not in (0, 1) or (line and spec.dim not in (2, 3)):
        return None
    dim, nd, nq, dt = spec.dim, spec.nd, spec.nq, spec.dtype
    ctx = (_line_ctx if line else _shared_ctx)(spec, params, device)
    if ctx is None:
        return None
    gather = int(spec.op == "mass_apply" and not (spec.qfunc == "force"
                                                   and spec.deterministic))
    mb = params.get("min_blocks", int(bool(line) and dim == 3 and dt == "float32"
                                      and nq >= MB1_FROM_NQ_F32))
    if mb not in (0, 1, 2, 3, 4):
        return None
    ctx.update(dim=dim, nd=nd, nq=nq, nl=nd - 1, dtype=dt, qfunc=spec.qfunc, min_blocks=mb,
               gather=gather, ncomp=1, colored=0)
    if spec.op == "mass_apply":
        ctx["index_t"] = _ITYPE[spec.index_dtype]
    return ctx


class ForceFamily(Family):
    """The corner force (both directions, element level and fused); see the module
    docstring."""

    name = "force"
    templates = ("force.cu.j2",)
    params = ("line", "per_block", "tpi", "apre", "min_blocks")
    public_keys = Family.public_keys + ("tpi", "apre")

    def claims(self, spec):
        return spec.op in ("action", "mass_apply") and getattr(spec, "qfunc", "mass") in (
            "force", "force_t")

    def supports(self, spec):
        return True

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        return force_ctx(spec, params, device)

    def entry(self, spec, ctx):
        form = "_line" if ctx["line"] else ""
        if spec.op == "action":
            return (f"stc_{spec.qfunc}_action_{spec.dim}d_{DT[spec.dtype]}_nd{spec.nd}"
                    f"nq{spec.nq}{form}")
        det = "_ev" if not ctx["gather"] else ""
        return (f"stc_{spec.qfunc}_op_{spec.dim}d_{DT[spec.dtype]}_nd{spec.nd}nq{spec.nq}"
                f"{'' if det else '_i' + spec.index_dtype[3:]}{det}{form}")

    def executor(self, choice, device):
        return ForceExecutor(choice, device)

    def space(self, spec):
        for tpi in (4, 8, 16, 32, 64, 128, 256):
            for pb in (1, 2, 4, 8, 16, 32, 64):
                yield (dict(line=0, per_block=pb, tpi=tpi, apre=0, min_blocks=0),
                       "threads" if tpi * pb > 1024 or tpi * pb < 32 else None)
        if spec.dim in (2, 3):
            tpi = line_tpi(spec.dim, spec.nd, spec.nq)
            for pb in (1, 2, 3, 4, 6, 8, 16, 32, 64, 128):
                for apre in (0, 1):
                    for mb in (0, 1, 2):
                        yield (dict(line=1, per_block=pb, tpi=tpi, apre=apre, min_blocks=mb),
                               "threads" if tpi * pb > 1024 or tpi * pb < 32 else None)

    def carry(self, spec, entry_spec, params, device):
        """An entry answers its own size only (another batch or DoF count): carried to
        other orders, the 3D p = 4 entries (one element a block) ran the fused F^T at
        p = 6, 7 at 0.2-0.3x the heuristic on the H200)."""
        if spec.size_key != entry_spec.size_key:
            return None
        return params if self.context(spec, params, device) is not None else None


FORCE = ForceFamily()


class ForceExecutor(KernelExecutor):
    """Element level: one launch over the elements. Fused ``F^T``: the same with the gather.
    Fused ``F``: ``y = 0`` and the atomic kernel, or (deterministic) the element kernel into
    an E-vector and the mass_apply family's sum through the transposed map.

    The line form reads the 1D matrices from its module's constant bank (``stc_cL``,
    ``stc_cB``, ``stc_cG``): each call first copies them there on the current stream,
    after the previous launch of the module on any other stream (an event), as the action
    family's line form does (:class:`.action.ActionExecutor`)."""

    def __init__(self, choice, device):
        super().__init__(choice, device)
        self._device = device
        spec = choice.spec
        self.fused = spec.op == "mass_apply"
        self.gather = bool(choice.ctx["gather"])
        self.ndofs = getattr(spec, "ndofs", None)
        self._evectors = {}
        self._line = bool(choice.ctx.get("line"))
        self._bank = None                    # RT.ConstantBank of stc_cL, stc_cB, stc_cG

    def run(self, operands, out, **kw):
        if not self._line:
            self._run(operands, out)
            return
        if self._bank is None:
            self._bank = RT.ConstantBank(self.template, self.kernel, self.ctx, self.smem,
                                         ("stc_cL", "stc_cB", "stc_cG"))
        self._bank.load(*operands[:3])
        self._run(operands, out)
        self._bank.launched()

    def _run(self, operands, out):
        L, B, G, A, F, *rest = operands
        E = A.shape[0]
        if not self.fused:
            self._run_arrays(E, (L, B, G, A, F, out))
            return
        MAP = rest[0]
        err = _flag(MAP, self.ndofs)
        spec = self.choice.spec
        if not self.gather:                    # deterministic F: E-vector, then the sum
            u = self._evector(out, E * spec.dim * spec.nd ** spec.dim)
            self._run_arrays(E, (L, B, G, A, F, u))
            pos, off = map_info(MAP, self.ndofs).transposed(MAP)
            _scatter_sum(u, pos, off, out, self.ndofs, spec.dim, spec.nd ** spec.dim)
            return
        if spec.qfunc == "force":
            _zero(out)
        head = (L, B, G, A, F, MAP, out)
        if E == 0:
            return
        d = self._direct("P" * len(head) + "qP" + "q", E)
        if d is None:
            self._launch(E, head + (np.int64(self.ndofs), np.uint64(err)))
        else:
            d(*[a.data.ptr for a in head], self.ndofs, err, E)

    def _evector(self, out, n):
        cp = cupy_or_none()
        dev = cp.cuda.runtime.getDevice()
        u = self._evectors.get(dev)
        if u is None:
            guard("force_apply (deterministic)", (n,), out.dtype, on_gpu=True,
                  what="E-vector workspace")
            u = self._evectors[dev] = cp.empty(n, dtype=out.dtype)
        return u
