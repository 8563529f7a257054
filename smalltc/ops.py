"""The operations smalltc plans, one declarative entry each.

An :class:`Op` says what an operation is to the rest of the library: its name (what
:func:`smalltc.plan` takes), its operands in the order its plan is called with them
(``spec.inputs``' order), the keyword options that choose its spec, and the function
that checks the operands and returns the spec (:mod:`smalltc._validate`). Everything
else is shared: the public functions (:mod:`smalltc.api`, :mod:`smalltc.evaluation`)
hand their operands to :func:`smalltc.plan.call`, which keys the plan cache on the
entry, the options and each operand's type, shape and dtype, builds the plan on a
miss, takes arrays of other libraries through :mod:`smalltc._interop` and runs the plan
with ``out`` and ``stream``; :func:`smalltc.plan.plan` builds a plan of any entry from
example operands.

Adding an operation
-------------------
One entry, registered where its spec is at hand (here for the core's operations)::

    MY_OP = register(Op(
        "my_op", ("B1d", "D", "x", "elem_dofs"),  # operands, in the plan's call order
        my_op_spec,                               # (*operands, **options) -> (spec, xp, ops)
        options=("deterministic",),               # keyword options that choose the spec
        defaults=dict(deterministic=False),       # their values when plan() is not given one
        public=("my_op",)))                       # the public function(s) running it

and a public function whose body is one call, its operands in the entry's order and its
options in the entry's ``options`` order::

    def my_op(B1d, D, x, elem_dofs, *, out=None, deterministic=False, backend="auto",
              stream=None):
        return call(MY_OP, (B1d, D, x, elem_dofs), (bool(deterministic),), out, stream,
                    backend)

``smalltc.plan("my_op", B1d, D, x, elem_dofs, deterministic=True)`` then works with no
other change, and so do the plan cache, ``out=``, ``stream=`` and torch/JAX arrays. An
operand that may be left out (``None``) needs ``omits=True`` (and ``required``, the
operands :func:`smalltc.plan.plan` cannot do without); where the public function takes
some operands by keyword, ``positional`` names those plan() takes by position, the others
by keyword as there (see ``mixed_apply``). ``example=`` (a two-element problem of given
sizes, and ``varies``, the build options its kernels depend on) makes
:func:`smalltc.precompile` build the entry's kernels ahead (``smalltc precompile --ops``).
The spec function
raises the errors that name an operand; the backends build the spec's kernel
(``backend.build(spec)``), so a new spec class needs its kernel families (or the
reference backend's fallback) and nothing here. ``tests/test_plan_ops.py`` asks for a
case of every registered entry.

Examples
--------
>>> from smalltc.ops import OPS
>>> OPS["interpolate"].describe()
'B1d, G1d, x and optionally elem_dofs'
>>> OPS["mixed_apply"].options
('eval_in', 'eval_out', 'ndofs_out')
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np

from . import _validate

__all__ = ["Op", "OPS", "OPERATORS", "VERTEX_OPERATORS", "register", "Extents"]

#: plan() names -> entries, in registration order
OPS: dict = {}
#: the generalised operators by (qfunc, level), those of qfunc "mass" included
OPERATORS: dict = {}
#: the operators whose point data come from the element vertices, by (qfunc, level):
#: ``"<qfunc>_<level>_vertices"`` to :func:`smalltc.plan.plan`
VERTEX_OPERATORS: dict = {}


@dataclass(frozen=True, eq=False)
class Op:
    """One operation; see the module docstring.

    Attributes
    ----------
    name : str
        What :func:`smalltc.plan` takes (unique among registered entries).
    operands : tuple of str
        The operand names in the plan's call order; ``None`` marks an absent optional
        operand (it is not passed to the plan).
    spec : callable
        ``spec(*operands, **options) -> (spec, xp, ops)``: checks the operands (errors
        name the operand, its shape and the expected one) and returns the frozen spec,
        the array module and the operands the plan runs (converted where needed).
    options : tuple of str
        Keyword options that choose the spec, in the order the public function passes
        them to :func:`smalltc.plan.call` (they are part of the cache key: hashable).
    defaults : dict
        The options' values where :func:`smalltc.plan.plan` is not given them.
    required : int or None
        How many leading operands :func:`smalltc.plan.plan` needs (None: all).
    positional : tuple of str or None
        :func:`smalltc.plan.plan`'s positional operands where they are not ``operands``
        (the others are given by keyword, as in the public function).
    public : tuple of str
        The public functions that run it (documentation).
    method : bool
        Whether ``method="pairwise"`` applies (the mass action and assembly).
    scalars : bool
        Whether the plan takes ``alpha``/``beta`` at call time (GEMM); the spec function
        then takes them as keywords too.
    reshape : callable or None
        ``reshape(options) -> bool``: a plan that reshapes its operands first.
    names : callable or None
        ``names(operands)``: the operand names for messages, where they depend on which
        operands are given.
    takes : str or None
        :func:`smalltc.plan.plan`'s operands in words, for its messages (None: from
        ``operands`` and ``required``).
    omits : bool
        Whether a call may leave operands out (``None``: the collocated ``B1d``, a ``G1d``
        not evaluated, a map not given); they are dropped before the plan runs.
    example : callable or None
        ``example(dim, p, nq, dtype, ncomp, index_dtype, xp) -> (operands, options)``: a
        two-element problem of those sizes, what :func:`smalltc.precompile` plans and calls
        to build the entry's kernels ahead (None: it does not build this entry).
    varies : tuple of str
        The build options beyond ``dim``, ``p``, ``nq`` and ``dtype`` its kernels depend
        on, among ``"ncomp"``, ``"deterministic"``, ``"index_dtype"`` (the others are
        not varied by :func:`smalltc.precompile`).
    """

    name: str
    operands: tuple
    spec: Callable
    options: tuple = ()
    defaults: dict = field(default_factory=dict)
    required: int | None = None
    positional: tuple | None = None
    public: tuple = ()
    method: bool = False
    scalars: bool = False
    reshape: Callable | None = None
    names: Callable | None = None
    takes: str | None = None
    omits: bool = False
    example: Callable | None = None
    varies: tuple = ()

    def __post_init__(self):
        missing = [o for o in self.options if o not in self.defaults]
        if missing:
            raise ValueError(f"op {self.name!r}: options {missing} have no default")

    def __repr__(self):
        return f"<smalltc op {self.name!r} ({', '.join(self.operands)})>"

    def describe(self) -> str:
        """The positional operands of :func:`smalltc.plan.plan`, for messages."""
        if self.takes is not None:
            return self.takes
        pos = self.positional or self.operands
        n = len(pos) if self.required is None else self.required
        head = ", ".join(pos[:n])
        if n == len(pos):
            return head
        return f"{head} and optionally {', '.join(pos[n:])}"

    def operand_names(self, operands) -> tuple:
        return self.operands if self.names is None else self.names(operands)

    def bind(self, args, kwargs):
        """:func:`smalltc.plan.plan`'s ``*operands`` and keywords as ``(operands, options)``
        in this entry's order; unused keywords are left in ``kwargs``."""
        pos = self.positional or self.operands
        need = len(pos) if self.required is None else self.required
        given = dict(zip(pos, args))
        for n in self.operands:
            if n in kwargs:
                if n in given:
                    raise TypeError(f"op {self.name!r}: operand {n} given twice")
                given[n] = kwargs.pop(n)
        if len(args) > len(pos) or any(n not in given for n in pos[:need]):
            raise TypeError(f"op {self.name!r} takes {self.describe()}; got {len(args)} "
                            "operands")
        options = tuple(kwargs.pop(o, self.defaults[o]) for o in self.options)
        return tuple(given.get(n) for n in self.operands), options


def register(op: Op) -> Op:
    """Add ``op`` to :data:`OPS` (its name must be new); returns it."""
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} is registered already")
    OPS[op.name] = op
    return op


class Extents(tuple):
    """``contract``'s extents as a hashable key part (the dict's items)."""

    __slots__ = ()

    @classmethod
    def of(cls, extents):
        """A dict's items; anything else as it is (the spec function says what is wrong)."""
        return cls(extents.items()) if type(extents) is dict else extents


# --- the spec functions of the entries: the operands in the entry's order ------------------

def _gemm(A, B, C=None, *, trans_a, trans_b, alpha, beta):
    return _validate.gemm_spec(A, B, C, alpha=alpha, beta=beta, trans_a=trans_a,
                               trans_b=trans_b)


def _contract(X, Y, *, kind, extents):
    return _validate.contract_spec(kind, X, Y, extents=dict(extents)
                                   if isinstance(extents, Extents) else extents)


def _mass_apply(B1d, D, x, elem_dofs, *, deterministic):
    return _validate.mass_apply_spec(B1d, D, x, elem_dofs, deterministic)


def _mass_diagonal(B1d, D, elem_dofs, *, ndofs, deterministic):
    return _validate.mass_diagonal_spec(B1d, D, elem_dofs, ndofs, deterministic)


def _operator(qfunc, level, B1d, G1d, *operands, deterministic, ndofs):
    ndata = 2 if qfunc == "helmholtz" else 1
    data = tuple(operands[:2]) if ndata == 2 else operands[0]
    return _validate.operator_spec(level, qfunc, B1d, G1d, data, *operands[ndata:],
                                   deterministic=deterministic, ndofs=ndofs)


def _vertex_operator(qfunc, level, B1d, G1d, X, coef, *rest, deterministic):
    return _validate.vertex_operator_spec(level, qfunc, B1d, G1d, X, coef, *rest,
                                          deterministic=deterministic)


def _force(transpose, B_l2, B1d, G1d, A, field, elem_dofs=None, *, ndofs, deterministic):
    return _validate.force_spec(transpose, B_l2, B1d, G1d, A, field, elem_dofs, ndofs,
                                deterministic)


def _mixed(B_in, G_in, B_out, G_out, Q, field, elem_dofs_in=None, elem_dofs_out=None, *,
           eval_in, eval_out, ndofs_out=None):
    return _validate.mixed_spec(B_in, B_out, Q, field, G_in=G_in, G_out=G_out,
                                eval_in=eval_in, eval_out=eval_out, elem_dofs_in=elem_dofs_in,
                                elem_dofs_out=elem_dofs_out, ndofs_out=ndofs_out)


def _mixed_names(operands):
    """mixed_apply's field is ``x`` through the input map, the element vectors ``V``
    without one."""
    return ("B_in", "G_in", "B_out", "G_out", "Q", "V" if operands[6] is None else "x",
            "elem_dofs_in", "elem_dofs_out")


def _geometry(J, weights=None, coef=None, jmin=None, *, what, absdet, dtype):
    return _validate.geometry_spec(J, weights, coef, jmin, what=what, dtype=dtype,
                                   absdet=absdet)


def _basis(transpose, B1d, G1d, field, elem_dofs=None, *, what, dim, ndofs=None):
    return _validate.basis_spec(B1d, G1d, field, elem_dofs, what=what, transpose=transpose,
                                ndofs=ndofs, dim=dim)


# --- the two-element problems smalltc.precompile builds (Op.example) ------------------------

_E = 2                          # elements: kernels do not depend on the element count


def _rand(xp, dtype, *shape):
    rng = np.random.default_rng(0)
    return xp.asarray(rng.random(shape).astype(dtype) + 0.5)


def _emap(xp, nd, dim, index_dtype):
    """``(map, ndofs)``: the elements apart (any map will do)."""
    ndofs = _E * nd ** dim
    return xp.asarray(np.arange(ndofs, dtype=index_dtype).reshape(_E, *(nd,) * dim)), ndofs


def _example_action(dim, p, nq, dtype, ncomp, index_dtype, xp):
    nd = p + 1
    V = _rand(xp, dtype, _E, *((ncomp,) if ncomp > 1 else ()), *(nd,) * dim)
    return (_rand(xp, dtype, nq, nd), _rand(xp, dtype, _E, *(nq,) * dim), V), {}


def _example_assembly(dim, p, nq, dtype, ncomp, index_dtype, xp):
    return (_rand(xp, dtype, nq, p + 1), _rand(xp, dtype, _E, *(nq,) * dim)), {}


def _example_mass_apply(dim, p, nq, dtype, ncomp, index_dtype, xp):
    emap, ndofs = _emap(xp, p + 1, dim, index_dtype)
    x = _rand(xp, dtype, *((ncomp,) if ncomp > 1 else ()), ndofs)
    return (_rand(xp, dtype, nq, p + 1), _rand(xp, dtype, _E, *(nq,) * dim), x, emap), {}


def _example_mass_diagonal(dim, p, nq, dtype, ncomp, index_dtype, xp):
    emap, ndofs = _emap(xp, p + 1, dim, index_dtype)
    return ((_rand(xp, dtype, nq, p + 1), _rand(xp, dtype, _E, *(nq,) * dim), emap),
            {"ndofs": ndofs})


# --- the entries -----------------------------------------------------------------------------

_FEM = dict(deterministic=False)

ACTION = register(Op("action", ("B1d", "D", "V"), _validate.action_spec, method=True,
                     public=("batched_contract",), example=_example_action,
                     varies=("ncomp",)))
ASSEMBLY = register(Op("assembly", ("B1d", "D"), _validate.assembly_spec, method=True,
                       public=("assemble_mass",), example=_example_assembly))
GEMM = register(Op("gemm", ("A", "B", "C"), _gemm, options=("trans_a", "trans_b"),
                   defaults=dict(trans_a=False, trans_b=False), required=2, scalars=True,
                   public=("batched_gemm",)))
CONTRACT = register(Op("contract", ("X", "Y"), _contract, options=("kind", "extents"),
                       defaults=dict(kind=None, extents=None), public=("contract",),
                       reshape=lambda options: options[1] is not None))
MASS_APPLY = register(Op("mass_apply", ("B1d", "D", "x", "elem_dofs"), _mass_apply,
                         options=("deterministic",), defaults=_FEM, public=("mass_apply",),
                         example=_example_mass_apply,
                         varies=("ncomp", "deterministic", "index_dtype")))
MASS_DIAGONAL = register(Op("mass_diagonal", ("B1d", "D", "elem_dofs"), _mass_diagonal,
                            options=("ndofs", "deterministic"),
                            defaults=dict(_FEM, ndofs=None), public=("mass_diagonal",),
                            example=_example_mass_diagonal,
                            varies=("deterministic", "index_dtype")))

#: the operators' levels: the operands after the point data
_LEVELS = {"action": ("V",), "apply": ("x", "elem_dofs"), "diagonal": ("elem_dofs",),
           "assembly": ()}
_DATA = {"mass": ("D",), "diffusion": ("Q",), "helmholtz": ("D", "Q")}
_PUBLIC = {"action": "operator_action", "apply": "operator_apply",
           "diagonal": "operator_diagonal", "assembly": "assemble_operator"}

for _q, _data in _DATA.items():
    for _level, _rest in _LEVELS.items():
        _op = Op(f"{_q}_{_level}", ("B1d", "G1d") + _data + _rest,
                 partial(_operator, _q, _level), options=("deterministic", "ndofs"),
                 defaults=dict(_FEM, ndofs=None), omits=True, required=2 + len(_data),
                 takes=f"B1d (or None), G1d, {', '.join(_data)} and the level's operands "
                       f"({', '.join(_rest) or 'none'})", public=(_PUBLIC[_level],))
        OPERATORS[_q, _level] = _op
        if _q != "mass":          # mass: the entries above ("action", "mass_apply", ...)
            register(_op)
        if _q != "helmholtz" and _level in ("action", "apply"):     # vertices= (section 8)
            VERTEX_OPERATORS[_q, _level] = register(Op(
                f"{_q}_{_level}_vertices", ("B1d", "G1d", "X", "coef") + _rest,
                partial(_vertex_operator, _q, _level), options=("deterministic",),
                defaults=_FEM, omits=True, public=(_PUBLIC[_level],),
                takes=f"B1d (or None), G1d (or None), X, coef and {', '.join(_rest)}"))

FORCE = register(Op("force_apply", ("B_l2", "B1d", "G1d", "A", "e", "elem_dofs"),
                    partial(_force, False), options=("ndofs", "deterministic"),
                    defaults=dict(_FEM, ndofs=None), required=5, omits=True, public=("force_apply",)))
FORCE_T = register(Op("force_apply_transpose", ("B_l2", "B1d", "G1d", "A", "w", "elem_dofs"),
                      partial(_force, True), options=("ndofs", "deterministic"),
                      defaults=dict(_FEM, ndofs=None), required=5,
                      omits=True, public=("force_apply_transpose",)))
_EVALS = dict(eval_in="value", eval_out="value")
MIXED_ACTION = register(Op("mixed_action", ("B_in", "G_in", "B_out", "G_out", "Q", "V"),
                           _mixed, options=("eval_in", "eval_out"), defaults=_EVALS,
                           positional=("B_in", "B_out", "Q", "V"), omits=True, public=("mixed_action",)))
MIXED_APPLY = register(Op("mixed_apply", ("B_in", "G_in", "B_out", "G_out", "Q", "x",
                                          "elem_dofs_in", "elem_dofs_out"),
                          _mixed, options=("eval_in", "eval_out", "ndofs_out"),
                          defaults=dict(_EVALS, ndofs_out=None), names=_mixed_names,
                          positional=("B_in", "B_out", "Q", "x"), omits=True,
                          public=("mixed_apply",)))
INTERPOLATE = register(Op("interpolate", ("B1d", "G1d", "x", "elem_dofs"),
                          partial(_basis, False), options=("what", "dim"),
                          defaults=dict(what="values", dim=None), required=3, omits=True,
                          public=("interpolate",)))
INTEGRATE = register(Op("integrate", ("B1d", "G1d", "H", "elem_dofs"), partial(_basis, True),
                        options=("what", "ndofs", "dim"),
                        defaults=dict(what="values", ndofs=None, dim=None), required=3, omits=True,
                        public=("integrate",)))
GEOMETRY = register(Op("geometry", ("J", "weights", "coef", "jmin"), _geometry,
                       options=("what", "absdet", "dtype"),
                       defaults=dict(what="mass", absdet=False, dtype=None), required=1,
                       omits=True, public=("geometry_data",)))
del _q, _data, _level, _rest, _op
