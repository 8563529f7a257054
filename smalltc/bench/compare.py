"""``smalltc bench --compare A.json B.json``: per-case speed-up of run B over run A.

Cases are matched by id (sizes and dtype, not batch); the ratio is
``rate(B) / rate(A)`` in the case's unit (GFLOP/s or DoF/s), so > 1 means B
is faster. Runs on different devices compare too, but docs/math.md section 5 warns
that only ratios measured in one run are claims.

Examples
--------
>>> a = {"cases": [{"id": "x", "suite": "gemm", "op": "gemm",
...                 "impls": {"smalltc": {"status": "ok", "gflops": 2.0}}}]}
>>> b = {"cases": [{"id": "x", "suite": "gemm", "op": "gemm",
...                 "impls": {"smalltc": {"status": "ok", "gflops": 3.0}}}]}
>>> rows, gm = ratios(a, b)
>>> rows[0][1:], gm
((2.0, 3.0, 1.5), 1.5)
"""
from __future__ import annotations

import sys

from .report import geomean, load, speed, unit

__all__ = ["ratios", "compare_files"]


def ratios(a, b, impl="smalltc", impl_b=None):
    """``([(id, rate_a, rate_b, b/a), ...], geometric mean)`` over cases in both."""
    impl_b = impl_b or impl
    by_id = {c["id"]: c for c in b["cases"]}
    rows = []
    for ca in a["cases"]:
        cb = by_id.get(ca["id"])
        if cb is None:
            continue
        ra, rb = speed(ca, impl), speed(cb, impl_b)
        if ra is None or rb is None:
            continue
        rows.append((ca["id"], ra, rb, rb / ra))
    return rows, geomean(r[3] for r in rows)


def compare_files(path_a, path_b, impl="smalltc", impl_b=None, file=None) -> int:
    file = file or sys.stdout
    a, b = load(path_a), load(path_b)
    rows, gm = ratios(a, b, impl, impl_b)
    print(f"A: {path_a}  ({a['device']['name']}, {a['date']})", file=file)
    print(f"B: {path_b}  ({b['device']['name']}, {b['date']})", file=file)
    print(f"implementation: A {impl}, B {impl_b or impl}; ratio = rate(B) / rate(A)",
          file=file)
    if not rows:
        print("no case measured in both runs", file=file)
        return 1
    by_id = {c["id"]: c for c in a["cases"]}
    print(f"{'case':52s} {'A':>10s} {'B':>10s} {'B/A':>7s}", file=file)
    for cid, ra, rb, r in rows:
        u = unit(by_id[cid])[0]
        print(f"{cid:52s} {ra:10.4g} {rb:10.4g} {r:7.2f}  {u}", file=file)
    for suite in dict.fromkeys(by_id[r[0]]["suite"] for r in rows):
        g = geomean(r[3] for r in rows if by_id[r[0]]["suite"] == suite)
        print(f"geometric mean B/A, {suite}: {g:.3f}", file=file)
    print(f"geometric mean B/A over {len(rows)} cases: {gm:.3f}", file=file)
    return 0
