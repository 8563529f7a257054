"""ptxas resources and SASS opcode counts of the fused 3D action: rb = 1 vs register-blocked.

No GPU needed: renders through the CUDA backend's context (``action_ctx``) and
template, compiles with ``nvcc -cubin -arch=sm_90 -Xptxas -v`` (float64) and
counts SASS opcodes with ``cuobjdump -sass`` ($CUOBJDUMP, else the PATH; pip
package ``nvidia-cuda-cuobjdump`` where the toolkit lacks it). Prints the
Markdown tables of notes/cuda.md ("Register-blocked action"); raw JSON in
notes/cuda_results/action_rb_ptxas.json.

    python notes/action_rb_ptxas.py
"""
import collections
import json
import math
import os
import re
import shutil
import subprocess
import tempfile

from smalltc.backends import _cuda_params as P
from smalltc.backends._cuda_runtime import render
from smalltc.tuning.compile import parse_ptxas

ARCH = "sm_90"
SM_REGS, SM_THREADS, SM_SMEM, SM_BLOCKS = 65536, 2048, 228 * 1024, 32
CUOBJDUMP = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")


def compile_(ctx, sass=False):
    """ptxas' resources of the rendered kernel (and its SASS opcode counts)."""
    entry = "stc_k"
    src = render(P.action_template(ctx), dict(ctx, entry=entry))
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = os.path.join(tmp, "k.cu"), os.path.join(tmp, "k.cubin")
        with open(cu, "w") as f:
            f.write(src)
        r = subprocess.run(["nvcc", f"-arch={ARCH}", "-std=c++17", "-cubin", "-Xptxas", "-v",
                            "-o", cubin, cu], capture_output=True, text=True, check=True)
        res = parse_ptxas(r.stdout + r.stderr)[entry]
        if sass:
            text = subprocess.run([CUOBJDUMP, "-sass", cubin], capture_output=True,
                                  text=True, check=True).stdout
            ops = collections.Counter()
            for line in text.splitlines():
                m = re.match(r"\s*/\*[0-9a-f]{4}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)",
                             line)
                if m:
                    ops[m.group(1)] += 1
            res["sass"] = dict(ops)
    return res


def resident(ctx, regs):
    """Elements resident per SM: registers (per-warp allocation), shared memory, threads."""
    warps = math.ceil(ctx["threads"] / 32)
    per_warp = math.ceil(regs * 32 / 256) * 256
    blocks = min(SM_REGS // (per_warp * warps), SM_SMEM // (ctx["smem_bytes"] + 1024),
                 SM_THREADS // (warps * 32), SM_BLOCKS)
    return blocks * ctx["per_block"]


def counts(ops):
    pick = lambda pre: sum(v for k, v in ops.items() if k.startswith(pre))  # noqa: E731
    return dict(LDS=pick("LDS"), STS=pick("STS"), DFMA=pick("DFMA"), DMUL=pick("DMUL"),
                LDG=pick("LDG"), total=sum(ops.values()))


def main():
    rows = []
    print("| p | nq | rb | threads/element | per_block | registers | spill (stack B) "
          "| elements/SM | heuristic rb=1 (per_block, min_blocks): registers, stack B |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in range(4, 9):
        for nq in (p + 1, p + 2):
            nd = p + 1
            heur = P.action_ctx(3, nd, nq, 1, "float64")
            h = compile_(heur)
            for rb in (1, 2, 3, 4):
                probe = P.action_ctx(3, nd, nq, 1, "float64", params=dict(per_block=1, rb=rb))
                if probe["rb"] != rb:
                    continue                     # normalised to a smaller rb: same kernel
                pb = max(1, 128 // probe["tpi"])  # ~128 threads per block, no register cap
                ctx = P.action_ctx(3, nd, nq, 1, "float64",
                                   params=dict(per_block=pb, min_blocks=0, rb=rb))
                r = compile_(ctx)
                res = resident(ctx, r["registers"])
                rows.append(dict(p=p, nq=nq, rb=rb, tpi=ctx["tpi"], per_block=pb, **r,
                                 elements_per_sm=res,
                                 heuristic=dict(per_block=heur["per_block"],
                                                min_blocks=heur["min_blocks"], **h)))
                hs = (f"({heur['per_block']}, {heur['min_blocks']}): {h['registers']}, "
                      f"{h['stack_bytes']}") if rb == 1 else ""
                print(f"| {p} | {nq} | {rb} | {ctx['tpi']} | {pb} | {r['registers']} | "
                      f"{r['spill_stores']} st / {r['spill_loads']} ld ({r['stack_bytes']}) | "
                      f"{res} | {hs} |", flush=True)
    sass = []
    if CUOBJDUMP:
        print("\n| p | nq | rb | threads/element | LDS/thread | DFMA/thread | LDS/element "
              "| DFMA/element | DFMA per LDS |")
        print("|---|---|---|---|---|---|---|---|---|")
        for p, nq in ((4, 5), (6, 8), (8, 10)):
            for rb in (1, 2, 3):
                ctx = P.action_ctx(3, p + 1, nq, 1, "float64", params=dict(per_block=1, rb=rb))
                c = counts(compile_(ctx, sass=True)["sass"])
                sass.append(dict(p=p, nq=nq, rb=rb, tpi=ctx["tpi"], **c))
                t = ctx["tpi"]
                print(f"| {p} | {nq} | {ctx['rb']} | {t} | {c['LDS']} | {c['DFMA']} | "
                      f"{c['LDS'] * t} | {c['DFMA'] * t} | {c['DFMA'] / c['LDS']:.2f} |",
                      flush=True)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_results",
                       "action_rb_ptxas.json")
    with open(out, "w") as f:
        json.dump(dict(arch=ARCH, dtype="float64", nvcc=subprocess.run(
            ["nvcc", "--version"], capture_output=True, text=True).stdout.splitlines()[-1],
            rows=rows, sass=sass), f, indent=1)


if __name__ == "__main__":
    main()
