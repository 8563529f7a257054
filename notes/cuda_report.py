"""Tables (markdown) and plots from the CUDA bench JSON files (no GPU needed).

    python notes/cuda_report.py notes/cuda_results/bench_f64_h100.json ... > table.md
Plots go next to the first JSON file: cuda_<op>_<dtype>.png.
"""
import json
import os
import sys


def load(paths):
    rows, meta = [], []
    for p in paths:
        d = json.load(open(p))
        meta.append((os.path.basename(p), d["device"], d["copy_bw"]))
        for r in d["rows"]:
            rows.append(dict(r, file=os.path.basename(p), copy_bw=d["copy_bw"]))
    return rows, meta


def table(rows, meta):
    out = ["| file | device | copy BW (TB/s) |", "|---|---|---|"]
    out += [f"| {f} | {dev} | {bw / 1e12:.2f} |" for f, dev, bw in meta]
    gem = [r for r in rows if r["op"] == "gemm"]
    if gem:
        out += ["", "| dtype | n | batch | ours % Pmax | cuBLAS % Pmax | ours / cuBLAS | GFlop/s | file |",
                "|---|---|---|---|---|---|---|---|"]
        for r in gem:
            cub = r["frac_pmax"] / r["vs_cublas"]
            out.append(f"| {r['dtype']} | {r['n']} | {r['batch']} | {100 * r['frac_pmax']:.1f} | "
                       f"{100 * cub:.1f} | {r['vs_cublas']:.2f} | {r['gflops']:.0f} | {r['file']} |")
    act = [r for r in rows if r["op"].startswith("action")]
    if act:
        out += ["", "| op | dtype | p | nq | E | fused % bound | GDoF/s | fused / einsum | "
                "pairwise % own bound | fused / pairwise | file |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in act:
            pw = (f"{100 * r['pairwise_frac_own_bound']:.1f} | {r['fused_vs_pairwise']:.2f}"
                  if "t_pairwise" in r else "- | -")
            out.append(f"| {r['op']} | {r['dtype']} | {r['p']} | {r['nq']} | {r['E']} | "
                       f"{100 * r['frac_bound']:.1f} | {r['gdofs']:.1f} | {r['vs_einsum']:.1f} | {pw} | "
                       f"{r['file']} |")
    asm = [r for r in rows if r["op"].startswith("assembly")]
    if asm:
        out += ["", "| dtype | p | nq | E | % bound | ms | file |", "|---|---|---|---|---|---|---|"]
        for r in asm:
            out.append(f"| {r['dtype']} | {r['p']} | {r['nq']} | {r['E']} | {100 * r['frac_bound']:.1f} | "
                       f"{1e3 * r['t']:.3f} | {r['file']} |")
    return "\n".join(out)


def plots(rows, where):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    merged = {}   # later files win (the final code path); fields of earlier runs kept
    for r in rows:
        key = (r["op"], r["dtype"], r.get("n"), r.get("batch"), r.get("p"), r.get("nq"))
        merged[key] = dict(merged.get(key, {}), **r)
    groups = {}
    for r in merged.values():
        groups.setdefault((r["op"], r["dtype"]), []).append(r)
    for (op, dt), rs in groups.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        if op == "gemm":
            for big in (False, True):
                sel = [r for r in rs if (r["batch"] > 100_000) == big or (r["n"] >= 16 and big)]
                sel = sorted({r["n"]: r for r in sel}.values(), key=lambda r: r["n"])
                ax.plot([r["n"] for r in sel], [100 * r["frac_pmax"] for r in sel], "o-",
                        label=f"smalltc, {'>= 256 MB' if big else '100,000 matrices'}")
            sel = sorted({r["n"]: r for r in rs}.values(), key=lambda r: r["n"])
            ax.plot([r["n"] for r in sel], [100 * r["frac_pmax"] / r["vs_cublas"] for r in sel],
                    "s--", label="cuBLAS (cupy.matmul)")
            ax.set_xlabel("n (square)")
        else:
            for nqoff in (1, 2):
                sel = sorted([r for r in rs if r["nq"] == r["p"] + nqoff], key=lambda r: r["p"])
                ax.plot([r["p"] for r in sel], [100 * r["frac_bound"] for r in sel], "o-",
                        label=f"fused, nq=p+{nqoff}")
                sp = [r for r in sel if "t_pairwise" in r]
                if sp:
                    ax.plot([r["p"] for r in sp], [100 * r["pairwise_frac_own_bound"] for r in sp],
                            "x:", label=f"pairwise (own bound), nq=p+{nqoff}")
                if sel and "t_einsum" in sel[0]:
                    ax.plot([r["p"] for r in sel], [100 * r["frac_bound"] / r["vs_einsum"] for r in sel],
                            "s--", label=f"cupy.einsum chain, nq=p+{nqoff}")
            ax.set_xlabel("p")
        ax.axhline(80 if op != "gemm" else 90, color="grey", lw=0.8)
        ax.set_ylabel("% of bandwidth bound")
        ax.set_title(f"{op} {dt}, H100 (notes/cuda.md)")
        ax.set_ylim(0, 110)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(where, f"cuda_{op}_{dt}.png"), dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    rows, meta = load(sys.argv[1:])
    print(table(rows, meta))
    plots(rows, os.path.dirname(sys.argv[1]))
