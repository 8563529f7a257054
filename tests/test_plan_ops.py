"""``smalltc.plan(op, ...)`` for every registered operation (:data:`smalltc.ops.OPS`): the
plan, called with an output poisoned with NaN, and the public function it stands for
both match a float64 oracle written from the definitions (dense Kronecker matrices,
``np.add.at`` for the maps); every entry has a case here. Then the registry's rules:
plan()'s messages, keywords, and one call signature one cached plan.
"""
import numpy as np
import pytest

import smalltc
import oracle as O
from smalltc.ops import OPS, OPERATORS
from smalltc.plan import _PLANS

from conftest import rel_err

DIM, ND, NQ, E, NDOFS = 2, 3, 4, 3, 11
rng = np.random.default_rng(7)
B, G = rng.standard_normal((2, NQ, ND))                 # any matrices: the oracles are exact
L = rng.standard_normal((NQ, ND - 1))                   # the corner force's L2 basis
D = rng.standard_normal((E,) + (NQ,) * DIM)
Q = rng.standard_normal((E, 3) + (NQ,) * DIM)            # packed symmetric (11, 12, 22)
V = rng.standard_normal((E,) + (ND,) * DIM)
x = rng.standard_normal(NDOFS)
M = rng.integers(0, NDOFS, size=(E,) + (ND,) * DIM).astype(np.int32)
A = rng.standard_normal((E, DIM, DIM) + (NQ,) * DIM)


def gather(x, m):
    """``V[e, c, i] = x[c, m[e, i]]``, (E, ncomp, nd^dim)."""
    xc = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
    return np.moveaxis(xc[:, m.reshape(m.shape[0], -1)], 0, 1)


def scatter(U, m, ndofs):
    """``y[c, m[e, i]] += U[e, c, i]``, (ncomp, ndofs)."""
    y = np.zeros((U.shape[1], ndofs))
    for c in range(U.shape[1]):
        np.add.at(y[c], m.reshape(m.shape[0], -1), U[:, c])
    return y


def evals(Bm, Gm, ev):
    """One side's dense evaluation matrices in slot order (the value, then d/dxi_a)."""
    what = {"value": "values", "grad": "gradients"}.get(ev, ev)
    return O.basis_matrices(Bm, Gm if Gm is not None else Bm, what, DIM)


def mixed(Bi, Gi, Bo, Go, Qm, Ve, ei, eo):
    """``U[e, c'] = sum_j' Eout_j'^T sum_s Qm[e, c' nper + j', s] X[e, s]`` with
    ``X[e, c nper + j] = Ein_j V[e, c]``: (E, ncomp_out, nd_out^dim) from V (E, ncomp_in,
    nd_in^dim)."""
    Ein, Eout = evals(Bi, Gi, ei), evals(Bo, Go, eo)
    Qf = Qm.reshape(Qm.shape[0], Qm.shape[1], Qm.shape[2], -1)
    X = np.stack([Ve[:, c] @ Mi.T for c in range(Ve.shape[1]) for Mi in Ein], axis=1)
    H = np.einsum("ersk,esk->erk", Qf, X)
    return np.stack([sum(H[:, c * len(Eout) + j] @ Mo for j, Mo in enumerate(Eout))
                     for c in range(Qm.shape[1] // len(Eout))], axis=1)


def force_q(transpose):
    """The corner force as the general operator: ``Q[e, c dim + a, 0] = A[e, c, a]``."""
    q = A.reshape((E, DIM * DIM, 1) + (NQ,) * DIM)
    return np.swapaxes(q, 1, 2) if transpose else q


Qmix = rng.standard_normal((E, 1 + DIM, DIM) + (NQ,) * DIM)     # grad in, both out
H = rng.standard_normal((E, DIM) + (NQ,) * DIM)                  # two gradient slots
X8, Y8 = rng.standard_normal((5, 2, 3, 4)), rng.standard_normal((3, 3, 2))
Ag, Bg, Cg = rng.standard_normal((4, 3, 2)), rng.standard_normal((5, 2)), rng.standard_normal((4, 3, 5))


def _dense_op(qfunc, Dd, Qd):
    return O.operator_matrices(qfunc, B, G if qfunc != "mass" else None, Dd, Qd, DIM)


# (id, op, plan operands, plan keywords, call keywords of the plan, public call, oracle)
CASES = [
    ("action", "action", (B, D, V), {}, {},
     lambda **k: smalltc.batched_contract(B, D, V, **k), lambda: O.action(B, D, V)),
    ("assembly", "assembly", (B, D), {}, {},
     lambda **k: smalltc.assemble_mass(B, D, **k), lambda: O.assembly(B, D)),
    ("gemm", "gemm", (Ag, Bg, Cg), dict(alpha=2.0, beta=0.5, trans_b=True),
     dict(alpha=2.0, beta=0.5),
     lambda **k: smalltc.batched_gemm(Ag, Bg, Cg, alpha=2.0, beta=0.5, trans_b=True, **k),
     lambda: O.gemm(Ag, Bg, Cg, 2.0, 0.5, False, True)),
    ("contract", "contract", (X8, Y8), dict(kind="8a"), {},
     lambda **k: smalltc.contract("8a", X8, Y8, **k), lambda: O.contract("8a", X8, Y8)),
    ("mass_apply", "mass_apply", (B, D, x, M), {}, {},
     lambda **k: smalltc.mass_apply(B, D, x, M, **k),
     lambda: O.operator_apply("mass", B, None, D, None, x, M, DIM)),
    ("mass_diagonal", "mass_diagonal", (B, D, M), dict(ndofs=NDOFS), {},
     lambda **k: smalltc.mass_diagonal(B, D, M, NDOFS, **k),
     lambda: O.operator_diagonal("mass", B, None, D, None, M, NDOFS, DIM)),
]
for _q, _data in (("diffusion", (Q,)), ("helmholtz", (D, Q))):
    _d = _data if _q == "helmholtz" else _data[0]
    _D, _Q = (D, Q) if _q == "helmholtz" else (None, Q)
    CASES += [
        (f"{_q}_action", f"{_q}_action", (B, G) + _data + (V,), {}, {},
         lambda _q=_q, _d=_d, **k: smalltc.operator_action(_q, B, G, _d, V, **k),
         lambda _q=_q, _D=_D, _Q=_Q: O.operator_action(_q, B, G, _D, _Q, V, DIM)),
        (f"{_q}_apply", f"{_q}_apply", (B, G) + _data + (x, M), dict(deterministic=True), {},
         lambda _q=_q, _d=_d, **k: smalltc.operator_apply(_q, B, G, _d, x, M,
                                                          deterministic=True, **k),
         lambda _q=_q, _D=_D, _Q=_Q: O.operator_apply(_q, B, G, _D, _Q, x, M, DIM)),
        (f"{_q}_diagonal", f"{_q}_diagonal", (B, G) + _data + (M,), dict(ndofs=NDOFS), {},
         lambda _q=_q, _d=_d, **k: smalltc.operator_diagonal(_q, B, G, _d, M, NDOFS, **k),
         lambda _q=_q, _D=_D, _Q=_Q: O.operator_diagonal(_q, B, G, _D, _Q, M, NDOFS, DIM)),
        (f"{_q}_assembly", f"{_q}_assembly", (B, G) + _data, {}, {},
         lambda _q=_q, _d=_d, **k: smalltc.assemble_operator(_q, B, G, _d, **k),
         lambda _q=_q, _D=_D, _Q=_Q: _dense_op(_q, _D, _Q)),
    ]
_e = rng.standard_normal((E,) + (ND - 1,) * DIM)
_w = rng.standard_normal((E, DIM) + (ND,) * DIM)
_wg = rng.standard_normal((DIM, NDOFS))
CASES += [
    ("force_apply", "force_apply", (L, B, G, A, _e), {}, {},
     lambda **k: smalltc.force_apply(L, B, G, A, _e, **k),
     lambda: mixed(L, None, B, G, force_q(False), _e.reshape(E, 1, -1), "value", "grad")
     .reshape((E, DIM) + (ND,) * DIM)),
    ("force_apply-fused", "force_apply", (L, B, G, A, _e, M), dict(ndofs=NDOFS), {},
     lambda **k: smalltc.force_apply(L, B, G, A, _e, elem_dofs=M, ndofs=NDOFS, **k),
     lambda: scatter(mixed(L, None, B, G, force_q(False), _e.reshape(E, 1, -1), "value",
                           "grad"), M, NDOFS)),
    ("force_apply_transpose", "force_apply_transpose", (L, B, G, A, _w), {}, {},
     lambda **k: smalltc.force_apply_transpose(L, B, G, A, _w, **k),
     lambda: mixed(B, G, L, None, force_q(True), _w.reshape(E, DIM, -1), "grad", "value")
     .reshape((E,) + (ND - 1,) * DIM)),
    ("force_apply_transpose-fused", "force_apply_transpose", (L, B, G, A, _wg),
     dict(elem_dofs=M), {},
     lambda **k: smalltc.force_apply_transpose(L, B, G, A, _wg, elem_dofs=M, **k),
     lambda: mixed(B, G, L, None, force_q(True), gather(_wg, M), "grad", "value")
     .reshape((E,) + (ND - 1,) * DIM)),
    ("mixed_action", "mixed_action", (B, L, Qmix[:, :1], V),
     dict(G_in=G, eval_in="grad"), {},
     lambda **k: smalltc.mixed_action(B, L, Qmix[:, :1], V, G_in=G, eval_in="grad", **k),
     lambda: mixed(B, G, L, None, Qmix[:, :1], V.reshape(E, 1, -1), "grad", "value")
     .reshape((E,) + (ND - 1,) * DIM)),
    ("mixed_apply", "mixed_apply", (B, B, Qmix, x),
     dict(G_in=G, G_out=G, eval_in="grad", eval_out="both", elem_dofs_in=M, elem_dofs_out=M,
          ndofs_out=NDOFS), {},
     lambda **k: smalltc.mixed_apply(B, B, Qmix, x, G_in=G, G_out=G, eval_in="grad",
                                     eval_out="both", elem_dofs_in=M, elem_dofs_out=M,
                                     ndofs_out=NDOFS, **k),
     lambda: scatter(mixed(B, G, B, G, Qmix, gather(x, M), "grad", "both"), M, NDOFS)[0]),
    ("mixed_apply-element-in", "mixed_apply", (B, B, Qmix, V),
     dict(G_in=G, G_out=G, eval_in="grad", eval_out="both", elem_dofs_out=M,
          ndofs_out=NDOFS), {},
     lambda **k: smalltc.mixed_apply(B, B, Qmix, V, G_in=G, G_out=G, eval_in="grad",
                                     eval_out="both", elem_dofs_out=M, ndofs_out=NDOFS, **k),
     lambda: scatter(mixed(B, G, B, G, Qmix, V.reshape(E, 1, -1), "grad", "both"), M,
                     NDOFS)[0]),
    ("interpolate", "interpolate", (B, G, x, M), dict(what="both"), {},
     lambda **k: smalltc.interpolate(B, G, x, M, what="both", **k),
     lambda: np.stack([gather(x, M)[:, 0] @ Mi.T for Mi in evals(B, G, "both")], axis=1)
     .reshape((E, 1 + DIM) + (NQ,) * DIM)),
    ("interpolate-values", "interpolate", (B, None, V), {}, {},
     lambda **k: smalltc.interpolate(B, None, V, **k),
     lambda: (V.reshape(E, -1) @ evals(B, None, "value")[0].T).reshape((E,) + (NQ,) * DIM)),
    ("integrate", "integrate", (B, G, H, M), dict(what="gradients", ndofs=NDOFS), {},
     lambda **k: smalltc.integrate(B, G, H, M, what="gradients", ndofs=NDOFS, **k),
     lambda: scatter(sum(H.reshape(E, DIM, -1)[:, s] @ Mi for s, Mi in
                         enumerate(evals(B, G, "grad")))[:, None], M, NDOFS)[0]),
]
IDS = [c[0] for c in CASES]


def test_every_registered_op_has_a_case():
    assert sorted({c[1] for c in CASES}) == sorted(OPS)


@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_plan_matches_the_public_function_and_the_oracle(case, backend):
    _, op, operands, kw, call_kw, public, want = case
    entry = OPS[op]
    pl = smalltc.plan(op, *operands, backend=backend, **kw)
    given, _ = entry.bind(operands, dict(kw))
    args = [a for a in given if a is not None]              # the plan's call order
    ref = np.asarray(want(), np.float64).reshape(pl.out_shape)
    out = np.full(pl.out_shape, np.nan)
    assert pl(*args, out=out, **call_kw) is out
    assert rel_err(out, ref) < 1e-12
    out2 = np.full(pl.out_shape, np.nan)
    assert public(out=out2, backend=backend) is out2
    assert rel_err(out2, ref) < 1e-12
    assert rel_err(public(backend=backend), ref) < 1e-12    # the cached plan, its own out


def test_the_public_call_caches_the_plan_plan_builds():
    """The plan a public call caches has the spec and backend of ``smalltc.plan``'s."""
    for _, op, operands, kw, _, public, _ in CASES:
        _PLANS.clear()
        public(backend="reference")
        (cached,) = _PLANS.values()
        pl = smalltc.plan(op, *operands, backend="reference", **kw)
        assert cached.spec == pl.spec, op


def test_operators_of_every_qfunc_and_level_are_entries():
    assert sorted(OPERATORS) == sorted((q, lv) for q in ("mass", "diffusion", "helmholtz")
                                       for lv in ("action", "apply", "diagonal", "assembly"))
    assert all(OPS[f"{q}_{lv}"] is OPERATORS[q, lv] for q, lv in OPERATORS if q != "mass")


PLAN_ERRORS = [
    (lambda: smalltc.plan("mixed_apply", B, B, Qmix), TypeError,
     r"op 'mixed_apply' takes B_in, B_out, Q, x; got 3 operands"),
    (lambda: smalltc.plan("mixed_action", B, L, Qmix[:, :1], V, G_in=G, eval_in="grad",
                          G_out=G), ValueError, r"G_out"),
    (lambda: smalltc.plan("mixed_action", B, L, Qmix[:, :1], V, G_in=G, eval_in="grad",
                          kind="8a"), TypeError, r"op 'mixed_action' takes no option 'kind'"),
    (lambda: smalltc.plan("action", B, D, V, colour=True), TypeError,
     r"unexpected keyword 'colour'"),
    (lambda: smalltc.plan("action", B, D, B=B), TypeError, r"op 'action' takes B1d, D, V; got 2 operands"),
    (lambda: smalltc.plan("action", B, D, V, B1d=B), TypeError, r"operand B1d given twice"),
    (lambda: smalltc.plan("interpolate", B, G, x, M, what="both", ndofs=3), TypeError,
     r"op 'interpolate' takes no option 'ndofs'"),
    (lambda: smalltc.plan("force_apply", L, B, G), TypeError,
     r"op 'force_apply' takes B_l2, B1d, G1d, A, e and optionally elem_dofs; got 3"),
    (lambda: smalltc.plan(("action",), B, D, V), ValueError,
     r"op must be 'action', 'assembly', 'gemm', 'contract', 'mass_apply' or "
     r"'mass_diagonal', or one of .*'mixed_apply'.*got \('action',\)"),
]


@pytest.mark.parametrize("i", range(len(PLAN_ERRORS)))
def test_plan_errors(i):
    fn, exc, match = PLAN_ERRORS[i]
    with pytest.raises(exc, match=match):
        fn()


def test_operands_by_keyword():
    pl = smalltc.plan("action", B, D, V=V, backend="reference")
    assert rel_err(pl(B, D, V), O.action(B, D, V)) < 1e-12


def test_old_keywords_at_their_defaults_are_taken_by_any_op():
    """plan() took every op's keywords before the entries declared theirs: at their
    defaults they still do (``deterministic=False`` for the action, ...)."""
    pl = smalltc.plan("action", B, D, V, deterministic=False, alpha=1.0, what="values",
                      backend="reference")
    assert rel_err(pl(B, D, V), O.action(B, D, V)) < 1e-12


def test_register_refuses_a_name_twice_and_options_without_defaults():
    from smalltc.ops import Op, register
    with pytest.raises(ValueError, match=r"op 'action' is registered already"):
        register(Op("action", ("B1d", "D", "V"), OPS["action"].spec))
    with pytest.raises(ValueError, match=r"op 'x': options \['what'\] have no default"):
        Op("x", ("B1d",), OPS["action"].spec, options=("what",))


def test_mixed_apply_names_its_field_by_the_input_map():
    entry = OPS["mixed_apply"]
    assert entry.operand_names((B, None, B, None, Qmix, V, None, M))[5] == "V"
    assert entry.operand_names((B, None, B, None, Qmix, x, M, M))[5] == "x"
