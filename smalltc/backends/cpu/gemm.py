"""The batched GEMM family: ``C = alpha op(A) op(B) + beta C`` for small matrices.

``gemm.py.j2`` computes one matrix product per step of the batch loop, the
batch split statically over the threads, in one of two forms:

=========  =================================================================
``full``   the whole product unrolled (all loads, then the sums, then the
           stores); for tiny ``m*n*k``
``rows``   blocks of ``rb`` rows of C held in scalars over a fixed-trip k
           loop; SLP packs each row into SIMD registers (SIMD along the row)
=========  =================================================================

Tuning parameters ``form``, ``rb`` (0 for ``full``; ``rb`` divides m) and
``vbits`` (as the action's). The
heuristic: ``full`` up to ``m*n*k <= 125``, else the largest ``rb`` of 4, 3,
2, 1 dividing m with ``rb * n`` accumulators within the register budget of
the target (:data:`ACC_SCALARS`: ``rb * n <= 32``, measured on Zen 5 with
AVX-512, notes/cpu.md). Every operand is
an argument, so the body is inlined into the parallel loop (Numba marks only
the parfor's arguments no-alias, which SLP needs). Beyond m, n, k <= 64 the
generic kernel runs (:mod:`.contract`).

Examples
--------
>>> from smalltc.spec import GemmSpec
>>> from smalltc.backends.cpu.target import TARGETS
>>> GEMM.heuristic_params(GemmSpec(batch=1, m=8, n=8, k=8, dtype="float64"), TARGETS["avx512"])
{'form': 'rows', 'rb': 4, 'vbits': 512}
"""
from __future__ import annotations

import numpy as np

from .action import vector_bits
from .family import CpuExecutor, Family
from .runtime import NB_TYPES, SHORT, signature
from .target import resolve

__all__ = ["GEMM", "GemmFamily", "MAX_GEMM", "ACC_SCALARS", "gemm_args"]

MAX_GEMM = 64            # m, n, k of the unrolled/row-blocked GEMM
FULL_MAX = 125           # m*n*k up to which the heuristic unrolls the whole product
#: accumulator scalars (rb * n) the heuristic allows per register block, per ISA
ACC_SCALARS = {"avx512": 32, "avx2": 32, "neon": 32, "sse": 16}


class GemmFamily(Family):
    """Small batched GEMM (``gemm.py.j2``); see the module docstring."""

    name = "gemm"
    templates = ("gemm.py.j2",)
    params = ("form", "rb", "vbits")
    #: a factor 2 in one extent at most (as the CUDA layout family's tables)
    max_distance = 1.0

    def claims(self, spec):
        return spec.op == "gemm" and max(spec.m, spec.n, spec.k) <= MAX_GEMM

    def context(self, spec, params=None, target=None):
        target = resolve(target)
        m, n, k, dt = spec.m, spec.n, spec.k, spec.dtype
        vbits = vector_bits(params, target)
        if vbits is None:
            return None
        if params is None:
            if m * n * k <= FULL_MAX:
                form, rb = "full", 0
            else:
                form = "rows"
                cap = ACC_SCALARS[target.isa]
                rb = next(r for r in (4, 3, 2, 1) if m % r == 0 and (r * n <= cap or r == 1))
        else:
            form, rb = params.get("form"), params.get("rb")
            ok = (form == "full" and rb == 0 and m * n * k <= 8 * FULL_MAX) or \
                 (form == "rows" and rb in (1, 2, 3, 4) and m % rb == 0)
            if not ok:
                return None
        flags = dict(trans_a=spec.trans_a, trans_b=spec.trans_b, shared_a=spec.shared_a,
                     shared_b=spec.shared_b, beta_zero=spec.beta_zero)
        render = dict(dtype=dt, m=m, n=n, k_=k, form=form, rb=rb, ctype=f"np.{dt}",
                      inline_body=True, vbits=vbits,
                      signature=signature(dt, 4, [NB_TYPES[dt]] * 2 + ["int64"] * 2), **flags)
        return dict(form=form, rb=rb, vbits=vbits, dtype=dt, render=render)

    def entry(self, spec, ctx):
        t = ("t" if spec.trans_a else "n") + ("t" if spec.trans_b else "n")
        tags = ("_sa" if spec.shared_a else "") + ("_sb" if spec.shared_b else "") + \
               ("" if spec.beta_zero else "_beta")
        return f"stc_gemm_{t}_{SHORT[spec.dtype]}_m{spec.m}n{spec.n}k{spec.k}{tags}"

    def executor(self, choice):
        return GemmExecutor(choice)

    def carry(self, spec, entry_spec, params, target):
        """The same form and width; ``rb`` lowered to a divisor of m (``full`` only where
        the product stays small enough to unroll)."""
        p = dict(params)
        if p["form"] == "rows":
            p["rb"] = next(r for r in range(p["rb"], 0, -1) if spec.m % r == 0)
        return p if self.context(spec, p, target) is not None else None

    def space(self, spec, target=None):
        """``full`` (pruned ``large`` beyond m*n*k = 1000: compile time) and ``rows`` with
        each rb of 1-4 dividing m (pruned ``registers`` beyond 64 accumulator scalars)."""
        m, n, k = spec.m, spec.n, spec.k
        target = resolve(target)
        for vbits in ((512, 256) if target.isa == "avx512" else (0,)):
            yield dict(form="full", rb=0, vbits=vbits), ("large" if m * n * k > 8 * FULL_MAX
                                                         else None)
            for rb in (1, 2, 3, 4):
                if m % rb == 0:
                    yield dict(form="rows", rb=rb, vbits=vbits), (
                        "registers" if rb > 1 and rb * n > 64 else None)


GEMM = GemmFamily()


def gemm_args(spec, operands, out, alpha, beta):
    """A GEMM's kernel arguments ``(A, B, C, out, alpha, beta)``: the arrays as 2D views
    ``(batch or 1, core)`` (C is ``out`` where it is None), the scalars in the dtype."""
    A, B, C = operands
    nb = out.shape[0]
    A2 = A.reshape(1 if spec.shared_a else nb, -1)
    B2 = B.reshape(1 if spec.shared_b else nb, -1)
    o2 = out.reshape(nb, -1)
    C2 = o2 if C is None else C.reshape(nb, -1)
    dt = np.dtype(spec.dtype).type
    return A2, B2, C2, o2, dt(alpha), dt(beta)


class GemmExecutor(CpuExecutor):
    """One matrix product per item; operands as 2D views ``(batch or 1, core)``."""

    def run(self, operands, out, alpha=1.0, beta=0.0):
        nb = out.shape[0]
        self.fn(*gemm_args(self.spec, operands, out, alpha, beta), nb, self.nparts(nb))
