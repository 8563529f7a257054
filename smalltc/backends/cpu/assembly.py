"""The assembly family: element mass matrices ``M_e = B^T D_e B``, a chunk of elements at a time.

``assembly.py.j2`` vectorises across elements as the action does (lanes =
elements of a chunk): ``bb[k, i*nd + j] = B[k,i] B[k,j]`` once, then one
contraction over k per dimension; in 3D, (2b) and (2c) run one ``i1`` slab at a
time and (2c) builds one row of M for the chunk in ``mr[column, lane]``, moved
out with ``lanes x lanes`` block transposes (notes/cpu.md, version 9).

Tuning parameters: ``lanes`` (one or two vector registers of elements),
``tr`` (1: block transposes for D in and, in 3D, rows of M out; 0: lane by
lane) and ``vbits`` (as the action's). The heuristic: one vector of elements, ``tr = 1`` (measured on Zen 5;
:data:`HEURISTIC`). The executor runs full chunks in the kernel and a padded
chunk for the remainder. Beyond ``nd^(2 dim) <= 2^20`` (3D p <= 9) or
``nq <= 24`` the generic kernel runs (:mod:`.contract`).

Examples
--------
>>> from smalltc.spec import AssemblySpec
>>> from smalltc.backends.cpu.target import TARGETS
>>> ASSEMBLY.heuristic_params(AssemblySpec(dim=3, nq=5, nd=4, batch=9, dtype="float32"),
...                           TARGETS["avx2"])
{'lanes': 8, 'tr': 1, 'vbits': 0}
>>> ASSEMBLY.heuristic_params(AssemblySpec(dim=3, nq=5, nd=4, batch=9, dtype="float64"),
...                           TARGETS["avx512"])
{'lanes': 8, 'tr': 1, 'vbits': 512}
"""
from __future__ import annotations

import threading

import numpy as np

from .action import simd_lanes, vector_bits
from .family import CpuExecutor, Family
from .runtime import SHORT, signature
from .target import resolve

__all__ = ["ASSEMBLY", "AssemblyFamily", "MAX_ASM_ENTRIES", "MAX_NQ", "HEURISTIC"]

MAX_ASM_ENTRIES = 2 ** 20  # nd**(2 dim) entries per element
MAX_NQ = 24
#: the measured heuristic per target profile (:attr:`.target.Target.profile`): vectors of
#: elements per chunk, transposes
HEURISTIC = {"avx512/512": dict(vectors=1, tr=1), "avx512/256": dict(vectors=1, tr=1),
             "avx2/256": dict(vectors=1, tr=1), "neon/128": dict(vectors=2, tr=1),
             "sse/128": dict(vectors=2, tr=1)}


class AssemblyFamily(Family):
    """Element mass matrices (``assembly.py.j2``); see the module docstring."""

    name = "assembly"
    templates = ("assembly.py.j2",)
    params = ("lanes", "tr", "vbits")

    def claims(self, spec):
        return (spec.op == "assembly" and spec.nd ** (2 * spec.dim) <= MAX_ASM_ENTRIES
                and spec.nq <= MAX_NQ)

    def context(self, spec, params=None, target=None):
        target = resolve(target)
        dt = spec.dtype
        if params is None:
            h = HEURISTIC[target.profile]
            W, tr, vbits = h["vectors"] * target.lanes(dt), h["tr"], target.vector_bits
        else:
            W, tr, vbits = params.get("lanes"), params.get("tr"), vector_bits(params, target)
            vl = simd_lanes(target, vbits or 0, dt)
            if not (isinstance(W, int) and W >= vl and W % vl == 0 and W & (W - 1) == 0
                    and W <= 64 and tr in (0, 1) and vbits is not None):
                return None
        render = dict(dtype=dt, W=W, tr=tr, dim=spec.dim, nd=spec.nd, nq=spec.nq,
                      vbits=vbits, signature=signature(dt, 3, ["int64"] * 2))
        return dict(lanes=W, tr=tr, vbits=vbits, dtype=dt, render=render)

    def entry(self, spec, ctx):
        return f"stc_mass_assemble_{spec.dim}d_{SHORT[spec.dtype]}_nd{spec.nd}_nq{spec.nq}"

    def executor(self, choice):
        return AssemblyExecutor(choice)

    def space(self, spec, target=None):
        """lanes: one or two vectors of elements; tr 0, 1; vbits 512 and 256 on AVX-512."""
        target = resolve(target)
        for vbits in ((512, 256) if target.isa == "avx512" else (0,)):
            vl = simd_lanes(target, vbits, spec.dtype)
            for vectors in (1, 2):
                for tr in (0, 1):
                    yield dict(lanes=vectors * vl, tr=tr, vbits=vbits), None


ASSEMBLY = AssemblyFamily()


class AssemblyExecutor(CpuExecutor):
    """Full chunks in the kernel; the remainder as one padded chunk."""

    def __init__(self, choice):
        super().__init__(choice)
        self.W = choice.ctx["lanes"]
        self._local = threading.local()      # the padded chunk's buffers, per calling thread

    def run(self, operands, out, **_):
        B, D = operands
        E, W = D.shape[0], self.W
        D2, M2 = D.reshape(E, -1), out.reshape(E, -1)
        full = E // W
        if full:
            self.fn(B, D2, M2, full, self.nparts(full))
        rest = E - full * W
        if rest:   # one padded chunk for the remainder (buffers kept between calls)
            pad = getattr(self._local, "pad", None)
            if pad is None:
                pad = self._local.pad = (np.zeros((W, D2.shape[1]), dtype=D2.dtype),
                                         np.empty((W, M2.shape[1]), dtype=M2.dtype))
            Dp, Mp = pad
            Dp[:rest] = D2[full * W:]
            self.fn(B, Dp, Mp, 1, 1)
            M2[full * W:] = Mp[:rest]
