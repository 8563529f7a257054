"""The specs of the general sum-factorised path (docs/math.md section 7): the operator of
mixed spaces, the basis application (evaluation at the points and its transpose) and the
pointwise geometry (:mod:`smalltc.spec`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ._spec_base import (INDEX_DTYPES, Operand, _check_choice, _check_comp_axis, _check_dim,
                         _check_float, _Element, _evals, _field_shape, _index_bytes,
                         _map_operand, _Spec, nsym)

__all__ = ["EVALS", "MixedSpec", "BASIS_WHATS", "BasisSpec", "GEOMETRY_WHATS",
           "GeometrySpec"]


#: what a side of the general operator evaluates at the quadrature points, per component
#: (:class:`MixedSpec`): the value, the ``dim`` reference gradients, or both (value first)
EVALS = ("value", "grad", "both")


@dataclass(frozen=True)
class MixedSpec(_Spec):
    """The general operator of mixed spaces, ``U = E_out^T (Q . E_in V)`` per element
    (docs/math.md section 7): bases ``(nq, nd_in)`` and ``(nq, nd_out)`` at one quadrature;
    each side evaluates ``eval_in``/``eval_out`` ("value", "grad", "both") of its
    ``ncomp_in``/``ncomp_out`` components; ``Q[e, r, s, k...]`` couples output slot ``r``
    with input slot ``s``. Slots are component-major, ``c * nper + j``, ``j`` over the value
    then ``d/dxi_1 .. d/dxi_dim`` as evaluated (:meth:`evals`).

    ``ndofs_in`` None: the input is element vectors ``V`` ``(E, [ncomp_in,] nd_in, ...)``
    (L2); else a global ``x`` ``([ncomp_in,] ndofs_in)`` gathered through
    ``elem_dofs_in``. Likewise ``ndofs_out``: element results, or a global ``y`` added into
    through ``elem_dofs_out``; the output has a component axis when ``ncomp_out > 1``. The
    general sum-factorised path, no size-specialised kernel on any backend (``qfunc``
    "mixed": ``specialized=False``).

    >>> s = MixedSpec(dim=2, nq=4, nd_in=2, nd_out=3, batch=5, dtype="float64",
    ...               ncomp_out=2, eval_out="grad")
    >>> [(o.name, o.shape) for o in s.inputs]
    [('B_in', (4, 2)), ('B_out', (4, 3)), ('G_out', (4, 3)), ('Q', (5, 4, 1, 4, 4)), ('V', (5, 2, 2))]
    >>> s.out_shape, s.size_key, str(s)
    ((5, 2, 3, 3), 'mixed/2d/nq4in2v1out3g2', 'mixed_2d nq=4 in: nd=2 value x1 out: nd=3 grad x2 E=5 float64')
    """

    dim: int
    nq: int
    nd_in: int
    nd_out: int
    batch: int
    dtype: str
    ncomp_in: int = 1
    ncomp_out: int = 1
    eval_in: str = "value"
    eval_out: str = "value"
    comp_axis_in: bool = False
    ndofs_in: int | None = None
    ndofs_out: int | None = None
    index_dtype_in: str = "int32"
    index_dtype_out: str = "int32"
    op = "mixed"
    qfunc = "mixed"           # not a field: the backends' test for an instance without a kernel

    def __post_init__(self):
        for side in ("in", "out"):
            _check_choice(f"eval_{side}", getattr(self, f"eval_{side}"), EVALS)
            _check_choice(f"index_dtype_{side}", getattr(self, f"index_dtype_{side}"),
                          INDEX_DTYPES)
        _check_dim(self.dim)
        _check_comp_axis(self.ncomp_in, self.comp_axis_in, "the input", "_in")

    def evals(self, side):
        """The evaluations of one side, in slot order: ``-1`` the value, ``a`` the reference
        derivative along tensor axis ``a``."""
        ev = getattr(self, f"eval_{side}")
        return _evals(self.dim, ev != "grad", ev != "value")

    @property
    def nslots_in(self):
        return self.ncomp_in * len(self.evals("in"))

    @property
    def nslots_out(self):
        return self.ncomp_out * len(self.evals("out"))

    def _side_shape(self, side):
        nc = getattr(self, f"ncomp_{side}")
        axis = self.comp_axis_in if side == "in" else nc > 1
        return _field_shape(self.batch, self.dim, getattr(self, f"nd_{side}"),
                            (nc,) if axis else (), getattr(self, f"ndofs_{side}"))

    @property
    def out_shape(self):
        return self._side_shape("out")

    @property
    def inputs(self):
        ops = []
        for side in ("in", "out"):
            shape = (self.nq, getattr(self, f"nd_{side}"))
            ops.append(Operand(f"B_{side}", shape, False))
            if getattr(self, f"eval_{side}") != "value":
                ops.append(Operand(f"G_{side}", shape, False))
        q = (self.batch, self.nslots_out, self.nslots_in) + (self.nq,) * self.dim
        ops.append(Operand("Q", q, True))
        ops.append(Operand("V" if self.ndofs_in is None else "x", self._side_shape("in"),
                           self.ndofs_in is None))
        for side in ("in", "out"):
            if getattr(self, f"ndofs_{side}") is not None:
                ops.append(_map_operand(f"elem_dofs_{side}", self.batch,
                                        getattr(self, f"nd_{side}"), self.dim,
                                        getattr(self, f"index_dtype_{side}")))
        return tuple(ops)

    def kernel_key(self):
        """No batch count and no vector lengths."""
        return (self.op,) + tuple(v for k, v in self.__dict__.items()
                                  if k not in ("batch", "ndofs_in", "ndofs_out")) + (
            self.ndofs_in is None, self.ndofs_out is None)

    @property
    def size_key(self):
        def side(s):
            return (f"{getattr(self, f'nd_{s}')}{getattr(self, f'eval_{s}')[0]}"
                    f"{getattr(self, f'ncomp_{s}')}"
                    + ("" if getattr(self, f"ndofs_{s}") is None else "m"))
        return f"mixed/{self.dim}d/nq{self.nq}in{side('in')}out{side('out')}"

    def sizes(self):
        return dict(dim=self.dim, nq=self.nq, nd_in=self.nd_in, nd_out=self.nd_out,
                    batch=self.batch, ncomp_in=self.ncomp_in, ncomp_out=self.ncomp_out,
                    nslots_in=self.nslots_in, nslots_out=self.nslots_out)

    def __str__(self):
        def side(s):
            nd = getattr(self, f"nd_{s}")
            ndofs = getattr(self, f"ndofs_{s}")
            where = "" if ndofs is None else f" ndofs={ndofs}"
            return (f"{s}: nd={nd} {getattr(self, f'eval_{s}')} x{getattr(self, f'ncomp_{s}')}"
                    f"{where}")
        return f"mixed_{self.dim}d nq={self.nq} {side('in')} {side('out')} E={self.batch} " \
               f"{self.dtype}"


#: what :class:`BasisSpec` evaluates at the points: the values, the reference gradients, or
#: both (the value first, then ``d/dxi_1 .. d/dxi_dim``)
BASIS_WHATS = ("values", "gradients", "both")


@dataclass(frozen=True)
class BasisSpec(_Element):
    """CEED's basis application: the evaluation of element fields at the quadrature points
    (``EVAL_INTERP``, ``EVAL_GRAD``) or, ``transpose``, its transpose (the integration
    against the basis and its derivatives); docs/math.md section 7, the input and output
    sides of :class:`MixedSpec` alone.

    Evaluation (``transpose`` False): the field, ``([ncomp,] ndofs)`` gathered through
    ``elem_dofs`` or element vectors ``(E, [ncomp,] nd, ..., nd)`` when ``ndofs`` is None,
    to ``H`` of shape ``(E, [ncomp,] [nslots,] nq, ..., nq)``: ``nslots`` evaluations a
    component (no axis for ``"values"``; ``dim`` for ``"gradients"``; ``1 + dim`` for
    ``"both"``, the value first). Integration (``transpose``): ``H`` of that shape to the
    element vectors, or summed into the global vector through ``elem_dofs``.

    >>> s = BasisSpec(dim=2, nq=4, nd=3, batch=5, dtype="float64", what="both", ndofs=40)
    >>> [(o.name, o.shape) for o in s.inputs]
    [('B1d', (4, 3)), ('G1d', (4, 3)), ('x', (40,)), ('elem_dofs', (5, 3, 3))]
    >>> s.out_shape, s.size_key, str(s)
    ((5, 3, 4, 4), 'basis/2d/nd3nq4c1+both+m', 'interp_2d p=2 nq=4 both E=5 ndofs=40 float64')
    >>> t = BasisSpec(dim=3, nq=3, nd=2, batch=7, dtype="float64", what="values",
    ...               transpose=True)
    >>> [(o.name, o.shape) for o in t.inputs], t.out_shape
    ([('B1d', (3, 2)), ('H', (7, 3, 3, 3))], (7, 2, 2, 2))
    """

    what: str = "values"
    transpose: bool = False
    ncomp: int = 1
    comp_axis: bool = False
    ndofs: int | None = None
    index_dtype: str = "int32"
    op = "basis"
    qfunc = "basis"           # not a field: no operator instance of the FEM families

    def __post_init__(self):
        _check_choice("what", self.what, BASIS_WHATS)
        _check_dim(self.dim)
        _check_choice("index_dtype", self.index_dtype, INDEX_DTYPES)
        _check_comp_axis(self.ncomp, self.comp_axis, "the field")

    def evals(self):
        """The evaluations in slot order: ``-1`` the value, ``a`` the reference derivative
        along tensor axis ``a`` (:meth:`MixedSpec.evals`'s convention)."""
        return _evals(self.dim, self.what != "gradients", self.what != "values")

    @property
    def nslots(self):
        """Evaluations a component: 1, ``dim`` or ``1 + dim``."""
        return len(self.evals())

    @property
    def points_shape(self):
        """``H``'s shape: ``(E, [ncomp,] [nslots,] nq, ..., nq)``."""
        return ((self.batch,) + ((self.ncomp,) if self.comp_axis else ())
                + ((self.nslots,) if self.what != "values" else ()) + (self.nq,) * self.dim)

    @property
    def field_shape(self):
        """The field's shape: ``([ncomp,] ndofs)``, or the element vectors."""
        return _field_shape(self.batch, self.dim, self.nd,
                            (self.ncomp,) if self.comp_axis else (), self.ndofs)

    @property
    def out_shape(self):
        return self.field_shape if self.transpose else self.points_shape

    @property
    def inputs(self):
        ops = [Operand("B1d", (self.nq, self.nd), False)]
        if self.what != "values":
            ops.append(Operand("G1d", (self.nq, self.nd), False))
        if self.transpose:
            ops.append(Operand("H", self.points_shape, True))
        else:
            ops.append(Operand("V" if self.ndofs is None else "x", self.field_shape,
                               self.ndofs is None))
        if self.ndofs is not None:
            ops.append(_map_operand("elem_dofs", self.batch, self.nd, self.dim,
                                    self.index_dtype))
        return tuple(ops)

    def kernel_key(self):
        """No batch count and no vector length: one kernel serves every mesh."""
        return (self.op, self.dim, self.nq, self.nd, self.dtype, self.what, self.transpose,
                self.ncomp, self.comp_axis, self.ndofs is None, self.index_dtype)

    @property
    def size_key(self):
        return (f"basis/{self.dim}d/nd{self.nd}nq{self.nq}c{self.ncomp}+{self.what}"
                + ("+t" if self.transpose else "") + ("" if self.ndofs is None else "+m"))

    def sizes(self):
        return dict(dim=self.dim, nq=self.nq, nd=self.nd, batch=self.batch, ncomp=self.ncomp,
                    nslots=self.nslots, ndofs=self.ndofs,
                    index_bytes=_index_bytes(self.index_dtype))

    def __str__(self):
        comp = f" ncomp={self.ncomp}" if self.comp_axis else ""
        where = "" if self.ndofs is None else f" ndofs={self.ndofs}"
        return (f"{'integrate' if self.transpose else 'interp'}_{self.dim}d p={self.p} "
                f"nq={self.nq} {self.what}{comp} E={self.batch}{where} {self.dtype}")


#: what :class:`GeometrySpec` writes at each point, slot by slot (``nsym`` the packed upper
#: triangle): ``det`` |J|; ``adjugate`` |J| then adj J (row-major); ``inverse`` |J| then
#: J^-1; ``mass`` D = w c |J|; ``diffusion`` Q = w c adj J adj J^T / |J|, packed;
#: ``both`` D then Q
GEOMETRY_WHATS = ("det", "adjugate", "inverse", "mass", "diffusion", "both")


@dataclass(frozen=True)
class GeometrySpec(_Spec):
    """The pointwise geometry: from the reference Jacobians ``J[e, a, b] = dx_a/dxi_b`` at
    the tensor-product points (the layout :func:`smalltc.interpolate` gives the coordinate
    field with ``what="gradients"``), in one pass, the determinant, the closed-form
    adjugate or inverse, or the operators' point data ``D = w c |J|`` and ``Q = w c adj J
    adj J^T / |J|`` (packed upper triangle, docs/math.md section 7), ``w`` the tensor
    weights (a tensor ``(nq,) * dim``) and ``c`` an optional coefficient at every point; and
    each element's smallest ``|J|`` (``jmin``, written: an inverted element has one <= 0).

    ``dtype`` is the outputs' (float64 or float32), ``jdtype`` that of ``J`` and of the
    coefficient; the arithmetic is float64. ``absdet``: ``|det J|`` in place of ``det J``
    in D and Q (elements of either orientation; ``jmin`` stays signed).

    >>> s = GeometrySpec(dim=3, nq=4, batch=10, dtype="float32", what="diffusion", coef=True)
    >>> [(o.name, o.shape, o.dtype) for o in s.inputs]       # doctest: +NORMALIZE_WHITESPACE
    [('J', (10, 3, 3, 4, 4, 4), 'float64'), ('weights', (4, 4, 4), 'float64'),
     ('coef', (10, 4, 4, 4), 'float64'), ('jmin', (10,), 'float64')]
    >>> s.out_shape, s.size_key, str(s)
    ((10, 6, 4, 4, 4), 'geometry/3d/nq4+diffusion+c', 'geometry_3d nq=4 diffusion coef E=10 float32')
    >>> GeometrySpec(dim=2, nq=3, batch=5, dtype="float64", what="adjugate").out_shape
    (5, 5, 3, 3)
    """

    dim: int
    nq: int
    batch: int
    dtype: str
    what: str = "mass"
    coef: bool = False
    jdtype: str = "float64"
    absdet: bool = False
    op = "geometry"
    qfunc = "geometry"        # not a field: no operator instance of the FEM families

    def __post_init__(self):
        _check_choice("what", self.what, GEOMETRY_WHATS)
        _check_dim(self.dim)
        _check_float("dtype", self.dtype)
        _check_float("jdtype", self.jdtype)
        if self.coef and not self.weighted:
            raise ValueError(f"coef is for what 'mass', 'diffusion' or 'both' (point data), "
                             f"not {self.what!r}")

    @property
    def weighted(self):
        """Whether the outputs are point data (weights and coefficient read)."""
        return self.what in ("mass", "diffusion", "both")

    @property
    def nsym(self):
        return nsym(self.dim)

    @property
    def nslots(self):
        """Values a point: 1 (det, mass), nsym, 1 + nsym, or 1 + dim^2."""
        return {"det": 1, "mass": 1, "diffusion": self.nsym, "both": 1 + self.nsym,
                "adjugate": 1 + self.dim ** 2, "inverse": 1 + self.dim ** 2}[self.what]

    @property
    def points(self):
        return (self.nq,) * self.dim

    @property
    def out_shape(self):
        """``(E, nq, ..., nq)`` for one slot (det, mass), else ``(E, nslots, nq, ..., nq)``."""
        slot = () if self.what in ("det", "mass") else (self.nslots,)
        return (self.batch,) + slot + self.points

    @property
    def inputs(self):
        ops = [Operand("J", (self.batch, self.dim, self.dim) + self.points, True, False,
                       self.jdtype)]
        if self.weighted:
            ops.append(Operand("weights", self.points, False, True, "float64"))
        if self.coef:
            ops.append(Operand("coef", (self.batch,) + self.points, True, True, self.jdtype))
        ops.append(Operand("jmin", (self.batch,), True, False, "float64"))
        return tuple(ops)

    def kernel_key(self):
        return (self.op, self.dim, self.nq, self.dtype, self.what, self.coef, self.jdtype,
                self.absdet)

    @property
    def size_key(self):
        return (f"geometry/{self.dim}d/nq{self.nq}+{self.what}" + ("+c" if self.coef else "")
                + ("+abs" if self.absdet else "")
                + ("" if self.jdtype == "float64" else "+j32"))

    def sizes(self):
        return dict(dim=self.dim, nq=self.nq, batch=self.batch, what=self.what,
                    coef=self.coef, nslots=self.nslots,
                    jbytes=8 if self.jdtype == "float64" else 4)

    def __str__(self):
        extra = (" coef" if self.coef else "") + (" absdet" if self.absdet else "") + (
            "" if self.jdtype == "float64" else f" J {self.jdtype}")
        return f"geometry_{self.dim}d nq={self.nq} {self.what}{extra} E={self.batch} {self.dtype}"
