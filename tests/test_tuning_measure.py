"""The GPU device's logic (inputs, poisoning, verification, sampling, timing) without a GPU.

CuPy is replaced by a NumPy stand-in and the CUDA backend by the reference
backend (optionally made wrong), so what runs here is exactly
``GpuDevice``'s own code. Real kernels are timed only on a GPU.
"""
import math
import types

import numpy as np
import pytest

from smalltc import _timing
from smalltc.backends import get
from smalltc.backends.cuda import family_of
from smalltc.spec import ActionSpec, AssemblySpec, BasisSpec, ContractSpec, GemmSpec
from smalltc.tuning import measure as M
from smalltc.tuning.search import Search


class _Rng:
    def __init__(self, seed):
        self._g = np.random.default_rng(seed)

    def random(self, shape, dtype=np.float64):
        return self._g.random(shape).astype(dtype)


FakeCupy = types.SimpleNamespace(
    __version__="0.0-fake", float64=np.float64, empty=np.empty, asarray=np.asarray,
    asnumpy=np.asarray, random=types.SimpleNamespace(default_rng=_Rng),
    get_default_memory_pool=lambda: types.SimpleNamespace(free_all_blocks=lambda: None),
    cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(runtimeGetVersion=lambda: 13000,
                                      driverGetVersion=lambda: 13000),
        nvrtc=types.SimpleNamespace(getVersion=lambda: (13, 0))))


class _Ex:
    """The reference result, through the params it was built with (as the CUDA backend's
    ``build(spec, params)``: "heuristic" or a dict)."""

    def __init__(self, spec, how, params):
        fam = family_of(spec)
        self.source = "heuristic" if params == "heuristic" else "params"
        ctx = fam.context(spec, None if params == "heuristic" else params)
        self.params = dict(fam.public(ctx), registers=32, local_bytes=0)
        self.spec, self.how = spec, how
        self._ref = get("reference").build(spec)

    def run(self, operands, out, **scalars):
        assert out.shape == self.spec.out_shape, "an executor runs the batch it was built for"
        self._ref.run(operands, out, **scalars)
        if self.how == "noisy":
            out *= 1 + 1e-9
        elif self.how == "skip-last":          # a kernel that misses the last item
            out[-1] = np.nan if np.issubdtype(out.dtype, np.floating) else 0


class FakeBackend:
    def __init__(self, how=None):
        self.how = how

    def build(self, spec, params=None):
        assert params is not None, "the tuner never lets the tables choose"
        return _Ex(spec, self.how, params)


def _device(dtype="float64", how=None):
    dev = M.GpuDevice.__new__(M.GpuDevice)
    dev.cp, dev.backend = FakeCupy, FakeBackend(how)
    dev.dtype, dev.repeats, dev.warmup, dev.footprint = dtype, 20, 1, M.FOOTPRINT
    dev._dev = 0
    dev._info = dict(name="Fake GPU", cc="90", sms=1, smem_optin=227 * 1024)
    dev._bw, dev._peak = 1e12, 1e13
    return dev


SPECS = [
    ActionSpec(dim=3, nq=4, nd=3, batch=37, dtype="float64"),
    ActionSpec(dim=2, nq=5, nd=4, batch=37, dtype="float32", ncomp=2, comp_axis=True),
    AssemblySpec(dim=2, nq=4, nd=3, batch=37, dtype="float64"),
    GemmSpec(batch=37, m=4, n=3, k=5, dtype="float64", beta_zero=False, shared_b=True),
    GemmSpec(batch=37, m=4, n=4, k=4, dtype="float32", trans_a=True),
    ContractSpec(kind="8b", batch=37, i=3, s=3, j=4, k=4, l=3, dtype="float64", shared_y=True),
    # the basis application through a map: the sampled check gathers with the map's integers
    BasisSpec(dim=3, nq=4, nd=3, batch=27, dtype="float64", what="both", ndofs=7 ** 3),
]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_prepare_and_verify(spec):
    dev = _device(spec.dtype)
    prob = dev.prepare(spec)
    for (name, shape, _, positive, dt), a in zip(spec.inputs, prob.big):
        assert a.shape == shape and a.dtype == np.dtype(dt or spec.dtype)
        if dt is None:                                   # the map's integers start at 0
            assert np.all(a != 0) and (not positive or a.min() >= 0.5)
    assert prob.check_out.shape[0] >= 3 and prob.samples[0] == 0 and (
        prob.samples[-1] == spec.batch - 1)
    ex = dev.build(spec, None)
    assert ex.source == "heuristic"
    assert dev.verify(prob, ex) <= M.TOL[spec.dtype]
    assert dev.verify_big(prob, ex) <= M.TOL[spec.dtype]
    params = {k: ex.params[k] for k in family_of(spec).params if k in ex.params}
    built = dev.build(spec, params)
    assert built.source == "params" and built.check.spec.batch == prob.check_out.shape[0]


@pytest.mark.parametrize("spec", SPECS[:1] + SPECS[3:4], ids=str)
def test_wrong_kernels_are_caught(spec):
    dev = _device(spec.dtype, how="noisy")
    prob = dev.prepare(spec)
    assert dev.verify(prob, dev.build(spec, None)) > M.TOL["float64"]
    dev = _device(spec.dtype, how="skip-last")
    prob = dev.prepare(spec)
    ex = dev.build(spec, None)
    assert dev.verify(prob, ex) == math.inf              # NaN in the output is never passed
    assert dev.verify_big(prob, ex) == math.inf          # the last item is sampled


def test_timing_uses_cuda_event_timer(monkeypatch):
    calls = {}

    def fake_time_calls(fn, *, repeats, warmup, on_gpu):
        calls.update(repeats=repeats, warmup=warmup, on_gpu=on_gpu)
        fn()
        return [1000 + i for i in range(repeats)]

    monkeypatch.setattr(_timing, "time_calls", fake_time_calls)
    spec = SPECS[0]
    dev = _device()
    prob = dev.prepare(spec)
    t = dev.time(prob, dev.build(spec, None))
    assert len(t) == 20 and calls == dict(repeats=20, warmup=1, on_gpu=True)
    info = dev.info()
    assert info["name"] == "Fake GPU" and info["cupy"] == "0.0-fake" and info["nvrtc"] == "13.0"


def test_timing_forms(monkeypatch):
    """"double" runs an executor built for twice the batch on operands of twice the batch;
    "inplace" writes the GEMM's C (out=C); anything else is refused."""
    monkeypatch.setattr(_timing, "time_calls", lambda fn, **kw: (fn(), [1000] * kw["repeats"])[1])
    spec = M.sized(GemmSpec(batch=1, m=3, n=3, k=3, dtype="float64", beta_zero=False),
                   footprint=2 ** 16)
    assert M.forms(spec) == ("separate", "double", "inplace")
    assert M.forms(GemmSpec(batch=1, m=3, n=3, k=3, dtype="float64")) == ("separate", "double")
    dev = _device(spec.dtype)
    prob = dev.prepare(spec)
    ex = dev.build(spec, None)
    dev.time(prob, ex, form="double")
    assert ex.double.spec.batch == 2 * spec.batch
    (A, B, C), out = prob.double
    assert A.shape[0] == 2 * spec.batch and out.shape == ex.double.spec.out_shape
    assert np.allclose(out, A @ B + 0.5 * C)              # it really ran, on those operands
    C0 = prob.big[2].copy()
    dev.time(prob, ex, form="inplace")
    assert not np.array_equal(prob.big[2], C0)            # out=C: C was updated in place
    with pytest.raises(ValueError, match="form"):
        dev.time(prob, ex, form="sideways")


def test_search_on_the_gpu_device_logic(monkeypatch):
    monkeypatch.setattr(_timing, "time_calls",
                        lambda fn, **kw: (fn(), [1000] * kw["repeats"])[1])
    spec = AssemblySpec(dim=2, nq=4, nd=3, batch=41, dtype="float64")
    s = Search("assembly", "float64", [spec], _device(), compiler="none", jobs=1,
               progress=False, log=lambda m: None)
    assert s.run() == "done"
    r = next(iter(s.results.values()))
    assert r["heuristic"]["status"] == "ok"
    assert all(c["status"] == "ok" for c in r["candidates"])
    assert r["winner"]["params"] == r["heuristic"]["params"]     # all equal: heuristic kept


def test_sized_footprint():
    spec = M.sized(ActionSpec(dim=3, nq=5, nd=4, batch=1, dtype="float64"))
    assert spec.batch * 8 * (2 * 64 + 125) >= M.FOOTPRINT
    g = M.sized(GemmSpec(batch=1, m=32, n=32, k=32, dtype="float64"))
    assert g.batch == max(100_000, math.ceil(M.FOOTPRINT / (8 * 3 * 1024)))
    assert M.sized(GemmSpec(batch=1, m=2, n=2, k=2, dtype="float64"), 1000).batch == 100_000
    shared = GemmSpec(batch=1, m=4, n=4, k=4, dtype="float64", shared_b=True)
    assert M.per_item_bytes(shared) == 8 * (16 + 16)          # B counts once, not per item


def test_small_form(monkeypatch):
    """A GEMM timed at >= 200,000 matrices is also timed at 100,000 (in place for beta != 0)
    by replaying a captured CUDA graph; without graph capture, by the event timer."""
    monkeypatch.setattr(_timing, "time_calls", lambda fn, **kw: (fn(), [1000] * kw["repeats"])[1])
    spec = M.sized(GemmSpec(batch=1, m=2, n=2, k=2, dtype="float64", beta_zero=False),
                   footprint=2 ** 25)                 # 128 bytes a matrix: 262,144 of them
    assert spec.batch > 2 * M.GEMM_MIN_BATCH and M.small_batch(spec) == M.GEMM_MIN_BATCH
    assert M.forms(spec) == ("separate", "double", "small", "inplace")
    big32 = M.sized(GemmSpec(batch=1, m=32, n=32, k=32, dtype="float64"))
    assert big32.batch == M.GEMM_MIN_BATCH and "small" not in M.forms(big32)
    assert "small" not in M.forms(M.sized(ActionSpec(dim=3, nq=5, nd=4, batch=1,
                                                     dtype="float64")))
    dev = _device(spec.dtype)
    prob = dev.prepare(spec)
    ex = dev.build(spec, None)
    A, B, C = prob.big
    C0 = C.copy()
    t = dev.time(prob, ex, form="small")              # FakeCupy: no streams, no graphs
    assert t == [1000] * 20 and dev.graph_fallbacks == 1
    assert ex.small.spec.batch == M.GEMM_MIN_BATCH
    n = M.GEMM_MIN_BATCH
    assert np.allclose(C[:n], A[:n] @ B[:n] + 0.5 * C0[:n])   # in place, on the first n
    assert np.array_equal(C[n:], C0[n:])                      # the rest untouched
    few32 = big32.with_batch(8)         # no "small" form either (and not 2 GB of operands)
    assert "small" not in M.forms(few32)
    with pytest.raises(ValueError, match="small"):
        dev.time(dev.prepare(few32), dev.build(few32, None), form="small")

    # with graph capture: ns per call = event time of one replay / calls captured
    class Stream:
        def __init__(self, **_):
            self.captured = []

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def synchronize(self):
            pass

        def begin_capture(self):
            self.capturing = True

        def end_capture(self):
            return types.SimpleNamespace(launch=lambda s: None)

    class Event:
        def record(self, s):
            pass

        def synchronize(self):
            pass

    graph_cupy = types.SimpleNamespace(**vars(FakeCupy))
    graph_cupy.cuda = types.SimpleNamespace(**vars(FakeCupy.cuda), Stream=Stream, Event=Event,
                                            get_elapsed_time=lambda e0, e1: 0.25)   # ms
    dev.cp = graph_cupy
    ex2 = dev.build(spec, None)
    t = dev.time(prob, ex2, form="small")
    assert t == [int(0.25e6 / 50)] * 20 and dev.graph_fallbacks == 1
