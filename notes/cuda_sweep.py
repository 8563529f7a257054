"""Parameter sweep for the CUDA heuristics (one GPU run): time variants of a kernel.

Installs each variant through ``_cuda_params.set_table_lookup`` and builds the
executor directly (no plan cache), times it with CUDA events (median of 20)
and prints its fraction of the bandwidth bound measured in the same run.

    python notes/cuda_sweep.py [action|gemm|assembly ...]
"""
import json
import sys

import numpy as np
import cupy as cp

from smalltc.backends import _cuda_params as P
from smalltc.backends import get
from smalltc.spec import ActionSpec, AssemblySpec, GemmSpec

sys.path.insert(0, "notes")
from cuda_bench import copy_bw, timeit, FOOT, free  # noqa: E402

BE = get("cuda")


def run_variants(spec, ops, out, variants, bytes_, bw, label, rows):
    best = None
    for v in variants:
        P.set_table_lookup(lambda s, cc, v=v: v)
        try:
            ex = BE.build(spec)
        except Exception as err:  # a variant that does not compile or fit
            print(f"  {label} {v}: {type(err).__name__}")
            continue
        finally:
            P.set_table_lookup(None)
        if ex.source != "table":
            continue
        t = timeit(lambda: ex.run(ops, out))
        f = bytes_ / bw / t
        rows.append(dict(label=label, variant=v, t=t, frac=f, params=ex.params))
        print(f"  {label} {v}: {1e3 * t:.4f} ms  {100 * f:5.1f}% bound", flush=True)
        best = max(best or (0, None), (f, str(v)))
    print(f"{label}: best {best}", flush=True)


def sweep_action(bw, rows, dt="float64", ps=(1, 2, 4, 6, 8), dq=2):
    s = np.dtype(dt).itemsize
    for p in ps:
        nd, nq = p + 1, p + dq
        per = s * (2 * nd ** 3 + nq ** 3)
        E = FOOT // per
        spec = ActionSpec(dim=3, nq=nq, nd=nd, batch=E, dtype=dt)
        ops = (cp.random.standard_normal((nq, nd)).astype(dt),
               (cp.random.random((E, nq, nq, nq)) + .5).astype(dt),
               cp.random.standard_normal((E, nd, nd, nd)).astype(dt))
        out = cp.empty_like(ops[2])
        base = P.action_ctx(3, nd, nq, 1, dt)
        ne = base["per_block"]
        tpi = base["tpi"]
        variants = []
        for k in sorted({max(1, ne // 2), ne, ne * 2, ne * 4}):
            if k * tpi > 1024:
                continue
            for mb in (0, 2, 3, 4, 6):
                if mb and mb * k * tpi > 2048:
                    continue
                variants.append(dict(per_block=k, min_blocks=mb))
        run_variants(spec, ops, out, variants, per * E, bw, f"action3d {dt} p={p} nq={nq}", rows)
        del ops, out
        free()


def sweep_gemm(bw, rows, dt="float64", ns=(10, 16, 32)):
    s = np.dtype(dt).itemsize
    for n in ns:
        batch = max(100_000, FOOT // (3 * n * n * s))
        spec = GemmSpec(batch=batch, m=n, n=n, k=n, dtype=dt)
        ops = (cp.random.standard_normal((batch, n, n)).astype(dt),
               cp.random.standard_normal((batch, n, n)).astype(dt), None)
        out = cp.empty((batch, n, n), dt)
        variants = []
        for dx in (n, (n + 1) // 2, (n + 3) // 4, 8):
            for dy in (n, (n + 1) // 2, (n + 3) // 4, (n + 7) // 8):
                tpm = dx * dy
                for nb in (1, 2, 4, 8, 16):
                    if 64 <= tpm * nb <= 512 and dx >= 4:
                        variants.append(dict(dim_x=dx, dim_y=dy, per_block=nb))
        run_variants(spec, ops, out, variants, 3 * batch * n * n * s, bw, f"gemm {dt} n={n}", rows)
        del ops, out
        free()


if __name__ == "__main__":
    what = sys.argv[1:] or ["action", "gemm"]
    bw = copy_bw()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    if "action" in what:
        sweep_action(bw, rows)
    if "actionq1" in what:
        sweep_action(bw, rows, "float64", (1, 2, 5, 6, 8), dq=1)
    if "action32" in what:
        sweep_action(bw, rows, "float32", (1, 4, 8))
    if "gemm" in what:
        sweep_gemm(bw, rows)
    import os
    with open(os.path.join(os.environ.get("OUT", "notes"), "sweep.json"), "w") as f:
        json.dump(dict(bw=bw, rows=rows), f, default=str)
