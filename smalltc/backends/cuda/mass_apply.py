"""The fused FEM operator family: ``y = sum_e R_e^T B^T D_e B R_e x`` in one kernel per call.

The action kernels of :mod:`.action` with ``gather`` set (``fem_io.cuh.j2``): an
item's V is read from the global vector ``x`` through the element-to-DoF map
(``R_e``), its U added into ``y`` at the same entries with atomics, so the
E-vectors never reach device memory. The executor zeroes ``y`` first.

=================  ==========================  ==============================================
form               template                    entry point (example)
=================  ==========================  ==============================================
shared-memory      ``action.cu.j2``            ``stc_mass_op_2d_f64_nd5nq7c1_i32``
line (3D)          ``action_line.cu.j2``       ``stc_mass_op_3d_f64_nd5nq7c1_i32_line``
deterministic      either, then                ``..._ev``, then
                   ``scatter_sum.cu.j2``       ``stc_scatter_sum_f64_c1_n125_p32``
diagonal           ``mass_diagonal.cu.j2``     ``stc_mass_diag_3d_f64_nd5nq7_i32``
=================  ==========================  ==============================================

The diffusion and helmholtz instances run the same way through the action's
:func:`.action.qfunc_ctx` contexts (``stc_diffusion_op_3d_f64_nd5nq6c1_i32_line``), and
their diagonal through ``mass_diagonal.cu.j2``'s per-axis factor tables
(``stc_diffusion_diag_3d_f64_nd5nq6_i32``); operands ``[B1d,] G1d, [D,] Q, x, map``.

``deterministic`` specs store U as an E-vector (``evector``) and a second kernel
adds it into ``y`` through the transposed map (:func:`smalltc.maps.transpose`:
each DoF's entries in increasing order): no atomics, the same bits every run.
(On the H200, atomics limited the one-kernel form: ncu of p = 4 read L2 74% and
L1/TEX 78% busy at 49% of the DRAM bandwidth.) The diagonal's deterministic form
runs a launch per element colour. The heuristic is the action's (the line form
from T = 5 on with prefetch 1); tuning parameters ``per_block, min_blocks, line,
prefetch`` (``prefetch`` 0 or 1: the ``cp.async`` form copies contiguous slabs,
not gathered values), and ``qmode`` for the diffusion and helmholtz instances' line form.
Its table entries are its own (``mass_apply/3d/...``, ``diffusion/mass_apply/3d/...+co``),
tuned by ``smalltc tune --op mass_apply``: never the element-level action's.

Every kernel that reads the map checks each index (``fem_io.cuh.j2``): a thread that
read a bad one reads and adds nothing more through the map, and the index is reported in
the device's error flag (:mod:`smalltc._errors`),
which the next call that reads a map on the device, :func:`smalltc.check_errors` and
:func:`smalltc.fem.cg` read and raise (``ValueError`` naming ``elem_dofs``, the index
and the range). The deterministic form's second kernel reads the transposed map
(``pos``, ``off``), which the library builds from the map at its first use: its entries
are positions in the E-vector, in range whatever the map holds later, so it needs no
check. ``unchecked()`` gives an executor rendered without the check (the bench's
measure of its cost).
"""
from __future__ import annotations

import numpy as np

from ..._arrays import cupy_or_none
from ..._errors import device_flag, raise_pending, record_map
from ..._memory import guard
from ...maps import map_info
from . import runtime as RT
from .action import (ACTION, ActionExecutor, _carry_qfunc, _meaningful, action_ctx,
                     LAYOUTS, point_data_ctx, point_data_f32, qfunc_ctx, qfunc_of)
from .family import (DEFAULT_DEVICE, DT, ITEMSIZE, SMEM_TARGET, THREADS, Family,
                     KernelExecutor, even)

__all__ = ["MASS_APPLY", "MASS_DIAGONAL", "MassApplyFamily", "MassDiagonalFamily"]

_ITYPE = {"int32": "int", "int64": "long long"}


def _flag(MAP, ndofs):
    """The current device's error flag pointer, after raising what it reports (a finished
    kernel's bad map index) and recording the map this launch reads."""
    dev = RT.current_device_id()
    view, ptr = device_flag(dev)
    if view[0]:
        raise_pending(dev, MAP)
    record_map(dev, MAP, ndofs)
    return ptr


def _unchecked_choice(choice):
    """``choice`` rendered without the map's bounds check (the bench's comparison)."""
    return choice._replace(ctx=dict(choice.ctx, bounds_check=0),
                           entry=choice.entry + "_unchecked")


def _zero(y):
    cp = cupy_or_none()
    cp.cuda.runtime.memsetAsync(y.data.ptr, 0, y.nbytes, cp.cuda.get_current_stream().ptr)


class MassApplyFamily(Family):
    """The fused operator; see the module docstring."""

    name = "mass_apply"
    templates = ("action.cu.j2", "action_line.cu.j2")
    #: ``qmode``: the diffusion and helmholtz instances' line form only (as the action's)
    params = ("per_block", "min_blocks", "line", "prefetch", "qmode", "layout")
    optional = {"line": 0, "prefetch": 0, "qmode": "global", "layout": "odd"}
    public_keys = Family.public_keys + ("qmode", "layout")
    max_distance = 2.0

    def claims(self, spec):
        return spec.op == "mass_apply"

    def supports(self, spec):
        """Every operator instance: mass, diffusion and helmholtz, Gauss or collocated (as
        the action's :meth:`.action.ActionFamily.supports`)."""
        return ACTION.supports(spec)

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        return point_data_ctx(self._context, spec, params, device)

    def _context(self, spec, params, device):
        qf, co = qfunc_of(spec)
        if qf != "mass" or co:
            # diffusion, helmholtz: the action's contexts (line form in 3D, prefetch 0)
            ctx = qfunc_ctx(spec.dim, spec.nd, spec.nq, spec.ncomp, spec.dtype, qf, co,
                            device["smem_optin"], params, device.get("cc", "90"))
            return None if ctx is None else dict(
                ctx, gather=1, colored=0, evector=int(spec.deterministic),
                index_t=_ITYPE[spec.index_dtype])
        if params is not None and (params.get("rb", 1) != 1 or params.get("prefetch", 0) > 1):
            return None
        if params is None and spec.dim == 3:
            params = self.heuristic_3d(spec)
        ctx = action_ctx(spec.dim, spec.nd, spec.nq, spec.ncomp, spec.dtype,
                         device["smem_optin"], params)
        if ctx is None or ctx["prefetch"] > 1:
            return None
        return dict(ctx, gather=1, colored=0, evector=int(spec.deterministic),
                    index_t=_ITYPE[spec.index_dtype])

    @staticmethod
    def heuristic_3d(spec):
        """The 3D heuristic: the line form at every p, no prefetch, ~110 threads a block
        (at most 8 items), the shared-memory layout with the fewest modelled wavefronts
        (``layout`` "model": :func:`.smem_layout.qfunc_line_layout`; on the H200 BP1 ran
        1.081x the odd layout, 1.11-1.41x at p = 1, 2). Measured on the H200 (BP1, ~3M
        DoFs, nq = p+2, float64, a sweep of per_block 1-4 or 2-8, min_blocks 0/2/3,
        prefetch 0/1 against the action's heuristic, one run): the best variant was the
        line form at every p, prefetch 0 from p = 4 on (p = 3: 0.4% behind prefetch 1),
        with these item counts; it ran 1.06-1.45x the action's heuristic (p = 6: 123 ->
        85 us)."""
        T = max(spec.nd, spec.nq)
        tpi = (T | 1) * T
        return dict(per_block=min(8, max(1, round(110 / tpi))), min_blocks=0, line=1,
                    prefetch=0, layout="model")

    def template(self, ctx):
        return ACTION.template(ctx)

    def entry(self, spec, ctx):
        q32 = "_q32" if ctx.get("qt") else "_vx" if ctx.get("geometry") else ""
        if ctx.get("qfunc"):
            return (f"stc_{ctx['qfunc']}_op_{spec.dim}d_{DT[spec.dtype]}_nd{spec.nd}nq{spec.nq}"
                    f"c{spec.ncomp}_i{spec.index_dtype[3:]}{'_co' if ctx['colloc'] else ''}"
                    f"{'_line' if ctx.get('line') else ''}{'_ev' if spec.deterministic else ''}"
                    f"{q32}")
        return (f"stc_mass_op_{spec.dim}d_{DT[spec.dtype]}_nd{spec.nd}nq{spec.nq}c{spec.ncomp}"
                f"_i{spec.index_dtype[3:]}{'_line' if ctx.get('line') else ''}"
                f"{'_ev' if spec.deterministic else ''}{q32}")

    def executor(self, choice, device):
        return MassApplyExecutor(choice, device)

    def space(self, spec):
        """The action's space without register blocking and without the cp.async form
        (the diffusion and helmholtz instances: the action's, ``qmode`` included)."""
        mass = qfunc_of(spec) == ("mass", False)
        for params, why in ACTION.space(spec):
            if params["rb"] == 1 and params["prefetch"] < 2:
                p = {k: params[k] for k in self.params if k in params}
                if mass and p.get("line"):             # the mass line form's layouts
                    for lay in LAYOUTS:
                        yield dict(p, layout=lay), why
                else:
                    yield p, why

    def adapt(self, spec, entry_spec, params, device=DEFAULT_DEVICE):
        return _meaningful(spec, super().adapt(spec, entry_spec, params, device))

    def carry(self, spec, entry_spec, params, device):
        """Another size's entry of this family (its own keys, ``diffusion/mass_apply/...``:
        the fused operator is tuned apart from the element-level action, whose best
        parameters differ: see :meth:`heuristic_3d`), carried as the action carries its
        own; never one instance's entry for another's spec."""
        if qfunc_of(spec) != qfunc_of(entry_spec):
            return None
        if qfunc_of(spec) != ("mass", False):
            return _carry_qfunc(self, spec, entry_spec, params, device)
        p = ACTION.carry(spec, entry_spec, dict(params, rb=1), device)
        return None if p is None else {k: p[k] for k in self.params if k in p}


MASS_APPLY = MassApplyFamily()


class MassApplyExecutor(ActionExecutor):
    """Atomic form: ``y = 0``, then the gather-action-scatter kernel over every (element,
    component) item. Deterministic form: the gather-action kernel into an E-vector, then
    :func:`_scatter_sum` through the transposed map."""

    def __init__(self, choice, device):
        super().__init__(choice, device)
        spec = choice.spec
        self.ndofs, self.deterministic = spec.ndofs, bool(spec.deterministic)
        self.ncomp, self.ndd = spec.ncomp, spec.nd ** spec.dim
        self._evectors = {}                  # device -> the deterministic form's E-vector

    def unchecked(self):
        """This executor rendered without the map's bounds check (bench and tests only)."""
        return MassApplyExecutor(_unchecked_choice(self.choice), self._device)

    def run(self, operands, out, **_):
        # the map is the last operand for every qfunc: ..., x, map
        self._err = _flag(operands[-1], self.ndofs)
        if self.deterministic:
            dst = self._evector(out)
        else:
            _zero(out)
            dst = out
        if self._qfunc:     # [B1d], G1d, [D], Q, x, map
            B1d, G1d, rest = self._split([o for o in operands if o is not None])
            MAP = rest[-1]
            if self._line:
                self._load_constant_bank(B1d, G1d)
                head = tuple(rest) + (dst,)
            else:
                head = ((B1d,) if B1d is not None else ()) + (G1d,) + tuple(rest) + (dst,)
            self._launch_items(self.nbatch, head, ())
            if self._line:
                self._after_launch()
            self._sum_evector(dst, MAP, out)
            return
        B1d, *data, X, MAP = operands     # data: D, or XV and CF (the vertex geometry)
        if self._line:
            self._load_constant_bank(B1d)
        head = (*data, X, MAP, dst) if self._line else (B1d, *data, X, MAP, dst)
        self._launch_items(self.nbatch, head, ())
        if self._line:
            self._after_launch()
        self._sum_evector(dst, MAP, out)

    def _sum_evector(self, dst, MAP, out):
        if self.deterministic:
            pos, off = map_info(MAP, self.ndofs).transposed(MAP)
            _scatter_sum(dst, pos, off, out, self.ndofs, self.ncomp, self.ndd)

    def _evector(self, out):
        cp = cupy_or_none()
        dev = cp.cuda.runtime.getDevice()
        u = self._evectors.get(dev)
        if u is None:
            guard("mass_apply (deterministic)", (self.nbatch * self.ndd,), out.dtype,
                  on_gpu=True, what="E-vector workspace")
            u = self._evectors[dev] = cp.empty(self.nbatch * self.ndd, dtype=out.dtype)
        return u

    def _launch_items(self, nitems, head, tail):
        """One launch: the arrays ``head``, the vector length, the arrays ``tail`` (the
        colour's element list), the item count."""
        if nitems == 0:
            return
        fmt = "P" * len(head) + "qP" + "P" * len(tail) + "q"
        d = self._direct(fmt, nitems)
        if d is None:
            self._launch(nitems, tuple(head) + (np.int64(self.ndofs), np.uint64(self._err))
                         + tuple(tail))
        else:
            d(*[a.data.ptr for a in head], self.ndofs, self._err,
              *[a.data.ptr for a in tail], nitems)


_SUM_THREADS = 256


def _scatter_sum(U, pos, off, y, ndofs, ncomp, ndd):
    """``y`` from the E-vector ``U`` through the transposed map (``scatter_sum.cu.j2``)."""
    dt = DT[np.dtype(y.dtype).name]
    pt = "int" if pos.dtype == np.int32 else "long long"
    ctx = dict(dtype=np.dtype(y.dtype).name, ncomp=ncomp, ndd=ndd, threads=_SUM_THREADS,
               pos_t=pt)
    entry = f"stc_scatter_sum_{dt}_c{ncomp}_n{ndd}_p{32 if pt == 'int' else 64}"
    kern = RT.get_kernel("scatter_sum.cu.j2", entry, ctx)
    n = ndofs * ncomp
    RT.launch(kern, -(-n // _SUM_THREADS), _SUM_THREADS, (U, pos, off, y, np.int64(ndofs)))


def diagonal_ctx(dim, nd, nq, dtype, smem_optin=227 * 1024, params=None):
    """Context of ``mass_diagonal.cu.j2``, or None when one element's D does not fit.

    A group of ``per_block`` elements (heuristic: ~1024 outputs a block of 256 threads,
    D within the shared-memory target)."""
    s = ITEMSIZE[dtype]
    ndd, nqd = nd ** dim, nq ** dim
    nb = params["per_block"] if params else max(1, min(64, 1024 // ndd))

    def smem(nb):
        return s * (even(nq * nd) + nb * nqd)

    while params is None and nb > 1 and smem(nb) > SMEM_TARGET:
        nb -= 1
    if nb < 1 or smem(nb) > smem_optin:
        return None
    return dict(dim=dim, nd=nd, nq=nq, dtype=dtype, per_block=nb, threads=THREADS,
                smem_bytes=smem(nb), min_blocks=0)


def qfunc_diagonal_ctx(dim, nd, nq, dtype, qfunc, colloc, smem_optin=227 * 1024, params=None):
    """Context of ``mass_diagonal.cu.j2``'s diffusion and helmholtz instances, or None:
    the per-axis factor tables B^2, B G, G^2 and a group's Q (and D) in shared memory.

    >>> c = qfunc_diagonal_ctx(3, 4, 5, "float64", "helmholtz", False)
    >>> c["nsym"], c["ndata"], c["per_block"], c["tab"]
    (6, 7, 6, 20)
    """
    if qfunc not in ("diffusion", "helmholtz") or (colloc and nd != nq):
        return None
    s = ITEMSIZE[dtype]
    ndd, nqd = nd ** dim, nq ** dim
    nsym = dim * (dim + 1) // 2
    ndata = nsym + (qfunc == "helmholtz")
    tab = even(nq * nd)
    nb = params["per_block"] if params else max(1, min(64, 1024 // ndd))

    def smem(nb):
        return s * (3 * tab + nb * ndata * nqd)

    while params is None and nb > 1 and smem(nb) > SMEM_TARGET:
        nb -= 1
    if nb < 1 or smem(nb) > smem_optin:
        return None
    return dict(dim=dim, nd=nd, nq=nq, dtype=dtype, per_block=nb, threads=THREADS,
                smem_bytes=smem(nb), min_blocks=0, qfunc=qfunc, colloc=int(colloc),
                nsym=nsym, ndata=ndata, tab=tab)


class MassDiagonalFamily(Family):
    """The mass matrix's diagonal through the map; see the module docstring."""

    name = "mass_diagonal"
    templates = ("mass_diagonal.cu.j2",)
    params = ("per_block",)
    max_distance = 2.0

    def claims(self, spec):
        return spec.op == "mass_diagonal"

    def supports(self, spec):
        """Every operator instance: mass, diffusion and helmholtz, Gauss or collocated (as
        the action's :meth:`.action.ActionFamily.supports`)."""
        return ACTION.supports(spec)

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        ctx = self._context(spec, params, device)
        rebuild = (None if params is not None else
                   lambda p: self._context(spec, p, device))
        return point_data_f32(ctx, spec, rebuild)

    def _context(self, spec, params, device):
        qf, co = qfunc_of(spec)
        if qf != "mass" or co:
            ctx = qfunc_diagonal_ctx(spec.dim, spec.nd, spec.nq, spec.dtype, qf, co,
                                     device["smem_optin"], params)
        else:
            ctx = diagonal_ctx(spec.dim, spec.nd, spec.nq, spec.dtype, device["smem_optin"],
                               params)
        return None if ctx is None else dict(ctx, colored=int(spec.deterministic),
                                             index_t=_ITYPE[spec.index_dtype])

    def entry(self, spec, ctx):
        if ctx.get("qfunc"):
            return (f"stc_{ctx['qfunc']}_diag_{spec.dim}d_{DT[spec.dtype]}_nd{spec.nd}"
                    f"nq{spec.nq}_i{spec.index_dtype[3:]}{'_co' if ctx['colloc'] else ''}"
                    f"{'_col' if spec.deterministic else ''}")
        return (f"stc_mass_diag_{spec.dim}d_{DT[spec.dtype]}_nd{spec.nd}nq{spec.nq}"
                f"_i{spec.index_dtype[3:]}{'_col' if spec.deterministic else ''}")

    def executor(self, choice, device):
        return MassDiagonalExecutor(choice, device)

    def space(self, spec):
        for nb in (1, 2, 4, 8, 16, 32, 64):
            yield dict(per_block=nb), None

    def carry(self, spec, entry_spec, params, device):
        if qfunc_of(spec) != ("mass", False):
            return None
        nb = max(1, round(params["per_block"] * entry_spec.nd ** entry_spec.dim
                          / spec.nd ** spec.dim))
        return self.first_valid(spec, dict(per_block=nb), device)


MASS_DIAGONAL = MassDiagonalFamily()


class MassDiagonalExecutor(KernelExecutor):
    def __init__(self, choice, device):
        super().__init__(choice, device)
        self._device = device
        self.nbatch, self.ndofs = choice.spec.batch, choice.spec.ndofs
        self.colored = bool(choice.spec.deterministic)

    def unchecked(self):
        """This executor rendered without the map's bounds check (bench and tests only)."""
        return MassDiagonalExecutor(_unchecked_choice(self.choice), self._device)

    def run(self, operands, out, **_):
        ops = [o for o in operands if o is not None]   # [B1d], G1d, [D], Q, map (qfunc)
        MAP = ops[-1]
        err = _flag(MAP, self.ndofs)
        _zero(out)
        if not self.colored:
            self._launch_map(self.nbatch, tuple(ops) + (out,), (), err)
            return
        order, offsets = map_info(MAP, self.ndofs).colors(MAP)
        for c in range(len(offsets) - 1):
            lo, hi = int(offsets[c]), int(offsets[c + 1])
            if hi > lo:
                self._launch_map(hi - lo, tuple(ops) + (out,), (order[lo:hi],), err)

    def _launch_map(self, nitems, head, tail, err):
        """One launch: the arrays ``head``, ``ndofs``, the error flag, the arrays ``tail``
        (a colour's element list), the item count."""
        d = self._direct("P" * len(head) + "qP" + "P" * len(tail) + "q", nitems)
        if d is None:
            self._launch(nitems, tuple(head) + (np.int64(self.ndofs), np.uint64(err))
                         + tuple(tail))
        else:
            d(*[a.data.ptr for a in head], self.ndofs, err, *[a.data.ptr for a in tail],
              nitems)

