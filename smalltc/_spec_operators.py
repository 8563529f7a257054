"""The specs of the FEM operators (docs/math.md sections 2 and 7): what they share
(:class:`_Operator`: the quadrature function, the collocated form, the point-data source
and the operands they imply), the element action, the element matrices, the fused global
operator and its diagonal (:mod:`smalltc.spec`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ._spec_base import (FORCE_QFUNCS, GEOMETRIES, INDEX_DTYPES, QDTYPES, QFUNCS, Operand,
                         _check_choice, _check_comp_axis, _Element, _index_bytes,
                         _map_operand, _non_default, nsym)

__all__ = ["ActionSpec", "AssemblySpec", "MassApplySpec", "MassDiagonalSpec"]


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
