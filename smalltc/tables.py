"""Tuning tables, read side: find the shipped lookup tables and answer a spec from them.

A table is versioned JSON written by ``smalltc tune`` (:mod:`smalltc.tuning`,
which imports this module; this module never imports the tuner). One file
per target and dtype, in the folders :func:`table_dirs` lists:

- ``sm90-nvidia-h200-float64.json``: tuned on that device model;
- ``sm90-float64.json``: the architecture's table (tuned on one of its
  devices, named in the file), used by every device of that architecture.

For one spec: the entry of the spec's exact size key (``spec.size_key``) in the
device's own table, else in the architecture's; else the nearest entry of the
same variant (:func:`distance`, at most the family's ``max_distance``) in the
device's table, else in the architecture's, its parameters carried over to the
new size by the family (``family.adapt``), which also rejects what no longer
fits; else the backend's measured heuristic (:func:`lookup` returns None).

Schema 2, what ``smalltc tune`` writes::

    {"schema": 2, "arch": "sm90", "dtype": "float64",
     "device": {"name": "NVIDIA H100 80GB HBM3", "cc": "90", "sms": 132, "smem_optin": 232448},
     "versions": {...}, "date": "2026-11-21T16:00:00Z",
     "entries": {
    "gemm/nn/m8n8k8": [{"op": "gemm", "m": 8, "n": 8, "k": 8},
                       {"dim_x": 8, "dim_y": 4, "per_block": 4}],
    ...}}

(written one line an entry).

An entry is its size key -> ``[spec, params]``: the spec as :func:`spec_dict` writes
it (``op`` and the fields that differ from their defaults, without the batch and the
dtype: the table's), and the family's parameters. The search's evidence (times, the
runner-up, the heuristic's time, the kernel's resources, the runs) is not in the
table: the tuner keeps it in a record of its own (:mod:`smalltc.tuning.tables`). Schema 1,
that record's form, is read too: ``"entries": {key: {"op": ..., "spec": {...},
"params": {...}, "time_s": ..., ...}}``.

A *family* (a kernel family of a backend, e.g. :mod:`smalltc.backends.cuda.action`)
gives the reader: ``name``, ``params`` (its parameter names), ``optional``
(parameters an older entry may lack, with the value that means), ``max_distance``
and ``adapt(spec, entry_spec, params, device) -> params | None``.

Environment: ``SMALLTC_TUNING=off`` ignores every table; ``SMALLTC_TUNING_TABLES``
(folders, ``os.pathsep``-separated) is searched before the shipped folder. Both are
read when a table is first looked up (tables are cached per folder list).

Examples
--------
>>> distance("gemm/nn/m8n8k8", "gemm/nn/m16n8k8")      # a factor 2 in one extent
1.0
>>> round(distance("action/3d/nd4nq5c1", "action/3d/nd4nq6c1"), 3)   # log2(6/5)
0.263
>>> distance("action/3d/nd4nq5c1", "action/2d/nd4nq5c1")
inf
>>> table_names("sm90", "NVIDIA H200", "float64")
['sm90-nvidia-h200-float64.json', 'sm90-float64.json']
>>> from smalltc.spec import GemmSpec
>>> spec_dict(GemmSpec(batch=9, m=8, n=8, k=8, dtype="float64", beta_zero=False))
{'op': 'gemm', 'm': 8, 'n': 8, 'k': 8, 'beta_zero': False}
"""
from __future__ import annotations

import functools
import importlib.util
import json
import logging
import math
import os
import pathlib
import re
from dataclasses import MISSING, fields
from typing import NamedTuple

from .spec import spec_from_dict

__all__ = ["SCHEMA", "SCHEMAS", "Table", "Hit", "Entry", "enabled", "table_dirs",
           "shipped_dir", "table_names", "device_slug", "load", "validate", "entries",
           "spec_dict", "tables_for", "lookup", "split_key", "distance"]

log = logging.getLogger("smalltc")

SCHEMA = 2                   # what the tuner writes
SCHEMAS = (1, 2)             # what this module reads (1: the tuner's record, see above)
_TOP = {1: ("schema", "arch", "dtype", "device", "versions", "date", "entries"),
        2: ("schema", "arch", "dtype", "device", "entries")}
_ENTRY = ("op", "spec", "params")
_NUM = re.compile(r"([a-z]+)(\d+)")


class Entry(NamedTuple):
    """One entry of a table: the spec it was tuned for (batch 1) and its parameters."""

    spec: object
    params: dict


class Hit(NamedTuple):
    """A table's answer for one spec."""

    params: dict
    match: str            # "exact" or "nearest"
    entry: str            # the entry's size key
    table: str            # the table's file name

    @property
    def source(self) -> str:
        return f"table-{self.match}"


# ----------------------------------------------------------------------------
# size keys

def split_key(key: str):
    """``(variant, {name: number})`` of a size key such as ``"gemm/nn+beta/m8n8k8"``; a
    flag after the numbers (``".../nd5nq5c1+co"``, the collocated operators) belongs to
    the variant."""
    variant, nums = _split(key)
    return variant, dict(nums)


@functools.lru_cache(maxsize=8192)
def _split(key: str):
    """:func:`split_key` with the numbers as a tuple of pairs, kept per key (a nearest
    lookup measures the distance to every entry of a table)."""
    variant, _, nums = key.rpartition("/")
    nums, plus, flags = nums.partition("+")
    variant += plus + flags
    found = tuple((n, int(v)) for n, v in _NUM.findall(nums))
    if not variant or not found or "".join(f"{n}{v}" for n, v in found) != nums:
        raise ValueError(f"not a size key: {key!r}")
    return variant, found


def distance(a: str, b: str) -> float:
    """``sum |log2 x - log2 y|`` over the numbers of two keys of one variant, else inf."""
    (va, na), (vb, nb) = _split(a), _split(b)
    if va != vb:
        return math.inf
    na, nb = dict(na), dict(nb)
    if na.keys() != nb.keys():
        return math.inf
    return sum(abs(math.log2(max(na[k], 1)) - math.log2(max(nb[k], 1))) for k in na)


# ----------------------------------------------------------------------------
# files

def enabled() -> bool:
    """False when ``SMALLTC_TUNING`` says off (0, off, no, false)."""
    return os.environ.get("SMALLTC_TUNING", "on").lower() not in ("0", "off", "no", "false")


def shipped_dir() -> pathlib.Path:
    """The tables shipped with the package (``smalltc/tuning/tables``), found without
    importing the tuner."""
    spec = importlib.util.find_spec("smalltc.tuning")
    if spec is not None and spec.submodule_search_locations:
        return pathlib.Path(next(iter(spec.submodule_search_locations))) / "tables"
    return pathlib.Path(__file__).resolve().parents[1] / "tuning" / "tables"


def table_dirs() -> list:
    """``$SMALLTC_TUNING_TABLES`` folders first, then the shipped one."""
    extra = os.environ.get("SMALLTC_TUNING_TABLES", "")
    return [pathlib.Path(d) for d in extra.split(os.pathsep) if d] + [shipped_dir()]


def device_slug(name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"``."""
    return re.sub(r"[^0-9a-z]+", "-", str(name).lower()).strip("-")


def table_names(arch: str, device_name: str | None, dtype: str) -> list:
    """File names to look for, best first: the device model's, then the architecture's."""
    names = [f"{arch}-{device_slug(device_name)}-{dtype}.json"] if device_name else []
    return names + [f"{arch}-{dtype}.json"]


def spec_dict(spec) -> dict:
    """The spec as a table entry stores it: ``op`` and the fields that differ from their
    defaults, without the batch and the dtype (the table's)."""
    d = {"op": spec.op}
    for f in fields(spec):
        v = getattr(spec, f.name)
        if f.name not in ("batch", "dtype") and (f.default is MISSING or v != f.default):
            d[f.name] = v
    return d


def _entry(e, dtype, schema, where, key) -> Entry:
    """An :class:`Entry` of an entry as the file holds it (``[spec, params]`` in schema 2,
    a dict with ``spec`` and ``params`` in schema 1)."""
    if schema == 1:
        if not isinstance(e, dict):
            raise ValueError(f"{where}: entry {key!r} is not a JSON object")
        miss = [k for k in _ENTRY if k not in e]
        if miss:
            raise ValueError(f"{where}: entry {key!r} lacks {', '.join(miss)}")
        if "time_s" in e and not (isinstance(e["time_s"], (int, float)) and e["time_s"] > 0):
            raise ValueError(f"{where}: entry {key!r} time_s {e['time_s']!r}")
        d, params = e["spec"], e["params"]
    else:
        if not (isinstance(e, list) and len(e) == 2 and all(isinstance(x, dict) for x in e)):
            raise ValueError(f"{where}: entry {key!r} is not [spec, params]")
        d, params = e
    try:
        spec = spec_from_dict({"batch": 1, "dtype": dtype, **d}).with_batch(1)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: entry {key!r} spec: {err}") from None
    return Entry(spec, dict(params))


def entries(table: dict, where="table") -> dict:
    """``{size key: Entry}`` of a table of either schema (not validated against the
    families: :func:`validate` does that)."""
    return {key: _entry(e, table["dtype"], table["schema"], where, key)
            for key, e in table["entries"].items()}


def validate(table: dict, where="table", family_of=None) -> dict:
    """Raise ValueError naming what is wrong with ``table``; return it when it is fine.

    ``family_of(spec)``: the family that tunes a spec (None: none); with it, each
    entry's parameter names are checked against that family's.
    """
    if not isinstance(table, dict):
        raise ValueError(f"{where}: not a JSON object")
    if table.get("schema") not in SCHEMAS:
        raise ValueError(f"{where}: schema {table.get('schema')!r}, this smalltc reads "
                         f"schema {' and '.join(map(str, SCHEMAS))}")
    missing = [k for k in _TOP[table["schema"]] if k not in table]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    if table["dtype"] not in ("float32", "float64"):
        raise ValueError(f"{where}: dtype {table['dtype']!r}")
    if table["arch"].startswith("sm") and table["arch"] != f"sm{table['device'].get('cc')}":
        raise ValueError(f"{where}: arch {table['arch']!r} but device cc "
                         f"{table['device'].get('cc')!r}")
    for key, e in table["entries"].items():
        split_key(key)
        spec, params = _entry(e, table["dtype"], table["schema"], where, key)
        if spec.size_key != key:
            raise ValueError(f"{where}: entry {key!r} holds the spec of {spec.size_key!r}")
        if spec.dtype != table["dtype"]:
            raise ValueError(f"{where}: entry {key!r} is {spec.dtype}, the table "
                             f"{table['dtype']}")
        if family_of is not None:
            fam = family_of(spec)
            names = set(fam.params) if fam else set()
            need = names - set(getattr(fam, "optional", {}))
            if fam is None or not need <= set(params) <= names:
                raise ValueError(f"{where}: entry {key!r} params {sorted(params)}, "
                                 f"expected {sorted(names) if fam else 'none'}")
    return table


def load(path, family_of=None) -> dict:
    """The table at ``path``, validated (:func:`validate`)."""
    with open(path, encoding="utf-8") as f:
        return validate(json.load(f), str(path), family_of)


# ----------------------------------------------------------------------------
# lookup

class Table:
    """A loaded table with exact and nearest lookup.

    Examples
    --------
    >>> from smalltc.spec import GemmSpec
    >>> t = Table(dict(schema=2, arch="sm90", dtype="float64", device={}, entries={}))
    >>> t.lookup(GemmSpec(batch=1, m=4, n=4, k=4, dtype="float64"), family=None) is None
    True
    """

    def __init__(self, data: dict, path=None):
        self.data, self.path = data, path
        self.name = pathlib.Path(path).name if path else "table"
        self.entries = entries(data, self.name)        # size key -> Entry
        self.device = dict(data.get("device") or {})

    def lookup(self, spec, family, max_distance=None):
        """A :class:`Hit` for ``spec`` (tuned by ``family``): :meth:`exact`, else
        :meth:`nearest`; None when neither answers."""
        return self.exact(spec, family) or self.nearest(spec, family, max_distance)

    def exact(self, spec, family):
        """The :class:`Hit` of the spec's own size key, or None."""
        if family is None or spec.dtype != self.data["dtype"]:
            return None
        key = spec.size_key
        e = self.entries.get(key)
        if e is not None:
            p = family.adapt(spec, e.spec, e.params, self.device)
            if p is not None:
                return Hit(p, "exact", key, self.name)
        return None

    def nearest(self, spec, family, max_distance=None):
        """The :class:`Hit` of the nearest other entry that adapts to ``spec``, or None."""
        if family is None or spec.dtype != self.data["dtype"]:
            return None
        if max_distance is None:
            max_distance = family.max_distance
        key = spec.size_key
        near = sorted((distance(key, k), k) for k in self.entries if k != key)
        for d, k in near:
            if d > max_distance:
                break
            e = self.entries[k]
            p = family.adapt(spec, e.spec, e.params, self.device)
            if p is not None:
                return Hit(p, "nearest", k, self.name)
        return None


@functools.lru_cache(maxsize=64)
def _load_table(path: str, mtime_ns: int):
    """The table at ``path`` as of ``mtime_ns`` (a table rewritten by a tuner is read again)."""
    try:
        data = load(path)
    except (OSError, ValueError) as err:
        log.warning("smalltc: ignoring tuning table %s: %s", path, err)
        return None
    if data.get("dry_run"):
        log.warning("smalltc: ignoring tuning table %s: written by a dry run", path)
        return None
    return Table(data, path)


def tables_for(arch: str, device_name: str | None, dtype: str) -> list:
    """The tables that answer for a device, best first (none when tuning is off)."""
    if not enabled():
        return []
    found = []
    for name in table_names(arch, device_name, dtype):
        for d in table_dirs():
            p = d / name
            if p.is_file():
                t = _load_table(str(p), p.stat().st_mtime_ns)
                if t is not None:
                    found.append(t)
                break                        # an earlier folder shadows the later ones
    return found


def lookup(spec, family, arch: str, device_name: str | None = None):
    """The :class:`Hit` for ``spec`` among :func:`tables_for`, or None: an exact entry
    of any table (the device's first) before a nearest one of any table. (On the H200,
    the device table's 3D ncomp = 1 action entry carried to ncomp = 3 ran at 0.74x the
    H100 table's own ncomp = 3 entry: the size is a stronger match than the device.)"""
    tables = tables_for(arch, device_name, spec.dtype)
    for t in tables:
        hit = t.exact(spec, family)
        if hit is not None:
            return hit
    for t in tables:
        hit = t.nearest(spec, family)
        if hit is not None:
            return hit
    return None
