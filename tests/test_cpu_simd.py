"""Evidence that the CPU kernels vectorise, per ISA.

* The host: the generated kernels' machine code uses vector FMAs of the width
  the target's kernels use (:attr:`Target.vector_bits`: zmm on AVX-512 where
  LLVM prefers 512 bits, ymm on Intel AVX-512 cores, where 256-bit code
  measured faster, and on AVX2; v.2d on NEON) and (almost) no scalar ones; on
  AVX-512 hosts, ``vbits=512`` gives zmm FMAs (the full width, when asked).
* AVX2 on any x86-64 host: the same, compiled in a subprocess for
  ``NUMBA_CPU_NAME=haswell`` (what the AVX2 figures in ``benchmarks/`` are).
* NEON without an ARM machine: the kernels rendered for the ``neon`` target,
  lowered by Numba without vectorisation, then retargeted to AArch64 and
  optimised there by LLVM (llvmlite carries the AArch64 backend) with its SLP
  vectoriser, as Numba would on an ARM host: the assembly has vector FMAs.

Each kernel is compiled fresh (``numba_cache=False``), a few seconds each.
"""
import os
import re
import subprocess
import sys
import textwrap

import pytest

from smalltc.backends.cpu import ACTION, ASSEMBLY, GEMM, MASS_APPLY
from smalltc.backends.cpu.runtime import load_kernel
from smalltc.backends.cpu.target import TARGETS, classify, host
from smalltc.spec import ActionSpec, AssemblySpec, GemmSpec, MassApplySpec

pytest.importorskip("numba")

# (family, spec): one kernel of each design the heuristic chooses
KERNELS = [
    (ACTION, ActionSpec(dim=3, nq=6, nd=5, batch=1, dtype="float64")),
    (ACTION, ActionSpec(dim=2, nq=5, nd=4, batch=1, dtype="float32")),
    (ASSEMBLY, AssemblySpec(dim=3, nq=5, nd=4, batch=1, dtype="float64")),
    (GEMM, GemmSpec(batch=1, m=8, n=8, k=8, dtype="float64", beta_zero=False)),
    (MASS_APPLY, MassApplySpec(dim=3, nq=5, nd=4, batch=1, dtype="float64", ndofs=1)),
]

#: vector and scalar FMA patterns per dtype (AT&T syntax on x86); register per width
_X86 = {"float64": ("pd", "sd"), "float32": ("ps", "ss")}
_REG = {512: "zmm", 256: "ymm", 128: "xmm"}


def fma_counts(asm, isa, dtype, bits=128):
    """(vector FMAs of ``bits`` width, vector FMAs of other widths, scalar FMAs) in ``asm``."""
    if isa == "neon":
        v = "2d" if dtype == "float64" else "4s"
        full = len(re.findall(rf"\bfmla\s+v\d+\.{v}", asm))
        return full, 0, len(re.findall(r"\bfmadd\s+[ds]\d+", asm))
    vec, sca = _X86[dtype]
    fmas = re.findall(rf"\bvfn?m(?:add|sub)\d+{vec}\s+([^\n]*)", asm)
    full = sum(1 for ops in fmas if f"%{_REG[bits]}" in ops)
    return full, len(fmas) - full, len(re.findall(rf"\bvfn?m(?:add|sub)\d+{sca}\b", asm))


def _fresh(fam, spec, target, slp=True, params=None):
    """Compile the family's kernel of ``spec`` for ``target`` (``params``, or the heuristic)
    without Numba's disk cache (so its code is in this process); returns the generated
    module and the entry."""
    ctx = fam.context(spec, params, target)
    fn, _ = load_kernel(fam.template(ctx), fam.entry(spec, ctx), slp=slp,
                        **dict(ctx["render"], numba_cache=False))
    return sys.modules[fn.py_func.__module__], fn


def _asm(module, fn):
    text = "".join(fn.inspect_asm().values())
    run = getattr(module, "_run", None)
    if run is not None:
        text += "".join(run.inspect_asm().values())
    return text


@pytest.mark.skipif(host().isa == "sse", reason="no FMA on this target")
@pytest.mark.parametrize("fam,spec", KERNELS, ids=lambda v: getattr(v, "name", str(v)))
def test_host_kernels_use_vector_fmas_of_their_width(fam, spec):
    t = host()
    module, fn = _fresh(fam, spec, t)
    bits = fam.heuristic_params(spec, t).get("vbits") or t.vector_bits or t.vector_bytes * 8
    full, narrow, scalar = fma_counts(_asm(module, fn), t.isa, spec.dtype, bits)
    assert full >= 16, (t, full, narrow, scalar)
    assert scalar <= full // 8 and narrow <= full // 4, (t, full, narrow, scalar)


@pytest.mark.skipif(host().isa != "avx512", reason="an AVX-512 host")
@pytest.mark.parametrize("fam,spec,params", [
    (ACTION, KERNELS[0][1], dict(lanes=8, rb=2, tr=1, vbits=512)),
    (ACTION, ActionSpec(dim=3, nq=8, nd=5, batch=1, dtype="float64"),   # nq = 8 lanes
     dict(form="inner", rb=2, jb=1, pf=1, vbits=512)),
    (GEMM, KERNELS[3][1], dict(form="rows", rb=4, vbits=512)),
], ids=["action", "action-inner", "gemm"])
def test_avx512_full_width_when_asked(fam, spec, params):
    """``vbits=512``: zmm FMAs on any AVX-512 host, also where LLVM prefers 256 bits."""
    module, fn = _fresh(fam, spec, host(), params=params)
    full, narrow, scalar = fma_counts(_asm(module, fn), "avx512", spec.dtype, 512)
    assert full >= 16 and narrow <= full // 4 and scalar <= full // 8, (full, narrow, scalar)


_AVX2_SCRIPT = textwrap.dedent("""
    import re, sys
    from smalltc.backends.cpu import ACTION, GEMM
    from smalltc.backends.cpu.runtime import load_kernel
    from smalltc.backends.cpu.target import host
    from smalltc.spec import ActionSpec, GemmSpec
    t = host()
    for fam, spec in [(ACTION, ActionSpec(dim=3, nq=5, nd=4, batch=1, dtype="float64")),
                      (GEMM, GemmSpec(batch=1, m=8, n=8, k=8, dtype="float64"))]:
        ctx = fam.context(spec, None, t)
        fn, _ = load_kernel(fam.template(ctx), fam.entry(spec, ctx),
                            **dict(ctx["render"], numba_cache=False))
        mod = sys.modules[fn.py_func.__module__]
        asm = "".join(fn.inspect_asm().values())
        if hasattr(mod, "_run"):
            asm += "".join(mod._run.inspect_asm().values())
        ymm = len(re.findall(r"vfn?madd\\d+pd[^\\n]*%ymm", asm))
        print(t.isa, t.llvm_cpu, fam.name, ymm, asm.count("%zmm"),
              len(re.findall(r"vfn?madd\\d+sd", asm)))
""")


@pytest.mark.skipif(not host().isa.startswith(("avx", "sse")), reason="x86-64 only")
def test_avx2_target_compiles_to_ymm_fmas(tmp_path):
    """``NUMBA_CPU_NAME=haswell``: the AVX2 target on this x86-64 host; ymm FMAs, no zmm
    register anywhere, no scalar FMAs."""
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="",
               SMALLTC_CACHE_DIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", _AVX2_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.strip().splitlines()]
    assert [r[:3] for r in rows] == [["avx2", "haswell", "action"], ["avx2", "haswell", "gemm"]]
    for _, _, name, ymm, zmm, scalar in rows:
        assert int(ymm) >= 16 and int(zmm) == 0 and int(scalar) == 0, (name, ymm, zmm, scalar)


def _aarch64_asm(ir, cpu="neoverse-n1"):
    """``ir`` (a module Numba lowered, not optimised) optimised and compiled for AArch64
    with NEON, as Numba would on an ARM host (O3 with SLP, no loop vectoriser)."""
    import llvmlite.binding as llvm
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    triple = "aarch64-unknown-linux-gnu"
    tm = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features="+neon",
                                                               opt=3)
    ir = re.sub(r"^target datalayout = .*$", f'target datalayout = "{tm.target_data}"', ir,
                flags=re.M)
    ir = re.sub(r"^target triple = .*$", f'target triple = "{triple}"', ir, flags=re.M)
    mod = llvm.parse_assembly(ir)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.slp_vectorization, pto.loop_vectorization = True, False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_assembly(mod)


@pytest.mark.parametrize("fam,spec", KERNELS[:4], ids=lambda v: getattr(v, "name", str(v)))
def test_neon_kernels_vectorise_for_aarch64(monkeypatch, fam, spec):
    """The kernel rendered for the ``neon`` target (lanes, register blocks, 2 x 2 or 4 x 4
    transposes), its unoptimised LLVM IR captured as Numba lowers it, compiled for
    AArch64: vector FMAs (``fmla v.2d`` / ``v.4s``), few scalar ones."""
    from numba.core.codegen import CPUCodeLibrary
    captured = []
    add = CPUCodeLibrary.add_ir_module

    def record(self, ir_module):
        captured.append(str(ir_module))
        return add(self, ir_module)

    monkeypatch.setattr(CPUCodeLibrary, "add_ir_module", record)
    _fresh(fam, spec, TARGETS["neon"], slp=False)
    monkeypatch.undo()
    # the part body (_run), or the parallel loop's body where it is inlined (GEMM)
    body = [m for m in captured if re.search(r"^define .*(_run|parfor_gufunc)", m, re.M)]
    assert body, "no kernel body among the lowered modules"
    full, _, scalar = fma_counts(_aarch64_asm(body[0]), "neon", spec.dtype)
    assert full >= 16 and scalar <= full // 4, (full, scalar)


@pytest.mark.parametrize("triple,cpu,features,isa", [
    ("x86_64-unknown-linux-gnu", "znver5", "+avx2,+fma,+avx512f", "avx512"),
    ("x86_64-unknown-linux-gnu", "rocketlake", "", "avx512"),
    ("x86_64-unknown-linux-gnu", "haswell", "", "avx2"),
    ("x86_64-unknown-linux-gnu", "haswell", "+avx2,+fma,-avx512f", "avx2"),
    ("x86_64-unknown-linux-gnu", "x86-64", "+sse2", "sse"),
    ("aarch64-unknown-linux-gnu", "apple-m1", "+neon", "neon"),
])
def test_isa_of_llvm_targets(triple, cpu, features, isa):
    assert classify(triple, cpu, features) == isa
    assert TARGETS[isa].arch == f"cpu-{isa}"
