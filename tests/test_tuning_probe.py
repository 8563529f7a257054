"""The resource probe: ptxas' report of registers and spills for rendered candidates.

The parser runs everywhere; compiling needs ``nvcc`` (skipped without it, no GPU needed).
"""
import shutil
import types

import pytest

from smalltc.backends.cuda import choose
from smalltc.backends.cuda import runtime as RT
from smalltc.backends.cuda.family import DEFAULT_DEVICE
from smalltc.backends.cuda.runtime import render
from smalltc.spec import ActionSpec, AssemblySpec, ContractSpec, GemmSpec
from smalltc.tuning import compile as C
from smalltc.tuning.space import generate, prune_compiled

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on the PATH")

LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'stc_a' for 'sm_90'
ptxas info    : Function properties for stc_a
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 384 bytes smem, 380 bytes cmem[0]
ptxas info    : Compiling entry function 'stc_b' for 'sm_90'
ptxas info    : Function properties for stc_b
    208 bytes stack frame, 216 bytes spill stores, 248 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 380 bytes cmem[0]
"""


def test_parse_ptxas():
    found = C.parse_ptxas(LOG)
    assert found["stc_a"] == dict(stack_bytes=0, spill_stores=0, spill_loads=0, registers=40,
                                  smem_static=384)
    assert found["stc_b"]["registers"] == 64 and found["stc_b"]["spill_stores"] == 216
    assert prune_compiled(dict(found["stc_b"], local_bytes=208), 640) is None   # <= 256 B
    assert prune_compiled(dict(found["stc_b"], local_bytes=208), 640, 0) == "spills"
    assert prune_compiled(dict(found["stc_a"], local_bytes=0), 256, 0) is None


@needs_nvcc
def test_nvcc_probe_of_a_rendered_kernel():
    spec = ActionSpec(dim=3, nq=4, nd=3, batch=1, dtype="float64")
    c = choose(spec, DEFAULT_DEVICE, "heuristic")
    template, ctx = c.template, c.ctx
    res = C.nvcc_resources(render(template, dict(ctx, entry="stc_probe")), "stc_probe", "sm_90")
    assert 16 <= res["registers"] <= 255
    assert res["spill_stores"] == 0 and res["local_bytes"] == 0


@needs_nvcc
def test_nvcc_probe_finds_spills_and_the_space_prunes_them():
    # nd=9, nq=10: 81 threads per element; 10 elements with min_blocks=2 caps registers at 40
    spec = ActionSpec(dim=3, nq=10, nd=9, batch=1, dtype="float64")
    tight = dict(per_block=10, min_blocks=2, rb=1, line=0, prefetch=0, stages=0)
    assert tight in [c.params for c in generate(spec).candidates]
    res = C.compile_nvcc(spec, tight)
    assert res["ok"] and res["spill_stores"] > 0 and res["registers"] <= 40
    assert prune_compiled(res, 810) == "spills"


@needs_nvcc
def test_nvcc_compile_error_is_a_failed_candidate():
    res = C.compile_nvcc(AssemblySpec(dim=3, nq=4, nd=3, batch=1, dtype="float64"),
                         dict(per_block=100000))
    assert res["ok"] is False and "rejects" in res["error"]
    with pytest.raises(RuntimeError, match="nvcc failed"):
        C.nvcc_resources("this is not CUDA", "stc_x")


# ---------------------------------------------------------------------------
# compile_cuda through the real CUDA backend, the device faked (as in test_cuda_runtime.py):
# the backend renders what the tuner predicts, and the kernel's attributes come back.

class _FakeKernel:
    def __init__(self, attrs):
        self.attributes = attrs


@pytest.fixture
def fake_cuda(monkeypatch):
    seen = []
    monkeypatch.setattr(RT, "current_device_id", lambda: 0)
    monkeypatch.setattr(RT, "current_device", lambda: (0, dict(name="Fake H100", cc="90", sms=132,
                                                               smem_optin=227 * 1024)))

    def get_kernel(template, entry, ctx, smem):
        seen.append((template, entry, ctx))
        if NVCC is None:
            return _FakeKernel({"num_regs": 40, "local_size_bytes": 0})
        res = C.nvcc_resources(render(template, dict(ctx, entry=entry)), entry, "sm_90")
        return _FakeKernel({"num_regs": res["registers"], "local_size_bytes": res["local_bytes"]})

    monkeypatch.setattr(RT, "get_kernel", get_kernel)
    # the prefetch forms cap the grid with the driver's occupancy calculator
    monkeypatch.setattr(RT, "resident_blocks", lambda kern, threads, smem: 4)
    return seen


CUDA_CASES = [
    GemmSpec(batch=99, m=8, n=8, k=8, dtype="float64"),
    GemmSpec(batch=99, m=3, n=5, k=7, dtype="float32", trans_b=True, shared_a=True,
             beta_zero=False),
    ContractSpec(kind="8b", batch=99, i=3, s=3, j=4, k=4, l=3, dtype="float64", shared_y=True),
    ContractSpec(kind="9", batch=99, i=3, s=4, j=3, k=4, l=16, dtype="float64", shared_x=True),
    ActionSpec(dim=3, nq=5, nd=4, batch=99, dtype="float64"),
    AssemblySpec(dim=2, nq=5, nd=4, batch=99, dtype="float32"),
]


@pytest.mark.parametrize("spec", CUDA_CASES, ids=str)
def test_compile_cuda_renders_what_the_space_predicts(fake_cuda, spec):
    cands = generate(spec).candidates
    for c in (cands[0], cands[-1]):                # the heuristic's choice and another
        fake_cuda.clear()
        res = C.compile_cuda(spec, c.params, "sm_90", 227 * 1024)
        assert res["ok"], res
        assert res["registers"] > 0 and res["local_bytes"] >= 0
        (template, entry, ctx), = fake_cuda
        assert (template, ctx) == (c.template, c.ctx)   # the space renders as the backend


def test_compile_cuda_reports_a_rejected_variant(fake_cuda):
    spec = AssemblySpec(dim=3, nq=4, nd=3, batch=9, dtype="float64")
    res = C.compile_cuda(spec, dict(per_block=100000))
    assert res["ok"] is False and "do not fit" in res["error"]
