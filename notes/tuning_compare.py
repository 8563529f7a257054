"""Tuned against untuned `smalltc bench` runs: per case, grouped by where the parameters came from.

``smalltc bench --compare A.json B.json`` gives the per-case ratio and the
geometric mean; this adds, from the JSON's recorded ``params`` and ``source``
(the plan's: heuristic / table-exact / table-nearest):

- which cases ran *another kernel* with the table (params differ) and which ran
  the *same kernel* in both runs (their spread is the run-to-run noise);
- per (op, group): count, geometric mean of rate(tuned)/rate(untuned), min, max,
  cases slower than 0.97;
- optionally a second untuned run (``--noise U2.json``): its ratio per case.

Usage:
    python notes/tuning_compare.py UNTUNED.json TUNED.json [--noise UNTUNED2.json] [--md OUT.md]
"""
import argparse
import json
import math

KEYS = ("dim_x", "dim_y", "per_block", "min_blocks", "rb", "line", "rows", "pad")


def cases(path):
    with open(path) as f:
        doc = json.load(f)
    return doc, {c["id"]: c["impls"]["smalltc"] for c in doc["cases"]
                 if c["impls"].get("smalltc", {}).get("status") == "ok"}


def gmean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("untuned")
    ap.add_argument("tuned")
    ap.add_argument("--noise", help="a second untuned run (run-to-run spread)")
    ap.add_argument("--md", help="write the tables as Markdown here")
    args = ap.parse_args()
    docA, A = cases(args.untuned)
    docB, B = cases(args.tuned)
    N = cases(args.noise)[1] if args.noise else {}
    rows, groups = [], {}
    for k, a in A.items():
        b = B.get(k)
        if b is None:
            continue
        r = a["median_s"] / b["median_s"]
        same = all(a["params"].get(x) == b["params"].get(x) for x in KEYS)
        group = "same kernel" if same else b.get("source", "?")
        op = k.split()[0]
        noise = a["median_s"] / N[k]["median_s"] if k in N else None
        rows.append((k, group, r, noise, b.get("fraction")))
        groups.setdefault((op, group), []).append((r, k))
    out = [f"untuned: `{args.untuned}` ({docA['date']})  ",
           f"tuned: `{args.tuned}` ({docB['date']})  ",
           f"device: {docB['device'].get('name')}; ratio = rate(tuned) / rate(untuned)"
           + (f"; noise = rate(second untuned run) / rate(untuned): `{args.noise}`" if N else ""),
           "", "| op | parameters (tuned run) | cases | geometric mean | min | max | < 0.97 |",
           "|---|---|---|---|---|---|---|"]
    for (op, g), v in sorted(groups.items()):
        rs = [r for r, _ in v]
        lo = min(v)
        out.append(f"| {op} | {g} | {len(v)} | {gmean(rs):.3f} | {lo[0]:.2f} ({lo[1]}) | "
                   f"{max(rs):.2f} | {sum(r < 0.97 for r in rs)} |")
    changed = [r for _, g, r, _, _ in rows if g != "same kernel"]
    out += ["", f"All {len(rows)} cases: geometric mean {gmean([r for _, _, r, _, _ in rows]):.3f}; "
            f"the {len(changed)} cases whose kernel the table changed: {gmean(changed):.3f}.", "",
            "| case | parameters (tuned run) | tuned / untuned | noise | tuned: fraction of Pmax |",
            "|---|---|---|---|---|"]
    for k, g, r, n, fr in rows:
        out.append(f"| {k} | {g} | {r:.2f} | {'' if n is None else f'{n:.2f}'} | "
                   f"{'' if fr is None else f'{fr:.2f}'} |")
    text = "\n".join(out)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
