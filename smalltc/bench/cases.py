"""One benchmark case: its operation, sizes, random inputs and float64 reference.

A :class:`Case` is data (suite, op, sizes, dtype); :func:`case_spec` turns it
into the spec it measures, whose operands (``spec.inputs``) and result
(``spec.out_shape``) the functions here read to make operands on NumPy or
CuPy arrays, a float64 NumPy reference on a sample of the batch, and the
smalltc implementation to time (a plan built once, then called with a
preallocated ``out``).

Examples
--------
>>> import numpy as np
>>> c = Case("gemm", "gemm", dict(m=2, n=3, k=4, batch=5, beta=0.0), "float64")
>>> ops = make_inputs(c, np)
>>> [o.shape for o in ops]
[(5, 2, 4), (5, 4, 3)]
>>> c.id
'gemm m=2 n=3 k=4 beta=0 float64'
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

import smalltc

from .._timing import time_once
from ..backends.reference import (action_einsum, assembly_einsum, contract_einsum,
                                  operator_assembly_einsum)
from ..catalogue import STEPS
from ..spec import ActionSpec, AssemblySpec, BasisSpec, ContractSpec, GemmSpec, GeometrySpec

__all__ = ["Case", "Impl", "make_inputs", "batched_flags", "reference", "assembly_reference",
           "out_shape", "smalltc_impl", "step_spec", "case_spec"]

# Sizes that name a case (the batch does not: runs on different devices use
# different batches, and --compare matches cases by id).
_ID_KEYS = ("label", "dim", "p", "nq", "ncomp", "m", "n", "k", "shared_a", "shared_b",
            "beta", "batch_class", "qfunc", "collocated")


@dataclass
class Case:
    """``suite`` (gemm, action, assembly, pairwise), ``op`` (gemm, action,
    assembly, step) and ``sizes`` (a JSON-able dict with ``batch``)."""

    suite: str
    op: str
    sizes: dict
    dtype: str
    note: str = ""

    @property
    def batch(self) -> int:
        return int(self.sizes["batch"])

    @property
    def id(self) -> str:
        parts = [self.suite if self.op != "step" else "step"]
        for key in _ID_KEYS:
            if key in self.sizes:
                v = self.sizes[key]
                if isinstance(v, bool):
                    if v:
                        parts.append(key)
                    continue
                if isinstance(v, float) and v.is_integer():
                    v = int(v)
                parts.append(str(v) if key == "label" else f"{key}={v}")
        return " ".join(parts + [self.dtype])

    def roofline_sizes(self) -> dict:
        s = {k: v for k, v in self.sizes.items() if k not in ("batch_class",)}
        return s


@dataclass
class Impl:
    """One implementation of a case, ready to call.

    ``fn()`` computes the case and returns the result (possibly in ``out``,
    which the runner poisons with NaN before the check); ``prepare()`` (if
    any) restores inputs an in-place implementation overwrites; ``to_array``
    turns the result into a NumPy/CuPy array.
    """

    name: str
    fn: object
    out: object = None
    prepare: object = None
    to_array: object = None
    what: str = ""
    info: dict = field(default_factory=dict)
    first_call_s: float | None = None


def step_spec(case) -> ContractSpec:
    """The reshaping-layout kernel of a pairwise step case (B1d shared)."""
    s = case.sizes
    st = next(x for x in STEPS if x.label == s["label"])
    nd = s["p"] + 1
    return ContractSpec(kind=st.kernel, batch=case.batch, dtype=case.dtype,
                        shared_x=st.x[0] == "B", shared_y=st.y[0] == "B",
                        **st.extents(nd, s["nq"]))


def case_spec(case):
    """The spec a case measures (a pairwise step: its reshaping-layout kernel)."""
    s, E, dt = case.sizes, case.batch, case.dtype
    if case.op == "gemm":
        return GemmSpec(batch=E, m=s["m"], n=s["n"], k=s["k"], dtype=dt,
                        shared_a=bool(s.get("shared_a")), shared_b=bool(s.get("shared_b")),
                        beta_zero=float(s.get("beta", 0.0)) == 0.0)
    if case.op == "action":
        ncomp = s.get("ncomp", 1)
        return ActionSpec(dim=s["dim"], nq=s["nq"], nd=s["p"] + 1, batch=E, dtype=dt,
                          ncomp=ncomp, comp_axis=ncomp > 1)
    if case.op == "assembly":
        return AssemblySpec(dim=s["dim"], nq=s["nq"], nd=s["p"] + 1, batch=E, dtype=dt,
                            qfunc=s.get("qfunc", "mass"),
                            collocated=bool(s.get("collocated", False)))
    if case.op == "step":
        return step_spec(case)
    if case.op == "basis":
        return BasisSpec(dim=s["dim"], nq=s["nq"], nd=s["p"] + 1, batch=E, dtype=dt,
                         what=s["what"], transpose=s["direction"] == "integrate",
                         ndofs=s["ndofs"])
    if case.op == "geometry":
        return GeometrySpec(dim=s["dim"], nq=s["nq"], batch=E, dtype=dt, what=s["what"],
                            coef=bool(s["coef"]))
    raise ValueError(f"unknown case op {case.op!r}")


def _random(xp, shape, dtype, rng):
    # uniform in [0.5, 1.5): random, never zero, well conditioned sums
    if xp.__name__ == "cupy":
        return xp.random.random(shape, dtype=dtype) + xp.asarray(0.5, dtype=dtype)
    return rng.random(shape, dtype=dtype) + np.asarray(0.5, dtype=dtype)


def _shapes(case):
    """Operand shapes, in plan order."""
    return [o.shape for o in case_spec(case).inputs]


def batched_flags(case):
    """For each operand: does it carry the batch axis (False: shared by the batch)?"""
    return [o.batched for o in case_spec(case).inputs]


def make_inputs(case, xp, seed=0):
    """Random operands of the case on module ``xp`` (numpy or cupy)."""
    rng = np.random.default_rng(seed)
    if xp.__name__ == "cupy":
        xp.random.seed(seed)
    return [_random(xp, sh, case.dtype, rng) for sh in _shapes(case)]


def out_shape(case):
    return case_spec(case).out_shape


def _gemm_reference(case, A, B, C=None):
    s = case.sizes
    r = float(s.get("alpha", 1.0)) * np.matmul(A, B)
    return r if C is None else r + float(s["beta"]) * C


#: op -> the float64 result of (case, operands)
_REFERENCE = {
    "gemm": _gemm_reference,
    "action": lambda case, B, D, V: action_einsum(B, D, V, case.sizes["dim"]),
    "assembly": lambda case, *ops: assembly_reference(case, ops),
    "step": lambda case, X, Y: contract_einsum(step_spec(case).kind, X, Y),
}


def assembly_reference(case, ops):
    """The element matrices of an assembly case: the mass einsum, or the operator family's
    einsum per (a, b) pair (operands by their names in the spec)."""
    spec = case_spec(case)
    if spec.qfunc == "mass":
        return assembly_einsum(*ops, spec.dim)
    a = dict(zip([o.name for o in spec.inputs], ops))
    return operator_assembly_einsum(spec.qfunc, a.get("B1d"), a["G1d"], a.get("D"),
                                    a.get("Q"), spec.dim)


def reference(case, host_ops):
    """The float64 NumPy result of the case for operands ``host_ops``
    (already cut down to a sample of the batch and cast to float64)."""
    return _REFERENCE[case.op](case, *host_ops)


def smalltc_impl(case, ops, xp, backend="auto", method="auto"):
    """Build the smalltc plan (timed, with its first call) and return the Impl."""
    s = case.sizes
    on_gpu = xp.__name__ == "cupy"
    spec = case_spec(case)
    kw = {}
    if spec.op == "gemm":
        kw = dict(alpha=float(s.get("alpha", 1.0)), beta=float(s.get("beta", 0.0)))

    op, lead = spec.op, ()
    if spec.op == "assembly" and spec.qfunc != "mass":     # the operator family's entry
        op, lead = f"{spec.qfunc}_assembly", ((None,) if spec.collocated else ())

    def build():
        return smalltc.plan(op, *lead, *ops, backend=backend,
                            method=method if spec.op in ("action", "assembly") else "auto",
                            kind=getattr(spec, "kind", None), **kw)
    out = xp.empty(spec.out_shape, dtype=case.dtype)

    def first():
        p = build()
        p(*ops, out=out, **kw)
        return p
    plan, t_first = time_once(first, on_gpu=on_gpu)
    info = dict(backend=plan.backend, method=plan.method, kernel=str(plan.kernel),
                specialized=bool(plan.specialized), params=_jsonable(plan.params),
                source=str(getattr(plan, "source", "")),
                table=getattr(plan.executor, "table", None), fallbacks=list(plan.fallbacks))
    return Impl("smalltc", lambda: plan(*ops, out=out, **kw), out=out,
                what=f"smalltc plan ({plan.backend}, {plan.method})", info=info,
                first_call_s=t_first)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


def footprint(case) -> int:
    """Bytes of all operands and the result (what must fit in memory)."""
    s = np.dtype(case.dtype).itemsize
    return s * (sum(math.prod(sh) for sh in _shapes(case)) + math.prod(out_shape(case)))
