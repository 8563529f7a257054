"""The fused FEM operator family: ``y = sum_e R_e^T A_e R_e x``, and its diagonal.

``A_e`` is the element action of the spec's ``qfunc`` (docs/math.md section 7): the
mass action ``B^T D_e B``, or the diffusion or Helmholtz action, whose steps
(:func:`.action.operator_steps`) run between the same gather and scatter.

``mass_apply.py.j2`` is the action of :mod:`.action` (same lanes, steps and
register blocks) with the element restriction inside: a chunk's V is gathered
from the global vector ``x`` through the element-to-DoF map and its U added
into ``y`` through the map, so the E-vectors never reach memory. One kernel
call per operator application: it zeroes ``y``, then runs the element colours
of :func:`smalltc.maps.element_colors` in turn, each colour's chunks split
over the threads. Elements of one colour share no DoF, so no two threads add
into one entry of ``y`` (no atomics, no races), and every entry receives its
additions in colour order: the result has the same bits for any thread
count. ``deterministic=False`` runs the same kernel (a CPU has no cheap
floating-point atomics to do otherwise); the colouring is computed once per
map object (:func:`smalltc.maps.map_info`).

``mass_diagonal.py.j2``: the element diagonals (the action's transposed half
with ``B^2``; for diffusion one such chain per packed pair of Q with the products
of the pair's 1D matrices, :func:`.action.diagonal_steps`) added into ``y`` the same
way.

===============  =========================  ======================================
spec             template                   entry point (example)
===============  =========================  ======================================
MassApplySpec    ``mass_apply.py.j2``       ``stc_mass_op_3d_f64_nd5_nq7_i32``
MassDiagonalSpec ``mass_diagonal.py.j2``    ``stc_mass_diag_3d_f64_nd5_nq7_i32``
===============  =========================  ======================================

Tuning parameters as the action's (``lanes``, ``rb``, ``tr``, ``vbits``; ``tr`` moves D
into the lane buffers with :func:`.simd.tr_rows`); the heuristic is the
action's. Sizes beyond the action's limits raise ``Unsupported`` (the
reference path runs them).

Both kernels bounds-check every map entry they read (the last argument, an
``int64`` pair, is the error flag and the offending index): an index outside
``[0, ndofs)`` reads and writes nothing, and the executor raises the
``ValueError`` of :func:`smalltc.maps.out_of_range` when the call returns (a
map changed in place after its first use, which the once-per-map host check does
not see). ``checked=False`` renders them without (for the bench, to measure the
check's cost; nothing else uses it).
"""
from __future__ import annotations

import numpy as np

from ...maps import map_info, out_of_range
from .action import LanesFamily
from .family import CpuExecutor
from .runtime import NB_TYPES, SHORT

__all__ = ["MASS_APPLY", "MASS_DIAGONAL", "MassApplyFamily", "MassDiagonalFamily"]


def _sig(dtype, index_dtype, n_float_before, n_float_after, tail, before=None):
    """``before``: the dtypes of the leading arrays where they differ from ``dtype``
    (float32 point data with float64 vectors)."""
    a = f"{NB_TYPES[dtype]}[:, ::1]"
    lead = ([f"{NB_TYPES[d]}[:, ::1]" for d in before] if before is not None else
            [a] * n_float_before)
    args = lead + [f"{index_dtype}[:, ::1]"] + [a] * n_float_after
    return f"void({', '.join(args + ['int32[::1]', 'int64[::1]'] + list(tail))}, int64[::1])"


class MassApplyFamily(LanesFamily):
    """The fused operator (``mass_apply.py.j2``); see the module docstring."""

    name = "mass_apply"
    templates = ("mass_apply.py.j2",)

    def signature(self, spec):
        before = [o.dtype or spec.dtype for o in spec.inputs[:-1]]
        return _sig(spec.dtype, spec.index_dtype, len(spec.inputs) - 1, 1, ["int64"] * 2,
                    before if getattr(spec, "qdtype", None) else None)

    def entry(self, spec, ctx):
        return (f"stc_{spec.qfunc}_op_{spec.dim}d_{SHORT[spec.dtype]}_nd{spec.nd}_nq{spec.nq}"
                f"_i{spec.index_dtype[3:]}{'_co' if spec.collocated else ''}"
                f"{'_q32' if spec.qdtype else ''}{'_vx' if spec.geometry else ''}")

    def executor(self, choice, checked=True):
        return MassApplyExecutor(_unchecked(choice) if not checked else choice)


class MassDiagonalFamily(LanesFamily):
    """The operator's diagonal (``mass_diagonal.py.j2``); see the module docstring."""

    name = "mass_diagonal"
    templates = ("mass_diagonal.py.j2",)
    back_only = True

    def signature(self, spec):
        # a collocated spec's kernel takes B1d too (the executor passes the identity)
        n = len(spec.inputs) - 1 + (1 if spec.collocated else 0)
        return _sig(spec.dtype, spec.index_dtype, n, 1, ["int64"])

    def entry(self, spec, ctx):
        return (f"stc_{spec.qfunc}_diag_{spec.dim}d_{SHORT[spec.dtype]}_nd{spec.nd}_nq{spec.nq}"
                f"_i{spec.index_dtype[3:]}{'_co' if spec.collocated else ''}")

    def executor(self, choice, checked=True):
        return MassDiagonalExecutor(_unchecked(choice) if not checked else choice)


MASS_APPLY = MassApplyFamily()
MASS_DIAGONAL = MassDiagonalFamily()


def _unchecked(choice):
    """The choice rendered without the bounds check (the bench's comparison only)."""
    ctx = dict(choice.ctx, render=dict(choice.ctx["render"], bounds_check=0))
    return choice._replace(ctx=ctx, entry=choice.entry + "_unchecked")


class _Checked(CpuExecutor):
    """Runs the kernel with an error flag and raises when it reports a bad map entry."""

    def unchecked(self):
        """This executor rendered without the bounds check (bench and tests only)."""
        return type(self)(_unchecked(self.choice))

    def _call(self, MAP, n, *args):
        err = np.zeros(2, dtype=np.int64)
        self.fn(*args, err)
        if err[0]:
            out_of_range(MAP, n, int(err[1]))

    @staticmethod
    def _start(data, MAP, out):
        """``(E, n, order, offsets, data)``: the element count, the vector length, the map's
        colouring (once per map) and ``data`` with its batched arrays flattened per element;
        None, with ``out`` zeroed, when there are no elements."""
        E, n = MAP.shape[0], out.shape[-1]
        if E == 0:
            out[...] = 0
            return None
        order, offsets = map_info(MAP, n).colors(MAP)
        return E, n, order, offsets, [a if a.ndim == 2 else a.reshape(E, -1) for a in data]


class MassApplyExecutor(_Checked):
    """One kernel call: y = 0, then the colours in turn (the map's colouring, once per map)."""

    def run(self, operands, out, **_):
        *data, X, MAP = operands            # the bases (B1d, G1d) and the data (D, Q)
        if (start := self._start(data, MAP, out)) is None:
            return
        E, n, order, offsets, data = start
        self._call(MAP, n, *data, X.reshape(-1, n), MAP.reshape(E, -1), out.reshape(-1, n),
                   order, offsets, out.size // n, self.nparts(E))


class MassDiagonalExecutor(_Checked):
    def run(self, operands, out, **_):
        *data, MAP = operands
        if self.spec.collocated:            # B1d is the identity: the kernel takes it
            data = [np.eye(self.spec.nd, dtype=self.spec.dtype)] + data
        if (start := self._start(data, MAP, out)) is None:
            return
        E, n, order, offsets, data = start
        self._call(MAP, n, *data, MAP.reshape(E, -1), out.reshape(1, n), order, offsets,
                   self.nparts(E))
