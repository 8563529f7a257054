"""One launch per configuration, for Nsight Compute (ncu) to profile.

    ncu --section SpeedOfLight ... python3 notes/cuda_ncu.py [CASE ...]

CASE is ``action:DIM:P:NQ:DTYPE``, ``assembly:DIM:P:NQ:DTYPE``,
``contract9:S:N:K:L:DTYPE`` (kernel (9), B shared) or ``gemm:N[:BATCH]:DTYPE`` (square,
beta = 1, C updated in place); without arguments the cases of
session 1. A suffix ``@k=v,k=v`` forces those kernel parameters (as a tuning table
would give them), e.g. ``action:3:8:9:float64@line=1,per_block=2,min_blocks=0,prefetch=1``. Each case runs its plan twice (the first launch warms up), with the plan
the runtime would choose (tuning tables included), on a ~256 MiB batch.
"""
import sys

import cupy as cp

import smalltc

DEFAULT = ["action:3:1:2:float64", "action:3:1:3:float64", "action:3:5:6:float64",
           "action:3:5:7:float64", "assembly:3:3:4:float32", "assembly:3:3:4:float64"]
FOOT = 256 * 2 ** 20


def force(params):
    """Make the next plan take ``params`` (a table's answer) for every spec."""
    from smalltc.backends import _cuda_params as P
    global DEFAULT_LOOKUP
    if DEFAULT_LOOKUP is None:
        DEFAULT_LOOKUP = [P.get_table_lookup()]      # the shipped tables
    P.set_table_lookup(DEFAULT_LOOKUP[0] if params is None else (lambda spec, cc: dict(params)))


DEFAULT_LOOKUP = None


def inputs(case):
    case, _, forced = case.partition("@")
    force({k: int(v) for k, v in (kv.split("=") for kv in forced.split(","))} if forced else None)
    op, *rest = case.split(":")
    dt = rest[-1]
    s = cp.dtype(dt).itemsize
    if op == "gemm":          # gemm:N:DTYPE, or gemm:N:BATCH:DTYPE (the bench's 100,000)
        n = int(rest[0])
        E = int(rest[1]) if len(rest) > 2 else FOOT // (s * 4 * n * n)
        A, B, C = (cp.random.standard_normal((E, n, n)).astype(dt) for _ in range(3))
        pl = smalltc.plan("gemm", A, B, C, beta=1.0, backend="cuda")
        return (lambda A, B, C: pl(A, B, C, out=C, beta=1.0)), (A, B, C), pl
    if op == "contract9":
        S, N, K, L = map(int, rest[:4])
        E = FOOT // (s * (K * S * L + K * N * L * N))
        B = cp.random.standard_normal((S, N)).astype(dt)
        C = cp.random.standard_normal((E, K, S, L)).astype(dt)
        return smalltc.plan("contract", B, C, kind="9", backend="cuda"), (B, C)
    dim, p, nq = map(int, rest[:3])
    nd = p + 1
    B1d = cp.random.standard_normal((nq, nd)).astype(dt)
    if op == "action":
        E = FOOT // (s * (2 * nd ** dim + nq ** dim))
        D = (cp.random.random((E,) + (nq,) * dim) + .5).astype(dt)
        V = cp.random.standard_normal((E,) + (nd,) * dim).astype(dt)
        return smalltc.plan("action", B1d, D, V, backend="cuda"), (B1d, D, V)
    E = FOOT // (s * (nq ** dim + nd ** (2 * dim)))
    D = (cp.random.random((E,) + (nq,) * dim) + .5).astype(dt)
    return smalltc.plan("assembly", B1d, D, backend="cuda"), (B1d, D)


for case in sys.argv[1:] or DEFAULT:
    call, ops, *plan = inputs(case)
    pl = plan[0] if plan else call
    for _ in range(2):
        call(*ops)
    cp.cuda.runtime.deviceSynchronize()
    print(case, pl.kernel, pl.params, pl.source, file=sys.stderr)
    del ops
    cp.get_default_memory_pool().free_all_blocks()
