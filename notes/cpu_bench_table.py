"""The issue-#4 target table of a CPU bench JSON (for results/*/README.md).

Usage: python notes/cpu_bench_table.py results/cpu-amd-epyc-2c/bench-float64.json

Ratios are the bench's own, from one run: ours/Pmax is the median time's
fraction of the roofline bound, ours/baseline the baseline's median time
over ours (numpy.matmul for GEMM, the numpy.einsum chain for the action,
numpy.einsum for the assembly).
"""
import json
import sys


def rows(doc):
    for c in doc["cases"]:
        s, impls = c["sizes"], c["impls"]
        ours = impls.get("smalltc", {})
        if ours.get("status") != "ok":
            continue
        base = next((v for k, v in impls.items() if k != "smalltc" and v.get("status") == "ok"), None)
        vs = base["median_s"] / ours["median_s"] if base else float("nan")
        if c["op"] == "gemm" and s.get("batch_class") == "paper" and s["m"] == s["n"] == s["k"]:
            n = s["n"]
            yield ("gemm", f"n={n}", ours["fraction"], 0.70, vs, 2.0 if n <= 16 else None)
        elif c["op"] == "action" and s["dim"] == 3 and s["nq"] == s["p"] + 2 and s["ncomp"] == 1:
            yield ("action 3D", f"p={s['p']}", ours["fraction"], 0.50, vs, 10.0)
        elif c["op"] == "assembly" and s["dim"] == 3:
            yield ("assembly 3D", f"p={s['p']}", ours["fraction"], 0.50, vs, None)


def main(path):
    doc = json.load(open(path))
    pr = doc["probes"]
    print(f"bandwidth {pr['bandwidth']['value'] / 1e9:.1f} GB/s ({pr['bandwidth']['method']}), "
          f"peak {pr['peak']['float64']['value'] / 1e9:.1f} GF/s ({pr['peak']['float64']['method']})")
    print(f"load average start {doc['load_average_start']}, end {doc['load_average_end']}\n")
    print("| case | size | ours/Pmax | target | ours/baseline | target | met |")
    print("|---|---|---|---|---|---|---|")
    for op, size, frac, tf, vs, tv in rows(doc):
        ok = frac >= tf and (tv is None or vs >= tv)
        print(f"| {op} | {size} | {frac:.2f} | >= {tf:.2f} | {vs:.1f}x | "
              f"{'>= %gx' % tv if tv else '-'} | {'yes' if ok else '**no**'} |")


if __name__ == "__main__":
    main(sys.argv[1])
