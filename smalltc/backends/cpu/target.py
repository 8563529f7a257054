"""The instruction set the CPU kernels are compiled for, and what follows from it.

Numba compiles every kernel for one LLVM target per process: the host's CPU
(``llvmlite.binding.get_host_cpu_name()``) with its features, unless
``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` say otherwise. :func:`host` reads
that target from Numba's code generator (what it *will* compile for, not what
the chip could do) and maps it to one of the ISAs below; the kernel families
choose their lanes, register blocks and transposes for it
(:attr:`Target.vector_bytes`, :attr:`Target.registers`), and the tuning
tables are per ISA (``cpu-avx512-float64.json``).

=========  ======  ==========  ==============================================
isa        vector  registers   targets
=========  ======  ==========  ==============================================
avx512     64 B    32          x86-64 with AVX-512F (Skylake-SP and later
                               Xeons, Ice/Tiger/Rocket Lake, Zen 4/5)
avx2       32 B    16          x86-64 with AVX2 and FMA (Haswell .. Alder
                               Lake, Zen 1-3)
neon       16 B    32          AArch64 (Graviton, Ampere, Apple silicon)
sse        16 B    16          any other x86-64 (no FMA)
=========  ======  ==========  ==============================================

On Intel cores LLVM prefers 256-bit vectors even where AVX-512 exists (its
``prefer-256-bit`` tuning for Skylake-SP and later Xeons); on AMD Zen 4/5 it
uses 512. :attr:`Target.vector_bits` is that preference, and the kernels'
default: on the Intel Xeon of this project 256-bit code measured faster than
512-bit code (0.46 vs 0.41 of Pmax, 3D action p=6), on the Zen 5 512-bit code
was the one measured (notes/cpu.md). A kernel may ask for the other width
per function (the ``vbits`` tuning parameter, :func:`.simd.vector_width`),
without changing what Numba compiles for anything else in the process. The
heuristics are keyed by :attr:`Target.profile` (``avx512/256``,
``avx512/512``, ``avx2/256``, ``neon/128``).

To compile AVX2 code on an AVX-512 machine (what the AVX2 figures in
``benchmarks/cpu-intel-xeon-2c-avx2/`` are): ``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=""`` in the
environment before the process starts.

Examples
--------
>>> TARGETS["avx2"].lanes("float64"), TARGETS["avx512"].lanes("float32")
(4, 16)
>>> TARGETS["avx512"]._replace(vector_bits=256).profile
'avx512/256'
>>> classify("x86_64-unknown-linux-gnu", "haswell", "")
'avx2'
>>> classify("x86_64-unknown-linux-gnu", "rocketlake", "+avx2,+avx512f,+fma")
'avx512'
>>> classify("aarch64-unknown-linux-gnu", "neoverse-n1", "+neon")
'neon'
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

__all__ = ["Target", "TARGETS", "host", "classify", "target_of", "resolve"]


class Target(NamedTuple):
    """What a kernel is generated for: an ISA and its vector registers.

    ``vector_bytes``: the widest SIMD register; ``registers``: how many there are;
    ``vector_bits``: the width the kernels use by default, LLVM's preference for the
    CPU (0: the only width, nothing to ask for); ``llvm_cpu``: the LLVM CPU name.
    """

    isa: str
    vector_bytes: int
    registers: int
    vector_bits: int = 0
    llvm_cpu: str = ""

    def lanes(self, dtype) -> int:
        """Scalars of ``dtype`` in one vector of the default width."""
        width = self.vector_bits // 8 if self.vector_bits else self.vector_bytes
        return width // np.dtype(dtype).itemsize

    @property
    def profile(self) -> str:
        """ISA and default vector width, ``avx512/256``: what the heuristics are keyed by."""
        return f"{self.isa}/{self.vector_bits or self.vector_bytes * 8}"

    @property
    def arch(self) -> str:
        """The tuning tables' name for it: ``cpu-avx512``."""
        return f"cpu-{self.isa}"

    def as_dict(self) -> dict:
        return dict(isa=self.isa, vector_bytes=self.vector_bytes, registers=self.registers,
                    vector_bits=self.vector_bits, llvm_cpu=self.llvm_cpu)


#: the ISAs the CPU kernels know (see the module docstring)
TARGETS = {
    "avx512": Target("avx512", 64, 32, 512),
    "avx2": Target("avx2", 32, 16),
    "neon": Target("neon", 16, 32),
    "sse": Target("sse", 16, 16),
}

# Intel AVX-512 CPUs for which LLVM prefers 256-bit vectors (its TuningPrefer256Bit)
_PREFER_256 = ("skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake",
               "tigerlake", "rocketlake", "sapphirerapids", "emeraldrapids", "graniterapids",
               "diamondrapids")
# LLVM CPU names whose default features include AVX-512F / AVX2+FMA, for a target
# given by name alone (NUMBA_CPU_NAME with empty NUMBA_CPU_FEATURES)
_AVX512_CPUS = ("skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake",
                "tigerlake", "rocketlake", "sapphirerapids", "emeraldrapids",
                "graniterapids", "diamondrapids", "znver4", "znver5", "x86-64-v4", "knl", "knm")
_AVX2_CPUS = ("haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake",
              "arrowlake", "lunarlake", "gracemont", "znver1", "znver2", "znver3", "x86-64-v3",
              "bdver4")


def classify(triple: str, cpu: str, features: str) -> str:
    """The ISA name of an LLVM target (triple, CPU name, feature string)."""
    if triple.startswith(("aarch64", "arm64")):
        return "neon"
    feats = {f[1:] for f in features.split(",") if f.startswith("+")}
    if features:
        if "avx512f" in feats:
            return "avx512"
        if {"avx2", "fma"} <= feats:
            return "avx2"
        return "sse"
    if cpu.startswith(_AVX512_CPUS):
        return "avx512"
    if cpu.startswith(_AVX2_CPUS):
        return "avx2"
    return "sse"


def preferred_bits(cpu: str, features: str) -> int:
    """The vector width LLVM prefers on an AVX-512 target: 256 on Intel cores (unless the
    features say ``-prefer-256-bit``), else 512."""
    feats = features.split(",")
    if "-prefer-256-bit" in feats:
        return 512
    return 256 if "+prefer-256-bit" in feats or cpu.startswith(_PREFER_256) else 512


@functools.lru_cache(maxsize=None)
def host() -> Target:
    """The target Numba compiles for in this process (read from its code generator)."""
    from numba.core.registry import cpu_target
    triple, cpu, features = cpu_target.target_context.codegen().magic_tuple()
    t = TARGETS[classify(triple, cpu, features)]._replace(llvm_cpu=cpu)
    if t.isa == "avx512":
        t = t._replace(vector_bits=preferred_bits(cpu, features))
    return t


def target_of(device: dict | None) -> Target:
    """The target a tuning table's ``device`` record names (its ``isa`` and
    ``vector_bits``), else the host's."""
    device = device or {}
    isa, t = device.get("isa"), host()
    if isa is None or isa == t.isa and device.get("vector_bits", t.vector_bits) == t.vector_bits:
        return t
    t = TARGETS[isa]
    return t._replace(vector_bits=device["vector_bits"]) if "vector_bits" in device else t


def resolve(target=None) -> Target:
    """A :class:`Target` from what the families are given: None (the host's), a Target,
    or a device record (a tuning table's or the tuner's, with ``isa``)."""
    if target is None:
        return host()
    if isinstance(target, Target):
        return target
    return target_of(target)
