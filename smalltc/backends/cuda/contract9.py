"""The kernel-(9) family: ``A[b](k,i,l,j) = sum_s B(s,i) B(s,j) C[b](k,s,l)``.

Every step of the pairwise assembly (1a)-(2c) is this kernel (docs/math.md section 3).
``contract9.cu.j2`` forms the products ``BB(i,j,s) = B(s,i) B(s,j)`` once per
block in shared memory (rows :func:`bb_stride` apart, against bank conflicts),
stages ``per_block`` items of C, and writes the outputs in storage order.
``B`` must be shared by the batch and C must not be; anything else runs the
generic kernel (:func:`.layout.generic_executor`).

=================  ==========================  ===================================
spec               template                    entry point (example)
=================  ==========================  ===================================
ContractSpec 9     ``contract9.cu.j2``         ``stc_contract9_f64_s4n3k1l16``
=================  ==========================  ===================================

Tuning parameter: ``per_block`` (items per block).
"""
from __future__ import annotations

import math
from dataclasses import replace

from .family import (DEFAULT_DEVICE, DT, ITEMSIZE, POW2, SMEM_TARGET, THREADS, Family,
                     KernelExecutor, even)
from .layout import MAX_UNROLLED

__all__ = ["CONTRACT9", "Contract9Family", "contract9_ctx", "bb_stride", "fold_k9"]


def contract9_ctx(S, N, K, L, dtype, smem_optin=227 * 1024, params=None):
    """Context of ``contract9.cu.j2``, or None when one item does not fit."""
    s = ITEMSIZE[dtype]
    if max(S, N, K * L) > 4 * MAX_UNROLLED or S > MAX_UNROLLED:
        return None
    ys, os_ = K * S * L, K * N * L * N
    nb = params["per_block"] if params else max(1, min(64, math.ceil(1024 / os_)))
    sb = bb_stride(S, N, s)

    def smem(nb):
        return s * (even(N * N * sb) + nb * ys)

    while params is None and nb > 1 and smem(nb) > SMEM_TARGET:
        nb -= 1
    if smem(nb) > smem_optin:
        return None
    return dict(kind="9", S=S, N=N, K=K, L=L, SB=sb, dtype=dtype, per_block=nb, threads=THREADS,
                smem_bytes=smem(nb), unroll=min(8, math.ceil(nb * os_ / THREADS)), min_blocks=0)


def bb_stride(S, N, itemsize):
    """Row stride (in items) of kernel (9)'s ``BB(i, j, :)`` table in shared memory.

    In one load instruction a warp reads row ``(i, j)`` for up to N different j
    (the output's fastest index). Rows S items apart start on banks S*itemsize/4
    apart; at S*itemsize = 64 bytes (float64 S = 8, float32 S = 16) or 32 bytes
    (float32 S = 8) the N rows fall on two or four banks and the loads replay
    (step (2c) p = 6, float64: 30% of its bound, S = 7 next to it: 89%). The
    stride is the smallest one from S on whose N rows use distinct banks,
    stepping by whole 16-byte vectors when S allows 128-bit loads, so they stay.

    >>> bb_stride(8, 7, 8), bb_stride(7, 6, 8), bb_stride(8, 7, 4), bb_stride(6, 5, 8)
    (10, 7, 12, 6)
    """
    vec = 16 if (S * itemsize) % 16 == 0 else itemsize    # bytes one load reads per row
    step = vec // itemsize
    words = vec // 4
    allowed = max(1, math.ceil(N * words / 32))
    for sb in range(S, S + 8 * step + 1, step):
        banks = [0] * 32
        for j in range(N):
            for w in range(words):
                banks[(j * sb * itemsize // 4 + w) % 32] += 1
        if max(banks) <= allowed:
            return sb
    return S


def fold_k9(spec):
    """The kernel-(9) spec that runs ``spec``: ``spec`` itself, or with K folded into the batch.

    ``A[b](k,i,l,j)`` needs only the slab ``C[b](k,:,:)``, and k is the slowest
    index of both C and the output, so element b of K slabs is K consecutive
    elements of one slab each: the same memory read as ``(batch*K, 1, S, L)``
    in, ``(batch*K, 1, N, L, N)`` out. When one item's ``K*L`` is past what
    :func:`contract9_ctx` unrolls (3D assembly step (2c) from p = 4 on: K = L =
    (p+2)^2), the folded spec keeps the specialised kernel instead of the
    generic one (notes/cuda.md). Other specs come back unchanged.

    >>> from smalltc.spec import ContractSpec
    >>> s = ContractSpec(kind="9", batch=10, i=5, s=6, j=5, k=36, l=36, dtype="float64",
    ...                  shared_x=True)
    >>> f = fold_k9(s); (f.batch, f.k, f.l)
    (360, 1, 36)
    >>> fold_k9(f.with_batch(1)) == f.with_batch(1)
    True
    """
    if (spec.op != "contract" or spec.kind != "9" or not spec.shared_x or spec.shared_y
            or spec.k == 1 or spec.k * spec.l <= 4 * MAX_UNROLLED):
        return spec
    return replace(spec, k=1, batch=spec.batch * spec.k)


def _outputs_per_item(spec):
    return spec.k * spec.i * spec.l * spec.j


class Contract9Family(Family):
    """Kernel (9) through ``contract9.cu.j2``; see the module docstring."""

    name = "contract9"
    templates = ("contract9.cu.j2",)
    params = ("per_block",)
    max_distance = 2.0

    def claims(self, spec):
        return (spec.op == "contract" and spec.kind == "9" and spec.shared_x
                and not spec.shared_y)

    def tuned_spec(self, spec):
        return fold_k9(spec)

    def context(self, spec, params=None, device=DEFAULT_DEVICE):
        return contract9_ctx(spec.s, spec.i, spec.k, spec.l, spec.dtype,
                             device["smem_optin"], params)

    def entry(self, spec, ctx):
        return f"stc_contract9_{DT[spec.dtype]}_s{spec.s}n{spec.i}k{spec.k}l{spec.l}"

    def executor(self, choice, device):
        return Contract9Executor(choice, device)

    def space(self, spec):
        """Items per block 1, 2, 4, ... 512."""
        for nb in POW2[:10]:
            yield dict(per_block=nb), None

    def carry(self, spec, entry_spec, params, device):
        """The same outputs per block."""
        nb = max(1, round(params["per_block"] * _outputs_per_item(entry_spec)
                          / _outputs_per_item(spec)))
        return self.first_valid(spec, dict(per_block=nb), device)


CONTRACT9 = Contract9Family()


class Contract9Executor(KernelExecutor):
    def __init__(self, choice, device):
        super().__init__(choice, device)
        self.nbatch = choice.spec.batch

    def run(self, operands, out, **_):
        X, Y = operands
        self._run_arrays(self.nbatch, (X, Y, out))
