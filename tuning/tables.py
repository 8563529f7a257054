"""Tuning tables: versioned JSON, one file per architecture and dtype, and the runtime lookup.

A table (``tuning/tables/sm90-float64.json``) is only ever written by a
tuning run on a GPU (``smalltc tune``). Format, ``schema`` 1::

    {"schema": 1, "arch": "sm90", "dtype": "float64",
     "device": {"name": "NVIDIA H100 80GB HBM3", "cc": "90", "sms": 132, "smem_optin": 232448},
     "versions": {"cuda_runtime": 13000, "cuda_driver": 13000, "nvrtc": "13.0",
                  "cupy": "13.6.0", "smalltc": "0.1.0"},
     "date": "2026-11-21T16:00:00Z", "bandwidth": 3.3e12, "peak": 6.0e13,
     "runs": [{"op": "gemm", "seconds": 512.3, "sizes": 31, "generated": ...,
               "pruned": ..., "pruned_before_compile": ..., "compiled": ..., "failed": ...,
               "wrong": ..., "timed": ..., "keys": [...]}],
     "entries": {
       "gemm/nn/m8n8k8": {
         "op": "gemm", "family": "layout", "spec": {... sizes, batch ...},
         "params": {"dim_x": 8, "dim_y": 4, "per_block": 4},
         "time_s": 1.2e-4, "fraction_of_pmax": 0.82, "speedup_vs_heuristic": 1.07,
         "runner_up": {"params": {...}, "time_s": 1.25e-4},
         "heuristic": {"params": {...}, "time_s": 1.28e-4},
         "kernel": {"threads": 128, "smem_bytes": 4096, "registers": 40, "local_bytes": 0}}}}

Counts: ``generated = pruned + timed`` (every variant not timed has a
reason: before compiling, a failed compile, spills or registers after it, a
wrong result); ``compiled`` counts the compiles that succeeded.

Lookup for a spec (:meth:`Table.lookup`): the entry of its exact size key;
else the nearest entry of the same variant (same op, dimension, transposes,
shared operands; :func:`.keys.distance`, at most :data:`MAX_DISTANCE` of the family),
its parameters carried over to the new size (:func:`adapt`: the same
outputs per thread and threads per block for the GEMM, the same threads per
block and register blocking ``rb`` for the action, the same outputs per block for
the assembly and kernel (9)) and checked against the kernel's constraints; else None, and
the CUDA backend uses its measured heuristic.

The runtime hook (:func:`install`) hands :func:`runtime_lookup` to
``smalltc.backends._cuda_params.set_table_lookup``. Its answer carries
``"_source": "table-exact"`` or ``"table-nearest"`` (and ``"_entry"``, the
key used) next to the parameters, for the plan to record.
"""
from __future__ import annotations

import functools
import json
import logging
import math
import os
import pathlib

from smalltc.spec import ActionSpec, AssemblySpec, ContractSpec, GemmSpec
from .keys import distance, size_key, split_key
from .space import OPTIONAL_PARAMS, PARAMS, SM_THREADS, MAX_THREADS, ctx_for, family, layout_axes

__all__ = ["SCHEMA", "MAX_DISTANCE", "Table", "table_name", "tables_dir", "load", "validate",
           "new_table", "add_results", "demote", "save", "adapt", "runtime_lookup", "install",
           "uninstall", "describe", "spec_from_dict", "find_table"]

log = logging.getLogger("smalltc")

SCHEMA = 1
#: nearest-neighbour cut-off per family: sum over extents of |log2 ratio| (2 = a factor
#: 4 in one extent). GEMM/layout kernels take a factor 2 at most: on the H100 (tuned
#: against untuned bench, 2026-11-21) square-GEMM entries carried 4x along one extent
#: (m=4 n=8 k=16, m=8 n=16 k=4 from m=n=k=8) lost 2-14% in 5 of 9 cases; the action
#: (ncomp=3 from the ncomp=1 entry) and assembly entries carried at distance <= 2 won.
MAX_DISTANCE = {"layout": 1.0, "contract9": 2.0, "action": 2.0, "assembly": 2.0}
_SPECS = {"gemm": GemmSpec, "contract": ContractSpec, "action": ActionSpec,
          "assembly": AssemblySpec}
_TOP = ("schema", "arch", "dtype", "device", "versions", "date", "entries")
_ENTRY = ("op", "spec", "params", "time_s", "fraction_of_pmax", "runner_up")


def table_name(cc, dtype) -> str:
    """``sm90-float64.json`` for compute capability ``"90"`` and float64."""
    return f"sm{cc}-{dtype}.json"


def tables_dir() -> pathlib.Path:
    """The tables shipped with the package (``smalltc/tuning/tables``)."""
    return pathlib.Path(__file__).resolve().parent / "tables"


def spec_from_dict(d: dict):
    """The spec an entry was tuned for (``d`` holds ``op`` and the spec's fields)."""
    d = dict(d)
    cls = _SPECS[d.pop("op")]
    return cls(**d)


def validate(table: dict, where="table") -> dict:
    """Raise ValueError naming what is wrong with ``table``; return it when it is fine."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}: not a JSON object")
    if table.get("schema") != SCHEMA:
        raise ValueError(f"{where}: schema {table.get('schema')!r}, this smalltc reads "
                         f"schema {SCHEMA}")
    missing = [k for k in _TOP if k not in table]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    if table["dtype"] not in ("float32", "float64"):
        raise ValueError(f"{where}: dtype {table['dtype']!r}")
    if table["arch"] != f"sm{table['device'].get('cc')}":
        raise ValueError(f"{where}: arch {table['arch']!r} but device cc "
                         f"{table['device'].get('cc')!r}")
    for key, e in table["entries"].items():
        split_key(key)
        miss = [k for k in _ENTRY if k not in e]
        if miss:
            raise ValueError(f"{where}: entry {key!r} lacks {', '.join(miss)}")
        spec = spec_from_dict(e["spec"])
        if size_key(spec) != key:
            raise ValueError(f"{where}: entry {key!r} holds the spec of {size_key(spec)!r}")
        if spec.dtype != table["dtype"]:
            raise ValueError(f"{where}: entry {key!r} is {spec.dtype}, the table "
                             f"{table['dtype']}")
        fam = family(spec)
        optional = set(OPTIONAL_PARAMS.get(fam, ())) if fam else set()
        if fam is None or not set(PARAMS[fam]) - optional <= set(e["params"]) <= set(PARAMS[fam]):
            raise ValueError(f"{where}: entry {key!r} params {sorted(e['params'])}, expected "
                             f"{sorted(PARAMS[fam]) if fam else 'none'}")
        if not (isinstance(e["time_s"], (int, float)) and e["time_s"] > 0):
            raise ValueError(f"{where}: entry {key!r} time_s {e['time_s']!r}")
    return table


def new_table(info: dict, dtype: str, dry_run=False) -> dict:
    """An empty table for the device ``info`` (from a device's ``info()``)."""
    import smalltc
    from .measure import now_iso
    t = dict(schema=SCHEMA, arch=f"sm{info['cc']}", dtype=dtype,
             device={k: info.get(k) for k in ("name", "cc", "sms", "smem_optin")},
             versions=dict(cuda_runtime=info.get("cuda_runtime"),
                           cuda_driver=info.get("cuda_driver"), nvrtc=info.get("nvrtc"),
                           cupy=info.get("cupy"), smalltc=smalltc.__version__),
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


def load(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return validate(json.load(f), str(path))


# ----------------------------------------------------------------------------
# carrying parameters to a neighbouring size

def _outputs_per_item(spec):
    if isinstance(spec, AssemblySpec):
        return spec.nd ** (2 * spec.dim - 1) if spec.dim > 1 else spec.nd ** 2
    return spec.k * spec.i * spec.l * spec.j          # kernel (9)


def _first_valid(spec, params, smem_optin, shrink="per_block"):
    """``params``, or with ``shrink`` lowered until the kernel accepts them; None if never."""
    p = dict(params)
    while p[shrink] >= 1:
        if ctx_for(spec, p, smem_optin) is not None:
            return p
        p[shrink] -= 1
    return None


def adapt(spec, entry_spec, params, smem_optin=227 * 1024):
    """Parameters tuned for ``entry_spec`` carried over to ``spec`` (same family), or None."""
    fam = family(spec)
    if fam is None or fam != family(entry_spec):
        return None
    if spec == entry_spec.with_batch(spec.batch) and ctx_for(spec, params, smem_optin):
        return {**OPTIONAL_PARAMS.get(fam, {}), **params}     # absent optional = its default
    if fam == "layout":
        _, f0, s0 = layout_axes(entry_spec)
        _, f1, s1 = layout_axes(spec)
        tf = min(math.ceil(f0 / params["dim_x"]), f1)
        ts = min(math.ceil(s0 / params["dim_y"]), s1)
        dx, dy = math.ceil(f1 / tf), math.ceil(s1 / ts)
        threads = params["dim_x"] * params["dim_y"] * params["per_block"]
        nb = max(1, min(round(threads / (dx * dy)), MAX_THREADS // (dx * dy)))
        if dx * dy > MAX_THREADS:
            return None
        return _first_valid(spec, dict(dim_x=dx, dim_y=dy, per_block=nb), smem_optin)
    if fam == "action":
        line0 = bool(params.get("line", 0)) and entry_spec.dim == 3
        line = line0 and spec.dim == 3        # the line form is 3D only

        def tpi(s, rb, line):                 # threads per item (action_ctx's rules)
            T = max(s.nd, s.nq)
            if line:
                return (T | 1) * T
            tb = -(-T // rb)
            return T * tb if s.dim == 3 else tb
        rb0 = 1 if line0 else params.get("rb", OPTIONAL_PARAMS["action"]["rb"])
        rb = rb0 if spec.dim > 1 else 1       # 1D has no register blocking
        t1 = tpi(spec, rb, line)
        if t1 > MAX_THREADS:
            return None
        ne = max(1, min(round(params["per_block"] * tpi(entry_spec, rb0, line0) / t1),
                        MAX_THREADS // t1))
        mb = params.get("min_blocks", 0)
        while mb and mb * ne * t1 > SM_THREADS:
            mb -= 1
        pf = int(bool(params.get("prefetch", 0))) if line else 0
        return _first_valid(spec, dict(per_block=ne, min_blocks=mb, rb=rb, line=int(line),
                                       prefetch=pf), smem_optin)
    # assembly, kernel (9): the same outputs per block (and the assembly's final-stage form)
    nb = max(1, round(params["per_block"] * _outputs_per_item(entry_spec)
                      / _outputs_per_item(spec)))
    extra = {k: params.get(k, v) for k, v in OPTIONAL_PARAMS.get(fam, {}).items()}
    if extra.get("rows") and (spec.dim != 3 or spec.nd ** 3 * extra["rows"] > MAX_THREADS):
        extra["rows"] = 0                     # the rows form does not fit: the flat one
    return _first_valid(spec, dict(per_block=nb, **extra), smem_optin)


# ----------------------------------------------------------------------------
# the table object and the runtime hook

class Table:
    """A loaded table with exact and nearest lookup.

    Examples
    --------
    >>> t = Table(dict(new_table(dict(cc="90"), "float64"), entries={}))
    >>> from smalltc.spec import GemmSpec
    >>> t.lookup(GemmSpec(batch=1, m=4, n=4, k=4, dtype="float64")) is None
    True
    """

    def __init__(self, data: dict, path=None):
        self.data, self.path = data, path
        self.entries = data["entries"]
        self.smem_optin = data["device"].get("smem_optin") or 227 * 1024

    def lookup(self, spec, max_distance=None):
        """``(params, "exact" | "nearest", entry key)`` for ``spec``, or None.

        ``max_distance``: the nearest-entry cut-off (default: the family's
        :data:`MAX_DISTANCE`).
        """
        if spec.dtype != self.data["dtype"] or family(spec) is None:
            return None
        if max_distance is None:
            max_distance = MAX_DISTANCE[family(spec)]
        key = size_key(spec)
        e = self.entries.get(key)
        if e is not None:
            p = adapt(spec, spec_from_dict(e["spec"]), e["params"], self.smem_optin)
            if p is not None:
                return p, "exact", key
        near = sorted((distance(key, k), k) for k in self.entries if k != key)
        for d, k in near:
            if d > max_distance:
                break
            e = self.entries[k]
            p = adapt(spec, spec_from_dict(e["spec"]), e["params"], self.smem_optin)
            if p is not None:
                return p, "nearest", k
        return None


def _dirs():
    extra = os.environ.get("SMALLTC_TUNING_TABLES", "")
    return [pathlib.Path(d) for d in extra.split(os.pathsep) if d] + [tables_dir()]


def find_table(cc, dtype):
    """The path of the table for ``cc`` and ``dtype`` (``$SMALLTC_TUNING_TABLES`` first)."""
    for d in _dirs():
        p = d / table_name(cc, dtype)
        if p.is_file():
            return p
    return None


@functools.lru_cache(maxsize=None)
def _table_for(cc, dtype):
    path = find_table(cc, dtype)
    if path is None:
        return None
    try:
        data = load(path)
    except (OSError, ValueError) as err:
        log.warning("smalltc: ignoring tuning table %s: %s", path, err)
        return None
    if data.get("dry_run"):
        log.warning("smalltc: ignoring tuning table %s: written by a dry run", path)
        return None
    return Table(data, path)


def describe(spec, cc):
    """What the runtime lookup finds for ``spec`` on ``cc``: a dict (match, entry, params, table)."""
    t = _table_for(str(cc), spec.dtype)
    hit = t.lookup(spec) if t is not None else None
    if hit is None:
        return dict(match=None, entry=None, params=None, table=str(t.path) if t else None)
    params, how, key = hit
    return dict(match=how, entry=key, params=params, table=str(t.path))


def runtime_lookup(spec, cc):
    """``set_table_lookup`` callable: parameters (+ ``_source``, ``_entry``) or None."""
    if os.environ.get("SMALLTC_TUNING", "on").lower() in ("0", "off", "no", "false"):
        return None
    t = _table_for(str(cc), spec.dtype)
    hit = t.lookup(spec) if t is not None else None
    if hit is None:
        return None
    params, how, key = hit
    return dict(params, _source=f"table-{how}", _entry=key)


def install():
    """Make the CUDA backend consult the tables (:func:`runtime_lookup`)."""
    from smalltc.backends import _cuda_params as P
    P.set_table_lookup(runtime_lookup)


def uninstall():
    """Back to the heuristic alone; forget loaded tables."""
    from smalltc.backends import _cuda_params as P
    if getattr(P, "_LOOKUP", None) is runtime_lookup:
        P.set_table_lookup(None)
    _table_for.cache_clear()
