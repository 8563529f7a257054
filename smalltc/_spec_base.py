"""What every spec is built of: :class:`Operand`, the common behaviour (the kernel key
without the batch count, ``as_dict``), the fields of the specs on tensor-product elements,
the choices the FEM specs take and the checks the specs share (:mod:`smalltc.spec`).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import NamedTuple

__all__ = ["Operand", "QFUNCS", "FORCE_QFUNCS", "QDTYPES", "GEOMETRIES", "INDEX_DTYPES",
           "nsym"]


class Operand(NamedTuple):
    """One input of an operation: its name in messages, its shape, whether it has the
    batch axis (False: one array shared by the whole batch), whether its values are
    positive by nature (``D = w * rho * |J|``: tests and measurements draw it so), and
    its dtype when it is not the operation's (the integer element-to-DoF map)."""

    name: str
    shape: tuple
    batched: bool
    positive: bool = False
    dtype: str | None = None


#: the quadrature functions of the FEM operations (docs/math.md section 7); "force" and
#: "force_t" are BLAST's corner force ``F`` (H1^d <- L2) and its transpose (L2 <- H1^d):
#: mixed spaces, element level ("action") and kinematic side fused ("mass_apply") only
QFUNCS = ("mass", "diffusion", "helmholtz")
#: the mixed-space (corner force) instances
FORCE_QFUNCS = ("force", "force_t")
#: fields of the FEM specs left out of keys and dicts while they hold these defaults
#: (so every mass key, table entry and golden record stays as it was)
_OPERATOR_DEFAULTS = (("qfunc", "mass"), ("collocated", False), ("qdtype", None),
                      ("geometry", None))
#: the point-data dtypes: None (the spec's dtype) or float32 point data with float64
#: vectors (docs/math.md section 8: less data)
QDTYPES = (None, "float32")
#: where the point data comes from: None (stored D/Q) or "vertices" (recomputed in the
#: kernel from the vertex coordinates of trilinear/bilinear elements and one coefficient
#: an element; docs/math.md section 8)
GEOMETRIES = (None, "vertices")
#: the index dtypes of an element-to-DoF map
INDEX_DTYPES = ("int32", "int64")


def nsym(dim: int) -> int:
    """Entries of a symmetric ``dim x dim`` matrix kept: ``dim (dim + 1) / 2``.

    >>> [nsym(d) for d in (1, 2, 3)]
    [1, 3, 6]
    """
    return dim * (dim + 1) // 2


def _non_default(spec):
    """The operator fields that differ from their defaults, as ``(name, value)`` pairs."""
    return tuple((k, getattr(spec, k)) for k, v in _OPERATOR_DEFAULTS
                 if getattr(spec, k, v) != v)


def _check_choice(name, value, choices):
    """``value`` is one of ``choices``, else a ValueError naming the field."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _check_float(name, value):
    """``value`` is "float64" or "float32", else a ValueError naming the field."""
    if value not in ("float64", "float32"):
        raise ValueError(f"{name} must be 'float64' or 'float32', got {value!r}")


def _check_dim(dim):
    if dim not in (1, 2, 3):
        raise ValueError(f"dim must be 1, 2 or 3, got {dim}")


def _check_comp_axis(ncomp, comp_axis, holder, side=""):
    """More than one component needs the component axis (``holder`` names the array
    that has it; ``side`` the field suffix, ``"_in"`` for :class:`MixedSpec`)."""
    if ncomp > 1 and not comp_axis:
        raise ValueError(f"ncomp{side}={ncomp} needs comp_axis{side}=True ({holder} has a "
                         "component axis)")


def _index_bytes(index_dtype):
    """Bytes of one index: 4 for "int32", 8 for "int64"."""
    return int(index_dtype[3:]) // 8


def _map_operand(name, batch, n, dim, index_dtype):
    """An element-to-DoF map: ``(batch, n, ..., n)`` indices of ``index_dtype``."""
    return Operand(name, (batch,) + (n,) * dim, True, False, index_dtype)


def _field_shape(batch, dim, nd, comp, ndofs):
    """A field's shape: the element vectors ``(E, [ncomp,] nd, ..., nd)`` when ``ndofs``
    is None, else the global vector ``([ncomp,] ndofs)`` (``comp``: ``()`` or
    ``(ncomp,)``)."""
    if ndofs is None:
        return (batch,) + comp + (nd,) * dim
    return comp + (ndofs,)


def _evals(dim, value, gradients):
    """Evaluations in slot order: ``-1`` the value (when ``value``), then ``a`` the reference
    derivative along tensor axis ``a`` (when ``gradients``)."""
    return ((-1,) if value else ()) + (tuple(range(dim)) if gradients else ())


class _Spec:
    """Common behaviour: the kernel key drops the batch count."""

    op: str

    def kernel_key(self):
        return (self.op,) + tuple(
            v for k, v in self.__dict__.items()
            if k not in ("batch", "comp_axis", "qfunc", "collocated", "qdtype", "geometry")
        ) + _non_default(self)

    def with_batch(self, batch: int):
        return replace(self, batch=batch)

    @property
    def items(self) -> int:
        """The batch count: elements for the FEM operations, matrices for the GEMM."""
        return self.batch

    def as_dict(self) -> dict:
        """``op`` and the fields: what a tuning table stores (:func:`spec_from_dict`);
        ``qfunc`` and ``collocated`` only where they differ from their defaults."""
        skip = {k for k, v in _OPERATOR_DEFAULTS if getattr(self, k, v) == v}
        return dict(op=self.op, **{f.name: getattr(self, f.name) for f in fields(self)
                                   if f.name not in skip})


@dataclass(frozen=True)
class _Element(_Spec):
    """The specs on tensor-product elements: ``dim`` axes, ``nq`` points and ``nd`` nodes
    an axis, ``batch`` elements, ``dtype``; the fields every such spec begins with."""

    dim: int
    nq: int
    nd: int
    batch: int
    dtype: str

    @property
    def p(self):
        return self.nd - 1
