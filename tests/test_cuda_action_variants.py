"""The fused action's variants, no GPU needed: register blocking ``rb`` and the line form.

* ``rb`` is normalised (ceil(T / ceil(T / rb))), sets threads per item, and
  picks ``action_rb.cu.j2``; 1D has no ``rb > 1``.
* The line form (3D) is the heuristic from T = 5 on.

Every heuristic and table choice's rendered source is pinned by
``tests/test_cuda_golden.py``. The GPU check of the variants against the
reference is in ``tests/test_cuda_kernels.py``.
"""
import pytest

from smalltc.backends.cuda.action import ACTION, action_ctx, action_line_ctx
from smalltc.backends.cuda.runtime import render


def template(ctx):
    return ACTION.template(ctx)


@pytest.mark.parametrize("dim,nd,nq,rb,want_rb,tb,tpi", [
    (3, 5, 6, 1, 1, 6, 36),
    (3, 5, 6, 2, 2, 3, 18),
    (3, 5, 6, 4, 3, 2, 12),       # TB = 2 needs only 3 outputs per thread
    (3, 9, 10, 3, 3, 4, 40),
    (3, 9, 10, 4, 4, 3, 30),
    (3, 2, 2, 8, 2, 1, 2),        # rb > T: one thread per row
    (2, 9, 10, 2, 2, 5, 5),
    (2, 5, 5, 4, 3, 2, 2),
])
def test_rb_context(dim, nd, nq, rb, want_rb, tb, tpi):
    ctx = action_ctx(dim, nd, nq, 1, "float64", params=dict(per_block=4, min_blocks=0, rb=rb))
    assert (ctx["rb"], ctx["tb"], ctx["tpi"], ctx["threads"]) == (want_rb, tb, tpi, 4 * tpi)
    assert template(ctx) == ("action.cu.j2" if want_rb == 1 else "action_rb.cu.j2")
    src = render(template(ctx), dict(ctx, entry="stc_rb"))
    if want_rb > 1:
        assert f"constexpr int RB = {want_rb}, TB = {tb};" in src
    assert f"constexpr int TPI = {tpi};" in src


def test_rb_rejected_where_it_has_no_meaning():
    assert action_ctx(1, 4, 5, 1, "float64", params=dict(per_block=8, rb=2)) is None
    assert action_ctx(3, 4, 5, 1, "float64", params=dict(per_block=8, rb=0)) is None
    assert action_ctx(1, 4, 5, 1, "float64", params=dict(per_block=8, rb=1)) is not None


def test_heuristic_never_picks_rb():
    for dim in (1, 2, 3):
        for p in range(1, 9):
            for nq in (p + 1, p + 2):
                assert action_ctx(dim, p + 1, nq, 1, "float64")["rb"] == 1


# ---------------------------------------------------------------- the line form (3D)
@pytest.mark.parametrize("nd,nq,want_tt,want_tpi", [(2, 3, 3, 9), (5, 6, 7, 42), (9, 9, 9, 81),
                                                   (9, 10, 11, 110), (17, 18, 19, 342)])
def test_line_form_context(nd, nq, want_tt, want_tpi):
    ctx = action_ctx(3, nd, nq, 1, "float64", params=dict(per_block=2, line=1))
    assert (ctx["TT"], ctx["tpi"], ctx["threads"], ctx["line"]) == (want_tt, want_tpi,
                                                                   2 * want_tpi, 1)
    assert template(ctx) == "action_line.cu.j2"
    T = max(nd, nq)
    assert ctx["smem_bytes"] == 8 * (2 * (2 * T * T * want_tt + 1) + 1)
    src = render("action_line.cu.j2", dict(ctx, entry="stc_line"))
    assert f"__constant__ real_t stc_cB[{nq * nd}]" in src


def test_line_form_is_the_3d_heuristic_from_t5():
    for nd, nq, line in ((3, 4, 0), (4, 5, 1), (4, 4, 0), (8, 10, 1)):
        assert action_ctx(3, nd, nq, 1, "float64")["line"] == line
    assert action_ctx(2, 8, 10, 1, "float64")["line"] == 0       # 3D only
    assert action_ctx(3, 4, 5, 1, "float64", params=dict(per_block=2))["line"] == 0
    assert action_line_ctx(3, 4, 5, 1, "float64", params=dict(per_block=1000)) is None
