"""Size keys: how a spec is named in a tuning table, and how far apart two sizes are.

A key is ``"<variant>/<numbers>"``. The variant holds everything a table
entry must share with a spec to be used for it at all (operation, dimension,
transposes, shared operands, beta); the numbers are the extents the nearest
neighbour search measures. The dtype is not in the key: tables are one file
per architecture and dtype.

=============  ===============================  ===================
spec           key (example)                    numbers
=============  ===============================  ===================
GemmSpec       ``gemm/nn/m8n8k8``               m, n, k
               ``gemm/nt+sb+beta/m8n8k8``
ContractSpec   ``contract8b+sy/i3s3j4k4l3``      i, s, j, k, l
ActionSpec     ``action/3d/nd4nq5c1``           nd, nq, c (ncomp)
AssemblySpec   ``assembly/3d/nd4nq5``           nd, nq
=============  ===============================  ===================

Distance between two keys of the same variant: ``sum |log2 a - log2 b|``
over their numbers (a factor 2 in one extent is distance 1). Keys of
different variants are infinitely far apart.

Examples
--------
>>> from smalltc.spec import ActionSpec
>>> size_key(ActionSpec(dim=3, nq=5, nd=4, batch=10, dtype="float64"))
'action/3d/nd4nq5c1'
>>> distance("gemm/nn/m8n8k8", "gemm/nn/m16n8k8")      # a factor 2 in one extent
1.0
>>> round(distance("action/3d/nd4nq5c1", "action/3d/nd4nq6c1"), 3)   # log2(6/5)
0.263
>>> distance("action/3d/nd4nq5c1", "action/2d/nd4nq5c1")
inf
"""
from __future__ import annotations

import math
import re

from smalltc.spec import ActionSpec, AssemblySpec, ContractSpec, GemmSpec

__all__ = ["size_key", "split_key", "distance"]

_NUM = re.compile(r"([a-z]+)(\d+)")


def size_key(spec) -> str:
    """The table key of ``spec`` (sizes and layout, without batch count or dtype)."""
    if isinstance(spec, GemmSpec):
        t = ("t" if spec.trans_a else "n") + ("t" if spec.trans_b else "n")
        flags = (("+sa" if spec.shared_a else "") + ("+sb" if spec.shared_b else "")
                 + ("" if spec.beta_zero else "+beta"))
        return f"gemm/{t}{flags}/m{spec.m}n{spec.n}k{spec.k}"
    if isinstance(spec, ContractSpec):
        flags = ("+sx" if spec.shared_x else "") + ("+sy" if spec.shared_y else "")
        return (f"contract{spec.kind}{flags}/i{spec.i}s{spec.s}j{spec.j}"
                f"k{spec.k}l{spec.l}")
    if isinstance(spec, ActionSpec):
        return f"action/{spec.dim}d/nd{spec.nd}nq{spec.nq}c{spec.ncomp}"
    if isinstance(spec, AssemblySpec):
        return f"assembly/{spec.dim}d/nd{spec.nd}nq{spec.nq}"
    raise TypeError(f"not a spec: {spec!r}")


def split_key(key: str):
    """``(variant, {name: number})`` of a key."""
    variant, _, nums = key.rpartition("/")
    found = dict((n, int(v)) for n, v in _NUM.findall(nums))
    if not variant or not found or "".join(f"{n}{v}" for n, v in found.items()) != nums:
        raise ValueError(f"not a size key: {key!r}")
    return variant, found


def distance(a: str, b: str) -> float:
    """``sum |log2 x - log2 y|`` over the numbers of two keys of one variant, else inf."""
    va, na = split_key(a)
    vb, nb = split_key(b)
    if va != vb or na.keys() != nb.keys():
        return math.inf
    return sum(abs(math.log2(max(na[k], 1)) - math.log2(max(nb[k], 1))) for k in na)
