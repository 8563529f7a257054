"""SIMD building blocks the CPU templates call that plain Numba cannot express.

The action and the assembly vectorise across elements (lanes = elements of
a chunk), so their inputs and outputs must change layout between
``array[element, entry]`` and the lane buffers ``buf[entry, lane]``. Written
as scalar loops, every entry is one scalar load and one scalar store
(the assembly's output was 137 ``vmovsd`` stores to 14 zmm FMAs at p=6, see
notes/cpu.md). :func:`tr_block` moves one L x L block (L = one 64-byte
vector: 8 float64, 16 float32) with L vector loads, log2(L) * L two-source
shuffles and L vector stores.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["tr_block", "block_lanes"]

#: bytes of one SIMD vector (AVX-512)
VECTOR_BYTES = 64


def block_lanes(dtype) -> int:
    """Side L of the block :func:`tr_block` moves for ``dtype`` (8 f64, 16 f32)."""
    return VECTOR_BYTES // np.dtype(dtype).itemsize


def _butterfly_masks(L):
    """Shuffle masks of the log2(L) stages: stage s swaps bit s of row and column."""
    stages, s = [], 1
    while s < L:
        lo = [j if not j & s else L + j - s for j in range(L)]
        hi = [j + s if not j & s else L + j for j in range(L)]
        stages.append((s, lo, hi))
        s *= 2
    return stages


@intrinsic
def tr_block(typingctx, dst, dr, dc, src, sr, sc):
    """``dst[dr + a, dc + b] = src[sr + b, sc + a]`` for ``a, b < L``.

    Both arrays are 2D, C-contiguous, of one float dtype; rows of L
    consecutive entries are read and written as whole vectors (no alignment
    needed). No bounds checks: the caller keeps the block inside both arrays.
    """
    for arr in (dst, src):
        if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.layout == "C"
                and arr.dtype in (types.float64, types.float32)):
            return None
    if dst.dtype != src.dtype:
        return None
    L = VECTOR_BYTES // (dst.dtype.bitwidth // 8)
    sig = types.void(dst, dr, dc, src, sr, sc)

    def codegen(context, builder, signature, args):
        dty, drt, dct, sty, srt, sct = signature.args
        dval, dr_, dc_, sval, sr_, sc_ = args
        intp = context.get_value_type(types.intp)
        darr = context.make_array(dty)(context, builder, dval)
        sarr = context.make_array(sty)(context, builder, sval)
        dcols = cgutils.unpack_tuple(builder, darr.shape, 2)[1]
        scols = cgutils.unpack_tuple(builder, sarr.shape, 2)[1]
        dr_, dc_ = (context.cast(builder, v, t, types.intp) for v, t in ((dr_, drt), (dc_, dct)))
        sr_, sc_ = (context.cast(builder, v, t, types.intp) for v, t in ((sr_, srt), (sc_, sct)))
        elt = context.get_data_type(dty.dtype)
        vty = ir.VectorType(elt, L)
        align = dty.dtype.bitwidth // 8

        def row_ptr(arr, cols, r0, c0, a):
            idx = builder.add(builder.mul(builder.add(r0, ir.Constant(intp, a)), cols), c0)
            return builder.bitcast(builder.gep(arr.data, [idx]), vty.as_pointer())

        rows = [builder.load(row_ptr(sarr, scols, sr_, sc_, b), align=align) for b in range(L)]
        mty = ir.VectorType(ir.IntType(32), L)
        for s, lo, hi in _butterfly_masks(L):
            new = list(rows)
            for a in range(L):
                if not a & s:
                    new[a] = builder.shuffle_vector(rows[a], rows[a + s], ir.Constant(mty, lo))
                    new[a + s] = builder.shuffle_vector(rows[a], rows[a + s], ir.Constant(mty, hi))
            rows = new
        for a in range(L):
            builder.store(rows[a], row_ptr(darr, dcols, dr_, dc_, a), align=align)
        return context.get_dummy_value()

    return sig, codegen
