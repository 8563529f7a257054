"""Tuning tables, write side: a search's results into a table file (``smalltc tune``).

Reading tables (find, load, validate, the runtime lookup with nearest sizes) is
:mod:`smalltc.tables`, in the core; this module imports it and adds what only the
tuner does. A table is only ever written by a tuning run on a GPU. The format
(``schema`` 1) is documented in :mod:`smalltc.tables`; an entry records, next to
its ``params``, how it was found::

    "gemm/nn/m8n8k8": {"op": "gemm", "family": "layout", "spec": {... sizes, batch ...},
        "params": {"dim_x": 8, "dim_y": 4, "per_block": 4},
        "time_s": 1.2e-4, "fraction_of_pmax": 0.82, "speedup_vs_heuristic": 1.07,
        "runner_up": {"params": {...}, "time_s": 1.25e-4},
        "heuristic": {"params": {...}, "time_s": 1.28e-4},
        "kernel": {"threads": 128, "smem_bytes": 4096, "registers": 40, "local_bytes": 0}}

and the table's ``runs`` count, per search: ``generated = pruned + timed`` (every
variant not timed has a reason: before compiling, a failed compile, spills or
registers after it, a wrong result); ``compiled`` counts the compiles that
succeeded.

Files are named by :func:`table_name`: the device model's table by default
(``sm90-nvidia-h200-float64.json``), the architecture's with ``arch=True``; a CPU's
table is its ISA's (``cpu-avx512-float64.json``), which the CPU backend reads.
"""
from __future__ import annotations

import json
import os
import pathlib

from smalltc import tables as core
from smalltc.backends.cuda import family_of as cuda_family_of

__all__ = ["table_name", "load", "validate", "new_table", "add_results", "demote", "save"]


def table_name(info: dict, dtype: str, arch: bool = False) -> str:
    """The file a table for device ``info`` (``name``, ``cc``) and ``dtype`` is written to:
    the device model's (``sm90-nvidia-h200-float64.json``), or with ``arch`` the
    architecture's (``sm90-float64.json``), which every device of it reads after its own.

    >>> table_name(dict(name="NVIDIA H200", cc="90"), "float64")
    'sm90-nvidia-h200-float64.json'
    >>> table_name(dict(name="NVIDIA H200", cc="90"), "float32", arch=True)
    'sm90-float32.json'
    >>> table_name(dict(name="Intel Xeon", cc=None, isa="avx2"), "float64")
    'cpu-avx2-float64.json'
    """
    if info.get("isa"):                       # a CPU (the tuner's record, or a table's device)
        return core.table_names(f"cpu-{info['isa']}", None, dtype)[0]
    names = core.table_names(f"sm{info['cc']}", None if arch else info.get("name"), dtype)
    return names[0]


def family_of(table):
    """The ``family_of`` of the backend a table is for (its ``arch``: ``cpu-*`` or ``sm*``)."""
    if str(table.get("arch", "")).startswith("cpu-"):
        from smalltc.backends.cpu import family_of as cpu_family_of
        return cpu_family_of
    return cuda_family_of


def validate(table: dict, where="table") -> dict:
    """:func:`smalltc.tables.validate` with each entry's parameters checked against its family's."""
    return core.validate(table, where, family_of(table) if isinstance(table, dict) else None)


def load(path) -> dict:
    """The table at ``path``, validated with the families' parameter names."""
    with open(path, encoding="utf-8") as f:
        return validate(json.load(f), str(path))


def new_table(info: dict, dtype: str, dry_run=False) -> dict:
    """An empty table for the device ``info`` (from a device's ``info()``)."""
    import smalltc
    from .measure import now_iso
    if str(info.get("arch", "")).startswith("cpu-"):            # a CPU: its ISA's table
        arch = info["arch"]
        device = {k: info.get(k) for k in ("name", "isa", "llvm_cpu", "vector_bytes",
                                           "vector_bits", "cores", "threads")}
        versions = dict(numba=info.get("numba"), smalltc=smalltc.__version__)
    else:
        arch = f"sm{info['cc']}"
        device = {k: info.get(k) for k in ("name", "cc", "sms", "smem_optin")}
        versions = dict(cuda_runtime=info.get("cuda_runtime"),
                        cuda_driver=info.get("cuda_driver"), nvrtc=info.get("nvrtc"),
                        cupy=info.get("cupy"), smalltc=smalltc.__version__)
    t = dict(schema=core.SCHEMA, arch=arch, dtype=dtype, device=device, versions=versions,
             date=now_iso(), bandwidth=info.get("bandwidth"), peak=info.get("peak"),
             runs=[], entries={})
    if dry_run:
        t["dry_run"] = True
    return t


def _slim(rec):
    if not rec:
        return None
    return {k: rec[k] for k in ("params", "time_s", "kernel") if k in rec}


def add_results(table: dict, results: dict, op: str, seconds: float) -> dict:
    """Merge a search's finished results into ``table`` (entries of the same key replaced)."""
    n = dict(sizes=0, generated=0, pruned=0, pruned_before_compile=0, compiled=0, failed=0,
             wrong=0, timed=0)
    for key, r in results.items():
        if not r.get("winner"):
            continue
        w, sp = r["winner"], r["space"]
        table["entries"][key] = dict(
            op=r["spec"]["op"], family=r["family"], spec=r["spec"], params=dict(w["params"]),
            time_s=w["time_s"], fraction_of_pmax=r["fraction_of_pmax"],
            speedup_vs_heuristic=r.get("speedup_vs_heuristic"),
            kept_heuristic=r.get("kept_heuristic", False),
            kernel=w.get("kernel"), runner_up=_slim(r.get("runner_up")),
            heuristic=_slim(r.get("heuristic")),
            space={k: sp.get(k) for k in ("generated", "pruned", "compiled", "timed")},
            seconds=r.get("seconds"), device=table["device"].get("name"))
        if len(w.get("form_times_s") or {}) > 1:      # GEMM beta != 0: C apart and in place (measure.forms)
            h = r.get("heuristic") or {}
            table["entries"][key]["form_times_s"] = w["form_times_s"]
            table["entries"][key]["heuristic_form_times_s"] = h.get("form_times_s")
        n["sizes"] += 1
        n["generated"] += sp.get("generated", 0)
        n["pruned"] += sum(sp.get("pruned", {}).values())
        for k in ("pruned_before_compile", "compiled", "failed", "wrong", "timed"):
            n[k] += sp.get(k, 0)
    keys = sorted(k for k, r in results.items() if r.get("winner"))
    # a search run again over the same sizes replaces its record; an earlier run that
    # covered more sizes stays, naming the ones re-decided since under "superseded"
    runs = []
    for r in table.get("runs", []):
        again = set(r.get("keys", ())) & set(keys) if r.get("op") == op else set()
        if again and again == set(r.get("keys", ())):
            continue
        if again:
            r = dict(r, superseded=sorted(set(r.get("superseded", ())) | again))
        runs.append(r)
    table["runs"] = runs
    table["runs"].append(dict(op=op, seconds=round(seconds, 1), **n, keys=keys))
    table["entries"] = dict(sorted(table["entries"].items()))
    return table


def demote(table: dict, key: str, reason: str) -> dict:
    """Give entry ``key`` the heuristic's own parameters (recorded in the entry), keeping
    what it had under ``demoted`` with ``reason``: for an entry measured slower than the
    heuristic after tuning (a table entry that loses is a bug), until it is re-tuned.

    >>> t = {"entries": {"k": {"params": {"per_block": 4}, "time_s": 1.0,
    ...      "heuristic": {"params": {"per_block": 2}, "time_s": 1.1}}}}
    >>> demote(t, "k", "slower in the bench")["params"]
    {'per_block': 2}
    >>> t["entries"]["k"]["demoted"]["params"], t["entries"]["k"]["kept_heuristic"]
    ({'per_block': 4}, True)
    """
    e = table["entries"][key]
    h = e.get("heuristic") or {}
    if not h.get("params"):
        raise ValueError(f"entry {key!r} records no heuristic parameters to fall back to")
    e["demoted"] = dict(reason=reason, params=e["params"], time_s=e.get("time_s"),
                        speedup_vs_heuristic=e.get("speedup_vs_heuristic"))
    if e.get("fraction_of_pmax") and e.get("time_s") and h.get("time_s"):
        e["fraction_of_pmax"] = e["fraction_of_pmax"] * e["time_s"] / h["time_s"]
    e["params"], e["time_s"] = dict(h["params"]), h.get("time_s", e.get("time_s"))
    e["kept_heuristic"], e["speedup_vs_heuristic"] = True, 1.0
    return e


def save(table: dict, path) -> None:
    validate(table, str(path))
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
