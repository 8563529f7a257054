"""Timing sweep, one GPU run: the fused 3D action with register blocking rb = 1, 2, 3.

For each size (3D, p = 1..8, nq = p+1, p+2, float64 by default) it times
the kernel the library runs today (the shipped tuning table or the
heuristic: "shipped") and, for rb = 1, 2, 3, a small grid of launch choices
(about 128 and 256 threads per block, ``min_blocks`` 0 and 2), each forced
through ``_cuda_params.set_table_lookup``. Kernels are compiled first in a
process pool (CuPy's disk cache), then timed one by one: CUDA events, 3
warm-ups, median of 20 samples of 5 back-to-back calls (notes/cuda_bench.py),
>= 256 MB touched per call, random inputs. Every variant's output is
compared with the shipped kernel's on the same inputs (relative norm).
Writes ``$OUT/action_rb_sweep.json`` (or ``--json``) and prints one line per
variant and a summary per size.

    python notes/action_rb_sweep.py [--ps 1-8] [--dq 1,2] [--dtype float64] [--jobs 14]
    python notes/action_rb_sweep.py --dry      # list the variants (no GPU)
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from smalltc.backends import _cuda_params as P
from smalltc.spec import ActionSpec

RBS = (1, 2, 3)
THREADS = (128, 256)
MIN_BLOCKS = (0, 2)


def variants(nd, nq, dt):
    """Parameter dicts for one size: rb x (threads per block) x min_blocks, deduplicated."""
    out, seen = [], set()
    for rb in RBS:
        for target in THREADS:
            probe = P.action_ctx(3, nd, nq, 1, dt, params=dict(per_block=1, rb=rb))
            if probe is None or probe["rb"] != rb:
                continue
            pb = max(1, round(target / probe["tpi"]))
            for mb in MIN_BLOCKS:
                prm = dict(per_block=pb, min_blocks=mb, rb=rb)
                ctx = P.action_ctx(3, nd, nq, 1, dt, params=prm)
                if ctx is None or mb * ctx["threads"] > 2048:
                    continue
                key = (pb, max(mb, 1), rb)        # min_blocks 0 and 1: the same cap
                if key not in seen:
                    seen.add(key)
                    out.append(prm)
    return out


def _compile(args):
    """Worker: build through the CUDA backend (fills CuPy's disk cache); resources."""
    spec, params = args
    from smalltc.tuning.compile import compile_cuda
    return compile_cuda(spec, params)


def _parse_ps(text):
    a, _, b = text.partition("-")
    return range(int(a), int(b or a) + 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ps", default="1-8")
    ap.add_argument("--dq", default="1,2", help="nq - p values")
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."),
                                                   "action_rb_sweep.json"))
    ap.add_argument("--dry", action="store_true", help="list the variants, touch no GPU")
    a = ap.parse_args()
    dt = a.dtype
    sizes = [(p + 1, p + int(q)) for p in _parse_ps(a.ps) for q in a.dq.split(",")]
    plan = {s: variants(*s, dt) for s in sizes}
    if a.dry:
        for (nd, nq), vs in plan.items():
            print(f"nd={nd} nq={nq}: {len(vs)} variants: {vs}")
        print(f"{sum(map(len, plan.values()))} variants + {len(plan)} shipped")
        return 0

    import numpy as np
    import cupy as cp
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cuda_bench import FOOT, copy_bw, free, timeit
    from smalltc.backends import get
    from smalltc.tuning.compile import injected

    t0 = time.time()
    jobs = [(ActionSpec(dim=3, nq=nq, nd=nd, batch=1, dtype=dt), v)
            for (nd, nq), vs in plan.items() for v in vs]
    with ProcessPoolExecutor(a.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        compiled = list(pool.map(_compile, jobs))
    res = {(s.nd, s.nq, json.dumps(v, sort_keys=True)): r for (s, v), r in zip(jobs, compiled)}
    print(f"compiled {len(jobs)} variants in {time.time() - t0:.0f} s "
          f"({sum(not r['ok'] for r in compiled)} failed)", flush=True)
    bw = copy_bw()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    be, s = get("cuda"), np.dtype(dt).itemsize
    rows, summary = [], []
    for (nd, nq), vs in plan.items():
        per = s * (2 * nd ** 3 + nq ** 3)
        E = FOOT // per
        spec = ActionSpec(dim=3, nq=nq, nd=nd, batch=E, dtype=dt)
        B1d = cp.random.standard_normal((nq, nd)).astype(dt)
        D = (cp.random.random((E, nq, nq, nq)) + 0.5).astype(dt)
        V = cp.random.standard_normal((E, nd, nd, nd)).astype(dt)
        ref, out = cp.empty_like(V), cp.empty_like(V)
        ops = (B1d, D, V)
        shipped = be.build(spec)                  # what the library runs today
        shipped.run(ops, ref)
        here = []
        for label, v in [("shipped", None)] + [("forced", v) for v in vs]:
            r = res.get((nd, nq, json.dumps(v, sort_keys=True)), {}) if v else {}
            if v is not None and not r.get("ok"):
                rows.append(dict(nd=nd, nq=nq, label=label, params=v, error=r.get("error")))
                continue
            if v is None:
                ex = shipped
            else:
                with injected(v, spec):
                    ex = be.build(spec)
            out.fill(float("nan"))
            t = timeit(lambda: ex.run(ops, out))
            err = float(cp.linalg.norm(out - ref) / cp.linalg.norm(ref))
            row = dict(nd=nd, nq=nq, p=nd - 1, label=label, params=dict(ex.params),
                       source=ex.source, time_s=t, frac_bound=per * E / bw / t,
                       gdofs=E * nd ** 3 / t / 1e9, rel_diff_vs_shipped=err,
                       rb=ex.params.get("rb", 1))
            rows.append(row)
            here.append(row)
            pr = {k: ex.params.get(k) for k in ("rb", "per_block", "min_blocks", "threads",
                                                "registers", "local_bytes")}
            print(f"p={nd - 1} nq={nq} {label:8s} {pr}: {1e3 * t:.4f} ms "
                  f"{100 * row['frac_bound']:5.1f}% bound, diff {err:.1e}", flush=True)
        ok = [r for r in here if r["rel_diff_vs_shipped"] < (1e-11 if dt == "float64" else 1e-4)]
        base = next((r for r in ok if r["label"] == "shipped"), None)
        best = {rb: max((r for r in ok if r["rb"] == rb and r["label"] == "forced"),
                        key=lambda r: r["frac_bound"], default=None) for rb in RBS}
        line = dict(p=nd - 1, nq=nq, shipped=base and base["frac_bound"],
                    best={rb: b and dict(frac_bound=b["frac_bound"], params=b["params"])
                          for rb, b in best.items()},
                    wrong=[r["params"] for r in here if r not in ok])
        summary.append(line)
        print(f"== p={nd - 1} nq={nq}: shipped {100 * (line['shipped'] or math.nan):.1f}%, "
              + ", ".join(f"best rb={rb} {100 * b['frac_bound']:.1f}%"
                          for rb, b in best.items() if b) +
              (f"; WRONG {line['wrong']}" if line["wrong"] else ""), flush=True)
        del B1d, D, V, ref, out, ops, shipped
        free()
    info = dict(cp.cuda.runtime.getDeviceProperties(0))
    with open(a.json, "w") as f:
        json.dump(dict(device=info.get("name", b"").decode(errors="replace")
                       if isinstance(info.get("name"), bytes) else str(info.get("name")),
                       dtype=dt, bw=bw, seconds=time.time() - t0, rows=rows,
                       summary=summary), f, indent=1, default=str)
    print(f"wrote {a.json} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
