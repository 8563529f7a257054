"""Drop finished sizes from a tuning checkpoint, so that ``smalltc tune --resume`` searches
them again (after a kernel or search-space change), keeping everything else.

    python3 scripts/drop_sizes.py build/tune/sm90-gemm-float64.checkpoint.json \
        --prefix gemm/nn+beta/ --min-mn 64
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--prefix", default="", help="only size keys starting with this")
    ap.add_argument("--min-mn", type=int, default=0, help="only GEMMs with m * n >= this")
    args = ap.parse_args()
    d = json.load(open(args.checkpoint))
    drop = [k for k, r in d["results"].items() if k.startswith(args.prefix)
            and r["spec"].get("m", 1) * r["spec"].get("n", 1) >= args.min_mn]
    for k in drop:
        del d["results"][k]
    d["partial"] = {}                      # compile records of the old kernels
    json.dump(d, open(args.checkpoint, "w"))
    print(f"{args.checkpoint}: dropped {len(drop)} sizes, {len(d['results'])} kept")


if __name__ == "__main__":
    main()
