"""The resource probe: ptxas' report of registers and spills for rendered candidates.

The parser runs everywhere; compiling needs ``nvcc`` (skipped without it, no GPU needed).
"""
import shutil

import pytest

from smalltc.backends._cuda_runtime import render
from smalltc.spec import ActionSpec, AssemblySpec
from smalltc.tuning import compile as C
from smalltc.tuning.space import ctx_for, generate, prune_compiled

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
    template, ctx = ctx_for(spec)
    res = C.nvcc_resources(render(template, dict(ctx, entry="stc_probe")), "stc_probe", "sm_90")
    assert 16 <= res["registers"] <= 255
    assert res["spill_stores"] == 0 and res["local_bytes"] == 0


@needs_nvcc
def test_nvcc_probe_finds_spills_and_the_space_prunes_them():
    # nd=9, nq=10: 81 threads per element; 10 elements with min_blocks=2 caps registers at 40
    spec = ActionSpec(dim=3, nq=10, nd=9, batch=1, dtype="float64")
    tight = dict(per_block=10, min_blocks=2)
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
