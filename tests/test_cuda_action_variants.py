"""The fused action's tuning parameter ``rb`` (register blocking), no GPU needed.

* The default contexts (no params, or params without ``rb``) render the
  same source, byte for byte, as the template before ``rb`` existed: the
  hashes in ``tests/data/action_default_sha256.json`` were rendered from
  ``action.cu.j2`` at commit cad49e5 (its ``_from`` key) for dim 1-3,
  p = 1..16, nq = p+1..p+3, ncomp 1 and 3, float64 and float32, plus
  params ``per_block=2, min_blocks=3`` for p <= 8, nq = p+1, p+2.
* ``rb`` is normalised (ceil(T / ceil(T / rb))), sets threads per item, and
  picks ``action_rb.cu.j2``; 1D has no ``rb > 1``.

The GPU check of the variant against the reference is in
``tests/test_cuda_kernels.py`` (``test_action_register_blocked``).
"""
import hashlib
import json
import pathlib

import pytest

from smalltc.backends import _cuda_params as P
from smalltc.backends._cuda_runtime import render

GOLDEN = pathlib.Path(__file__).parent / "data" / "action_default_sha256.json"


def _key_ctx(key):
    parts = key.split("/")
    dim = int(parts[0][0])
    sizes = parts[1]
    nd = int(sizes[2:sizes.index("nq")])
    nq = int(sizes[sizes.index("nq") + 2:sizes.index("c")])
    ncomp = int(sizes[sizes.index("c") + 1:])
    params = None
    if len(parts) > 3:
        params = {k: int(v) for k, v in (kv.split("=") for kv in parts[3].split(","))}
    return P.action_ctx(dim, nd, nq, ncomp, parts[2], params=params)


def test_default_renders_are_byte_identical_to_before_rb(monkeypatch):
    # the heuristic's rb = 1 form (the 3D heuristic takes the line form from T = 5 on)
    monkeypatch.setattr(P, "LINE_FROM_T", 10 ** 6)
    golden = json.loads(GOLDEN.read_text())
    golden.pop("_from")
    assert len(golden) == 624
    changed = []
    for key, digest in golden.items():
        ctx = _key_ctx(key)
        assert ctx["rb"] == 1 and P.action_template(ctx) == "action.cu.j2"
        src = render("action.cu.j2", dict(ctx, entry="stc_golden"))
        if hashlib.sha256(src.encode()).hexdigest() != digest:
            changed.append(key)
    assert not changed, f"default action source changed for {len(changed)} contexts: {changed[:5]}"


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
    ctx = P.action_ctx(dim, nd, nq, 1, "float64", params=dict(per_block=4, min_blocks=0, rb=rb))
    assert (ctx["rb"], ctx["tb"], ctx["tpi"], ctx["threads"]) == (want_rb, tb, tpi, 4 * tpi)
    assert P.action_template(ctx) == ("action.cu.j2" if want_rb == 1 else "action_rb.cu.j2")
    src = render(P.action_template(ctx), dict(ctx, entry="stc_rb"))
    if want_rb > 1:
        assert f"constexpr int RB = {want_rb}, TB = {tb};" in src
    assert f"constexpr int TPI = {tpi};" in src


def test_rb_rejected_where_it_has_no_meaning():
    assert P.action_ctx(1, 4, 5, 1, "float64", params=dict(per_block=8, rb=2)) is None
    assert P.action_ctx(3, 4, 5, 1, "float64", params=dict(per_block=8, rb=0)) is None
    assert P.action_ctx(1, 4, 5, 1, "float64", params=dict(per_block=8, rb=1)) is not None


def test_heuristic_never_picks_rb():
    for dim in (1, 2, 3):
        for p in range(1, 9):
            for nq in (p + 1, p + 2):
                assert P.action_ctx(dim, p + 1, nq, 1, "float64")["rb"] == 1


# ---------------------------------------------------------------- the line form (3D)
@pytest.mark.parametrize("nd,nq,want_tt,want_tpi", [(2, 3, 3, 9), (5, 6, 7, 42), (9, 9, 9, 81),
                                                   (9, 10, 11, 110), (17, 18, 19, 342)])
def test_line_form_context(nd, nq, want_tt, want_tpi):
    ctx = P.action_ctx(3, nd, nq, 1, "float64", params=dict(per_block=2, line=1))
    assert (ctx["TT"], ctx["tpi"], ctx["threads"], ctx["line"]) == (want_tt, want_tpi,
                                                                   2 * want_tpi, 1)
    assert P.action_template(ctx) == "action_line.cu.j2"
    T = max(nd, nq)
    assert ctx["smem_bytes"] == 8 * (2 * (2 * T * T * want_tt + 1) + 1)
    src = render("action_line.cu.j2", dict(ctx, entry="stc_line"))
    assert f"__constant__ real_t stc_cB[{nq * nd}]" in src


def test_line_form_is_the_3d_heuristic_from_t5():
    for nd, nq, line in ((3, 4, 0), (4, 5, 1), (4, 4, 0), (8, 10, 1)):
        assert P.action_ctx(3, nd, nq, 1, "float64")["line"] == line
    assert P.action_ctx(2, 8, 10, 1, "float64")["line"] == 0       # 3D only
    assert P.action_ctx(3, 4, 5, 1, "float64", params=dict(per_block=2))["line"] == 0
    assert P.action_line_ctx(3, 4, 5, 1, "float64", params=dict(per_block=1000)) is None
