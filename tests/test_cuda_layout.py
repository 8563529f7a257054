"""The line form's shared-memory layout (``layout`` "odd" | "model"): the bank model, its
choice, and how a table entry and the heuristic select it. No GPU needed; the kernels
themselves are checked against the einsum oracle by the GPU tests of the operators
(tests/test_cuda_operators.py, tests/test_mass_apply.py) with the heuristic's layout."""
import pytest

from smalltc.backends.cuda.action import action_line_ctx, qfunc_ctx
from smalltc.backends.cuda.smem_layout import _layout_costs, _wavefronts, qfunc_line_layout
from smalltc.backends.cuda.family import DEFAULT_DEVICE
from smalltc.backends.cuda.mass_apply import MASS_APPLY
from smalltc.spec import MassApplySpec


def test_wavefront_model():
    """8-byte words: half warps on 16 banks; 4-byte words: whole warps on 32; a word read
    by several lanes once."""
    import numpy as np
    stride = lambda k, n=32: np.arange(n)[None, :] * k            # noqa: E731
    on = np.ones(32, bool)
    assert _wavefronts(stride(1), on, 8)[0] == 2                   # 256 bytes: two
    assert _wavefronts(stride(2), on, 8)[0] == 4                   # 2-way in each half
    assert _wavefronts(stride(16), on, 8)[0] == 32                 # one bank
    assert _wavefronts(stride(0), on, 8)[0] == 2                   # a broadcast per half
    assert _wavefronts(stride(1), on, 4)[0] == 1
    assert _wavefronts(stride(2), on, 4)[0] == 2
    assert _wavefronts(stride(1), np.arange(32) < 0, 8)[0] == 0    # no lane: nothing


def test_model_reproduces_the_profiled_kernel():
    """BP3 p = 2, 4 items a block, the odd layout: the kernel Nsight Compute profiled on
    an H100 (123.4 load and 101.8 store wavefronts an element, the Q slab's cp.async copy
    among the stores). The model: 125.5 loads and 95.5 stores (without that copy), 884 a
    group; the modelled layout 524 (0.59x)."""
    costs = {tuple(c[1:]): c[0] for c in _layout_costs(3, 4, 4, False, True, 8)}
    assert costs[(5, 5, 20, 241)] == 884
    best = qfunc_line_layout(3, 4, 4, False, True, 8)
    assert best == (4, 4, 17, 204) and costs[best] == 524
    assert min(costs.values()) == costs[best]


@pytest.mark.parametrize("nd,nq,pb,colloc,qsmem,mass", [
    (3, 4, 6, False, True, False), (5, 7, 1, False, True, False), (6, 6, 4, True, True, False),
    (2, 3, 16, False, False, False), (4, 5, 4, False, False, True), (9, 10, 1, False, False, True)])
def test_model_never_worse_than_odd(nd, nq, pb, colloc, qsmem, mass):
    """The chosen layout's modelled wavefronts are at most the odd layout's, and where they
    tie the odd layout itself is kept."""
    T = max(nd, nq)
    odd = (T | 1, T | 1, T * (T | 1), (2 if mass else 3) * T * T * (T | 1) | 1)
    costs = {tuple(c[1:]): c[0] for c in _layout_costs(nd, nq, pb, colloc, qsmem, 8, 6, mass)}
    best = qfunc_line_layout(nd, nq, pb, colloc, qsmem, 8, 6, mass)
    assert costs[best] <= costs[odd]
    assert best == odd or costs[best] < costs[odd]


def test_params_select_the_layout():
    """The heuristic takes the model's layout; parameters without ``layout`` (a table
    entry measured before the parameter) the odd one, rendered with the template's own
    strides; an unknown layout, or the model's for the cp.async and bulk forms, no
    context."""
    heur = qfunc_ctx(3, 3, 4, 1, "float64", "diffusion", False)
    assert heur["layout"] == "model" and (heur["TT"], heur["ls"], heur["ps"]) == (4, 4, 17)
    old = qfunc_ctx(3, 3, 4, 1, "float64", "diffusion", False,
                    params=dict(per_block=6, qmode="smem", line=1))
    assert old["layout"] == "odd" and old["TT"] == 5 and "ls" not in old
    assert old["istr"] == 3 * 4 * 4 * 5 + 1 and old["threads"] == 6 * 20
    assert qfunc_ctx(3, 3, 4, 1, "float64", "diffusion", False,
                     params=dict(per_block=6, line=1, layout="wide")) is None
    spec = MassApplySpec(dim=3, nq=4, nd=3, batch=100, dtype="float64", ndofs=1000)
    assert MASS_APPLY.context(spec, None, dict(DEFAULT_DEVICE))["layout"] == "model"
    assert MASS_APPLY.heuristic_params(spec, dict(DEFAULT_DEVICE))["layout"] == "model"
    assert action_line_ctx(3, 3, 4, 1, "float64",
                           params=dict(per_block=4, prefetch=3, layout="model")) is None
    assert action_line_ctx(3, 3, 4, 1, "float64",
                           params=dict(per_block=4, prefetch=1, layout="model"))["ls"] == 4
