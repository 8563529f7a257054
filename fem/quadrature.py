"""The quadrature rules of :mod:`smalltc.quadrature`, under their ``smalltc.fem`` name.

The rules live in the core (the vertex kernels hold them as constants); this module
keeps ``smalltc.fem.quadrature`` importable.

>>> from smalltc.fem.quadrature import quadrature_rule
>>> print(quadrature_rule(2, "lobatto")[1])
[1. 1.]
"""
from smalltc.quadrature import MAX_POINTS, RULES, gauss_legendre, gauss_lobatto, quadrature_rule

__all__ = ["gauss_legendre", "gauss_lobatto", "quadrature_rule", "RULES", "MAX_POINTS"]
