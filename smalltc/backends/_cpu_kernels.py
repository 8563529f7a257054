"""CPU executors: choose a template and its parameters for a spec, run it.

Heuristic choices (``source="heuristic"``), measured on AMD Zen 5 (see
notes/cpu.md):

* action, assembly: SIMD lanes = elements, ``W`` = one 64-byte vector of
  elements (8 float64, 16 float32) per chunk;
* GEMM: the whole product unrolled when ``m*n*k <= 125``, else blocks of
  ``rb`` rows of C kept in registers (``rb * n <= 32``, at most 4 zmm per
  row) with SIMD along the row;
* contractions (8a), (8b), (9): plain loops, innermost loop on the
  output's contiguous index (the loop vectoriser's case). They serve
  ``method="pairwise"``, the yardstick, whose steps come in many shapes
  (a 3D action needs six): by default one kernel with run-time extents per
  (kind, shared operands, dtype) runs them all and the plan reports
  ``specialized=False``; ``SMALLTC_CPU_SPECIALIZE_CONTRACT=1`` compiles one
  per shape instead (about a second each).
"""
from __future__ import annotations

import os

import numba
import numpy as np

from ..spec import ActionSpec, AssemblySpec, ContractSpec, GemmSpec
from ._cpu_codegen import load_kernel
from .base import Executor

__all__ = ["KERNEL_BUILDERS"]

_NB = {"float64": "float64", "float32": "float32"}
_SHORT = {"float64": "f64", "float32": "f32"}

# Limits of the specialised kernels (beyond them: the generic kernel).
MAX_GEMM = 64            # m, n, k of the unrolled/row-blocked GEMM
MAX_ND, MAX_NQ = 17, 24  # action: p <= 16
MAX_ASM_ENTRIES = 2 ** 20  # assembly: nd**(2 dim) entries per element
MAX_CONTRACT = 4096      # contraction: every extent
ACTION_RB = ACTION_TR = None   # experiments: force the action's forms (None: heuristic)
SPECIALIZE_CONTRACT = os.environ.get("SMALLTC_CPU_SPECIALIZE_CONTRACT", "") not in ("", "0")


def _sig(dtype, n_arrays, tail):
    a = f"{_NB[dtype]}[:, ::1]"
    return f"void({', '.join([a] * n_arrays + list(tail))})"


def _lanes(dtype):
    return 8 if dtype == "float64" else 16


class _Kernel(Executor):
    """Common state: the compiled function and how it was chosen."""

    source = "heuristic"

    def __init__(self, spec, template, entry, params, specialized, slp=True, **render):
        self.spec, self.kernel, self.params = spec, entry, dict(params)
        self.specialized = specialized
        self.fn, self.compile_s = load_kernel(template, entry, slp=slp, dtype=spec.dtype,
                                              **render)

    @staticmethod
    def nparts(nitems):
        return max(1, min(numba.get_num_threads(), nitems))


class _Gemm(_Kernel):
    def run(self, operands, out, alpha=1.0, beta=0.0):
        s = self.spec
        A, B, C = operands
        A2 = A.reshape(1 if s.shared_a else s.batch, -1)
        B2 = B.reshape(1 if s.shared_b else s.batch, -1)
        o2 = out.reshape(s.batch, -1)
        C2 = o2 if C is None else C.reshape(s.batch, -1)
        dt = np.dtype(s.dtype).type
        self._call(A2, B2, C2, o2, dt(alpha), dt(beta))

    def _call(self, A2, B2, C2, o2, alpha, beta):
        s = self.spec
        if self.specialized:
            self.fn(A2, B2, C2, o2, alpha, beta, s.batch, self.nparts(s.batch))
        else:
            self.fn(A2, B2, C2, o2, alpha, beta, s.m, s.n, s.k, s.trans_a, s.trans_b,
                    s.beta_zero, s.batch, self.nparts(s.batch))


def build_gemm(spec: GemmSpec):
    m, n, k, dt = spec.m, spec.n, spec.k, spec.dtype
    t = ("t" if spec.trans_a else "n") + ("t" if spec.trans_b else "n")
    flags = dict(trans_a=spec.trans_a, trans_b=spec.trans_b, shared_a=spec.shared_a,
                 shared_b=spec.shared_b, beta_zero=spec.beta_zero)
    if max(m, n, k) > MAX_GEMM:
        entry = f"stc_gemm_generic_{_SHORT[dt]}"
        sig = _sig(dt, 4, [_NB[dt]] * 2 + ["int64"] * 3 + ["boolean"] * 3 + ["int64"] * 2)
        return _Gemm(spec, "generic.py.j2", entry, {}, False, slp=False, op="gemm",
                     signature=sig)
    if m * n * k <= 125:
        form, rb = "full", 0
    else:
        form = "rows"
        rb = next(r for r in (4, 3, 2, 1) if m % r == 0 and (r * n <= 32 or r == 1))
    tags = ("_sa" if spec.shared_a else "") + ("_sb" if spec.shared_b else "") + \
           ("" if spec.beta_zero else "_beta")
    entry = f"stc_gemm_{t}_{_SHORT[dt]}_m{m}n{n}k{k}{tags}"
    sig = _sig(dt, 4, [_NB[dt]] * 2 + ["int64"] * 2)
    params = {"form": form} | ({"rb": rb} if rb else {})
    return _Gemm(spec, "gemm.py.j2", entry, params, True, m=m, n=n, k_=k, form=form,
                 rb=rb, ctype=f"np.{dt}", signature=sig, inline_body=True, **flags)


class _Action(_Kernel):
    def run(self, operands, out, **_):
        s = self.spec
        B, D, V = operands
        E = s.batch
        D2, V2, U2 = D.reshape(E, -1), V.reshape(E, -1), out.reshape(E, -1)
        if self.specialized:
            W = self.params["lanes"]
            nch = -(-E // W)
            self.fn(B, D2, V2, U2, E, s.ncomp, nch, self.nparts(nch))
        else:
            self.fn(B, D2, V2, U2, s.dim, s.ncomp, E, self.nparts(E))


def _action_steps(dim, nd, nq):
    """The sum-factorisation steps of the fused action, as template data.

    Shapes are padded to 3 axes; buffers ping-pong between ``ta`` and ``tb``
    and the last step writes back into ``vt``.
    """
    shape = [1] * (3 - dim) + [nd] * dim
    steps, sizes = [], {"ta": 0, "tb": 0}
    bufs = ["vt"] + ["ta", "tb"] * dim
    axes = list(range(2, 2 - dim, -1))
    for n, (ax, back) in enumerate([(a, False) for a in axes] + [(a, True) for a in axes]):
        out = list(shape)
        out[ax] = nd if back else nq
        dst = "vt" if n == 2 * dim - 1 else bufs[n + 1]
        if dst != "vt":
            sizes[dst] = max(sizes[dst], out[0] * out[1] * out[2])
        steps.append(dict(src=bufs[n], dst=dst, out=tuple(out), inp=tuple(shape), axis=ax,
                          nin=shape[ax], coef="B[{s}, {i}]" if back else "B[{i}, {s}]",
                          scale=(n == dim - 1)))
        shape = out
    return steps, [(b, sz) for b, sz in sizes.items() if sz]


def _action_rb(dim, nd, dtype):
    """Outputs per register block in each action step (notes/cpu.md, version 8).

    3D float64 p = 5..8: 2 (p = 5) or 3 (each buffer load feeds rb FMAs;
    0.53-0.59 -> 0.70-0.79 of Pmax), at ~2x (rb=2) to ~3x (rb=3) the compile
    time; 1 elsewhere: p <= 4 gains nothing, p > 8 would need more than the
    32 zmm registers for rb * nd coefficients, and float32 (16 lanes, twice
    the code) would compile in ~45 s instead of ~11 s at p = 8 (rb=3 measured
    0.44 -> 0.77 of Pmax there; set ACTION_RB to try it).
    """
    if dim != 3 or dtype != "float64" or not 6 <= nd <= 9:
        return 1
    return 3 if nd >= 7 else 2


def build_action(spec: ActionSpec):
    dim, nd, nq, dt = spec.dim, spec.nd, spec.nq, spec.dtype
    if nd > MAX_ND or nq > MAX_NQ:
        entry = f"stc_mass_apply_generic_{_SHORT[dt]}"
        sig = _sig(dt, 4, ["int64"] * 4)
        return _Action(spec, "generic.py.j2", entry, {}, False, slp=False, op="action",
                       signature=sig)
    W = _lanes(dt)
    steps, buffers = _action_steps(dim, nd, nq)
    rb = ACTION_RB if ACTION_RB is not None else _action_rb(dim, nd, dt)
    # block transposes from 64 entries per element (3D p >= 3): below, the
    # scalar copies measured faster (3D p=1: 0.59 vs 0.50, p=2: 0.62-0.64 vs
    # 0.44-0.48 of Pmax, best of 10); p=3 0.49 -> 0.53, p=4 0.37 -> 0.47
    tr = ACTION_TR if ACTION_TR is not None else nd ** dim >= 64
    entry = f"stc_mass_apply_{dim}d_{_SHORT[dt]}_nd{nd}_nq{nq}"
    sig = _sig(dt, 4, ["int64"] * 4)
    return _Action(spec, "action.py.j2", entry, {"lanes": W, "rb": rb, "tr": tr}, True, W=W,
                   steps=steps, buffers=buffers, nv=nd ** dim, nqd=nq ** dim, rb=rb, tr=tr,
                   signature=sig)


class _Assembly(_Kernel):
    def run(self, operands, out, **_):
        s = self.spec
        B, D = operands
        E = s.batch
        D2, M2 = D.reshape(E, -1), out.reshape(E, -1)
        if not self.specialized:
            self.fn(B, D2, M2, s.dim, E, self.nparts(E))
            return
        W = self.params["lanes"]
        full = E // W
        if full:
            self.fn(B, D2, M2, full, self.nparts(full))
        rest = E - full * W
        if rest:   # one padded chunk for the remainder
            Dp = np.zeros((W, D2.shape[1]), dtype=D2.dtype)
            Dp[:rest] = D2[full * W:]
            Mp = np.empty((W, M2.shape[1]), dtype=M2.dtype)
            self.fn(B, Dp, Mp, 1, 1)
            M2[full * W:] = Mp[:rest]


def build_assembly(spec: AssemblySpec):
    dim, nd, nq, dt = spec.dim, spec.nd, spec.nq, spec.dtype
    if nd ** (2 * dim) > MAX_ASM_ENTRIES or nq > MAX_NQ:
        entry = f"stc_mass_assemble_generic_{_SHORT[dt]}"
        sig = _sig(dt, 3, ["int64"] * 3)
        return _Assembly(spec, "generic.py.j2", entry, {}, False, slp=False,
                         op="assembly", signature=sig)
    W = _lanes(dt)
    entry = f"stc_mass_assemble_{dim}d_{_SHORT[dt]}_nd{nd}_nq{nq}"
    sig = _sig(dt, 3, ["int64"] * 2)
    return _Assembly(spec, "assembly.py.j2", entry, {"lanes": W}, True, W=W, dim=dim,
                     nd=nd, nq=nq, signature=sig)


class _Contract(_Kernel):
    def run(self, operands, out, **_):
        s = self.spec
        X, Y = operands
        X2 = X.reshape(1 if s.shared_x else s.batch, -1)
        Y2 = Y.reshape(1 if s.shared_y else s.batch, -1)
        A2 = out.reshape(s.batch, -1)
        n = self.nparts(s.batch)
        if self.specialized:
            self.fn(X2, Y2, A2, s.batch, n)
        else:
            self.fn(X2, Y2, A2, s.i, s.s, s.j, s.k, s.l, s.batch, n)


def build_contract(spec: ContractSpec):
    dt = spec.dtype
    ext = (spec.i, spec.s, spec.j, spec.k, spec.l)
    flags = dict(kind=spec.kind, shared_x=spec.shared_x, shared_y=spec.shared_y)
    sh = ("_sx" if spec.shared_x else "") + ("_sy" if spec.shared_y else "")
    if not SPECIALIZE_CONTRACT or max(ext) > MAX_CONTRACT:
        entry = f"stc_contract{spec.kind}_generic_{_SHORT[dt]}{sh}"
        sig = _sig(dt, 3, ["int64"] * 7)
        return _Contract(spec, "contract.py.j2", entry, {}, False, slp=False, generic=True,
                         ext=("I", "S", "J", "K", "L"), signature=sig, **flags)
    entry = (f"stc_contract{spec.kind}_{_SHORT[dt]}_i{spec.i}s{spec.s}j{spec.j}"
             f"k{spec.k}l{spec.l}{sh}")
    sig = _sig(dt, 3, ["int64"] * 2)
    return _Contract(spec, "contract.py.j2", entry, {}, True, slp=False, generic=False,
                     ext=ext, signature=sig, **flags)


KERNEL_BUILDERS = ((GemmSpec, build_gemm), (ActionSpec, build_action),
                   (AssemblySpec, build_assembly), (ContractSpec, build_contract))
