"""Tuning tables, write side: a search's results into a table file and its evidence
(``smalltc tune``).

Reading tables (find, load, validate, the runtime lookup with nearest sizes) is
:mod:`smalltc.tables`, in the core; this module imports it and adds what only the
tuner does. A table is only ever written by a tuning run on a GPU (or a CPU, for
the CPU backend). The tuner works on a *record* of a table (schema 1, documented
in :mod:`smalltc.tables`): each entry with, next to its ``params``, how it was
found::

    "gemm/nn/m8n8k8": {"op": "gemm", "family": "layout", "spec": {... sizes, batch ...},
        "params": {"dim_x": 8, "dim_y": 4, "per_block": 4},
        "time_s": 1.2e-4, "fraction_of_pmax": 0.82, "speedup_vs_heuristic": 1.07,
        "runner_up": {"params": {...}, "time_s": 1.25e-4},
        "heuristic": {"params": {...}, "time_s": 1.28e-4},
        "kernel": {"threads": 128, "smem_bytes": 4096, "registers": 40, "local_bytes": 0}}

and the record's ``runs`` count, per search: ``generated = pruned + timed`` (every
variant not timed has a reason: before compiling, a failed compile, spills or
registers after it, a wrong result); ``compiled`` counts the compiles that
succeeded.

:func:`save` writes two files: the table the backends read (schema 2: size key ->
``[spec, params]``, :func:`compact`) and the record itself, gzipped, as the
table's evidence (:func:`evidence_dir`: ``benchmarks/tuning/`` of the source tree
for the package's own tables). :func:`load` gives the record back: the evidence
where it matches the table, else the table's entries without their evidence.

Files are named by :func:`table_name`: the device model's table by default
(``sm90-nvidia-h200-float64.json``), the architecture's with ``arch=True``; a CPU's
table is its ISA's (``cpu-avx512-float64.json``), which the CPU backend reads.
"""
from __future__ import annotations

import gzip
import json
import os
import pathlib

import smalltc
from smalltc import tables as core
from smalltc.backends.cuda import family_of as cuda_family_of

from .measure import now_iso

__all__ = ["table_name", "load", "validate", "new_table", "add_results", "demote", "save",
           "compact", "evidence_dir", "evidence_path"]

#: the schema of the tuner's record (:mod:`smalltc.tables` reads it as a table too)
RECORD = 1
#: the table-level fields a compact table keeps (the rest stays in the evidence)
_KEEP = ("arch", "dtype", "device", "versions", "date", "dry_run")


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
        from smalltc.backends.cpu import family_of as cpu_family_of  # optional: loads Numba
        return cpu_family_of
    return cuda_family_of


def validate(table: dict, where="table") -> dict:
    """:func:`smalltc.tables.validate` with each entry's parameters checked against its family's."""
    return core.validate(table, where, family_of(table) if isinstance(table, dict) else None)


def evidence_dir(table_dir) -> pathlib.Path:
    """Where the evidence of the tables in ``table_dir`` goes: ``benchmarks/tuning`` of the
    source tree for the package's own tables (``tuning/tables`` of a checkout with a
    ``benchmarks`` folder), else the folder ``evidence`` inside ``table_dir``."""
    d = pathlib.Path(table_dir).resolve()
    if d == core.shipped_dir().resolve() and (d.parents[1] / "benchmarks").is_dir():
        return d.parents[1] / "benchmarks" / "tuning"
    return d / "evidence"


def evidence_path(path) -> pathlib.Path:
    """The evidence file of the table at ``path``: ``<evidence_dir>/<name>.gz``."""
    path = pathlib.Path(path)
    return evidence_dir(path.parent) / (path.name + ".gz")


def _read(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _expand(table: dict) -> dict:
    """A record of a compact table: its entries without evidence (op, spec, params)."""
    rec = {k: v for k, v in table.items() if k != "entries"}
    rec.update(schema=RECORD, runs=[], entries={})
    for key, (spec, params) in core.entries(table).items():
        rec["entries"][key] = dict(op=spec.op, spec=spec.as_dict(), params=params)
    return rec


def load(path, evidence=None) -> dict:
    """The record of the table at ``path`` (validated with the families' parameter names):
    its evidence (``evidence``, default :func:`evidence_path`) for the entries whose spec
    and parameters the table still holds, the table's own entries for the rest."""
    table = validate(_read(path), str(path))
    if table["schema"] == RECORD:                 # a table written as a record
        return table
    rec = _expand(table)
    ev = pathlib.Path(evidence) if evidence else evidence_path(path)
    if ev.is_file():
        old = validate(_read(ev), str(ev))
        have = core.entries(old, str(ev))
        for key, (spec, params) in core.entries(table, str(path)).items():
            if key in have and have[key] == (spec, params):
                rec["entries"][key] = old["entries"][key]
        rec = dict({k: v for k, v in old.items() if k != "entries"}, **rec)
        rec["runs"] = old.get("runs", [])
    return rec


def new_table(info: dict, dtype: str, dry_run=False) -> dict:
    """An empty table for the device ``info`` (from a device's ``info()``)."""
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
    t = dict(schema=RECORD, arch=arch, dtype=dtype, device=device, versions=versions,
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


def compact(record: dict) -> dict:
    """The table the backends read (schema 2) of a record: size key -> ``[spec, params]``
    (:func:`smalltc.tables.spec_dict`), the device and versions; no evidence.

    >>> from smalltc.spec import GemmSpec
    >>> s = GemmSpec(batch=4096, m=8, n=8, k=8, dtype="float64")
    >>> rec = dict(schema=1, arch="sm90", dtype="float64", device={"cc": "90"}, versions={},
    ...            date="2026-11-21", runs=[], entries={s.size_key: dict(op="gemm",
    ...            spec=s.as_dict(), params={"per_block": 4}, time_s=1e-4)})
    >>> compact(rec)["entries"]
    {'gemm/nn/m8n8k8': [{'op': 'gemm', 'm': 8, 'n': 8, 'k': 8}, {'per_block': 4}]}
    """
    out = dict(schema=core.SCHEMA, **{k: record[k] for k in _KEEP if k in record})
    out["entries"] = {key: [core.spec_dict(spec), params] for key, (spec, params)
                      in sorted(core.entries(record).items())}
    return out


def _dumps(table: dict) -> str:
    """JSON with one line an entry."""
    head = {k: v for k, v in table.items() if k != "entries"}
    lines = [f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}"
             for k, v in table["entries"].items()]
    text = json.dumps(head, indent=1)[:-2]
    return text + ',\n "entries": {\n' + ",\n".join(lines) + "}}\n"


def _write(path, text):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    if path.suffix == ".gz":
        with gzip.GzipFile(tmp, "wb", mtime=0) as f:
            f.write(text.encode("utf-8"))
    else:
        tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def save(record: dict, path, evidence=None) -> None:
    """Write the table of ``record`` to ``path`` (:func:`compact`) and the record to
    ``evidence`` (default :func:`evidence_path`)."""
    validate(record, str(path))
    table = validate(compact(record), str(path))
    _write(path, _dumps(table))
    _write(pathlib.Path(evidence) if evidence else evidence_path(path),
           json.dumps(record, separators=(",", ":")) + "\n")
