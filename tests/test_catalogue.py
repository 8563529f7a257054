"""The catalogue of pairwise steps is consistent data."""
import math

import pytest

from smalltc.backends.reference import ReferenceBackend
from smalltc.catalogue import STEPS, steps
from smalltc.pairwise import PairwiseExecutor
from smalltc.spec import ActionSpec, AssemblySpec, ContractSpec

SIZES = [(2, 3), (3, 3), (4, 6), (9, 10)]


@pytest.mark.parametrize("op,dim", [("action", 1), ("action", 2), ("action", 3),
                                    ("assembly", 1), ("assembly", 2), ("assembly", 3)])
@pytest.mark.parametrize("nd,nq", SIZES)
def test_steps_chain(op, dim, nd, nq):
    """Each step reads exactly what the previous one wrote; the ends match the
    operands (V or D in, U or M out)."""
    chain = steps(op, dim)
    first = chain[0]
    src = first.x if first.x[0] != "B" else first.y
    n_in = math.prod(first.x_extents(nd, nq) if first.x is src else first.y_extents(nd, nq))
    assert n_in == (nd ** dim if src[0] == "V" else nq ** dim)
    prev_out = None
    for st in chain:
        cs = ContractSpec(kind=st.kernel, batch=1, dtype="float64",
                          shared_x=st.x[0] == "B", shared_y=st.y[0] == "B", **st.extents(nd, nq))
        for name, shape in ((st.x[0], cs.x_shape), (st.y[0], cs.y_shape)):
            if name == "C":
                assert math.prod(shape) == prev_out, st.label
            if name == "B":
                assert math.prod(shape) == nq * nd, st.label
        prev_out = math.prod(cs.out_shape)
        if st.scale:
            assert prev_out == nq ** dim, st.label      # C = D * A is pointwise at quad points
    want = nd ** dim if op == "action" else nd ** (2 * dim)
    assert prev_out == want


def test_labels_cover_the_papers_table():
    labels = [s.label for s in STEPS]
    for lab in ["(1a)", "(1b)", "(2a)", "(2b)", "(2c)", "(3a)", "(3b)", "(3c)", "(3d)",
                "(4a)", "(4b)", "(4c)", "(4d)", "(4e)", "(4f)"]:
        assert lab in labels
    assert len(set(labels)) == len(labels)


def test_unknown_op():
    with pytest.raises(ValueError, match=r"no pairwise steps for op='mass', dim=2"):
        steps("mass", 2)


class _Recording(ReferenceBackend):
    def __init__(self):
        self.calls = []

    def build(self, spec, *args, **kwargs):
        self.calls.append((spec, args, kwargs))
        return super().build(spec)


@pytest.mark.parametrize("spec", [
    ActionSpec(dim=3, nq=4, nd=3, batch=5, dtype="float64", ncomp=2, comp_axis=True),
    ActionSpec(dim=1, nq=3, nd=2, batch=5, dtype="float32"),
    AssemblySpec(dim=2, nq=4, nd=3, batch=5, dtype="float64")])
def test_pairwise_builds_each_step_through_the_backend(spec):
    """The pairwise executor asks the backend for each step's contraction as
    ``build(spec)`` (the backend chooses its parameters), batched over elements and
    components, B1d shared."""
    be = _Recording()
    ex = PairwiseExecutor(be, spec)
    ncomp = spec.ncomp if spec.op == "action" else 1
    want = [ContractSpec(kind=st.kernel, batch=spec.batch * ncomp, dtype=spec.dtype,
                         shared_x=st.x[0] == "B", shared_y=st.y[0] == "B",
                         **st.extents(spec.nd, spec.nq)) for st in steps(spec.op, spec.dim)]
    assert be.calls == [(cs, (), {}) for cs in want]
    assert ex.kernel.startswith(f"pairwise {steps(spec.op, spec.dim)[0].label}:einsum")
