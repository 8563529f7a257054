"""Compiling candidates: the worker functions a process pool runs, and the resource probe.

Two compilers, both plain functions of picklable arguments so that
:class:`concurrent.futures.ProcessPoolExecutor` can run them on every core:

- :func:`compile_cuda` (on a GPU machine): builds the executor with the
  candidate's parameters exactly as the runtime does
  (``smalltc.backends.get("cuda").build(spec, params=...)``), so NVRTC runs
  through the backend's own runtime and CuPy's disk cache holds the kernel
  when the parent process builds it again to time it. Returns the compiled
  kernel's attributes (``num_regs``, ``local_size_bytes``).
- :func:`compile_cpu` (``--device cpu``): builds the executor through the CPU
  backend, which leaves the kernel in Numba's disk cache for the parent.
- :func:`compile_nvcc` (no GPU needed): renders the candidate's template
  and runs ``nvcc -arch=sm_XX -cubin -Xptxas -v``; registers, spills and
  stack come from ptxas' report (:func:`parse_ptxas`).

Both return a dict: ``ok``, ``registers``, ``local_bytes``,
``spill_stores``, ``spill_loads`` (what is known), ``seconds``, and
``error`` when the compile failed.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time

from smalltc.backends import get
from smalltc.backends.cuda import family_of
from smalltc.backends.cuda.family import DEFAULT_DEVICE
from smalltc.backends.cuda.runtime import render

__all__ = ["compile_cuda", "compile_cpu", "compile_nvcc", "compile_none", "parse_ptxas",
           "nvcc_resources", "COMPILERS"]

_PTXAS_FN = re.compile(r"Compiling entry function '(\w+)'")
_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                          r"(\d+) bytes spill loads")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> dict:
    """Per entry function: registers, stack, spill stores/loads, static smem, from ``-Xptxas -v``.

    Examples
    --------
    >>> log = '''ptxas info    : Compiling entry function 'stc_k' for 'sm_90'
    ... ptxas info    : Function properties for stc_k
    ...     16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
    ... ptxas info    : Used 40 registers, used 1 barriers, 380 bytes cmem[0]'''
    >>> parse_ptxas(log)["stc_k"]
    {'stack_bytes': 16, 'spill_stores': 8, 'spill_loads': 8, 'registers': 40, 'smem_static': 0}
    """
    out, cur = {}, None
    for line in log.splitlines():
        m = _PTXAS_FN.search(line)
        if m:
            cur = out.setdefault(m.group(1), dict(stack_bytes=0, spill_stores=0, spill_loads=0))
            continue
        m = re.search(r"Function properties for (\w+)", line)
        if m:
            cur = out.setdefault(m.group(1), dict(stack_bytes=0, spill_stores=0, spill_loads=0))
            continue
        if cur is None:
            continue
        m = _PTXAS_SPILL.search(line)
        if m:
            cur.update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)),
                       spill_loads=int(m.group(3)))
        m = _PTXAS_USED.search(line)
        if m:
            cur["registers"] = int(m.group(1))
            sm = _PTXAS_SMEM.search(line)
            cur["smem_static"] = int(sm.group(1)) if sm else 0
    return out


def nvcc_resources(source: str, entry: str, arch: str = "sm_90", nvcc: str | None = None,
                   options=("-std=c++17",)) -> dict:
    """Compile ``source`` with nvcc for ``arch`` and return ptxas' resources of ``entry``.

    Raises RuntimeError (with the log) when nvcc fails or does not report ``entry``.
    """
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("nvcc is not on the PATH")
    with tempfile.TemporaryDirectory(prefix="smalltc-tune-") as tmp:
        src = os.path.join(tmp, "k.cu")
        with open(src, "w", encoding="utf-8") as f:
            f.write(source)
        cmd = [nvcc, f"-arch={arch}", "-cubin", "-Xptxas", "-v", *options, "-o",
               os.path.join(tmp, "k.cubin"), src]
        res = subprocess.run(cmd, capture_output=True, text=True)
    log = res.stdout + res.stderr
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed ({' '.join(cmd)}):\n{log}")
    found = parse_ptxas(log).get(entry)
    if found is None or "registers" not in found:
        raise RuntimeError(f"ptxas reported nothing for {entry}:\n{log}")
    found["local_bytes"] = found["stack_bytes"]
    return found


def _entry(spec):
    return "stc_tune_" + re.sub(r"[^0-9a-zA-Z]+", "_", str(spec.op))


def compile_nvcc(spec, params, arch="sm_90", smem_optin=227 * 1024):
    """Worker: render the candidate and compile it with nvcc; its resources (no GPU)."""
    t0 = time.perf_counter()
    fam = family_of(spec)
    ctx = None if fam is None else fam.context(spec, params,
                                               dict(DEFAULT_DEVICE, smem_optin=smem_optin))
    if ctx is None:
        return dict(ok=False, error="the family's context rejects these parameters",
                    seconds=time.perf_counter() - t0)
    template = fam.template(ctx)
    entry = _entry(spec)
    try:
        res = nvcc_resources(render(template, dict(ctx, entry=entry)), entry, arch)
    except Exception as err:     # reported as a failed compile, never timed
        return dict(ok=False, error=str(err)[:2000], seconds=time.perf_counter() - t0)
    return dict(ok=True, seconds=time.perf_counter() - t0, **res)


def compile_cuda(spec, params, arch=None, smem_optin=None):
    """Worker (GPU): build the candidate through the CUDA backend; the kernel's attributes.

    ``params`` None builds the heuristic's kernel. ``arch`` and
    ``smem_optin`` are the device's (taken from the device, ignored here).
    """
    t0 = time.perf_counter()
    try:
        ex = get("cuda").build(spec, params="heuristic" if params is None else params)
    except Exception as err:     # SmalltcCompileError, unfitting params: never timed
        return dict(ok=False, error=str(err)[:2000], seconds=time.perf_counter() - t0)
    p = ex.params
    return dict(ok=True, registers=p.get("registers"), local_bytes=p.get("local_bytes", 0),
                seconds=time.perf_counter() - t0)


def compile_cpu(spec, params, arch=None, smem_optin=None):
    """Worker (CPU): build the candidate through the CPU backend (``params`` None: the
    heuristic); the compiled kernel lands in Numba's disk cache for the parent to load."""
    t0 = time.perf_counter()
    try:
        ex = get("cpu").build(spec, params="heuristic" if params is None else params)
    except Exception as err:     # unfitting params, a compile failure: never timed
        return dict(ok=False, error=str(err)[:2000], seconds=time.perf_counter() - t0)
    return dict(ok=True, compile_s=ex.compile_s, seconds=time.perf_counter() - t0)


def compile_none(spec, params, arch=None, smem_optin=None):
    """Worker that compiles nothing (a dry run without nvcc): no resources known."""
    return dict(ok=True, seconds=0.0)


COMPILERS = {"cuda": compile_cuda, "cpu": compile_cpu, "nvcc": compile_nvcc,
             "none": compile_none}
