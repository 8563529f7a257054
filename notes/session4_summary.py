"""Markdown summary of one `smalltc bench` JSON (all suites) for the CUDA issue's targets.

    python3 notes/session4_summary.py results/.../bench-float64.json [more.json ...]

Per file: square GEMM beta=1 (% of Pmax at 100,000 matrices and at the > 256 MB batch,
x cupy.matmul+add), the action and assembly (% of the bound, x the einsum baseline),
the pairwise steps (% of their own bound) and fused/pairwise per element, where the
pairwise time is the sum over the action's steps of time/batch (steps only: the
pointwise D scaling is not counted, so the ratio is a lower bound).
"""
import json
import re
import statistics
import sys


def rows(path):
    d = json.load(open(path))
    out = {}
    for c in d["cases"]:
        s = c["impls"].get("smalltc", {})
        if s.get("status") != "ok":
            continue
        base = {k: v for k, v in c["impls"].items() if k != "smalltc" and v.get("status") == "ok"}
        x = {k: v["median_s"] / s["median_s"] for k, v in base.items()}
        out[c["id"]] = dict(c=c, s=s, x=x)
    return d, out


def pct(r):
    return f"{100 * r['s']['fraction']:.0f}" if r else "-"


def xs(r):
    return f"{max(r['x'].values()):.1f}" if r and r["x"] else "-"


def main(paths):
    for path in paths:
        d, R = rows(path)
        dt = d["options"]["dtype"]
        print(f"\n### {d['device']['name']}, {dt} (`{path}`, {d['date']})\n")
        print("| n | % Pmax, 100k | x cuBLAS, 100k | % Pmax, >256 MB | x cuBLAS, >256 MB |")
        print("|---|---|---|---|---|")
        for n in range(2, 33):
            p = R.get(f"gemm m={n} n={n} k={n} beta=1 batch_class=paper {dt}")
            g = R.get(f"gemm m={n} n={n} k={n} beta=1 batch_class=large {dt}")
            print(f"| {n} | {pct(p)} | {xs(p)} | {pct(g)} | {xs(g)} |")
        for dim in (2, 3):
            print(f"\n| {dim}D action p | % bound nq=p+1 | x einsum | % bound nq=p+2 | x einsum |"
                  f" fused/pairwise (nq=p+2) |")
            print("|---|---|---|---|---|---|")
            for p in range(1, 9):
                a = R.get(f"action dim={dim} p={p} nq={p + 1} ncomp=1 {dt}")
                b = R.get(f"action dim={dim} p={p} nq={p + 2} ncomp=1 {dt}")
                steps = [r for k, r in R.items()
                         if re.match(rf"step \({dim + 1}[a-f]\) dim={dim} p={p} nq={p + 2} ", k)]
                fp = "-"
                if b and steps:
                    pw = sum(r["s"]["median_s"] / r["c"]["batch"] for r in steps)
                    fp = f"{pw / (b['s']['median_s'] / b['c']['batch']):.1f}"
                print(f"| {p} | {pct(a)} | {xs(a)} | {pct(b)} | {xs(b)} | {fp} |")
        print("\n| assembly p | 2D % bound | 2D x einsum | 3D % bound | 3D x einsum |")
        print("|---|---|---|---|---|")
        for p in range(1, 7):
            a = R.get(f"assembly dim=2 p={p} nq={p + 2} {dt}")
            b = R.get(f"assembly dim=3 p={p} nq={p + 2} {dt}")
            print(f"| {p} | {pct(a)} | {xs(a)} | {pct(b)} | {xs(b)} |")
        st = [r["s"]["fraction"] for k, r in R.items() if k.startswith("step")]
        if not st:
            continue
        low = sorted((r["s"]["fraction"], k) for k, r in R.items() if k.startswith("step"))[:6]
        print(f"\npairwise steps: {len(st)} cases, median {100 * statistics.median(st):.0f}% of "
              f"their bound; lowest: " + "; ".join(f"{k.rsplit(' ', 1)[0]} {100 * f:.0f}%" for f, k in low))


if __name__ == "__main__":
    main(sys.argv[1:])
