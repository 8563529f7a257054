"""SIMD building blocks the CPU templates call that plain Numba cannot express.

The action and the assembly vectorise across elements (lanes = elements of
a chunk), so their inputs and outputs must change layout between
``array[element, entry]`` and the lane buffers ``buf[entry, lane]``. Written
as scalar loops, every entry is one scalar load and one scalar store
(the assembly's output was 137 ``vmovsd`` stores to 14 zmm FMAs at p=6, see
notes/cpu.md). :func:`tr_block` moves one L x L block with L vector loads,
log2(L) * L two-source shuffles and L vector stores; :func:`tr_rows` does the
same from rows given by an index array (the elements of one colour, which
are not consecutive). L is the kernel's lane count (a compile-time literal):
one vector register of the target or a multiple of it, which LLVM splits.

:func:`vector_width` asks LLVM for vectors of a given width in the function
that calls it (the ``prefer-vector-width`` function attribute): on Intel
AVX-512 cores LLVM otherwise stays at 256 bits. :func:`prefetch` asks for a
cache line ahead of its use (``llvm.prefetch``: ``prefetcht0``/``prefetchw``).

:func:`lane_sums` is one register block of a contraction step across lanes:
the source rows loaded as whole vectors once, ``R`` outputs each a chain of
FMAs with broadcast coefficients, one vector store each. It is the code the
SLP vectoriser made of ``R x L`` scalar statements of ``nin`` terms, written
as one call: Numba types and lowers one call instead of ``R x L x 3 nin``
scalar operations, and LLVM has nothing left to pack, so a kernel compiles
several times faster (notes/cpu.md, compile times). :func:`lane_dots` is its
counterpart with a coefficient per lane (each lane its own element's matrix: the
Schwarz solve): one output row, the sum of the products of pairs of rows.
:func:`coef_block` loads a register block's coefficients (``R x S`` entries of a 1D
matrix) and :func:`row_run` makes its row indices (a run with the stride of the
contracted axis), one call each where the templates wrote ``R x S`` subscripts and
``R + S`` index expressions; :func:`lane_qfunc` is the operator family's pointwise stage
at one point (``h = Q g``, and ``u = D u``) across the lanes. Each call is one node of
Numba's IR to type and lower where there were dozens (notes/cpu.md, compile times).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["tr_block", "tr_rows", "vector_width", "prefetch", "lane_sums", "lane_dots", "row_run",
           "coef_block", "lane_qfunc"]

_FLOATS = (types.float64, types.float32)


def _butterfly_masks(L):
    """Shuffle masks of the log2(L) stages: stage s swaps bit s of row and column."""
    stages, s = [], 1
    while s < L:
        lo = [j if not j & s else L + j - s for j in range(L)]
        hi = [j + s if not j & s else L + j for j in range(L)]
        stages.append((s, lo, hi))
        s *= 2
    return stages


def _is_2d_c(arr):
    return isinstance(arr, types.Array) and arr.ndim == 2 and arr.layout == "C"


def _transpose(builder, rows, L):
    """The L vectors ``rows`` (row b = source row b) transposed: vector a = column a."""
    mty = ir.VectorType(ir.IntType(32), L)
    for s, lo, hi in _butterfly_masks(L):
        new = list(rows)
        for a in range(L):
            if not a & s:
                new[a] = builder.shuffle_vector(rows[a], rows[a + s], ir.Constant(mty, lo))
                new[a + s] = builder.shuffle_vector(rows[a], rows[a + s], ir.Constant(mty, hi))
        rows = new
    return rows


def _block_codegen(L, gathered):
    def codegen(context, builder, signature, args):
        if gathered:
            dty, drt, dct, sty, ity, i0t, sct, _ = signature.args
            dval, dr_, dc_, sval, ival, i0_, sc_, _ = args
        else:
            dty, drt, dct, sty, srt, sct, _ = signature.args
            dval, dr_, dc_, sval, sr_, sc_, _ = args
        intp = context.get_value_type(types.intp)
        darr = context.make_array(dty)(context, builder, dval)
        sarr = context.make_array(sty)(context, builder, sval)
        dcols = cgutils.unpack_tuple(builder, darr.shape, 2)[1]
        scols = cgutils.unpack_tuple(builder, sarr.shape, 2)[1]

        def cast(v, t):
            return context.cast(builder, v, t, types.intp)

        dr_, dc_, sc_ = cast(dr_, drt), cast(dc_, dct), cast(sc_, sct)
        elt = context.get_data_type(dty.dtype)
        vty = ir.VectorType(elt, L)
        align = dty.dtype.bitwidth // 8

        def vec_ptr(arr, cols, row, c0):
            idx = builder.add(builder.mul(row, cols), c0)
            return builder.bitcast(builder.gep(arr.data, [idx]), vty.as_pointer())

        if gathered:
            iarr = context.make_array(ity)(context, builder, ival)
            i0_ = cast(i0_, i0t)
            src_rows = []
            for b in range(L):
                k = builder.add(i0_, ir.Constant(intp, b))
                r = builder.load(builder.gep(iarr.data, [k]))
                src_rows.append(cast(r, ity.dtype))
        else:
            sr_ = cast(sr_, srt)
            src_rows = [builder.add(sr_, ir.Constant(intp, b)) for b in range(L)]
        rows = [builder.load(vec_ptr(sarr, scols, r, sc_), align=align) for r in src_rows]
        rows = _transpose(builder, rows, L)
        for a in range(L):
            builder.store(rows[a], vec_ptr(darr, dcols, builder.add(dr_, ir.Constant(intp, a)),
                                           dc_), align=align)
        return context.get_dummy_value()
    return codegen


@intrinsic
def tr_block(typingctx, dst, dr, dc, src, sr, sc, L):
    """``dst[dr + a, dc + b] = src[sr + b, sc + a]`` for ``a, b < L`` (L a literal power of 2).

    Both arrays are 2D, C-contiguous, of one float dtype; rows of L
    consecutive entries are read and written as whole vectors (no alignment
    needed). No bounds checks: the caller keeps the block inside both arrays.
    """
    if not isinstance(L, types.IntegerLiteral):
        return None
    n = L.literal_value
    if not (_is_2d_c(dst) and _is_2d_c(src) and dst.dtype in _FLOATS
            and dst.dtype == src.dtype and n >= 1 and n & (n - 1) == 0):
        return None
    return types.void(dst, dr, dc, src, sr, sc, L), _block_codegen(n, False)


@intrinsic
def tr_rows(typingctx, dst, dr, dc, src, rows, r0, sc, L):
    """``dst[dr + a, dc + b] = src[rows[r0 + b], sc + a]`` for ``a, b < L``: :func:`tr_block`
    from the rows that an integer array names (the elements of a chunk that are not
    consecutive). No bounds checks."""
    if not isinstance(L, types.IntegerLiteral):
        return None
    n = L.literal_value
    if not (_is_2d_c(dst) and _is_2d_c(src) and dst.dtype in _FLOATS
            and dst.dtype == src.dtype and isinstance(rows, types.Array) and rows.ndim == 1
            and isinstance(rows.dtype, types.Integer) and n >= 1 and n & (n - 1) == 0):
        return None
    return types.void(dst, dr, dc, src, rows, r0, sc, L), _block_codegen(n, True)


@intrinsic
def vector_width(typingctx, bits):
    """Ask LLVM for ``bits``-wide vectors (a literal, e.g. 512) in the calling function.

    Adds the function attributes ``prefer-vector-width`` and ``min-legal-vector-width``
    (what clang's ``-mprefer-vector-width`` sets); ``bits`` 0 adds nothing. It changes
    only the function whose body calls it (inlined bodies: their caller).
    """
    if not isinstance(bits, types.IntegerLiteral):
        return None
    n = bits.literal_value

    def codegen(context, builder, signature, args):
        if n:
            attrs = builder.function.attributes
            # string attributes: llvmlite's set validates names, so add them to the set
            # itself; the IR printer writes them as they are ("key"="value")
            set.add(attrs, f'"prefer-vector-width"="{n}"')
            set.add(attrs, f'"min-legal-vector-width"="{n}"')
        return context.get_dummy_value()

    return types.void(bits), codegen


@intrinsic
def prefetch(typingctx, arr, row, col, write):
    """Prefetch the cache line of ``arr[row, col]`` into L1 (``write`` a literal: 1 for a
    line about to be written, ``prefetchw``). A prefetch never faults, so the address
    may lie past the array; no bounds checks."""
    if not (_is_2d_c(arr) and isinstance(write, types.IntegerLiteral)):
        return None
    rw = int(bool(write.literal_value))

    def codegen(context, builder, signature, args):
        aty, rt, ct, _ = signature.args
        aval, r, c, _ = args
        a = context.make_array(aty)(context, builder, aval)
        cols = cgutils.unpack_tuple(builder, a.shape, 2)[1]
        r = context.cast(builder, r, rt, types.intp)
        c = context.cast(builder, c, ct, types.intp)
        idx = builder.add(builder.mul(r, cols), c)
        ptr = builder.bitcast(builder.gep(a.data, [idx]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [ptr, ir.Constant(i32, rw), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, row, col, write), codegen


def _row_ptr(builder, context, arr, cols, row, vty):
    idx = builder.mul(row, cols)
    return builder.bitcast(builder.gep(arr.data, [idx]), vty.as_pointer())


#: the kernels' fast-math flags (base.py.j2's FASTMATH): products and sums fuse into FMAs
_FASTMATH = ("contract", "reassoc", "nsz", "arcp")


def _int_tuple(t):
    return isinstance(t, types.BaseTuple) and len(t) > 0 and all(
        isinstance(e, types.Integer) for e in t)


@intrinsic
def lane_sums(typingctx, dst, drows, src, srows, coefs, scale, acc, L):
    """``dst[drows[r], :L] (+)= (sum_s coefs[r][s] * src[srows[s], :L]) * scale[drows[r], :L]``
    for ``r < R = len(drows)``, ``s < S = len(srows)`` (``coefs`` a tuple of R tuples of S
    numbers: a literal tuple of more than 30 items is one Numba cannot build; L a
    literal; ``scale`` an array or None: no factor; ``acc`` a literal: 1 adds into dst, 0
    overwrites).

    ``dst``, ``src`` (and ``scale``) are 2D C-contiguous arrays of one float dtype with
    at least L columns; each source row is one vector load, shared by the R outputs;
    each output is ``c_0 x_0`` then ``S - 1`` multiply-adds, in the order of s. No bounds checks:
    the rows lie inside the arrays (the caller's constants). The lanes beyond the valid
    elements of a partial chunk compute on whatever the buffers hold, as the scalar
    statements did.
    """
    if not (isinstance(L, types.IntegerLiteral) and isinstance(acc, types.IntegerLiteral)):
        return None
    n = L.literal_value
    has_scale = not isinstance(scale, (types.NoneType, types.Omitted))
    if not (_is_2d_c(dst) and _is_2d_c(src) and dst.dtype in _FLOATS and dst.dtype == src.dtype
            and _int_tuple(drows) and _int_tuple(srows) and n >= 1
            and isinstance(coefs, types.BaseTuple) and len(coefs) == len(drows)
            and all(isinstance(c, types.BaseTuple) and len(c) == len(srows) for c in coefs)):
        return None
    if has_scale and not (_is_2d_c(scale) and scale.dtype == dst.dtype):
        return None
    R, S, add = len(drows), len(srows), bool(acc.literal_value)

    def codegen(context, builder, signature, args):
        dty, drt, sty, srt, cty, scty, _, _ = signature.args
        dval, dr_, sval, sr_, cval, scval, _, _ = args
        intp = types.intp
        elt = context.get_data_type(dty.dtype)
        vty = ir.VectorType(elt, n)
        align = dty.dtype.bitwidth // 8
        darr = context.make_array(dty)(context, builder, dval)
        sarr = context.make_array(sty)(context, builder, sval)
        dcols = cgutils.unpack_tuple(builder, darr.shape, 2)[1]
        scols = cgutils.unpack_tuple(builder, sarr.shape, 2)[1]
        drow = [context.cast(builder, v, t, intp)
                for v, t in zip(cgutils.unpack_tuple(builder, dr_, R), drt)]
        srow = [context.cast(builder, v, t, intp)
                for v, t in zip(cgutils.unpack_tuple(builder, sr_, S), srt)]
        cs = [cgutils.unpack_tuple(builder, row, S)
              for row in cgutils.unpack_tuple(builder, cval, R)]
        xs = [builder.load(_row_ptr(builder, context, sarr, scols, r, vty), align=align)
              for r in srow]
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), n), None)

        def splat(v):
            vec = builder.insert_element(ir.Constant(vty, ir.Undefined), v,
                                         ir.Constant(ir.IntType(32), 0))
            return builder.shuffle_vector(vec, ir.Constant(vty, ir.Undefined), zeros)

        if has_scale:
            sc = context.make_array(scty)(context, builder, scval)
            sccols = cgutils.unpack_tuple(builder, sc.shape, 2)[1]
        for r in range(R):
            y = None
            for s_ in range(S):
                c = context.cast(builder, cs[r][s_], cty[r][s_], dty.dtype)
                t = builder.fmul(splat(c), xs[s_], flags=_FASTMATH)
                y = t if y is None else builder.fadd(y, t, flags=_FASTMATH)
            ptr = _row_ptr(builder, context, darr, dcols, drow[r], vty)
            if has_scale:
                y = builder.fmul(y, builder.load(
                    _row_ptr(builder, context, sc, sccols, drow[r], vty), align=align))
            if add:
                y = builder.fadd(builder.load(ptr, align=align), y)
            builder.store(y, ptr, align=align)
        return context.get_dummy_value()

    return types.void(dst, drows, src, srows, coefs, scale, acc, L), codegen


@intrinsic
def lane_dots(typingctx, dst, drow, a, arows, b, brows, L):
    """``dst[drow, :L] = sum_s a[arows[s], :L] * b[brows[s], :L]`` (``s < S =
    len(arows) = len(brows)``, L a literal): the 2S rows loaded as vectors, ``S``
    products summed in the order of s (fused into FMAs), one vector store.

    ``dst``, ``a`` and ``b`` are 2D C-contiguous arrays of one float dtype with at least
    L columns; every load comes before the store. No bounds checks: the rows lie inside
    the arrays (the caller's constants). It is what the SLP vectoriser made of ``L``
    scalar statements of ``S`` terms, one a lane, written as one call (:func:`lane_sums`).
    """
    if not isinstance(L, types.IntegerLiteral):
        return None
    n = L.literal_value
    if not (_is_2d_c(dst) and _is_2d_c(a) and _is_2d_c(b) and dst.dtype in _FLOATS
            and a.dtype == dst.dtype and b.dtype == dst.dtype and n >= 1
            and isinstance(drow, types.Integer) and _int_tuple(arows) and _int_tuple(brows)
            and len(arows) == len(brows)):
        return None
    S = len(arows)

    def codegen(context, builder, signature, args):
        dty, drt, aty, art, bty, brt, _ = signature.args
        dval, dr_, aval, ar_, bval, br_, _ = args
        intp = types.intp
        vty = ir.VectorType(context.get_data_type(dty.dtype), n)
        align = dty.dtype.bitwidth // 8
        arrs = [context.make_array(t)(context, builder, v)
                for t, v in ((dty, dval), (aty, aval), (bty, bval))]
        cols = [cgutils.unpack_tuple(builder, x.shape, 2)[1] for x in arrs]

        def rows(tup, typ):
            return [context.cast(builder, v, t, intp)
                    for v, t in zip(cgutils.unpack_tuple(builder, tup, S), typ)]
        xa = [builder.load(_row_ptr(builder, context, arrs[1], cols[1], r, vty), align=align)
              for r in rows(ar_, art)]
        xb = [builder.load(_row_ptr(builder, context, arrs[2], cols[2], r, vty), align=align)
              for r in rows(br_, brt)]
        y = None
        for u, v in zip(xa, xb):
            t = builder.fmul(u, v, flags=_FASTMATH)
            y = t if y is None else builder.fadd(y, t, flags=_FASTMATH)
        d = context.cast(builder, dr_, drt, intp)
        builder.store(y, _row_ptr(builder, context, arrs[0], cols[0], d, vty), align=align)
        return context.get_dummy_value()

    return types.void(dst, drow, a, arows, b, brows, L), codegen


@intrinsic
def row_run(typingctx, base, step, n):
    """The tuple ``(base, base + step, ..., base + (n - 1) * step)`` of ``n`` row indices
    (``step`` and ``n`` literals): the rows of a :func:`lane_sums` block as one call."""
    if not (isinstance(base, types.Integer) and isinstance(step, types.IntegerLiteral)
            and isinstance(n, types.IntegerLiteral) and n.literal_value >= 1):
        return None
    k, m = step.literal_value, n.literal_value
    tup = types.UniTuple(types.intp, m)

    def codegen(context, builder, signature, args):
        b = context.cast(builder, args[0], signature.args[0], types.intp)
        ity = context.get_value_type(types.intp)
        rows = [builder.add(b, ir.Constant(ity, k * i)) for i in range(m)]
        return context.make_tuple(builder, tup, rows)

    return tup(base, step, n), codegen


@intrinsic
def coef_block(typingctx, mat, first, R, S, trans):
    """The coefficients of a :func:`lane_sums` block: ``c[r][s] = mat[first + r, s]``
    (``trans`` 0) or ``mat[s, first + r]`` (``trans`` 1) for ``r < R``, ``s < S`` (``R``,
    ``S``, ``trans`` literals), as a tuple of R tuples of S scalars.

    ``mat`` is a 2D C-contiguous float array; no bounds checks (the caller's constants
    keep the block inside it). One call in place of ``R x S`` subscripts and a tuple."""
    if not (_is_2d_c(mat) and mat.dtype in _FLOATS and isinstance(first, types.Integer)
            and all(isinstance(v, types.IntegerLiteral) for v in (R, S, trans))):
        return None
    nr, ns, tr = R.literal_value, S.literal_value, bool(trans.literal_value)
    if nr < 1 or ns < 1:
        return None
    row = types.UniTuple(mat.dtype, ns)
    tup = types.UniTuple(row, nr)

    def codegen(context, builder, signature, args):
        mty, fty = signature.args[0], signature.args[1]
        arr = context.make_array(mty)(context, builder, args[0])
        cols = cgutils.unpack_tuple(builder, arr.shape, 2)[1]
        f = context.cast(builder, args[1], fty, types.intp)
        ity = context.get_value_type(types.intp)
        align = mty.dtype.bitwidth // 8
        out = []
        for r in range(nr):
            i = builder.add(f, ir.Constant(ity, r))
            vals = []
            for s_ in range(ns):
                s_c = ir.Constant(ity, s_)
                idx = builder.add(builder.mul(s_c, cols), i) if tr else \
                    builder.add(builder.mul(i, cols), s_c)
                vals.append(builder.load(builder.gep(arr.data, [idx]), align=align))
            out.append(context.make_tuple(builder, row, vals))
        return context.make_tuple(builder, tup, out)

    return tup(mat, first, R, S, trans), codegen


@intrinsic
def lane_qfunc(typingctx, g, q, u, d, k, L):
    """The pointwise stage of the operator family at point ``k`` for ``L`` lanes (a
    literal): the gradients ``g = (g_0, ..., g_{n-1})`` (lane buffers, row ``k``) become
    ``h_a = sum_b Q^{ab} g_b`` with ``Q`` packed in ``q`` (``q[c]``, ``c`` counting the
    pairs ``a <= b`` row by row: ``n (n + 1) / 2`` buffers), the terms in the order of b;
    ``u`` (None: no mass term) becomes ``u * d``, both at row ``k``.

    Every buffer is a 2D C-contiguous array of one float dtype with at least L columns;
    all rows are loaded before any is stored. It is the code the SLP vectoriser made of
    the ``L x n`` scalar statements of the stage, written as one call.
    """
    if not (isinstance(L, types.IntegerLiteral) and isinstance(k, types.Integer)
            and isinstance(g, types.UniTuple) and isinstance(q, types.UniTuple)):
        return None
    n, ln = len(g), L.literal_value
    has_u = not isinstance(u, (types.NoneType, types.Omitted))
    if not (_is_2d_c(g.dtype) and g.dtype.dtype in _FLOATS and q.dtype == g.dtype
            and len(q) == n * (n + 1) // 2 and ln >= 1):
        return None
    if has_u and not (u == g.dtype and d == g.dtype):
        return None
    sym, c = [[0] * n for _ in range(n)], 0
    for a in range(n):
        for b in range(a, n):
            sym[a][b] = sym[b][a] = c
            c += 1

    def codegen(context, builder, signature, args):
        gty, qty, uty, dty, kty, _ = signature.args
        gv, qv, uv, dv, kv, _ = args
        aty = gty.dtype
        vty = ir.VectorType(context.get_data_type(aty.dtype), ln)
        align = aty.dtype.bitwidth // 8
        row = context.cast(builder, kv, kty, types.intp)

        def ptr(val):
            arr = context.make_array(aty)(context, builder, val)
            cols = cgutils.unpack_tuple(builder, arr.shape, 2)[1]
            return _row_ptr(builder, context, arr, cols, row, vty)

        gp = [ptr(v) for v in cgutils.unpack_tuple(builder, gv, n)]
        xg = [builder.load(p, align=align) for p in gp]
        xq = [builder.load(ptr(v), align=align) for v in cgutils.unpack_tuple(builder, qv, len(q))]
        if has_u:
            up = ptr(uv)
            xu = builder.fmul(builder.load(up, align=align), builder.load(ptr(dv), align=align),
                              flags=_FASTMATH)
        hs = []
        for a in range(n):
            y = None
            for b in range(n):
                t = builder.fmul(xq[sym[a][b]], xg[b], flags=_FASTMATH)
                y = t if y is None else builder.fadd(y, t, flags=_FASTMATH)
            hs.append(y)
        for p, h in zip(gp, hs):
            builder.store(h, p, align=align)
        if has_u:
            builder.store(xu, up, align=align)
        return context.get_dummy_value()

    return types.void(g, q, u, d, k, L), codegen
