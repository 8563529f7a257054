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
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import NamedTuple

__all__ = ["Operand", "GemmSpec", "ContractSpec", "ActionSpec", "AssemblySpec",
           "MassApplySpec", "MassDiagonalSpec", "CONTRACT_KINDS", "SPEC_TYPES", "QFUNCS",
           "QDTYPES", "GEOMETRIES", "FORCE_QFUNCS", "MixedSpec", "EVALS", "BasisSpec",
           "BASIS_WHATS",
           "nsym", "spec_from_dict", "GeometrySpec", "GEOMETRY_WHATS"]

#: kernels (8a), (8b), (9) of docs/math.md section 3: output axis order per kind.
CONTRACT_KINDS = {
    "8a": "A[i,j,k,l] = sum_s X[i,s,j] Y[k,s,l]",
    "8b": "A[i,k,l,j] = sum_s X[i,s,j] Y[k,s,l]",
    "9": "A[k,i,l,j] = sum_s B[s,i] B[s,j] C[k,s,l]",
}


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


class _Operator(_Element):
    """What the FEM specs share: the quadrature function (``qfunc``), the collocated
    form, and the basis and data operands they imply (docs/math.md section 7):

    ========== =========================== =============================
    qfunc      basis operands              data operands
    ========== =========================== =============================
    mass       B1d (nq, nd)                D (E, nq, ..., nq)
    diffusion  B1d, G1d (nq, nd)           Q (E, nsym, nq, ..., nq)
    helmholtz  B1d, G1d                    D, Q
    ========== =========================== =============================

    B1d is left out when ``collocated`` (nq == nd, Gauss-Lobatto points on the nodes).
    """

    def _check_operator(self):
        if self.qfunc in FORCE_QFUNCS:
            return self._check_force()
        if self.qfunc not in QFUNCS:
            raise ValueError(f"qfunc must be one of {QFUNCS} or the corner force's "
                             f"{FORCE_QFUNCS}, got {self.qfunc!r}")
        if self.collocated and self.qfunc == "mass":
            raise ValueError("collocated=True is for qfunc 'diffusion' or 'helmholtz' (the "
                             "collocated mass action is the pointwise product D V)")
        if self.collocated and self.nq != self.nd:
            raise ValueError(f"collocated=True needs nq == nd, got nq={self.nq}, nd={self.nd}")

    def _check_force(self):
        """The corner force (docs/math.md section 7): the kinematic space H1 of order
        ``p = nd - 1`` with ``dim`` components, the thermodynamic space L2 of order
        ``p - 1`` (``nd - 1`` nodes per axis); element level and fused kinematic side."""
        if self.op not in ("action", "mass_apply"):
            raise ValueError(f"qfunc {self.qfunc!r} has the element level ('action') and the "
                             f"fused kinematic side ('mass_apply'), not {self.op!r}")
        if self.collocated:
            raise ValueError(f"collocated=True is not a form of qfunc {self.qfunc!r} (the "
                             "L2 basis is never the identity at the H1 points)")
        if self.nd < 2:
            raise ValueError(f"qfunc {self.qfunc!r} needs nd >= 2 (H1 of order p >= 1, L2 "
                             f"of order p - 1), got nd={self.nd}")
        if self.ncomp != self.dim or not self.comp_axis:
            raise ValueError(f"qfunc {self.qfunc!r}: the kinematic field has dim={self.dim} "
                             f"components (ncomp={self.dim}, comp_axis=True), got "
                             f"ncomp={self.ncomp}, comp_axis={self.comp_axis}")

    @property
    def nsym(self):
        return nsym(self.dim)

    @property
    def force(self):
        """Whether this is a corner-force instance (``qfunc`` "force" or "force_t")."""
        return self.qfunc in FORCE_QFUNCS

    @property
    def nd_l2(self):
        """Nodes per axis of the thermodynamic space L2 (order ``p - 1``): ``nd - 1``."""
        return self.nd - 1

    @property
    def l2_shape(self):
        """The thermodynamic (L2) element field's shape ``(E, nd - 1, ..., nd - 1)``."""
        return (self.batch,) + (self.nd - 1,) * self.dim

    def _basis_operands(self):
        if self.qfunc in FORCE_QFUNCS:
            return (Operand("B_l2", (self.nq, self.nd - 1), False),
                    Operand("B1d", (self.nq, self.nd), False),
                    Operand("G1d", (self.nq, self.nd), False))
        b = () if self.collocated else (Operand("B1d", (self.nq, self.nd), False),)
        return b + ((Operand("G1d", (self.nq, self.nd), False),)
                    if self.qfunc != "mass" else ())

    def _data_operands(self):
        if getattr(self, "geometry", None) == "vertices":
            # the element's 2^dim vertices (tensor order, the last axis fastest) and its
            # coefficient (rho for mass, kappa for diffusion): docs/math.md section 8
            return (Operand("X", (self.batch, 2 ** self.dim, self.dim), True),
                    Operand("coef", (self.batch,), True, True))
        qdt = getattr(self, "qdtype", None)
        q = (self.batch,) + (self.nq,) * self.dim
        if self.qfunc in FORCE_QFUNCS:
            return (Operand("A", (self.batch, self.dim, self.dim) + q[1:], True),)
        d = (Operand("D", q, True, True, qdt),) if self.qfunc in ("mass", "helmholtz") else ()
        return d + ((Operand("Q", (self.batch, self.nsym) + q[1:], True, False, qdt),)
                    if self.qfunc in ("diffusion", "helmholtz") else ())

    def _check_data_source(self):
        """``qdtype`` (float32 point data with float64 vectors) and ``geometry``
        ("vertices": the point data recomputed from vertex coordinates): action and
        fused apply only, one at a time; the vertex form for mass and diffusion."""
        qdt, geo = getattr(self, "qdtype", None), getattr(self, "geometry", None)
        _check_choice("qdtype", qdt, QDTYPES)
        _check_choice("geometry", geo, GEOMETRIES)
        if qdt is not None and self.dtype != "float64":
            raise ValueError(f"qdtype={qdt!r} is for float64 vectors (float32 point data "
                             f"read, float64 arithmetic); the spec's dtype is {self.dtype}")
        if qdt is not None and geo is not None:
            raise ValueError("qdtype and geometry='vertices' exclude each other (the vertex "
                             "form reads no point data)")
        if (qdt is not None or geo is not None) and self.qfunc in FORCE_QFUNCS:
            raise ValueError(f"qdtype and geometry are options of the stored-data operators, "
                             f"not of the corner force (qfunc={self.qfunc!r})")
        if geo is not None and self.qfunc == "helmholtz":
            raise ValueError("geometry='vertices' is for qfunc 'mass' or 'diffusion' (not "
                             "'helmholtz', which needs two coefficients)")

    def _key(self, level):
        """``size_key`` with the qfunc prefix and the collocated suffix (none for mass),
        ``+q32`` for float32 point data, ``+vx`` for the vertex geometry."""
        pre = "" if self.qfunc == "mass" else f"{self.qfunc}/"
        return (pre + level + ("+co" if self.collocated else "")
                + ("+q32" if getattr(self, "qdtype", None) else "")
                + ("+vx" if getattr(self, "geometry", None) else ""))

    def _name(self, what):
        """``str()``'s first word: ``mass_apply_3d``, ``diffusion_operator_2d``, ..."""
        return f"{self.qfunc}_{what}_{self.dim}d"

    @property
    def _co(self):
        return (" collocated" if self.collocated else "") + (
            " float32-data" if getattr(self, "qdtype", None) else "") + (
            " vertex-geometry" if getattr(self, "geometry", None) else "")

    def _extra_sizes(self):
        return dict(_non_default(self))


@dataclass(frozen=True)
class GemmSpec(_Spec):
    """``C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]`` for ``b < batch``.

    ``op(A)`` is ``m x k``, ``op(B)`` is ``k x n``. A shared operand (2D
    array) has batch stride 0. ``beta_zero`` means C is not read (and is not
    among the inputs).
    """

    batch: int
    m: int
    n: int
    k: int
    dtype: str
    trans_a: bool = False
    trans_b: bool = False
    shared_a: bool = False
    shared_b: bool = False
    beta_zero: bool = True
    op = "gemm"

    @property
    def a_shape(self):
        core = (self.k, self.m) if self.trans_a else (self.m, self.k)
        return core if self.shared_a else (self.batch,) + core

    @property
    def b_shape(self):
        core = (self.n, self.k) if self.trans_b else (self.k, self.n)
        return core if self.shared_b else (self.batch,) + core

    @property
    def out_shape(self):
        return (self.batch, self.m, self.n)

    @property
    def inputs(self):
        ops = (Operand("A", self.a_shape, not self.shared_a),
               Operand("B", self.b_shape, not self.shared_b))
        return ops if self.beta_zero else ops + (Operand("C", self.out_shape, True),)

    @property
    def size_key(self):
        t = ("t" if self.trans_a else "n") + ("t" if self.trans_b else "n")
        flags = (("+sa" if self.shared_a else "") + ("+sb" if self.shared_b else "")
                 + ("" if self.beta_zero else "+beta"))
        return f"gemm/{t}{flags}/m{self.m}n{self.n}k{self.k}"

    def sizes(self):
        return dict(m=self.m, n=self.n, k=self.k, batch=self.batch, shared_a=self.shared_a,
                    shared_b=self.shared_b, beta_zero=self.beta_zero)

    def __str__(self):
        t = ("T" if self.trans_a else "N") + ("T" if self.trans_b else "N")
        return (f"gemm_{t.lower()} m={self.m} n={self.n} k={self.k} batch={self.batch} "
                f"{self.dtype}{' shared A' if self.shared_a else ''}"
                f"{' shared B' if self.shared_b else ''}{'' if self.beta_zero else ' beta!=0'}")


@dataclass(frozen=True)
class ContractSpec(_Spec):
    """One reshaping-layout contraction, kernel (8a), (8b) or (9).

    Extents ``i, s, j`` belong to X (seen as ``X[i,s,j]``) and ``k, s, l`` to
    Y (``Y[k,s,l]``). For kind ``"9"`` X is ``B[s,n]`` with ``i == j == n``
    and Y is ``C[k,s,l]``.
    """

    kind: str
    batch: int
    i: int
    s: int
    j: int
    k: int
    l: int
    dtype: str
    shared_x: bool = False
    shared_y: bool = False
    op = "contract"

    @property
    def x_shape(self):
        core = (self.s, self.i) if self.kind == "9" else (self.i, self.s, self.j)
        return core if self.shared_x else (self.batch,) + core

    @property
    def y_shape(self):
        core = (self.k, self.s, self.l)
        return core if self.shared_y else (self.batch,) + core

    @property
    def out_shape(self):
        i, j, k, l = self.i, self.j, self.k, self.l
        core = {"8a": (i, j, k, l), "8b": (i, k, l, j), "9": (k, i, l, j)}[self.kind]
        return (self.batch,) + core

    @property
    def inputs(self):
        return (Operand("X", self.x_shape, not self.shared_x),
                Operand("Y", self.y_shape, not self.shared_y))

    @property
    def size_key(self):
        flags = ("+sx" if self.shared_x else "") + ("+sy" if self.shared_y else "")
        return f"contract{self.kind}{flags}/i{self.i}s{self.s}j{self.j}k{self.k}l{self.l}"

    def sizes(self):
        return dict(kind=self.kind, i=self.i, s=self.s, j=self.j, k=self.k, l=self.l,
                    batch=self.batch, shared_x=self.shared_x, shared_y=self.shared_y)

    def __str__(self):
        return (f"contract ({self.kind}) i={self.i} s={self.s} j={self.j} k={self.k} "
                f"l={self.l} batch={self.batch} {self.dtype}")


@dataclass(frozen=True)
class ActionSpec(_Operator):
    """Partial-assembly action on element vectors: the mass action ``U_e = B^T D_e B
    V_e``, the diffusion action ``U_e = sum_ab G_a^T Q_e^ab G_b V_e`` or their sum
    (``qfunc``; docs/math.md sections 2 and 7)."""

    ncomp: int = 1
    comp_axis: bool = False
    qfunc: str = "mass"
    collocated: bool = False
    qdtype: str | None = None
    geometry: str | None = None
    op = "action"

    def __post_init__(self):
        self._check_operator()
        self._check_data_source()
        # V is (batch, ncomp, nd, ...) for ncomp > 1; without the axis its shape would
        # hold 1/ncomp of the items the kernels process (the tuner made such specs once)
        _check_comp_axis(self.ncomp, self.comp_axis, "V")

    @property
    def b_shape(self):
        return (self.nq, self.nd)

    @property
    def d_shape(self):
        return (self.batch,) + (self.nq,) * self.dim

    @property
    def v_shape(self):
        comp = (self.ncomp,) if self.comp_axis else ()
        return (self.batch,) + comp + (self.nd,) * self.dim

    @property
    def out_shape(self):
        """V's shape; the corner force: ``(E, dim, nd, ...)`` for "force" (H1^d), the L2
        field ``(E, nd - 1, ...)`` for "force_t"."""
        return self.l2_shape if self.qfunc == "force_t" else self.v_shape

    @property
    def inputs(self):
        if self.qfunc == "force":
            field = (Operand("e", self.l2_shape, True),)
        elif self.qfunc == "force_t":
            field = (Operand("w", self.v_shape, True),)
        else:
            field = (Operand("V", self.v_shape, True),)
        return self._basis_operands() + self._data_operands() + field

    @property
    def size_key(self):
        return self._key(f"action/{self.dim}d/nd{self.nd}nq{self.nq}c{self.ncomp}")

    def sizes(self):
        return dict(dim=self.dim, nq=self.nq, nd=self.nd, batch=self.batch, ncomp=self.ncomp,
                    **self._extra_sizes())

    def __str__(self):
        comp = f" ncomp={self.ncomp}" if self.comp_axis else ""
        # named for the action: ``action_3d`` (mass), ``diffusion_action_3d``, ...
        name = (f"action_{self.dim}d" if self.qfunc == "mass" else self._name("action"))
        return (f"{name} p={self.p} nq={self.nq}{comp} "
                f"E={self.batch} {self.dtype}{self._co}")


@dataclass(frozen=True)
class AssemblySpec(_Operator):
    """Element matrices: mass ``M_e = B^T D_e B``, stiffness ``K_e = sum_ab G_a^T Q_e^ab
    G_b`` or their sum (``qfunc``; docs/math.md sections 2 and 7)."""

    qfunc: str = "mass"
    collocated: bool = False
    op = "assembly"

    def __post_init__(self):
        self._check_operator()

    @property
    def b_shape(self):
        return (self.nq, self.nd)

    @property
    def d_shape(self):
        return (self.batch,) + (self.nq,) * self.dim

    @property
    def out_shape(self):
        n = self.nd ** self.dim
        return (self.batch, n, n)

    @property
    def inputs(self):
        return self._basis_operands() + self._data_operands()

    @property
    def size_key(self):
        return self._key(f"assembly/{self.dim}d/nd{self.nd}nq{self.nq}")

    def sizes(self):
        return dict(dim=self.dim, nq=self.nq, nd=self.nd, batch=self.batch,
                    **self._extra_sizes())

    def __str__(self):
        return (f"{self._name('assemble')} p={self.p} nq={self.nq} E={self.batch} "
                f"{self.dtype}{self._co}")


INDEX_DTYPES = ("int32", "int64")


@dataclass(frozen=True)
class MassApplySpec(_Operator):
    """The global operator ``y = sum_e R_e^T A_e R_e x``, fused: each element's
    values gathered from the global vector ``x`` through the element-to-DoF map
    ``elem_dofs`` (``R_e``), the element action ``A_e`` applied (the mass action
    ``B^T D_e B`` by default; ``qfunc`` as for :class:`ActionSpec`), the result added
    into ``y``.

    ``batch`` is the element count E; ``ndofs`` the global vector's length (per
    component: ``x`` is ``(ndofs,)``, or ``(ncomp, ndofs)`` with ``comp_axis``);
    ``index_dtype`` the map's; ``deterministic``: the additions into ``y`` in a fixed
    order (element colours) instead of atomics, the same bits every run.

    >>> s = MassApplySpec(dim=2, nq=4, nd=3, batch=6, dtype="float64", ndofs=35)
    >>> [(o.name, o.shape, o.dtype) for o in s.inputs]
    [('B1d', (4, 3), None), ('D', (6, 4, 4), None), ('x', (35,), None), ('elem_dofs', (6, 3, 3), 'int32')]
    >>> s.out_shape, s.size_key
    ((35,), 'mass_apply/2d/nd3nq4c1')
    """

    ndofs: int
    ncomp: int = 1
    comp_axis: bool = False
    index_dtype: str = "int32"
    deterministic: bool = False
    qfunc: str = "mass"
    collocated: bool = False
    qdtype: str | None = None
    geometry: str | None = None
    op = "mass_apply"

    def __post_init__(self):
        _check_comp_axis(self.ncomp, self.comp_axis, "x")
        _check_choice("index_dtype", self.index_dtype, INDEX_DTYPES)
        self._check_operator()
        self._check_data_source()

    def kernel_key(self):
        """No batch count and no vector length: one kernel serves every mesh."""
        return (self.op, self.dim, self.nq, self.nd, self.dtype, self.ncomp, self.index_dtype,
                self.deterministic) + _non_default(self)

    @property
    def x_shape(self):
        return ((self.ncomp,) if self.comp_axis else ()) + (self.ndofs,)

    @property
    def out_shape(self):
        """x's shape; the corner force "force_t" (L2 <- H1^d, the kinematic vector ``w``
        gathered): the L2 element field ``(E, nd - 1, ...)``."""
        return self.l2_shape if self.qfunc == "force_t" else self.x_shape

    @property
    def inputs(self):
        dofs = _map_operand("elem_dofs", self.batch, self.nd, self.dim, self.index_dtype)
        if self.qfunc == "force":          # F e scatter-added into y (dim, ndofs)
            field = Operand("e", self.l2_shape, True)
        elif self.qfunc == "force_t":      # F^T w, w gathered from (dim, ndofs)
            field = Operand("w", self.x_shape, False)
        else:
            field = Operand("x", self.x_shape, False)
        return self._basis_operands() + self._data_operands() + (field, dofs)

    @property
    def size_key(self):
        return self._key(f"mass_apply/{self.dim}d/nd{self.nd}nq{self.nq}c{self.ncomp}")

    def sizes(self):
        return dict(dim=self.dim, nq=self.nq, nd=self.nd, batch=self.batch, ncomp=self.ncomp,
                    ndofs=self.ndofs, index_bytes=_index_bytes(self.index_dtype),
                    **self._extra_sizes())

    def __str__(self):
        comp = f" ncomp={self.ncomp}" if self.comp_axis else ""
        det = " deterministic" if self.deterministic else ""
        return (f"{self._name('operator')} p={self.p} nq={self.nq}{comp} E={self.batch} "
                f"ndofs={self.ndofs} {self.dtype} {self.index_dtype}{det}{self._co}")


@dataclass(frozen=True)
class MassDiagonalSpec(_Operator):
    """The diagonal of the global operator's matrix, ``y = sum_e R_e^T diag(A_e)``: for
    mass the element diagonals ``sum_k prod_a B[k_a, i_a]^2 D_e[k]`` added into ``y``
    through the element-to-DoF map (the Jacobi preconditioner); ``qfunc`` as for
    :class:`ActionSpec`.

    >>> MassDiagonalSpec(dim=3, nq=5, nd=4, batch=8, dtype="float32", ndofs=125).out_shape
    (125,)
    """

    ndofs: int
    index_dtype: str = "int32"
    deterministic: bool = False
    qfunc: str = "mass"
    collocated: bool = False
    op = "mass_diagonal"

    def __post_init__(self):
        _check_choice("index_dtype", self.index_dtype, INDEX_DTYPES)
        self._check_operator()

    def kernel_key(self):
        return (self.op, self.dim, self.nq, self.nd, self.dtype, self.index_dtype,
                self.deterministic) + _non_default(self)

    @property
    def out_shape(self):
        return (self.ndofs,)

    @property
    def inputs(self):
        return (self._basis_operands() + self._data_operands()
                + (_map_operand("elem_dofs", self.batch, self.nd, self.dim, self.index_dtype),))

    @property
    def size_key(self):
        return self._key(f"mass_diagonal/{self.dim}d/nd{self.nd}nq{self.nq}")

    def sizes(self):
        return dict(dim=self.dim, nq=self.nq, nd=self.nd, batch=self.batch, ndofs=self.ndofs,
                    index_bytes=_index_bytes(self.index_dtype), **self._extra_sizes())

    def __str__(self):
        det = " deterministic" if self.deterministic else ""
        return (f"{self._name('diagonal')} p={self.p} nq={self.nq} E={self.batch} "
                f"ndofs={self.ndofs} {self.dtype} {self.index_dtype}{det}{self._co}")


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


#: op name -> spec class
SPEC_TYPES = {c.op: c for c in (GemmSpec, ContractSpec, ActionSpec, AssemblySpec,
                                MassApplySpec, MassDiagonalSpec, MixedSpec, BasisSpec)}


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


SPEC_TYPES["geometry"] = GeometrySpec


# ---- the solver kernels: vector updates, p-multigrid transfers, CSR product, Schwarz ----

#: the Chebyshev smoother's and V-cycle's vector updates (:class:`VectorUpdateSpec`)
VECTOR_MODES = ("start", "step", "residual", "last")
#: the solver specs' ops
SOLVER_OPS = ("vector_update", "pcg", "pmg_transfer", "csr_spmv", "schwarz_fdm")


def _check_common(spec):
    """The solver specs' checks: the dtype, the index dtype and ``dim`` where the spec has
    them, a batch count >= 0."""
    _check_float("dtype", spec.dtype)
    idt = getattr(spec, "index_dtype", None)
    if idt is not None:
        _check_choice("index_dtype", idt, INDEX_DTYPES)
    if spec.batch < 0:
        raise ValueError(f"batch must be >= 0, got {spec.batch}")
    if hasattr(spec, "dim"):
        _check_dim(spec.dim)


class _Vectors(_Spec):
    """The specs on vectors of length ``batch``: the operands :meth:`_names` lists, each a
    vector; the result a vector."""

    def __post_init__(self):
        _check_common(self)

    @property
    def inputs(self):
        return tuple(Operand(n, (self.batch,), True) for n in self._names())

    @property
    def out_shape(self):
        return (self.batch,)

    def sizes(self):
        return dict(n=self.batch)


@dataclass(frozen=True)
class VectorUpdateSpec(_Vectors):
    """One vector update of a Chebyshev smoothing step or of a V-cycle's residual, on
    vectors of length ``batch``, in place (``f`` the free mask, 1 free and 0 constrained;
    ``y = A(f v)`` the raw operator's result; ``inv = 1 / diag(A_c)``):

    ===========  ==========================================  =================================
    mode         operands                                    effect
    ===========  ==========================================  =================================
    "start"      r, inv, [f]                                 ``d = c1 inv r``, ``dm = f d``
    "step"       y, r, x, d, dm, inv, [f]                    ``r -= f y + (1 - f) d``; ``x =
                                                             beta d`` (xzero) or ``x += beta
                                                             d``; ``d = c0 d + c1 inv r``;
                                                             ``dm = f d``
    "residual"   b, y, x, [f]                                ``r = b - (f y + (1 - f) x)``
    "last"       d, x, [f]                                   ``x = beta d`` or ``x += beta
                                                             d``; ``xm = f x``
    ===========  ==========================================  =================================

    ``masked`` False: no ``f`` (every DoF free).

    >>> s = VectorUpdateSpec(mode="step", batch=10, dtype="float64")
    >>> [o.name for o in s.inputs], s.size_key, str(s)
    (['y', 'r', 'x', 'd', 'dm', 'inv', 'f'], 'vector/step/n10', 'vector_step n=10 float64')
    """

    mode: str
    batch: int
    dtype: str
    masked: bool = True
    op = "vector_update"

    def __post_init__(self):
        _check_choice("mode", self.mode, VECTOR_MODES)
        super().__post_init__()

    #: the vectors of each mode, in order (the mask ``f`` follows where ``masked``)
    OPERANDS = {"start": ("r", "inv"), "step": ("y", "r", "x", "d", "dm", "inv"),
                "residual": ("b", "y", "x"), "last": ("d", "x")}

    def _names(self):
        return self.OPERANDS[self.mode] + (("f",) if self.masked else ())

    @property
    def size_key(self):
        return f"vector/{self.mode}{'' if self.masked else '+nomask'}/n{self.batch}"

    def __str__(self):
        return (f"vector_{self.mode} n={self.batch} {self.dtype}"
                + ("" if self.masked else " unmasked"))


@dataclass(frozen=True)
class PcgSpec(_Vectors):
    """The fused vector updates of preconditioned conjugate gradients on vectors of length
    ``batch``: ``p.Ap``; ``x += alpha p``, ``r -= alpha Ap`` with ``r.r`` and ``r.z``
    (``z = inv r`` when ``jacobi``, else ``z = r``); ``p = z + beta p``.

    >>> s = PcgSpec(batch=100, dtype="float64", jacobi=True)
    >>> [o.name for o in s.inputs], s.size_key, str(s)
    (['x', 'r', 'inv'], 'pcg/jacobi/n100', 'pcg n=100 jacobi float64')
    """

    batch: int
    dtype: str
    jacobi: bool = True
    op = "pcg"

    def _names(self):
        return ("x", "r") + (("inv",) if self.jacobi else ())

    @property
    def size_key(self):
        return f"pcg/{'jacobi' if self.jacobi else 'none'}/n{self.batch}"

    def __str__(self):
        return f"pcg n={self.batch}{' jacobi' if self.jacobi else ''} {self.dtype}"


@dataclass(frozen=True)
class TransferSpec(_Spec):
    """A p-multigrid transfer: ``y[out_map[e, i]] += out_w[out_map[e, i]] ((M x ... x M)
    (in_w x)[in_map[e, :]])[i]`` over the ``batch`` elements, ``M`` of shape ``(nout,
    nin)`` on each of the ``dim`` axes. Prolongation: ``in`` the coarse space, ``M`` the
    coarse basis at the fine nodes; restriction: ``in`` the fine space, ``M`` its
    transpose. ``y`` (``n_out``) is overwritten, or added to with ``add``.

    >>> s = TransferSpec(dim=2, nin=2, nout=3, batch=4, dtype="float64", n_in=9, n_out=25)
    >>> [(o.name, o.shape) for o in s.inputs][:3], s.out_shape
    ([('M', (3, 2)), ('x', (9,)), ('in_map', (4, 2, 2))], (25,))
    >>> s.size_key, str(s)
    ('pmg_transfer/2d/nin2nout3', 'pmg_transfer_2d 2->3 E=4 float64')
    """

    dim: int
    nin: int
    nout: int
    batch: int
    dtype: str
    n_in: int
    n_out: int
    index_dtype: str = "int32"
    op = "pmg_transfer"

    def __post_init__(self):
        _check_common(self)
        if self.nin < 1 or self.nout < 1:
            raise ValueError(f"nin and nout must be >= 1, got {self.nin}, {self.nout}")

    @property
    def inputs(self):
        E, d, it = self.batch, self.dim, self.index_dtype
        return (Operand("M", (self.nout, self.nin), False),
                Operand("x", (self.n_in,), False),
                _map_operand("in_map", E, self.nin, d, it),
                Operand("in_w", (self.n_in,), False),
                _map_operand("out_map", E, self.nout, d, it),
                Operand("out_w", (self.n_out,), False))

    @property
    def out_shape(self):
        return (self.n_out,)

    def kernel_key(self):
        return (self.op, self.dim, self.nin, self.nout, self.dtype, self.index_dtype)

    @property
    def size_key(self):
        return f"pmg_transfer/{self.dim}d/nin{self.nin}nout{self.nout}"

    def sizes(self):
        return dict(dim=self.dim, nin=self.nin, nout=self.nout, batch=self.batch)

    def __str__(self):
        return (f"pmg_transfer_{self.dim}d {self.nin}->{self.nout} E={self.batch} "
                f"{self.dtype}")


@dataclass(frozen=True)
class CsrSpmvSpec(_Spec):
    """``y = A x`` for a CSR matrix of ``batch`` rows, ``ncols`` columns and ``nnz``
    entries (``indptr``, ``indices`` of ``index_dtype``, ``data``).

    >>> s = CsrSpmvSpec(batch=3, ncols=3, nnz=7, dtype="float64")
    >>> [(o.name, o.shape) for o in s.inputs], s.size_key
    ([('indptr', (4,)), ('indices', (7,)), ('data', (7,)), ('x', (3,))], 'csr_spmv/n3')
    """

    batch: int
    ncols: int
    nnz: int
    dtype: str
    index_dtype: str = "int32"
    op = "csr_spmv"

    def __post_init__(self):
        _check_common(self)

    @property
    def inputs(self):
        it = self.index_dtype
        return (Operand("indptr", (self.batch + 1,), False, False, it),
                Operand("indices", (self.nnz,), False, False, it),
                Operand("data", (self.nnz,), False),
                Operand("x", (self.ncols,), False))

    @property
    def out_shape(self):
        return (self.batch,)

    def kernel_key(self):
        return (self.op, self.dtype, self.index_dtype)

    @property
    def size_key(self):
        return f"csr_spmv/n{self.batch}"

    def sizes(self):
        return dict(n=self.batch, nnz=self.nnz)

    def __str__(self):
        return f"csr_spmv n={self.batch} nnz={self.nnz} {self.dtype}"


@dataclass(frozen=True)
class SchwarzSpec(_Spec):
    """One application of the overlapping Schwarz preconditioner with fast-diagonalisation
    local solves: ``z[i] = w[i] sum_e (K_e^-1 (w r)[idx[e, :]])[slot of i]``, ``K_e^-1 =
    (S_0 x ... x S_{dim-1}) diag(inv[e]) (S_0 x ... x S_{dim-1})^T`` on the ``n^dim``
    extended nodes of each of the ``batch`` elements (an index ``ndofs`` is a pad: no
    DoF). ``rdtype``: the residual's dtype where it is not ``dtype`` (float64 residuals of
    float32 local solves: ``w r`` is formed in float64, then rounded).

    >>> s = SchwarzSpec(dim=2, n=4, batch=3, dtype="float64", ndofs=20)
    >>> [(o.name, o.shape) for o in s.inputs][:3], s.out_shape, s.size_key
    ([('S', (3, 2, 4, 4)), ('inv', (3, 4, 4)), ('idx', (3, 4, 4))], (20,), 'schwarz_fdm/2d/n4')
    """

    dim: int
    n: int
    batch: int
    dtype: str
    ndofs: int
    index_dtype: str = "int32"
    rdtype: str | None = None
    op = "schwarz_fdm"

    def __post_init__(self):
        _check_common(self)
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.rdtype not in (None, "float64"):
            raise ValueError(f"rdtype must be None or 'float64', got {self.rdtype!r}")

    @property
    def inputs(self):
        E, n, d = self.batch, self.n, self.dim
        return (Operand("S", (E, d, n, n), True),
                Operand("inv", (E,) + (n,) * d, True),
                _map_operand("idx", E, n, d, self.index_dtype),
                Operand("r", (self.ndofs,), False, False, self.rdtype),
                Operand("w", (self.ndofs,), False))

    @property
    def out_shape(self):
        return (self.ndofs,)

    def kernel_key(self):
        return (self.op, self.dim, self.n, self.dtype, self.index_dtype, self.rdtype)

    @property
    def size_key(self):
        return f"schwarz_fdm/{self.dim}d/n{self.n}" + ("+r64" if self.rdtype else "")

    def sizes(self):
        return dict(dim=self.dim, n=self.n, batch=self.batch, ndofs=self.ndofs)

    def __str__(self):
        return f"schwarz_fdm_{self.dim}d n={self.n} E={self.batch} {self.dtype}"


SPEC_TYPES.update({c.op: c for c in (VectorUpdateSpec, PcgSpec, TransferSpec, CsrSpmvSpec,
                                     SchwarzSpec)})
__all__ += ["VECTOR_MODES", "SOLVER_OPS", "VectorUpdateSpec", "PcgSpec", "TransferSpec",
            "CsrSpmvSpec", "SchwarzSpec"]
