"""``smalltc info``: what this installation can do on this machine.

Examples
--------
>>> from smalltc.info import collect
>>> info = collect()
>>> info["version"] == __import__("smalltc").__version__
True
>>> "reference" in info["backends"]
True
"""
from __future__ import annotations

import collections
import json
import os
import platform

import numpy as np

from . import __version__, backends
from . import tables as T
from ._arrays import cupy_or_none, gpu_available
from .aot import cache_report
from .roofline import _cpu_model
from .spec import QFUNCS

__all__ = ["collect", "add_arguments", "run", "entry_kind"]


def _cpu():
    cpu = {"name": _cpu_model(), "cores": os.cpu_count()}
    try:                 # Numba's LLVM, Numba and the CPU backend: loaded by the probe only
        import llvmlite.binding as llvm
        cpu["llvm_target"] = llvm.get_host_cpu_name()
        feats = llvm.get_host_cpu_features()
        cpu["simd"] = [f for f in ("avx2", "avx512f", "neon", "sve") if feats.get(f)]
    except Exception:  # llvmlite missing or too old
        pass
    try:                 # what the CPU backend compiles for (Numba's target): its ISA
        from .backends.cpu.target import host  # optional: Numba
        t = host()
        cpu.update(isa=t.isa, vector_bits=t.vector_bits or t.vector_bytes * 8,
                   max_vector_bits=t.vector_bytes * 8, numba_target=t.llvm_cpu,
                   table_arch=t.arch)
    except Exception:    # numba missing
        pass
    try:                 # the kernels' threads and the BLAS threads beside them
        import numba

        from .backends.cpu.threads import blas_policy, blas_threads  # optional: Numba
        cpu["threads"] = numba.get_num_threads()
        cpu["blas_threads"] = {os.path.basename(k): v for k, v in blas_threads().items()}
        cpu["blas_limit"] = blas_policy(os.environ, cpu["threads"])
    except Exception:
        pass
    return cpu


def _gpus():
    if not gpu_available():
        cp = cupy_or_none()
        return [], ("cupy not installed" if cp is None else "cupy installed, no CUDA device")
    cp = cupy_or_none()
    out = []
    for i in range(cp.cuda.runtime.getDeviceCount()):
        prop = cp.cuda.runtime.getDeviceProperties(i)
        name = prop["name"]
        out.append({"id": i, "name": name.decode() if isinstance(name, bytes) else name,
                    "cc": f"{prop['major']}.{prop['minor']}",
                    "memory_GiB": round(prop["totalGlobalMem"] / 2**30, 1),
                    "sms": prop["multiProcessorCount"]})
    return out, f"cupy {cp.__version__}"


def entry_kind(key):
    """What ``smalltc info`` counts a table entry as: its op and, for the operator
    family's other instances, the instance (``qfunc``, collocated ``+co``, float32 point
    data ``+q32``, the vertex geometry ``+vx``).

    >>> [entry_kind(k) for k in ("gemm/nn+beta/m8n8k8", "action/3d/nd4nq5c1",
    ...                          "diffusion/action/3d/nd5nq5c1+co",
    ...                          "helmholtz/mass_apply/3d/nd4nq6c1+q32")]
    ['gemm', 'action', 'diffusion/action+co', 'helmholtz/mass_apply+q32']
    """
    parts = key.split("/")
    pre = ""
    if parts[0] in QFUNCS and len(parts) > 2:
        pre, parts = parts[0] + "/", parts[1:]
    flags = parts[-1].partition("+")[2] if len(parts) > 1 else ""
    return pre + parts[0].split("+")[0] + ("+" + flags if flags else "")


def _tables():
    """The tuning tables the backends would read: file, device, date, entries per op,
    and which device of this machine reads it (a GPU: its own model's table, or its
    architecture's; the CPU: its ISA's, ``cpu-avx512-float64.json``)."""
    dirs = T.table_dirs()
    out, seen = [], set()
    for d in dirs:
        for path in sorted(d.glob("*.json")) if d.is_dir() else []:
            if path.name in seen:                  # an earlier folder shadows it
                continue
            seen.add(path.name)
            row = {"file": path.name, "folder": str(d)}
            try:
                data = T.load(path)
                row["arch"] = data.get("arch")
                ops = collections.Counter(entry_kind(k) for k in data["entries"])
                row.update(device=data["device"].get("name"), date=data.get("date"),
                           dtype=data["dtype"], entries=dict(sorted(ops.items())),
                           dry_run=bool(data.get("dry_run")))
            except Exception as err:               # a broken table is ignored at run time
                row["error"] = str(err)
            out.append(row)
    if not T.enabled():
        for row in out:
            row["disabled"] = "SMALLTC_TUNING=off"
    return out


def collect(kernels: bool = False) -> dict:
    """Everything ``smalltc info`` reports; ``kernels``: list the cached CPU kernels too."""
    be = {}
    for name in backends.names():
        b = backends.get(name)
        be[name] = {"available": bool(b.available()), "arrays": list(b.array_modules),
                    "detail": b.describe()}
    gpus, gpu_note = _gpus()
    tables = _tables()
    cpu = _cpu()
    for row in tables:                   # which GPU here reads it: its model's, its arch's
        row["used_by"] = [g["id"] for g in gpus if "dtype" in row and row["file"] in T.table_names(
            "sm" + g["cc"].replace(".", ""), g["name"], row["dtype"])]
        if "dtype" in row and row.get("arch") == cpu.get("table_arch"):
            row["used_by"].append("cpu")
    vers = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("numba", "jinja2", "cupy"):
        try:
            vers[mod] = __import__(mod).__version__
        except Exception:
            pass
    return {"version": __version__, "versions": vers, "backends": be,
            "cpu": cpu, "gpus": gpus, "gpu_note": gpu_note, "tuning_tables": tables,
            "caches": cache_report(kernels)}


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--kernels", action="store_true",
                        help="list the CPU kernels in the disk cache")


def run(args) -> int:
    info = collect(kernels=getattr(args, "kernels", False))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"smalltc {info['version']}  ("
          + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) + ")")
    cpu = info["cpu"]
    print(f"CPU: {cpu['name']}, {cpu['cores']} cores"
          + (f", LLVM target {cpu['llvm_target']}" if "llvm_target" in cpu else "")
          + (f", SIMD {'/'.join(cpu['simd'])}" if cpu.get("simd") else ""))
    if "isa" in cpu:
        print(f"CPU kernels: {cpu['isa']} ({cpu['vector_bits']}-bit vectors by default, "
              f"{cpu['max_vector_bits']} at most), Numba target {cpu['numba_target']}; tables "
              f"{cpu['table_arch']}-<dtype>.json")
    if "threads" in cpu:
        blas = ", ".join(f"{k} {v}" for k, v in cpu["blas_threads"].items()) or "none loaded"
        lim = cpu["blas_limit"]
        print(f"CPU threads: {cpu['threads']} (SMALLTC_NUM_THREADS); BLAS threads now: {blas}; "
              + (f"set to {lim} once a CPU kernel is built (SMALLTC_BLAS_THREADS)"
                 if lim is not None else "left alone"))
    if info["gpus"]:
        for g in info["gpus"]:
            print(f"GPU {g['id']}: {g['name']} (cc {g['cc']}, {g['sms']} SMs, "
                  f"{g['memory_GiB']} GiB)")
    else:
        print(f"GPU: none ({info['gpu_note']})")
    print("backends:")
    for name, b in info["backends"].items():
        state = "available" if b["available"] else "unavailable"
        print(f"  {name:10s} {state:12s} arrays: {', '.join(b['arrays'])}  {b['detail']}")
    tables = info["tuning_tables"]
    print("tuning tables:" + ("" if tables else " none (the backends use their heuristics)"))
    for t in tables:
        if "error" in t:
            print(f"  {t['file']:20s} ignored: {t['error']}")
            continue
        ents = ", ".join(f"{op} {n}" for op, n in t["entries"].items())
        note = "  [dry run: never used]" if t["dry_run"] else ""
        readers = [f"GPU {u}" for u in t["used_by"] if u != "cpu"] + \
            ["the CPU backend"] * ("cpu" in t["used_by"])
        if not t["dry_run"]:
            note += (f"  [read by {', '.join(readers)}]" if readers
                     else "  [not for the devices here]")
        note += f"  [{t['disabled']}]" if t.get("disabled") else ""
        print(f"  {t['file']:20s} {t['device']}, {t['date']}: {ents}{note}")
    _print_caches(info["caches"])
    return 0


def _print_caches(c):
    """The kernel caches' lines (what ``smalltc precompile`` fills)."""
    def size(n):
        return f"{n / 2**20:.1f} MiB"
    cpu, cuda = c["cpu"], c["cuda"]
    print("kernel caches (smalltc precompile fills them):")
    print(f"  cpu   {cpu['dir']}: {cpu['compiled']} kernels compiled by Numba"
          + (f" ({cpu['kernels'] - cpu['compiled']} rendered, not compiled)"
             if cpu["kernels"] > cpu["compiled"] else "")
          + f", {size(cpu['bytes'])}")
    for name in cpu.get("names", []):
        print(f"        {name}")
    print(f"  cuda  {cuda['dir']}: {cuda['modules']} compiled modules (CuPy), "
          f"{size(cuda['bytes'])}" + ("  [CUPY_CACHE_IN_MEMORY: not kept on disk]"
                                      if cuda.get("in_memory") else ""))
