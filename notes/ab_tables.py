"""Tuned against untuned plans in ONE process, alternating: is a table entry that
reads slower in two separate `smalltc bench` processes really slower?

For each case, two plans of the same spec are built (tables uninstalled, then
installed; the plan cache cleared in between) and timed in alternating rounds
with the bench's own timer (`smalltc._timing.time_calls`, CUDA events, median of
20), so both see the same host state. Each plan is also timed as a CUDA graph of
50 captured calls: the device's own time per call, free of the Python launch cost.

Prints one JSON object: per case the kernels, the params of each, the per-round
medians, the median over rounds and the graph time of each, and tuned/untuned
rate ratios.

Defaults: the GEMM cases (beta = 1, out=C) whose tuned/untuned ratio read < 1 across two
bench processes on 2026-11-21 (n = 2, 3 at 100,000 matrices are launch-bound).

Usage (GPU machine):  python3 notes/ab_tables.py [--rounds 7] [--json FILE]
    [--dtypes float32,float64] [--n 2,3,4] [--batches 100000,4000000] [--out inplace|separate|both]
"""
import argparse
import json
import statistics

import cupy as cp
import numpy as np

import smalltc
from ab_cases import set_tables          # notes/ab_cases.py (this script's folder)
from smalltc import _timing
from smalltc.tuning import tables

def graph_time(fn, calls=50, reps=10):
    """Device time per call of ``fn`` replayed from a captured CUDA graph (s)."""
    return statistics.median(_timing.graph_times(fn, repeats=reps, warmup=1, calls=calls)) * 1e-9


def build(on, *ops):
    set_tables(on)
    return smalltc.plan("gemm", *ops, beta=1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--n", default="2,3,4")
    ap.add_argument("--batches", default="100000,4000000")
    ap.add_argument("--out", default="inplace", help="inplace (out=C), separate, or both")
    args = ap.parse_args()
    outs = ("inplace", "separate") if args.out == "both" else (args.out,)
    cases = [(dt, int(n), int(b), o) for dt in args.dtypes.split(",") for n in args.n.split(",")
             for b in args.batches.split(",") for o in outs]
    rng = np.random.default_rng(0)
    res = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "cases": []}
    for dt, n, batch, where in cases:
        A = cp.asarray(rng.random((batch, n, n)), dtype=dt)
        B = cp.asarray(rng.random((batch, n, n)), dtype=dt)
        C = cp.asarray(rng.random((batch, n, n)), dtype=dt)
        O = C if where == "inplace" else cp.empty_like(C)
        plans = {"untuned": build(False, A, B, C), "tuned": build(True, A, B, C)}
        row = {"dtype": dt, "n": n, "batch": batch, "beta": 1.0, "out": where}
        for name, pl in plans.items():
            row[name] = {"kernel": pl.kernel, "source": pl.source,
                         "params": {k: pl.params[k] for k in ("dim_x", "dim_y", "per_block")
                                    if k in pl.params}, "round_medians_us": []}
        for _ in range(args.rounds):
            for name, pl in plans.items():
                ts = _timing.time_calls(lambda pl=pl: pl(A, B, C, out=O, beta=1.0), on_gpu=True)
                row[name]["round_medians_us"].append(statistics.median(ts) / 1e3)
        for name, pl in plans.items():
            r = row[name]
            r["median_us"] = statistics.median(r["round_medians_us"])
            try:
                r["graph_us"] = graph_time(lambda pl=pl: pl(A, B, C, out=O, beta=1.0)) * 1e6
            except Exception as e:       # capture not possible: say so, do not guess
                r["graph_us"] = None
                r["graph_error"] = f"{type(e).__name__}: {e}"
        row["ratio_tuned_over_untuned_rate"] = row["untuned"]["median_us"] / row["tuned"]["median_us"]
        if row["tuned"]["graph_us"] and row["untuned"]["graph_us"]:
            row["ratio_graph"] = row["untuned"]["graph_us"] / row["tuned"]["graph_us"]
        res["cases"].append(row)
        print(f"{dt} n={n} batch={batch} {where}: bench-timer ratio {row['ratio_tuned_over_untuned_rate']:.3f}"
              f" ({row['untuned']['median_us']:.1f} vs {row['tuned']['median_us']:.1f} us),"
              f" graph ratio {row.get('ratio_graph', float('nan')):.3f}"
              f" ({row['untuned']['graph_us']} vs {row['tuned']['graph_us']} us)", flush=True)
        del A, B, C, O
    tables.install()
    out = json.dumps(res, indent=1)
    if args.json:
        open(args.json, "w").write(out)
    print(out if not args.json else f"wrote {args.json}")


if __name__ == "__main__":
    main()
