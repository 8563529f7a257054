"""Search spaces: generation and pruning counts, size keys, the --sizes language (no GPU)."""
import math

import pytest

from smalltc import tables as K
from smalltc.backends.cuda import choose, family_of
from smalltc.backends.cuda.family import DEFAULT_DEVICE
from smalltc.backends.cuda.layout import LAYOUT
from smalltc.spec import ActionSpec, AssemblySpec, ContractSpec, GemmSpec
from smalltc.tuning import sizes as Z
from smalltc.tuning import space as S


def family(spec):
    fam = family_of(spec)
    return None if fam is None else fam.name

F64, F32 = "float64", "float32"
CASES = [
    GemmSpec(batch=1, m=2, n=2, k=2, dtype=F64),
    GemmSpec(batch=1, m=8, n=8, k=8, dtype=F64),
    GemmSpec(batch=1, m=32, n=32, k=32, dtype=F64),
    GemmSpec(batch=1, m=12, n=12, k=12, dtype=F64, beta_zero=False),   # with the prefetch form
    GemmSpec(batch=1, m=3, n=5, k=7, dtype=F32, trans_a=True, shared_b=True, beta_zero=False),
    ContractSpec(kind="8b", batch=1, i=3, s=3, j=4, k=4, l=3, dtype=F64, shared_y=True),
    ContractSpec(kind="9", batch=1, i=3, s=4, j=3, k=4, l=16, dtype=F64, shared_x=True),
    ActionSpec(dim=3, nq=4, nd=3, batch=1, dtype=F64),
    ActionSpec(dim=3, nq=10, nd=9, batch=1, dtype=F64),
    ActionSpec(dim=2, nq=6, nd=5, batch=1, dtype=F32, ncomp=3, comp_axis=True),
    AssemblySpec(dim=3, nq=4, nd=3, batch=1, dtype=F64),
    AssemblySpec(dim=3, nq=8, nd=7, batch=1, dtype=F64),
]


def _covers(e):
    return {math.ceil(e / t) for t in range(1, e + 1)}


def _expected_layout(spec):
    """Brute force, independent of space.py: (generated, pruned by tile, pruned by threads)."""
    _, fast, slow = LAYOUT.axes(spec)
    gen = tile = thr = 0
    heur = LAYOUT.heuristic_params(spec)
    # prefetch 0 and 1 for a GEMM with beta != 0 from 64 outputs per item on, else 0
    pfs = (0, 1) if (fast * slow >= 64 and isinstance(spec, GemmSpec)
                     and not spec.beta_zero) else (0,)
    combos = [(dx, dy, nb, pf) for dx in _covers(fast) for dy in _covers(slow)
              for nb in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) for pf in pfs]
    for dx, dy, nb, pf in combos:
        gen += 1
        if dict(dim_x=dx, dim_y=dy, per_block=nb, prefetch=pf) == heur:
            continue
        if math.ceil(fast / dx) * math.ceil(slow / dy) > 32:
            tile += 1
        elif not 64 <= dx * dy * nb <= 1024:
            thr += 1
    dicts = [dict(dim_x=a, dim_y=b, per_block=c, prefetch=d) for a, b, c, d in combos]
    return gen + (heur not in dicts), tile, thr


@pytest.mark.parametrize("spec", CASES, ids=str)
def test_space_invariants(spec):
    sp = S.generate(spec)
    assert sp.generated == len(sp.candidates) + sp.n_pruned
    assert sp.candidates, "every case here has a fused kernel"
    assert sp.candidates[0].params == sp.heuristic       # the heuristic's choice is timed too
    seen = set()
    for c in sp.candidates:
        names = set(sp.family.params)           # an optional one only where it has a meaning
        assert names - set(sp.family.optional) <= set(c.params) <= names
        assert c.ctx["threads"] <= 1024 and c.ctx["smem_bytes"] <= 227 * 1024
        assert choose(spec, DEFAULT_DEVICE, c.params).ctx == c.ctx   # the backend's own
        fp = S._fingerprint(c.ctx)
        assert fp not in seen                             # no kernel compiled twice
        seen.add(fp)
        if c.params != sp.heuristic and sp.family.name in ("layout", "action"):
            assert c.ctx["threads"] >= 64 or sp.family.name == "action"
        if sp.family.name == "action":
            assert c.params["min_blocks"] * c.ctx["threads"] <= 2048


@pytest.mark.parametrize("spec", [c for c in CASES if family(c) == "layout"], ids=str)
def test_layout_pruning_counts(spec):
    gen, tile, thr = _expected_layout(spec)
    sp = S.generate(spec)
    assert (sp.generated, sp.pruned["tile"], sp.pruned["threads"]) == (gen, tile, thr)


def test_pruning_counts_by_hand():
    # assembly: 10 per_block values 1..512 for each final stage: flat (rows 0) and,
    # in 3D, rows 1, 2 (nd^3 * rows = 343, 686 threads; 4 would be 1372 > 1024).
    # At nd=7, nq=8 a unit needs 8*(7*64 + 343*8) = 25536 bytes: 227 KiB hold 9,
    # so 16..512 are invalid: 6 per form.
    # nq = 8 is even: each form also with pad 0 and 1 (odd row stride 9).
    sp = S.generate(AssemblySpec(dim=3, nq=8, nd=7, batch=1, dtype=F64))
    assert sp.generated == 6 * 10 + (sp.heuristic["per_block"] not in (1, 2, 4, 8, 16, 32, 64,
                                                                       128, 256, 512))
    assert sp.pruned["invalid"] == 6 * 6
    assert {(c.params["rows"], c.params["pad"]) for c in sp.candidates} == \
        {(r, p) for r in (0, 1, 2) for p in (0, 1)}
    assert {c.params["pad"] for c in S.generate(   # odd nq: nothing to pad
        AssemblySpec(dim=3, nq=7, nd=6, batch=1, dtype=F64)).candidates} == {0}
    sp2 = S.generate(AssemblySpec(dim=2, nq=8, nd=7, batch=1, dtype=F64))
    # 2D: rows 1..16 (7^2 * rows = 49..784 threads; 1 is pruned: 49 threads)
    assert {c.params["rows"] for c in sp2.candidates} == {0, 2, 4, 8, 16}
    assert sp2.pruned["threads"] == 2 * 10
    assert sorted(c.params["per_block"] for c in sp.candidates)[-1] <= 8
    # action 3D nd=3 nq=4: T=4; per register blocking rb, ceil(4/rb) threads along the
    # blocked axis: 16 threads per element (rb 1), 8 (rb 2 and 3: rb 3 is rb 2 again),
    # 4 (rb 4). "nice" element counts up to 1024/threads (12, 14, 14, 16 of them),
    # x min_blocks 0,1,2,3,4,5,6,8 (8).
    sp = S.generate(ActionSpec(dim=3, nq=4, nd=3, batch=1, dtype=F64))
    nice = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    combos = [(rb, ne, mb, tpi) for rb, tpi in ((1, 16), (2, 8), (3, 8), (4, 4))
              for ne in nice if ne * tpi <= 1024 for mb in (0, 1, 2, 3, 4, 5, 6, 8)]
    heur = sp.heuristic
    assert heur["rb"] == 1 and len(combos) == 8 * (12 + 14 + 14 + 16) == 448
    # and the line form (3D): TT*T = 5*4 = 20 threads per element, nice counts up to
    # 1024/20 = 51 (11 of them), x min_blocks 0, 2, 4, x prefetch 0, 1, 2 and the bulk
    # form (prefetch 3) with 2 and 3 stages
    forms = ((0, 0), (1, 0), (2, 0), (3, 2), (3, 3))
    line = [(ne, mb, pf) for ne in nice if ne * 20 <= 1024 for mb in (0, 2, 4)
            for pf in forms]
    assert len(line) == 165
    assert sp.generated == 448 + 165 + (heur["per_block"] not in nice)
    threads = [c for c in combos if c[1] * c[3] < 64]         # < 64 threads per block
    assert sp.pruned["threads"] == len(threads) + 3 * 3 * 5 == 8 * (3 + 5 + 5 + 7) + 45
    over = [c for c in combos if c[1] * c[3] >= 64 and c[2] * c[1] * c[3] > 2048]
    over_line = [ne for ne, mb, _ in line if ne * 20 >= 64 and mb * ne * 20 > 2048]  # 32, 48
    assert sp.pruned["resident"] == len(over) + len(over_line) == 60 + 10
    # rb 4 at 256 elements: 256 * (2 * 64 + 1) doubles > 227 KiB (min_blocks 0, 1, 2)
    assert sp.pruned["invalid"] == 3
    kept = {c.params["rb"] for c in sp.candidates}
    assert kept == {1, 2, 4}                                  # every rb 3 is a duplicate of rb 2
    assert all(c.ctx["rb"] == c.params["rb"] and c.ctx["tpi"] == 4 * -(-4 // c.params["rb"])
               for c in sp.candidates if not c.params["line"])
    assert all(c.ctx["tpi"] == 20 and c.ctx["line"] == 1
               for c in sp.candidates if c.params["line"])
    # the bulk form: whole 16-byte slabs, so an even element count at nd = 3 (27 doubles)
    bulk = [c.params for c in sp.candidates if c.params["prefetch"] == 3]
    assert bulk and all(b["per_block"] % 2 == 0 and b["stages"] in (2, 3) for b in bulk)
    # 1D: no register blocking; 2D: T threads per element over rb (T = 6: 6, 3, 2, 2)
    assert {c.params["rb"] for c in S.generate(ActionSpec(dim=1, nq=6, nd=5, batch=1,
                                                          dtype=F64)).candidates} == {1}
    sp2 = S.generate(ActionSpec(dim=2, nq=6, nd=5, batch=1, dtype=F64))
    assert {(c.params["rb"], c.ctx["tpi"]) for c in sp2.candidates} == {(1, 6), (2, 3), (3, 2)}


def test_smaller_shared_memory_prunes_more():
    spec = GemmSpec(batch=1, m=16, n=16, k=16, dtype=F64)
    big, small = S.generate(spec), S.generate(spec, dict(DEFAULT_DEVICE, smem_optin=16 * 1024))
    assert small.pruned["invalid"] > big.pruned["invalid"]
    assert all(c.ctx["smem_bytes"] <= 16 * 1024 for c in small.candidates)


def test_generic_only_sizes_have_no_space():
    big = GemmSpec(batch=1, m=200, n=200, k=200, dtype=F64)
    assert family(big) == "layout" and S.generate(big).candidates == []
    nine = ContractSpec(kind="9", batch=1, i=3, s=4, j=3, k=4, l=16, dtype=F64)   # B not shared
    sp = S.generate(nine)
    assert sp.family is None and sp.generated == 0


@pytest.mark.parametrize("res,threads,limit,why", [
    (dict(registers=40, local_bytes=0), 256, 0, None),
    (dict(registers=40, local_bytes=16), 256, 0, "spills"),
    (dict(registers=40, local_bytes=256), 256, 256, None),        # the backend's own limit
    (dict(registers=40, local_bytes=264), 256, 256, "spills"),
    (dict(registers=40, spill_stores=8), 256, 0, "spills"),
    (dict(registers=128, local_bytes=0), 1024, 256, "registers"),
    (dict(), 1024, 0, None),
])
def test_prune_compiled(res, threads, limit, why):
    assert S.prune_compiled(res, threads, limit) == why


@pytest.mark.parametrize("spec,key", [
    (GemmSpec(batch=5, m=8, n=4, k=2, dtype=F64), "gemm/nn/m8n4k2"),
    (GemmSpec(batch=5, m=8, n=8, k=8, dtype=F64, trans_b=True, shared_a=True, beta_zero=False),
     "gemm/nt+sa+beta/m8n8k8"),
    (ContractSpec(kind="8b", batch=1, i=3, s=3, j=4, k=4, l=3, dtype=F64, shared_y=True),
     "contract8b+sy/i3s3j4k4l3"),
    (ActionSpec(dim=2, nq=5, nd=4, batch=9, dtype=F32, ncomp=3, comp_axis=True), "action/2d/nd4nq5c3"),
    (AssemblySpec(dim=3, nq=5, nd=4, batch=9, dtype=F32), "assembly/3d/nd4nq5"),
])
def test_size_keys(spec, key):
    assert spec.size_key == key
    variant, nums = K.split_key(key)
    assert key == f"{variant}/" + "".join(f"{k}{v}" for k, v in nums.items())


def test_distance():
    assert K.distance("gemm/nn/m8n8k8", "gemm/nn/m8n8k8") == 0
    assert K.distance("gemm/nn/m8n8k8", "gemm/nn/m16n8k8") == 1
    assert K.distance("gemm/nn/m8n8k8", "gemm/nn/m4n16k8") == 2
    assert K.distance("gemm/nn/m8n8k8", "gemm/nt/m8n8k8") == math.inf
    assert K.distance("action/3d/nd4nq5c1", "action/2d/nd4nq5c1") == math.inf
    with pytest.raises(ValueError, match="not a size key"):
        K.split_key("gemm-8")


def test_sizes_language():
    specs = Z.parse("action", ["3:1-8:p+1,p+2"], F64)
    assert len(specs) == 16 and {(s.nd, s.nq) for s in specs} >= {(2, 2), (9, 10)}
    assert [s.ncomp for s in Z.parse("action", ["2:3:5:c3"], F32)] == [3]
    g = Z.parse("gemm", ["2-4", "3", "4x8x3:tn+sb+beta"], F64)
    assert [(s.m, s.n, s.k) for s in g] == [(2, 2, 2), (3, 3, 3), (4, 4, 4), (4, 8, 3)]
    assert g[-1].trans_a and not g[-1].trans_b and g[-1].shared_b and not g[-1].beta_zero
    pw = Z.parse("pairwise", ["action:3:2:p+2", "assembly:3:2:p+2"], F64)
    assert {s.kind for s in pw} == {"8a", "8b", "9"}
    assert all(family(s) is not None for s in pw)
    gemm = Z.parse("gemm", None, F64)     # default: square n = 2..32, beta == 0 and != 0
    assert len(gemm) == 62 and sum(s.beta_zero for s in gemm) == 31


@pytest.mark.parametrize("op,tokens,match", [
    ("gemm", ["8:xx"], "unknown flag"),
    ("gemm", ["4x4"], "MxNxK"),
    ("action", ["3:1-8"], "DIM:P:NQ"),
    ("action", ["4:1:2"], "dim must be"),
    ("assembly", ["3:1:2:c3"], "DIM:P:NQ"),
    ("action", ["3:a:2"], "not an integer"),
    ("action", ["3:1:q+1"], "must be N, p.K or 2p"),
    ("pairwise", ["mass:3:1:2"], "action: or assembly:"),
    ("tensor", ["1"], "op must be"),
])
def test_sizes_errors(op, tokens, match):
    with pytest.raises(ValueError, match=match):
        Z.parse(op, tokens, F64)


def test_heuristic_comes_first_as_the_backend_renders_it():
    # the space's first candidate is what the CUDA backend renders without a table
    spec = ActionSpec(dim=3, nq=6, nd=5, batch=1, dtype=F64)
    first = S.generate(spec).candidates[0]
    assert first.ctx == choose(spec, DEFAULT_DEVICE, "heuristic").ctx
