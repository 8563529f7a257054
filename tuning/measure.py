"""Where candidates run: the GPU (CUDA events, docs/math.md section 5) or a dry run (no GPU).

A *device* gives the search what it needs, and nothing else:

- ``info()``: name, compute capability, multiprocessors, opt-in shared memory,
  CUDA / CuPy versions, and the bandwidth and peak the roofline bound uses;
- ``prepare(spec)``: a problem: random inputs of the timed size (>= 256 MB,
  never zeros), a small check problem with its float64 reference;
- ``build(spec, params)``: the executor the runtime would build with a table
  answering ``params`` (None: the heuristic);
- ``verify(problem, ex)``: relative error of the candidate on the check
  problem (output poisoned with NaN first), against the float64 reference;
- ``verify_big(problem, ex)``: relative error on sampled items of the timed
  output (after timing: the grid-stride loop at full size);
- ``time(problem, ex, form="separate")``: nanoseconds per call, warm-up first, CUDA
  events; ``form="double"`` (see :func:`forms`) times the same variant built for twice
  the batch, on operands of twice the batch; ``form="inplace"`` times a GEMM with
  ``beta != 0`` as ``out=C``, the in-place update; ``form="small"`` times a large
  GEMM batch's variant at 100,000 matrices (the paper's setting), replayed from a
  captured CUDA graph: the device's time, which the host's launch cost hides there;
- ``bound(spec)``: :func:`smalltc.roofline.bound` with this device's numbers.

:class:`DryRunDevice` answers the same calls without a GPU, with *made-up*
times (a deterministic function of the parameters) so the whole pipeline
can be exercised; a table it produces is marked ``"dry_run": true`` and the
runtime never loads it.
"""
from __future__ import annotations

import dataclasses
import datetime
import math
import sys
import zlib

import numpy as np

from smalltc import _timing, roofline
from smalltc.backends import get
from smalltc.backends.cuda import runtime as RT
from smalltc.backends.cuda import family_of
from smalltc.backends.cuda.family import DEFAULT_DEVICE

__all__ = ["GpuDevice", "DryRunDevice", "forms", "small_batch", "per_item_bytes",
           "sized", "check_spec", "box_spec", "box_map", "TOL", "FOOTPRINT", "GEMM_MIN_BATCH"]

#: docs/math.md section 5: relative error allowed against the float64 einsum reference
TOL = {"float64": 1e-12, "float32": 1e-5}
FOOTPRINT = 256 * 2 ** 20       # bytes read + written by one timed call (above any L2)
GEMM_MIN_BATCH = 100_000        # the paper's setting
_CHECK_BYTES = 32 * 2 ** 20     # float64 bytes of the check problem, at most
_CHECK_ITEMS = 2 * 1024 + 3     # check items, at most: several groups and a partial one


def forms(spec):
    """The ways a call of ``spec`` is timed; a winner must not lose to the heuristic in any.

    - ``"separate"``: the timed batch (>= 256 MB), output apart from the inputs;
      it orders the candidates and gives the table's time;
    - ``"double"``: twice that batch: a parameter set that wins only at one batch
      count (wave quantisation over the SMs) is not a table entry. On the H100 a
      pairwise step entry (kernel 8a, i10s9j1k1l10) 1.03x faster than the
      heuristic at 256 MB ran 0.76x in the bench at 537 MB (2026-11-21);
    - ``"inplace"``, GEMM with ``beta != 0`` only: ``out=C``. Float32 m=n=k=3 ran
      1.29x faster than the heuristic with C apart and 0.86x in place
      (notes/tuning.md, H100, 2026-11-21);
    - ``"small"``, GEMM timed at 2 x 100,000 matrices or more: 100,000 of them (in
      place for beta != 0), device time from a CUDA graph. On the H100 the float64
      beta != 0 entries n = 2 and 4, 1.02x the heuristic at 4M matrices, were 0.75x
      and 0.84x at 100,000 (notes/tuning.md, "Timing and the rules for a table entry").
    """
    f = ("separate", "double") + (("small",) if small_batch(spec) else ())
    if spec.op == "gemm" and not spec.beta_zero:
        return f + ("inplace",)
    return f


def small_batch(spec):
    """The batch of the ``"small"`` form of ``spec``, or None when it has none."""
    if spec.op == "gemm" and spec.batch >= 2 * GEMM_MIN_BATCH:
        return GEMM_MIN_BATCH
    return None


def _scalars(spec):
    if spec.op == "gemm":
        return dict(alpha=1.0, beta=0.0 if spec.beta_zero else 0.5)
    return {}


def per_item_bytes(spec) -> int:
    """Bytes one more batch item adds to a call (inputs read once, output written once)."""
    return (roofline.counts(spec.with_batch(2)).bytes - roofline.counts(spec.with_batch(1)).bytes)


def _on_a_mesh(spec):
    """Whether ``spec`` reads a map (the fused operator; the basis application through a
    map): its problems are box meshes (:func:`box_spec`)."""
    return spec.op == "mass_apply" or (spec.op == "basis" and spec.ndofs is not None)


def sized(spec, footprint=FOOTPRINT):
    """``spec`` with the batch count whose call moves ``footprint`` bytes (GEMM: >= 100,000;
    the fused operator and the basis application through a map: the smallest box mesh of
    ``n^dim`` elements that does, :func:`box_spec`).

    >>> from smalltc.spec import MassApplySpec
    >>> s = sized(MassApplySpec(dim=3, nq=4, nd=3, batch=1, ndofs=27, dtype="float64"))
    >>> s.batch == 71 ** 3, s.ndofs == (2 * 71 + 1) ** 3
    (True, True)
    """
    if _on_a_mesh(spec):
        n = 1
        while roofline.counts(box_spec(spec, n)).bytes < footprint:
            n += 1
        return box_spec(spec, n)
    n = math.ceil(footprint / per_item_bytes(spec))
    if spec.op == "gemm":
        n = max(n, GEMM_MIN_BATCH)
    return spec.with_batch(int(n))


def box_spec(spec, n):
    """The fused operator's ``spec`` on a box mesh of ``n^dim`` elements of order ``p``:
    ``(n p + 1)^dim`` DoFs (a component's).

    >>> from smalltc.spec import MassApplySpec
    >>> s = box_spec(MassApplySpec(dim=2, nq=4, nd=3, batch=1, ndofs=9, dtype="float64"), 3)
    >>> s.batch, s.ndofs
    (9, 49)
    """
    return dataclasses.replace(spec, batch=n ** spec.dim, ndofs=(n * (spec.nd - 1) + 1) ** spec.dim)


def box_map(spec):
    """``elem_dofs`` of a fused-operator spec made by :func:`box_spec` (lexicographic
    elements and DoFs, neighbours sharing their faces' DoFs), as ``spec.index_dtype``;
    a batch that is a multiple of the box's elements repeats the box (the timing's
    ``double`` form: twice the elements on the same vector).

    >>> from smalltc.spec import MassApplySpec
    >>> m = box_map(box_spec(MassApplySpec(dim=1, nq=3, nd=3, batch=1, ndofs=3,
    ...                                    dtype="float64"), 2))
    >>> m.tolist()
    [[0, 1, 2], [2, 3, 4]]
    """
    dim, p = spec.dim, spec.nd - 1
    m = round(spec.ndofs ** (1.0 / dim))
    n = (m - 1) // p
    if m ** dim != spec.ndofs or n * p + 1 != m:
        raise ValueError(f"ndofs={spec.ndofs} is not the DoF count of a box mesh of order "
                         f"{p} in {dim}D")
    e = np.indices((n,) * dim).reshape(dim, -1)            # element multi-indices
    i = np.indices((spec.nd,) * dim).reshape(dim, -1)      # local node multi-indices
    g = np.zeros((e.shape[1], i.shape[1]), dtype=np.int64)
    for a in range(dim):
        g = g * m + (e[a][:, None] * p + i[a][None, :])
    g = np.resize(g, (spec.batch, g.shape[1]))             # repeated up to the batch
    return g.reshape((spec.batch,) + (spec.nd,) * dim).astype(spec.index_dtype)


def check_spec(spec):
    """The check problem's spec: ``spec`` with few items (:data:`_CHECK_BYTES`, at most
    :data:`_CHECK_ITEMS`); the fused operator's (and the basis application's through a map)
    on a box mesh of at least 100 elements."""
    if _on_a_mesh(spec):
        n = 1
        while n ** spec.dim < 100:
            n += 1
        return box_spec(spec, n)
    return spec.with_batch(_check_batch(spec))


def _check_batch(spec):
    per = per_item_bytes(dataclasses.replace(spec, dtype="float64"))
    return int(max(3, min(_CHECK_ITEMS, _CHECK_BYTES // per)))


def _random_host(spec, batch, seed):
    """float64 host operands of ``spec`` with ``batch`` items (D positive, nothing zero; the
    fused operator's map: :func:`box_map`, as its index dtype; ``batch`` None: as given)."""
    rng = np.random.default_rng(seed)
    s = spec if batch is None else spec.with_batch(batch)
    out = []
    for name, shape, _, positive, dt in s.inputs:
        if dt is not None and np.dtype(dt).kind == "i":
            out.append(box_map(s))
            continue
        if name == "X" and getattr(s, "geometry", None) == "vertices":
            # the vertex geometry: unit cubes (squares) moved by up to 0.1 a vertex, so
            # that no element is inverted or flat (det J > 0 at every point)
            out.append(_corners(s.dim) + rng.uniform(-0.1, 0.1, shape))
            continue
        a = rng.random(shape) + 0.5 if positive else rng.standard_normal(shape)
        out.append(a)
    return out


def _corners(dim):
    """The unit cube's (square's) 2^dim vertices in tensor order, the last axis fastest
    (``X[e, v, i]`` of the vertex geometry)."""
    return np.indices((2,) * dim).reshape(dim, -1).T[:, ::-1].astype(np.float64)


def _is_index(operand):
    return operand.dtype is not None and np.dtype(operand.dtype).kind == "i"


def _seen(spec, host):
    """Host operands as float64 after rounding to the dtype the kernel reads (the map as
    it is)."""
    return [h if _is_index(o) else np.asarray(h).astype(o.dtype or spec.dtype).astype(np.float64)
            for o, h in zip(spec.inputs, host)]


def _host_cast(spec, host64):
    """The operands as the kernel reads them: each in its dtype (the spec's, or the
    operand's own: float32 point data, the map's integers)."""
    return [h if _is_index(o) else h.astype(o.dtype or spec.dtype)
            for o, h in zip(spec.inputs, host64)]


def _reference(spec, host64, xp=np):
    """The float64 reference output of ``spec`` on float64 operands (einsum), host arrays
    or, with ``xp`` CuPy, device arrays (the fused operator's timed size: the host's
    einsums took about 100 s a size for the vertex geometry)."""
    s64 = dataclasses.replace(spec, dtype="float64")
    ex = get("reference").build(s64)
    out = xp.empty(s64.out_shape)
    ops = list(host64) + ([None] if spec.op == "gemm" and spec.beta_zero else [])
    ex.run(tuple(ops), out, **_scalars(spec))
    return out


def rel_err(out, ref) -> float:
    out = np.asarray(out, dtype=np.float64)
    denom = float(np.linalg.norm(ref))
    err = float(np.linalg.norm(out - ref)) / (denom if denom else 1.0)
    return err if math.isfinite(err) else math.inf


class _Problem:
    """Operands of one size on the device, and the check problem."""

    def __init__(self, spec, big, out, check_host, check_dev, check_out, check_ref, samples):
        self.spec, self.big, self.out = spec, big, out
        self.check_host, self.check_dev, self.check_out = check_host, check_dev, check_out
        self.check_ref, self.samples = check_ref, samples
        self.double = None           # (operands, out) of twice the batch, made when needed
        self.check_spec = None       # the check problem's spec (:func:`check_spec`)
        self.big_ref = None          # the fused operator's reference at the timed size


class _Built:
    """One variant built for the timed batch (``big``) and the check batch (``check``);
    ``double`` (twice the timed batch) is built when first timed."""

    def __init__(self, big, check, cand=None):
        self.big, self.check, self.cand, self.double = big, check, cand, None
        self.small = None
        self.params, self.source = big.params, big.source
        self.kernel = getattr(big, "kernel", "?")


class _Device:
    """What the measuring devices share (:class:`GpuDevice`, ``tuning.cpu.CpuDevice``):
    the roofline bound, the problem of one size (``_xp`` the device's array module,
    ``_operands`` the timed operands), running an executor and its check."""

    def bound(self, spec):
        self.info()
        return roofline.bound(spec, bandwidth=self._bw, peak=self._peak)

    def prepare(self, spec) -> _Problem:
        xp, dt = self._xp, spec.dtype
        big = self._operands(spec)
        out = xp.empty(spec.out_shape, dtype=dt)
        chk = check_spec(spec)
        host = _seen(chk, _random_host(chk, None, seed=7))      # what the kernel sees
        ref = _reference(chk, host)
        dev = [xp.asarray(h) for h in _host_cast(chk, host)]
        chk_out = xp.empty(chk.out_shape, dtype=dt)
        n = spec.batch
        samples = sorted({*range(min(4, n)), *range(max(0, n - 4), n), n // 2, n // 3})
        problem = _Problem(spec, big, out, host, dev, chk_out, ref, samples)
        problem.check_spec = chk
        return problem

    def release(self, problem) -> None:
        problem.big = problem.out = problem.check_dev = problem.check_out = None
        problem.double = None

    def _build(self, spec, params):
        """The backend's executor with ``params`` (None: the heuristic, tables aside)."""
        return self.backend.build(spec, params="heuristic" if params is None else params)

    def _run(self, ex, spec, ops, out):
        ops = list(ops) + ([None] if spec.op == "gemm" and spec.beta_zero else [])
        ex.run(tuple(ops), out, **_scalars(spec))

    def verify(self, problem, ex) -> float:
        spec = problem.check_spec
        problem.check_out.fill(math.nan)
        self._run(ex.check, spec, problem.check_dev, problem.check_out)
        return rel_err(self._host(problem.check_out), problem.check_ref)


class GpuDevice(_Device):
    """The current CuPy device; kernels built through the CUDA backend."""

    dry_run = False
    compiler = "cuda"

    def __init__(self, dtype, repeats=20, warmup=3, footprint=FOOTPRINT):
        import cupy
        self.cp, self.backend = cupy, get("cuda")
        if not self.backend.available():
            raise RuntimeError("no CUDA device: smalltc tune needs one (or --dry-run)")
        self.dtype, self.repeats, self.warmup, self.footprint = dtype, repeats, warmup, footprint
        self._dev = cupy.cuda.runtime.getDevice()
        self._info = dict(RT.device_info(self._dev))
        self._bw = self._peak = None

    def info(self) -> dict:
        cp = self.cp
        if self._bw is None:
            self._bw = roofline.bandwidth("gpu")
            self._peak = roofline.peak(self.dtype, "gpu")
        rt = cp.cuda.runtime
        try:
            nvrtc = ".".join(str(v) for v in cp.cuda.nvrtc.getVersion())
        except Exception:  # an NVRTC CuPy cannot query: not fatal
            nvrtc = None
        return dict(name=self._info["name"], cc=self._info["cc"], sms=self._info["sms"],
                    smem_optin=self._info["smem_optin"],
                    cuda_runtime=rt.runtimeGetVersion(), cuda_driver=rt.driverGetVersion(),
                    nvrtc=nvrtc, cupy=cp.__version__, bandwidth=self._bw, peak=self._peak)

    @property
    def _xp(self):
        return self.cp

    def _host(self, a):
        return self.cp.asnumpy(a)

    def _operands(self, spec):
        cp, big = self.cp, []
        for i, o in enumerate(spec.inputs):
            if _is_index(o):
                big.append(cp.asarray(box_map(spec)))
                continue
            gen = cp.random.default_rng(1000 + i)
            a = gen.random(o.shape, dtype=cp.float64)
            if o.name == "X" and getattr(spec, "geometry", None) == "vertices":
                a = cp.asarray(_corners(spec.dim)) + 0.2 * (a - 0.5)   # as _random_host
            else:
                a = (a + 0.5) if o.positive else (a - 0.5)
            big.append(a.astype(o.dtype or spec.dtype))
            del a
        return big

    def release(self, problem) -> None:
        """Free the size's arrays, and its compiled variants (one module per variant)."""
        super().release(problem)
        RT.clear_cache()                     # CuPy's disk cache keeps them: rebuilt in ms
        self.cp.get_default_memory_pool().free_all_blocks()

    def build(self, spec, params):
        """Executors of the timed size and of the check size (an executor's batch is fixed)."""
        big = self._build(spec, params)
        check = self._build(check_spec(spec), params)
        return _Built(big, check, params)

    def verify_big(self, problem, ex) -> float:
        problem.out.fill(math.nan)
        self._run(ex.big, problem.spec, problem.big, problem.out)
        if problem.spec.op == "mass_apply" or (    # every DoF sums several elements: all
                _on_a_mesh(problem.spec) and problem.spec.transpose):
            if problem.big_ref is None:          # the reference path on the GPU, float64
                problem.big_ref = self.cp.asnumpy(_reference(problem.spec, [
                    a if _is_index(o) else a.astype(self.cp.float64)
                    for o, a in zip(problem.spec.inputs, problem.big)], self.cp))
            return rel_err(self.cp.asnumpy(problem.out), problem.big_ref)
        idx = problem.samples
        spec = problem.spec.with_batch(len(idx))
        host = []
        for o, a in zip(problem.spec.inputs, problem.big):
            h = self.cp.asnumpy(a[idx] if o.batched else a)
            host.append(h if _is_index(o) else h.astype(np.float64))   # the map as it is
        ref = _reference(spec, host)
        return rel_err(self.cp.asnumpy(problem.out[idx]), ref)

    def time(self, problem, ex, form="separate") -> list:
        spec, ops, out, run = problem.spec, problem.big, problem.out, ex.big
        if form == "inplace":
            out = ops[2]                 # out=C; beta = 0.5 keeps the values bounded
        elif form == "double":
            spec = spec.with_batch(2 * spec.batch)
            if problem.double is None:
                problem.double = (self._operands(spec), self.cp.empty(spec.out_shape,
                                                                      dtype=spec.dtype))
            if ex.double is None:
                ex.double = self._build(spec, ex.cand)
            (ops, out), run = problem.double, ex.double
        elif form == "small":
            n = small_batch(spec)
            if n is None:
                raise ValueError(f"{spec} has no 'small' timing form")
            full, spec = spec, spec.with_batch(n)
            ops = [a[:n] if batched else a
                   for (_, _, batched, _, _), a in zip(full.inputs, ops)]
            out = ops[2] if spec.op == "gemm" and not spec.beta_zero else out[:n]
            if ex.small is None:
                ex.small = self._build(spec, ex.cand)
            return self._graph_times(lambda: self._run(ex.small, spec, ops, out))
        elif form != "separate":
            raise ValueError(f"unknown timing form {form!r}")
        return _timing.time_calls(lambda: self._run(run, spec, ops, out),
                                  repeats=self.repeats, warmup=self.warmup, on_gpu=True)

    def _graph_times(self, fn, calls=50):
        """Nanoseconds per call of ``fn``, ``repeats`` samples, each a replay of a captured
        CUDA graph of ``calls`` calls: the device's time. Where capture fails, the event
        timer (``graph_fallbacks`` counts it)."""
        try:
            return _timing.graph_times(fn, repeats=self.repeats, warmup=self.warmup,
                                       calls=calls, cp=self.cp)
        except Exception as err:              # no graph capture here: the host-bound timer
            self.graph_fallbacks = getattr(self, "graph_fallbacks", 0) + 1
            if self.graph_fallbacks == 1:
                print(f"smalltc tune: the 'small' form times with CUDA events, not a graph "
                      f"({type(err).__name__}: {err})", file=sys.stderr)
            return _timing.time_calls(fn, repeats=self.repeats, warmup=self.warmup, on_gpu=True)


class _DryExecutor:
    def __init__(self, spec, params, ctx):
        self.spec, self.source = spec, "params" if params is not None else "heuristic"
        self.params = dict(family_of(spec).public(ctx), registers=None, local_bytes=0)
        self.kernel = f"dry-run {spec.op}"


class DryRunDevice:
    """No GPU: every call answers, times are made up (deterministic). Tables it yields are
    marked ``dry_run`` and never used by the runtime."""

    dry_run = True
    compiler = "nvcc"

    def __init__(self, dtype, cc="90", repeats=20, warmup=3, footprint=FOOTPRINT,
                 smem_optin=227 * 1024):
        self.dtype, self.cc, self.repeats, self.footprint = dtype, cc, repeats, footprint
        self.smem_optin = smem_optin

    def info(self) -> dict:
        return dict(name="dry run (no GPU; times are made up)", cc=self.cc, sms=0,
                    smem_optin=self.smem_optin, cuda_runtime=None, cuda_driver=None,
                    nvrtc=None, cupy=None, bandwidth=3.0e12, peak=5.0e13)

    def bound(self, spec):
        i = self.info()
        return roofline.bound(spec, bandwidth=i["bandwidth"], peak=i["peak"])

    def prepare(self, spec):
        return _Problem(spec, None, None, None, None, None, None, [])

    def release(self, problem) -> None:
        pass

    def build(self, spec, params):
        fam, dev = family_of(spec), dict(DEFAULT_DEVICE, smem_optin=self.smem_optin)
        ctx = None if fam is None else fam.context(spec, params, dev)
        if ctx is None:
            if params is None or fam is None:
                raise RuntimeError(f"no fused kernel for {spec}")
            raise ValueError(f"params {params} do not fit {spec}")
        return _DryExecutor(spec, params, ctx)

    def verify(self, problem, ex) -> float:
        return 0.0

    def verify_big(self, problem, ex) -> float:
        return 0.0

    def model_seconds(self, spec, params, form="separate") -> float:
        """The made-up time: the bound times a factor in [1.05, 3.05) hashed from the params
        (and the form, when it is ``"inplace"``); ``"double"`` takes twice the time."""
        if form == "double":
            return 2.0 * self.model_seconds(spec, params)
        if form == "small":                   # its own ordering, scaled to its batch
            spec = spec.with_batch(small_batch(spec))
        label = repr(sorted((params or {}).items())) + ("" if form == "separate" else form)
        penalty = 1.05 + (zlib.crc32(label.encode()) % 1000) / 500.0
        return self.bound(spec).tmin * penalty

    def time(self, problem, ex, form="separate") -> list:
        keys = family_of(problem.spec).params
        t = self.model_seconds(problem.spec, {k: ex.params[k] for k in keys if k in ex.params},
                               form)
        return [int(t * 1e9 * (1 + 0.001 * (r % 3))) for r in range(self.repeats)]


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# the heuristic's parameters of an executor, in a family's keys
def family_params(ex_params, fam_keys):
    return {k: ex_params[k] for k in fam_keys if k in ex_params}

