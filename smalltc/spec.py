"""Frozen, hashable descriptions of one batched operation (a "spec").

A spec holds everything that determines the computation except the data:
sizes, dtype, which operands are shared by the whole batch. It also answers
what every consumer asks of an operation, so none of them needs to know
which kind of spec it holds:

==================  =========================================================
``spec.op``         "gemm", "contract", "action", "assembly", "mass_apply",
                    "mass_diagonal", "mixed" or "basis"
``spec.inputs``     the operands a call takes, in order (:class:`Operand`:
                    name, shape, whether it carries the batch axis)
``spec.out_shape``  the result's shape
``spec.items``      the batch count (elements, matrices)
``spec.size_key``   the name of the size in a tuning table
                    (``"action/3d/nd4nq5c1"``; no batch count, no dtype)
``spec.sizes()``    the sizes the roofline formulas take
``str(spec)``       a readable one-liner (``action_3d p=3 nq=5 E=10 float64``)
==================  =========================================================

Every cache in smalltc is keyed on ``spec.kernel_key()`` (the spec without
the batch count, so one compiled kernel serves any number of elements) plus
the device and the tuning parameters.

Examples
--------
>>> s = ActionSpec(dim=3, nq=5, nd=4, batch=10, dtype="float64")
>>> [(o.name, o.shape) for o in s.inputs]
[('B1d', (5, 4)), ('D', (10, 5, 5, 5)), ('V', (10, 4, 4, 4))]
>>> s.size_key, s.items, str(s)
('action/3d/nd4nq5c1', 10, 'action_3d p=3 nq=5 E=10 float64')
>>> GemmSpec(batch=3, m=2, n=2, k=2, dtype="float32", beta_zero=False).size_key
'gemm/nn+beta/m2n2k2'

The FEM operations (action, fused apply, diagonal, assembly) are one family over
the *quadrature function* ``qfunc`` (docs/math.md section 7): ``"mass"`` (the
default: every key as before), ``"diffusion"`` and ``"helmholtz"``; ``collocated``
means Gauss-Lobatto quadrature on the basis nodes (B1d is the identity and not an
operand):

>>> d = ActionSpec(dim=3, nq=5, nd=5, batch=10, dtype="float64", qfunc="diffusion",
...                collocated=True)
>>> [(o.name, o.shape) for o in d.inputs]
[('G1d', (5, 5)), ('Q', (10, 6, 5, 5, 5)), ('V', (10, 5, 5, 5))]
>>> d.size_key, str(d)
('diffusion/action/3d/nd5nq5c1+co', 'diffusion_action_3d p=4 nq=5 E=10 float64 collocated')

The specs live in modules by family, all of them read from here: the common parts
(``smalltc._spec_base``), the GEMM and contractions (``smalltc._spec_contract``), the FEM
operators (``smalltc._spec_operators``), the mixed-space operator, basis application and
geometry (``smalltc._spec_general``) and the solver kernels (``smalltc._spec_solver``).
"""
from __future__ import annotations

from ._spec_base import (FORCE_QFUNCS, GEOMETRIES, INDEX_DTYPES, QDTYPES, QFUNCS, Operand,
                         nsym)
from ._spec_contract import CONTRACT_KINDS, ContractSpec, GemmSpec
from ._spec_general import (BASIS_WHATS, EVALS, GEOMETRY_WHATS, BasisSpec, GeometrySpec,
                            MixedSpec)
from ._spec_operators import ActionSpec, AssemblySpec, MassApplySpec, MassDiagonalSpec
from ._spec_solver import (SOLVER_OPS, VECTOR_MODES, CsrSpmvSpec, PcgSpec, SchwarzSpec,
                           TransferSpec, VectorUpdateSpec)

__all__ = ["Operand", "GemmSpec", "ContractSpec", "ActionSpec", "AssemblySpec",
           "MassApplySpec", "MassDiagonalSpec", "CONTRACT_KINDS", "SPEC_TYPES", "QFUNCS",
           "QDTYPES", "GEOMETRIES", "FORCE_QFUNCS", "MixedSpec", "EVALS", "BasisSpec",
           "BASIS_WHATS",
           "nsym", "spec_from_dict", "GeometrySpec", "GEOMETRY_WHATS",
           "VECTOR_MODES", "SOLVER_OPS", "VectorUpdateSpec", "PcgSpec", "TransferSpec",
           "CsrSpmvSpec", "SchwarzSpec"]

#: op name -> spec class
SPEC_TYPES = {c.op: c for c in (GemmSpec, ContractSpec, ActionSpec, AssemblySpec,
                                MassApplySpec, MassDiagonalSpec, MixedSpec, BasisSpec,
                                GeometrySpec, VectorUpdateSpec, PcgSpec, TransferSpec,
                                CsrSpmvSpec, SchwarzSpec)}


def spec_from_dict(d: dict):
    """The spec of ``d`` (``op`` and the fields, as :meth:`as_dict` writes them).

    >>> s = AssemblySpec(dim=2, nq=3, nd=2, batch=5, dtype="float32")
    >>> spec_from_dict(s.as_dict()) == s
    True
    """
    d = dict(d)
    op = d.pop("op", None)
    if op not in SPEC_TYPES:
        raise ValueError(f"not a spec: op {op!r} (expected one of {sorted(SPEC_TYPES)})")
    return SPEC_TYPES[op](**d)
