"""The roofline formulas of docs/math.md section 4 against hand-counted cases."""
import math

import pytest

from smalltc import roofline
from smalltc.catalogue import STEPS, steps
from smalltc.spec import ActionSpec, AssemblySpec, BasisSpec, ContractSpec, GemmSpec

INF = math.inf


def _nd3(nd, nq):
    return 4 * (nd ** 3 * nq + nd ** 2 * nq ** 2 + nd * nq ** 3) + nq ** 3


# (op, sizes, dtype, bytes, flops): counted by hand
CASES = [
    # GEMM, A and B batched, beta == 0: s*(mk + kn + mn) per item
    ("gemm", dict(m=4, n=4, k=4, batch=10), "float64", 8 * 3 * 16 * 10, 2 * 64 * 10),
    # beta != 0 reads C too
    ("gemm", dict(m=4, n=4, k=4, batch=10, beta=1.0), "float64", 8 * 4 * 16 * 10, 1280),
    ("gemm", dict(m=2, n=3, k=5, batch=7, beta_zero=False), "float32",
     4 * 7 * (10 + 15 + 2 * 6), 2 * 30 * 7),
    # a shared A counts once
    ("gemm", dict(m=5, n=16, k=4, batch=100, shared_a=True), "float64",
     8 * (20 + 100 * (64 + 80)), 2 * 5 * 16 * 4 * 100),
    ("gemm", dict(m=5, n=16, k=4, batch=100, shared_a=True, shared_b=True), "float64",
     8 * (20 + 64 + 100 * 80), 2 * 5 * 16 * 4 * 100),
    # action 3D: s*(2 nd^3 + nq^3) per element, plus B1d once
    ("action", dict(dim=3, p=3, nq=5, batch=10), "float64",
     8 * (10 * (2 * 64 + 125) + 20), 10 * _nd3(4, 5)),
    ("action", dict(dim=3, nd=2, nq=2, batch=1), "float32", 4 * (16 + 8 + 4), _nd3(2, 2)),
    # ncomp: V and U per component, D once; flops per component
    ("action", dict(dim=3, p=1, nq=3, batch=2, ncomp=3), "float64",
     8 * (2 * (2 * 3 * 8 + 27) + 6), 2 * 3 * _nd3(2, 3)),
    # 2D: interpolate 2*nd*(nq nd + nq^2), twice, plus nq^2
    ("action", dict(dim=2, p=2, nq=4, batch=5), "float64",
     8 * (5 * (2 * 9 + 16) + 12), 5 * (4 * (4 * 9 + 16 * 3) + 16)),
    ("action", dict(dim=1, p=3, nq=5, batch=4), "float64",
     8 * (4 * (2 * 4 + 5) + 20), 4 * (4 * 5 * 4 + 5)),
    # assembly 3D: s*(nq^3 + nd^6), 3 nq (nd^2 nq^2 + nd^4 nq + nd^6)
    ("assembly", dict(dim=3, p=2, nq=4, batch=100), "float32",
     4 * (100 * (64 + 729) + 12), 100 * 3 * 4 * (9 * 16 + 81 * 4 + 729)),
    ("assembly", dict(dim=2, p=1, nq=3, batch=10), "float64",
     8 * (10 * (9 + 16) + 6), 10 * 3 * 3 * (4 * 3 + 16)),
    ("assembly", dict(dim=1, p=1, nq=2, batch=1), "float64", 8 * (2 + 4 + 4), 3 * 2 * 4),
    # kernels
    ("contract", dict(kind="8a", i=3, s=4, j=5, k=6, l=7, batch=2), "float64",
     8 * 2 * (60 + 168 + 630), 2 * 2 * 4 * 630),
    ("contract", dict(kind="9", i=3, s=4, j=3, k=5, l=6, batch=2, shared_x=True), "float64",
     8 * (12 + 2 * (120 + 270)), 3 * 2 * 4 * 270),
    # (4f): U[i1, i2 i3] = sum_k1 B[k1,i1] C[k1, i2 i3]; nd=2, nq=3: C 3x4, U 2x4, B shared
    ("step", dict(label="(4f)", p=1, nq=3, batch=10), "float64",
     8 * (6 + 10 * (3 * 4 + 2 * 4)), 2 * 3 * 2 * 4 * 10),
    # (2a): A[i1,k2,k3,j1] = sum_k1 B B D; nd=2, nq=3: out 2*9*2, D 27 per element
    ("(2a)", dict(p=1, nq=3, batch=1), "float64", 8 * (6 + 27 + 36), 3 * 3 * 36),
    # the basis application, 2D nd=2 nq=3: values through the map (x 9, map 4 int32, H 9,
    # B1d 6); steps 2*2*(3*2) and 2*2*9
    ("basis", dict(dim=2, p=1, nq=3, batch=1, ndofs=9), "float64",
     8 * 9 + 4 * 4 + 8 * 9 + 8 * 6, 24 + 36),
    # its transpose on element vectors, 2 elements: H read, U written; 2*3*(2*3) + 2*3*4
    ("basis", dict(dim=2, p=1, nq=3, batch=2, transpose=True), "float64",
     8 * (2 * 9 + 2 * 4 + 6), 2 * (36 + 24)),
    # gradients on element vectors: B and G along axis 0 (2 of 6 values), then G, B (2 of 9)
    ("basis", dict(dim=2, p=1, nq=3, batch=1, what="gradients"), "float64",
     8 * (4 + 2 * 9 + 2 * 6), 2 * 4 * 6 + 2 * 4 * 9),
    # both, transposed through the map, float32, int64 map: x read and written, H 3 slots;
    # step 1: a contraction a slot (2*3*2*3 each), then the value and d/dxi_0 slots merge
    # (2*3 additions: B on the other axis both); step 2: 2 contractions (2*3*4 each) and
    # 4 additions; 4 into y
    ("basis", dict(dim=2, p=1, nq=3, batch=1, what="both", transpose=True, ndofs=4,
                   index_bytes=8), "float32",
     4 * 3 * 9 + 4 * 2 * 4 + 8 * 4 + 4 * 12, 3 * 36 + 6 + 2 * 24 + 4 + 4),
]


@pytest.mark.parametrize("op, sizes, dtype, nbytes, flops", CASES)
def test_counts_by_hand(op, sizes, dtype, nbytes, flops):
    c = roofline.counts(op, sizes, dtype)
    assert (c.bytes, c.flops) == (nbytes, flops)


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32])
@pytest.mark.parametrize("dtype, denom", [("float64", 16), ("float32", 8)])
def test_square_gemm_beta_is_the_papers_line(n, dtype, denom):
    bw = 4.2e12
    b = roofline.bound("gemm", dict(m=n, n=n, k=n, batch=100_000, beta=1.0), dtype,
                       bandwidth=bw, peak=INF)
    assert b.pmax == pytest.approx(n * bw / denom, rel=1e-12)
    assert b.limited_by == "bandwidth"
    assert b.tmin == pytest.approx(b.bytes / bw)


def test_square_gemm_beta_zero():
    b = roofline.bound("gemm", dict(m=8, n=8, k=8, batch=10), "float64", bandwidth=1.2e11,
                       peak=INF)
    assert b.pmax == pytest.approx(8 * 1.2e11 / 12)


def test_compute_bound_caps_pmax():
    b = roofline.bound("gemm", dict(m=32, n=32, k=32, batch=1000, beta=1.0), "float64",
                       bandwidth=1e15, peak=1e12)
    assert b.limited_by == "compute"
    assert b.pmax == pytest.approx(1e12)
    assert b.fraction(2 * b.tmin) == pytest.approx(0.5)


def test_action_3d_formula_of_spec():
    for p in range(1, 9):
        nd = p + 1
        for nq in (p + 1, p + 2, p + 3):
            E = 1000
            c = roofline.counts("action", dict(dim=3, p=p, nq=nq, batch=E), "float64")
            assert c.bytes == 8 * (E * (2 * nd ** 3 + nq ** 3) + nq * nd)
            assert c.flops == E * _nd3(nd, nq)
            assert c.dofs == E * nd ** 3


def test_dofs_per_second_bound():
    b = roofline.bound("action", dict(dim=3, p=7, nq=9, batch=10 ** 6), "float64",
                       bandwidth=4.2e12, peak=INF)
    # docs/math.md section 6: 98-157 GDoF/s for p = 1..8, nq = p + 2 at 4.2 TB/s
    assert 98e9 < b.dofs_per_s < 157e9


@pytest.mark.parametrize("dim", [1, 2, 3])
@pytest.mark.parametrize("p, nq", [(1, 2), (3, 5), (4, 4), (7, 9)])
def test_pairwise_steps_sum_to_the_operation(dim, p, nq):
    """Flops of the steps add up to the fused operation (action: plus the D scaling)."""
    E = 3
    act = sum(roofline.counts("step", dict(label=s.label, p=p, nq=nq, batch=E)).flops
              for s in steps("action", dim))
    assert act + E * nq ** dim == roofline.counts(
        "action", dict(dim=dim, p=p, nq=nq, batch=E)).flops
    asm = sum(roofline.counts(s.label, dict(p=p, nq=nq, batch=E)).flops
              for s in steps("assembly", dim))
    assert asm == roofline.counts("assembly", dict(dim=dim, p=p, nq=nq, batch=E)).flops


def test_every_catalogue_step_has_a_bound():
    for st in STEPS:
        b = roofline.bound("step", dict(label=st.label, p=3, nq=5, batch=100), "float64",
                           bandwidth=1e11, peak=1e12)
        assert b.bytes > 0 and b.flops > 0 and b.pmax > 0


def test_specs_are_accepted():
    g = GemmSpec(batch=10, m=4, n=4, k=4, dtype="float64", beta_zero=False)
    assert roofline.counts(g).bytes == 8 * 4 * 16 * 10
    a = ActionSpec(dim=3, nq=5, nd=4, batch=10, dtype="float32", ncomp=1)
    assert roofline.counts(a) == roofline.counts("action", dict(dim=3, p=3, nq=5, batch=10),
                                                 "float32")
    m = AssemblySpec(dim=2, nq=3, nd=2, batch=4, dtype="float64")
    assert roofline.bound(m, bandwidth=1e9, peak=1e9).dtype == "float64"
    c = ContractSpec(kind="8a", batch=2, i=3, s=4, j=5, k=6, l=7, dtype="float64")
    assert roofline.counts(c).flops == 2 * 2 * 4 * 630


@pytest.mark.parametrize("dim", [1, 2, 3])
@pytest.mark.parametrize("p, nq", [(1, 3), (4, 6), (7, 9)])
def test_basis_halves_make_the_operators(dim, p, nq):
    """The basis application's two directions and the point function make the action: the
    mass (values), diffusion (gradients, ``Q g``: dim (2 dim - 1) a point) and Helmholtz
    (both, one more) operators' flops on element vectors; their bytes are H's both ways."""
    E, nd = 5, p + 1
    for what, qfunc, point in (("values", "mass", 1), ("gradients", "diffusion", dim * (
            2 * dim - 1)), ("both", "helmholtz", dim * (2 * dim - 1) + 1)):
        sz = dict(dim=dim, p=p, nq=nq, batch=E, what=what)
        fwd = roofline.counts("basis", sz)
        back = roofline.counts("basis", dict(sz, transpose=True))
        act = roofline.counts("action", dict(dim=dim, p=p, nq=nq, batch=E, qfunc=qfunc))
        assert fwd.flops + back.flops + E * point * nq ** dim == act.flops, what
        assert fwd.bytes == back.bytes and fwd.dofs == E * nd ** dim


def test_basis_spec_counts_its_direction():
    """A BasisSpec brings ``what`` and ``transpose`` (not in ``spec.sizes()``); through the
    map the transpose reads and writes the vector and makes the additions into it."""
    s = BasisSpec(dim=3, nq=5, nd=4, batch=10, dtype="float64", what="gradients",
                  ndofs=900)
    t = BasisSpec(dim=3, nq=5, nd=4, batch=10, dtype="float64", what="gradients",
                  transpose=True, ndofs=900)
    sz = dict(dim=3, nq=5, nd=4, batch=10, ndofs=900, what="gradients")
    assert roofline.counts(s) == roofline.counts("basis", sz)
    assert roofline.counts(t) == roofline.counts("basis", dict(sz, transpose=True))
    assert roofline.counts(t).bytes - roofline.counts(s).bytes == 8 * 900
    assert roofline.counts("basis", dict(sz, what=None, nslots=3)) == roofline.counts(s)
    assert roofline.counts(s).dofs == 900
    with pytest.raises(ValueError, match="need what in"):
        roofline.counts("basis", dict(sz, what="hessians"))


@pytest.mark.parametrize("spec", [
    GemmSpec(batch=7, m=3, n=5, k=2, dtype="float32", shared_b=True, trans_a=True),
    ContractSpec(kind="9", batch=3, i=4, s=5, j=4, k=2, l=6, dtype="float64", shared_x=True),
    ActionSpec(dim=2, nq=4, nd=3, batch=5, dtype="float64", ncomp=3, comp_axis=True),
    AssemblySpec(dim=3, nq=3, nd=2, batch=6, dtype="float32")])
def test_a_spec_counts_as_its_sizes(spec):
    """A spec is counted through ``spec.sizes()``: the same as its op name and sizes."""
    assert roofline.counts(spec) == roofline.counts(spec.op, spec.sizes(), spec.dtype)
    assert roofline.bound(spec, bandwidth=1e9, peak=1e9).dtype == spec.dtype


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="op must be"):
        roofline.counts("nonsense", {})
    with pytest.raises(ValueError, match="op must be an op name, a step label or a spec"):
        roofline.counts(42)
    with pytest.raises(ValueError, match="need 'nq'"):
        roofline.counts("action", dict(dim=3, p=2))
    with pytest.raises(ValueError, match="need 'p' or 'nd'"):
        roofline.counts("assembly", dict(dim=3, nq=4))
    with pytest.raises(ValueError, match="unknown pairwise step"):
        roofline.counts("step", dict(label="(9z)", p=1, nq=2))
    with pytest.raises(TypeError, match="float32 or float64"):
        roofline.counts("gemm", dict(m=1, n=1, k=1), "int32")
    with pytest.raises(ValueError, match="device must be"):
        roofline.device_kind("tpu")


def test_cpu_probes_are_cached_and_plausible():
    bw1 = roofline.bandwidth("cpu")
    assert roofline.bandwidth("cpu") == bw1          # measured once per process
    assert 1e9 < bw1 < 1e13
    assert 1e9 < roofline.peak("float64", "cpu") < 1e14
    info = roofline.probe("cpu", dtypes=("float64",))
    assert info["device"] == "cpu" and "method" in info["bandwidth"]
    assert roofline.device_slug("cpu").startswith("cpu-")
