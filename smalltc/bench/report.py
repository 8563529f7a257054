"""The run's record: environment, JSON file, and the table on the terminal.

The JSON (``schema: "smalltc-bench/1"``) holds everything needed to redo a
plot or a comparison: the exact command line, the date, library versions,
the device and its properties, the measured bandwidth and peaks, and for
each case its sizes, bound, and per implementation the check result and
every raw time.
"""
from __future__ import annotations

import datetime as _dt
import gzip
import importlib.metadata
import json
import math
import os
import sys

import numpy as np

import smalltc

from .. import roofline
from ..info import collect
from .baselines import skipped

__all__ = ["SCHEMA", "environment", "write_json", "load", "table", "speed", "unit",
           "load_average", "format_rate", "rate_unit", "case_rows", "impl_table",
           "BASELINE_ORDER"]

SCHEMA = "smalltc-bench/1"


def _gpu_properties():
    import cupy as cp
    dev = cp.cuda.Device()
    prop = cp.cuda.runtime.getDeviceProperties(dev.id)
    keep = ("name", "major", "minor", "totalGlobalMem", "multiProcessorCount", "l2CacheSize",
            "clockRate", "memoryClockRate", "memoryBusWidth", "sharedMemPerBlockOptin",
            "regsPerMultiprocessor", "persistingL2CacheMaxSize")
    out = {}
    for k in keep:
        if k in prop:
            v = prop[k]
            out[k] = v.decode() if isinstance(v, bytes) else v
    out["id"] = dev.id
    out["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
    out["cuda_driver"] = cp.cuda.runtime.driverGetVersion()
    return out


def _cpu_properties():
    props = dict(collect()["cpu"])
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            props["l3"] = f.read().strip()
    except OSError:
        pass
    return props


def environment(kind, probes) -> dict:
    """Everything about this run except the cases."""
    info = collect()
    versions = dict(info["versions"])
    for mod in ("matplotlib", "tqdm", "torch", "llvmlite"):   # installed, not imported
        try:
            versions[mod] = importlib.metadata.version(mod)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        cfg = np.show_config(mode="dicts")
        versions["blas"] = cfg["Build Dependencies"]["blas"].get("name", "?") + " " + \
            str(cfg["Build Dependencies"]["blas"].get("version", ""))
    except Exception:
        pass
    props = _gpu_properties() if kind == "gpu" else _cpu_properties()
    return {
        "schema": SCHEMA,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
        "argv": list(sys.argv),
        "cwd": os.getcwd(),
        "smalltc": smalltc.__version__,
        "versions": versions,
        "backends": info["backends"],
        "device": {"kind": kind, "name": roofline.device_name(kind),
                   "slug": roofline.device_slug(kind), "properties": props},
        "probes": probes,
        "skipped_baselines": skipped(),
        "load_average_start": load_average(),
    }


def load_average():
    """1, 5, 15-minute load averages: other work on a CPU host skews timings."""
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def write_json(path, doc) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
        f.write("\n")
    return path


def load(path) -> dict:
    """A bench file (``bench-float64.json``, or gzipped: ``bench-float64.json.gz``)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a smalltc bench file (schema {doc.get('schema')!r}, "
                         f"expected {SCHEMA!r})")
    return doc


_PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))


def rate_unit(values, unit="DoF/s") -> tuple:
    """``(label, scale)``: one unit prefix for a column of rates (per second), the one that
    puts the largest of ``values`` in [1, 1000), so that ``v * scale`` printed with three
    significant digits (``:.3g``) shows what the figures hold; no prefix below 1.

    Examples
    --------
    >>> rate_unit([2.5e6, 3.1e7])
    ('MDoF/s', 1e-06)
    >>> rate_unit([4.2e11], "FLOP/s")
    ('GFLOP/s', 1e-09)
    >>> rate_unit([])
    ('DoF/s', 1.0)
    """
    finite = [abs(v) for v in values if v is not None and math.isfinite(v)]
    top = max(finite, default=0.0)
    for size, prefix in _PREFIXES:
        if top >= size:
            return prefix + unit, 1.0 / size
    return unit, 1.0


def format_rate(value, unit="DoF/s", digits=3) -> str:
    """A rate (per second) with ``digits`` significant digits under the prefix that puts it
    in [1, 1000): never "0.00 GDoF/s" for a rate of millions.

    Examples
    --------
    >>> format_rate(1.2345e9)
    '1.23 GDoF/s'
    >>> format_rate(4.5e6), format_rate(999.7e6), format_rate(12.0, "FLOP/s")
    ('4.5 MDoF/s', '1 GDoF/s', '12 FLOP/s')
    >>> format_rate(float("nan"))
    '- DoF/s'
    """
    if value is None or not math.isfinite(value):
        return f"- {unit}"
    value = float(f"{value:.{digits}g}")          # 999.7e6 rounds to 1e9: a G, not 1e+03 M
    label, scale = rate_unit([value], unit)
    return f"{value * scale:.{digits}g} {label}"


def unit(rec) -> tuple:
    """``(label, key, scale)``: FEM operations in GDoF/s, the rest in GFLOP/s."""
    if rec["op"] in ("action", "assembly", "bp1", "bp3", "bp5", "force", "basis", "geometry"):
        return "GDoF/s", "dofs_per_s", 1e-9
    return "GFLOP/s", "gflops", 1.0


def speed(rec, name):
    """Achieved rate of implementation ``name`` in the case's unit, or None."""
    r = rec.get("impls", {}).get(name)
    if not r or r.get("status") != "ok":
        return None
    _, key, scale = unit(rec)
    return r[key] * scale


def _bound_rate(rec):
    _, key, scale = unit(rec)
    b = rec["bound"]
    return (b["dofs_per_s"] if key == "dofs_per_s" else b["pmax"] * 1e-9) * scale


BASELINE_ORDER = ("cublas", "cupy.matmul+add", "numpy.matmul", "torch.bmm", "torch.baddbmm",
                  "torch.matmul", "cupy.einsum chain", "numpy.einsum chain", "cupy.einsum",
                  "numpy.einsum")


def baselines_in(cases) -> list:
    names = {n for c in cases for n in c.get("impls", {}) if n != "smalltc"}
    return [b for b in BASELINE_ORDER if b in names] + sorted(names - set(BASELINE_ORDER))


def _status(r):
    if r is None:
        return "-"
    if r.get("status") == "failed":
        return "FAILED"
    if r.get("status") != "ok":
        return "error"
    return None


def case_rows(rows, file, width, prefix=""):
    """The rows of a table that ran, each ``(case, label)``: the label is the case's id less
    its dtype and ``prefix``; a case that errored is printed as ``label error: ...``
    (``width`` characters of label) and not given.

    Examples
    --------
    >>> rows = [dict(id="basis p=1 float64", dtype="float64"),
    ...         dict(id="basis p=2 float64", dtype="float64", error="MemoryError()")]
    >>> [label for _, label in case_rows(rows, sys.stdout, 6, "basis ")]
    p=2    error: MemoryError()
    ['p=1']
    """
    for c in rows:
        label = c["id"].replace(f" {c['dtype']}", "").replace(prefix, "")
        if c.get("error"):
            print(f"{label:{width}s} error: {c['error']}", file=file)
            continue
        yield c, label


def impl_table(rows, file, *, suite, baseline, width, specialized=False) -> None:
    """The rows of a suite that times ``smalltc``, the ``reference`` path and the user's
    code ``baseline``: GDoF/s (``dofs_per_s``) and the fraction of the bound of each (the
    baseline's rate only), smalltc's speed-up over the other two, its backend,
    ``specialized`` (a column ``sp``, y or n) and kernel. The suite's title line is the
    caller's."""
    names = ("smalltc", "reference", baseline)
    print(f"{'case':{width}s} {'smalltc':>8s} {'%bound':>7s} {'refer.':>8s} {'%bound':>7s} "
          f"{baseline:>8s} {'x ref':>6s} {'x ' + baseline[:3]:>6s} {'backend':>9s}"
          + (" sp " if specialized else " ") + " kernel", file=file)
    for c, label in case_rows(rows, file, width, f"{suite} "):
        im = c["impls"]
        ok = {k: (im.get(k) or {}).get("status") == "ok" for k in names}
        cells = []
        for k in names:
            r = im.get(k) or {}
            if ok[k]:
                cells.append(f"{r['dofs_per_s'] * 1e-9:8.3g}" + (
                    f" {100 * r['fraction']:6.1f}%" if k != baseline else ""))
            else:
                st = {"failed": "FAILED"}.get(r.get("status"), r.get("status", "-"))
                cells.append(f"{st:>8s}" + (f" {'':>7s}" if k != baseline else ""))
        ratios = [f"{im[k]['median_s'] / im['smalltc']['median_s']:6.2f}"
                  if ok["smalltc"] and ok[k] else f"{'-':>6s}" for k in names[1:]]
        me = im.get("smalltc") or {}
        sp = {True: "y", False: "n"}.get(me.get("specialized"), "-")
        print(f"{label:{width}s} {' '.join(cells)} {' '.join(ratios)} "
              f"{me.get('backend', '-'):>9s}" + (f" {sp:2s}" if specialized else "")
              + f"  {me.get('kernel', '')[:60]}", file=file)


def _suite_tables() -> dict:
    """The suites with their own tables: their modules import this one's formatting, so
    they are imported here, when a table is printed."""
    from . import basis, bp1, force, geometry, poisson, solve  # cycle: they import this module
    return {"bp1": bp1.table, "bp3": bp1.table, "bp5": bp1.table, "force": force.table,
            "solve": solve.table, "poisson": poisson.table, "basis": basis.table,
            "geometry": geometry.table}


def table(doc, file=None) -> None:
    """Print one table per suite: achieved, bound, fraction, ratio to each baseline."""
    file = file or sys.stdout
    cases = doc["cases"]
    own = _suite_tables()
    for suite in dict.fromkeys(c["suite"] for c in cases):
        rows = [c for c in cases if c["suite"] == suite]
        if suite in own:
            own[suite](rows, file)
            continue
        base = baselines_in(rows)
        # speed() and _bound_rate() are in G units (GDoF/s, GFLOP/s); the table's prefix
        # is the one its largest figure needs
        u, tscale = rate_unit([v * 1e9 for c in rows if not c.get("error")
                               for v in (speed(c, "smalltc"), _bound_rate(c)) if v],
                              unit(rows[0])[0][1:])
        tscale *= 1e9
        blas = any("after_blas_fraction" in (c.get("impls", {}).get("smalltc") or {})
                   for c in rows)
        head = (f"{'case':44s} {'smalltc':>9s} {'bound':>9s} {'%bound':>7s} {'by':>2s} "
                + (f"{'%aBLAS':>7s} " if blas else "")
                + " ".join(f"{'x ' + b:>20s}" for b in base))
        print(f"\n== {suite} ({u}; by: the bound that applies, bw bandwidth, fl arithmetic; "
              f"x NAME = smalltc speed / NAME speed, same inputs"
              + ("; %aBLAS: %bound with a NumPy matrix product before each call" if blas
                 else "") + ") ==", file=file)
        print(head, file=file)
        for c, label in case_rows(rows, file, 44):
            st = c["impls"].get("smalltc")
            mine = speed(c, "smalltc")
            bound = _bound_rate(c)
            by = {"bandwidth": "bw", "compute": "fl"}.get(c["bound"].get("limited_by"), "?")
            if mine is None:
                cells = f"{_status(st):>9s} {bound * tscale:9.3g} {'':>7s} {by:>2s}"
            else:
                cells = (f"{mine * tscale:9.3g} {bound * tscale:9.3g} "
                         f"{100 * st['fraction']:6.1f}% {by:>2s}")
            if blas:
                fa = (st or {}).get("after_blas_fraction")
                cells += f" {100 * fa:6.1f}%" if fa else f" {'-':>7s}"
            ratios = []
            for b in base:
                other = speed(c, b)
                if mine is None or other is None:
                    ratios.append(f"{_status(c['impls'].get(b)) or '-':>20s}")
                else:
                    ratios.append(f"{mine / other:20.2f}")
            print(f"{label:44s} {cells} " + " ".join(ratios), file=file)
    fails = [(c["id"], n, r.get("error", "")) for c in cases
             for n, r in c.get("impls", {}).items() if r.get("status") != "ok"]
    if fails:
        print(f"\n{len(fails)} implementation(s) failed the check or errored:", file=file)
        for cid, n, err in fails[:20]:
            err = str(err)
            print(f"  {cid} [{n}]: {err if len(err) < 240 else err[:240] + ' ...'}", file=file)
        if len(fails) > 20:
            print(f"  ... and {len(fails) - 20} more (full messages in the JSON)", file=file)


def geomean(values):
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not vals:
        return math.nan
    return math.exp(sum(math.log(v) for v in vals) / len(vals))
