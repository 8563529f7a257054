"""Tuned against untuned plans of chosen `smalltc bench` cases, in ONE process, alternating.

Two bench processes back to back (scripts/gpu_evidence.sh) see run-to-run drift; a
case whose tuned/untuned ratio reads below 1 there is re-measured here: the bench's
own case, inputs and timer (`smalltc._timing.time_calls`, CUDA events, median of 20),
the plan built once with the tables uninstalled and once installed (plan cache cleared
in between), timed in alternating rounds so both see the same device state.

Prints a line per case and writes JSON: per case the kernel, source and params of
each plan, the per-round medians and minima, and tuned/untuned rate ratios of the
median over rounds.

Usage (GPU machine):
    python3 notes/ab_cases.py --dtype float64 --case "step (2c) dim=3 p=2 nq=4" \
        --case "action dim=3 p=5 nq=7 ncomp=1" [--rounds 5] [--json FILE]
(--case: a prefix of the bench case id; the suite is taken from the id's first word)
"""
import argparse
import json
import statistics
import sys

import numpy as np

import smalltc
import smalltc.plan  # noqa: F401  (the module: smalltc.plan the name is the function)
from smalltc import _timing
from smalltc.bench import suites
from smalltc.bench.cases import make_inputs, smalltc_impl

SUITE_OF = {"gemm": "gemm", "action": "action", "assembly": "assembly", "step": "pairwise"}


def xp_module():
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
        return cupy
    except Exception:                     # no GPU: the flow still runs (no tables apply)
        return np


def set_tables(on):
    from smalltc.backends import _cuda_params
    from smalltc.tuning import tables
    _cuda_params.get_table_lookup()       # the default install happens first, not behind us
    (tables.install if on else tables.uninstall)()
    sys.modules["smalltc.plan"]._PLANS.clear()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--case", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    xp = xp_module()
    on_gpu = xp.__name__ == "cupy"
    kind = "gpu" if on_gpu else "cpu"
    res = {"device": (xp.cuda.runtime.getDeviceProperties(0)["name"].decode() if on_gpu
                      else "cpu (no tables apply)"), "dtype": args.dtype, "cases": []}
    for prefix in args.case:
        suite = SUITE_OF[prefix.split()[0]]
        found = [c for c in suites.cases(suite, args.dtype, kind) if c.id.startswith(prefix)]
        if not found:
            print(f"{prefix}: no such case in suite {suite}", flush=True)
            continue
        for case in found:
            ops = make_inputs(case, xp)
            impls = {}
            for name, on in (("untuned", False), ("tuned", True)):
                set_tables(on)
                impls[name] = smalltc_impl(case, ops, xp)
            set_tables(True)
            row = {"id": case.id, "batch": case.batch}
            for name, im in impls.items():
                row[name] = {"kernel": im.info["kernel"], "source": im.info["source"],
                             "params": im.info["params"], "round_medians_us": [],
                             "round_min_us": []}
            for _ in range(args.rounds):
                for name, im in impls.items():
                    ts = _timing.time_calls(im.fn, on_gpu=on_gpu)
                    row[name]["round_medians_us"].append(statistics.median(ts) / 1e3)
                    row[name]["round_min_us"].append(min(ts) / 1e3)
            for name in impls:
                row[name]["median_us"] = statistics.median(row[name]["round_medians_us"])
            row["ratio_tuned_over_untuned_rate"] = (row["untuned"]["median_us"]
                                                    / row["tuned"]["median_us"])
            same = row["untuned"]["params"] == row["tuned"]["params"]
            res["cases"].append(row)
            print(f"{case.id}: ratio {row['ratio_tuned_over_untuned_rate']:.3f} "
                  f"({row['untuned']['median_us']:.1f} vs {row['tuned']['median_us']:.1f} us; "
                  f"{row['tuned']['source']}{', same kernel' if same else ''}); rounds "
                  f"{[round(x, 1) for x in row['untuned']['round_medians_us']]} vs "
                  f"{[round(x, 1) for x in row['tuned']['round_medians_us']]}", flush=True)
            del ops, impls
            if on_gpu:
                xp.get_default_memory_pool().free_all_blocks()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
