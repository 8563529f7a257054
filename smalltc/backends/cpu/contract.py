"""The contraction family (kernels 8a, 8b, 9) and the generic kernels with run-time sizes.

``contract.py.j2``: plain loops, one batch item per step, the innermost loop
on the output's contiguous index (the loop vectoriser's case). The
contractions serve ``method="pairwise"``, the yardstick, whose steps come in
many shapes (a 3D action needs six): by default one kernel with run-time
extents per (kind, shared operands, dtype) runs them all and reports
``specialized=False``; ``SMALLTC_CPU_SPECIALIZE_CONTRACT=1`` compiles one per
shape instead (about a second each). No tuning parameters.

``generic.py.j2``: the generic path of every other operation (STYLE habit 4):
GEMM beyond m, n, k <= 64, the action beyond p = 16, the assembly beyond 3D
p = 9; every size a run-time argument, ``specialized=False``, and the plan
logs the fallback.
"""
from __future__ import annotations

import os

from .family import Choice, CpuExecutor, Family
from .gemm import gemm_args
from .runtime import NB_TYPES, SHORT, signature
from .target import host, resolve

__all__ = ["CONTRACT", "ContractFamily", "generic_executor", "MAX_CONTRACT",
           "SPECIALIZE_CONTRACT"]

MAX_CONTRACT = 4096      # specialised contraction: every extent
SPECIALIZE_CONTRACT = os.environ.get("SMALLTC_CPU_SPECIALIZE_CONTRACT", "") not in ("", "0")


class ContractFamily(Family):
    """Kernels (8a), (8b), (9) (``contract.py.j2``); see the module docstring."""

    name = "contract"
    templates = ("contract.py.j2",)
    params = ()

    def claims(self, spec):
        return spec.op == "contract"

    def context(self, spec, params=None, target=None):
        if params:                            # none to choose
            return None
        target = resolve(target)
        dt = spec.dtype
        ext = (spec.i, spec.s, spec.j, spec.k, spec.l)
        specialized = SPECIALIZE_CONTRACT and max(ext) <= MAX_CONTRACT
        flags = dict(kind=spec.kind, shared_x=spec.shared_x, shared_y=spec.shared_y)
        render = dict(dtype=dt, generic=not specialized, vbits=0,
                      ext=ext if specialized else ("I", "S", "J", "K", "L"),
                      signature=signature(dt, 3, ["int64"] * (2 if specialized else 7)),
                      **flags)
        return dict(dtype=dt, slp=False, specialized=specialized, render=render)

    def entry(self, spec, ctx):
        sh = ("_sx" if spec.shared_x else "") + ("_sy" if spec.shared_y else "")
        if not ctx["specialized"]:
            return f"stc_contract{spec.kind}_generic_{SHORT[spec.dtype]}{sh}"
        return (f"stc_contract{spec.kind}_{SHORT[spec.dtype]}_i{spec.i}s{spec.s}j{spec.j}"
                f"k{spec.k}l{spec.l}{sh}")

    def executor(self, choice):
        return ContractExecutor(choice)

    def space(self, spec, target=None):
        yield {}, None


CONTRACT = ContractFamily()


class ContractExecutor(CpuExecutor):
    def __init__(self, choice):
        super().__init__(choice, specialized=choice.ctx["specialized"])
        if not self.specialized:
            self.source = "generic"

    def run(self, operands, out, **_):
        s = self.spec
        X, Y = operands
        nb = out.shape[0]
        X2 = X.reshape(1 if s.shared_x else nb, -1)
        Y2 = Y.reshape(1 if s.shared_y else nb, -1)
        A2 = out.reshape(nb, -1)
        n = self.nparts(nb)
        if self.specialized:
            self.fn(X2, Y2, A2, nb, n)
        else:
            self.fn(X2, Y2, A2, s.i, s.s, s.j, s.k, s.l, nb, n)


class _GenericFamily(Family):
    """The run-time-sized kernels of ``generic.py.j2`` (what no family claims)."""

    name = "generic"
    templates = ("generic.py.j2",)

    def public(self, ctx):
        return {}


_GENERIC = _GenericFamily()


class GenericExecutor(CpuExecutor):
    """``generic.py.j2`` for a GEMM, an action or an assembly: sizes at run time."""

    def __init__(self, choice):
        super().__init__(choice, specialized=False)

    def run(self, operands, out, alpha=1.0, beta=0.0):
        s = self.spec
        nb = out.shape[0]
        n = self.nparts(nb)
        if s.op == "gemm":
            self.fn(*gemm_args(s, operands, out, alpha, beta), s.m, s.n, s.k, s.trans_a,
                    s.trans_b, s.beta_zero, nb, n)
        elif s.op == "action":
            B, D, V = operands
            self.fn(B, D.reshape(nb, -1), V.reshape(nb, -1), out.reshape(nb, -1), s.dim,
                    s.ncomp, nb, n)
        else:
            B, D = operands
            self.fn(B, D.reshape(nb, -1), out.reshape(nb, -1), s.dim, nb, n)


_GENERIC_SIGNATURES = {
    "gemm": lambda dt: signature(dt, 4, [NB_TYPES[dt]] * 2 + ["int64"] * 3 + ["boolean"] * 3
                                 + ["int64"] * 2),
    "action": lambda dt: signature(dt, 4, ["int64"] * 4),
    "assembly": lambda dt: signature(dt, 3, ["int64"] * 3),
}
_GENERIC_NAMES = {"gemm": "gemm", "action": "mass_apply", "assembly": "mass_assemble"}


def generic_executor(spec, target=None):
    """The run-time-sized kernel of a GEMM, action or assembly ``spec`` (None for others)."""
    if spec.op not in _GENERIC_SIGNATURES or getattr(spec, "qfunc", "mass") != "mass":
        return None
    dt = spec.dtype
    ctx = dict(dtype=dt, slp=False, render=dict(
        dtype=dt, op=spec.op, vbits=0, signature=_GENERIC_SIGNATURES[spec.op](dt)))
    entry = f"stc_{_GENERIC_NAMES[spec.op]}_generic_{SHORT[dt]}"
    choice = Choice(_GENERIC, spec, "generic.py.j2", entry, ctx, "generic", None,
                    target or host())
    return GenericExecutor(choice)
