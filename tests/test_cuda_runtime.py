"""CUDA backend logic that needs no GPU: heuristics, launch geometry, per-device kernels.

The device is faked: ``get_kernel`` and ``launch`` are replaced by recorders and
the current device id is a settable number, so these run in CI.
"""
import math
import types

import numpy as np
import pytest

from smalltc import backends
from smalltc._arrays import gpu_available
from smalltc.backends import _cuda_params as P
from smalltc.backends import _cuda_runtime as RT
from smalltc.backends import cuda as C
from smalltc.spec import ActionSpec, GemmSpec


class _FakeKernel:
    def __init__(self, dev):
        self.dev = dev
        self.attributes = {"local_size_bytes": 0, "num_regs": 40}


@pytest.fixture
def fake_device(monkeypatch):
    state = types.SimpleNamespace(dev=0, compiled=[], launched=[])
    runtime = types.SimpleNamespace(getDevice=lambda: state.dev)
    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))
    monkeypatch.setattr(C, "cupy_or_none", lambda: fake_cupy)

    def get_kernel(template, entry, ctx, smem):
        state.compiled.append((state.dev, template, entry))
        return _FakeKernel(state.dev)

    def launch(kern, ngroups, threads, args, smem, max_blocks=None):
        state.launched.append((kern.dev, ngroups, threads, args, smem))

    monkeypatch.setattr(C, "get_kernel", get_kernel)
    monkeypatch.setattr(C, "launch", launch)
    monkeypatch.setattr(C, "direct_launcher", lambda *a, **k: None)   # RawKernel path
    return state


def test_kernel_per_device_and_geometry(fake_device):
    # T = 4: the heuristic's shared-memory form (from T = 5 on it is the line form, whose
    # constant-bank copy needs a real device)
    spec = ActionSpec(dim=3, nq=4, nd=3, batch=1001, dtype="float64", ncomp=3, comp_axis=True)
    ctx = P.action_ctx(3, 3, 4, 3, "float64")
    assert ctx["line"] == 0
    ex = C._ActionExecutor("stc_mass_apply_3d_f64_nd3nq4c3", ctx, "heuristic", spec)
    ex.run(("B", "D", "V"), "U")
    fake_device.dev = 1
    ex.run(("B", "D", "V"), "U")
    ex.run(("B", "D", "V"), "U")
    assert [c[0] for c in fake_device.compiled] == [0, 1]       # once per device
    devs = [launch[0] for launch in fake_device.launched]
    assert devs == [0, 1, 1]
    _, ngroups, threads, args, smem = fake_device.launched[0]
    assert ngroups == math.ceil(1001 * 3 / ctx["per_block"])
    assert threads == ctx["threads"] and smem == ctx["smem_bytes"]
    assert args[-1] == np.int64(3003) and isinstance(args[-1], np.int64)
    assert ex.params["registers"] == 40 and ex.source == "heuristic"


def test_gemm_scalars_take_the_kernel_dtype(fake_device):
    spec = GemmSpec(batch=7, m=4, n=4, k=4, dtype="float32")
    ex = C._build_gemm(spec, dict(smem_optin=227 * 1024, cc="90"))
    ex.run(("A", "B", None), "OUT", alpha=2.0, beta=0.0)
    args = fake_device.launched[-1][3]
    assert args[:4] == ("A", "B", "OUT", "OUT")       # C is not read: out stands in
    assert isinstance(args[4], np.float32) and args[4] == 2.0
    assert ex.kernel == "stc_gemm_nn_f32_m4n4k4" and ex.specialized


def test_generic_gemm_for_large_extents(fake_device):
    spec = GemmSpec(batch=3, m=200, n=5, k=7, dtype="float64", shared_b=True,
                    beta_zero=False)
    ex = C._build_gemm(spec, dict(smem_optin=227 * 1024, cc="90"))
    assert not ex.specialized and ex.kernel == "stc_generic8a_f64_beta"
    ex.run(("A", "B", "C"), "OUT", alpha=1.0, beta=0.5)
    _, ngroups, threads, args, _ = fake_device.launched[-1]
    assert args[6:11] == (200, 7, 1, 1, 5)            # I S J K L of op(A) op(B)
    assert args[11:13] == (200 * 7, 0)                # batch strides; B shared
    assert ngroups == math.ceil(3 * 200 * 5 / threads)


def test_table_lookup_overrides_heuristic(fake_device):
    spec = GemmSpec(batch=7, m=8, n=8, k=8, dtype="float64")
    P.set_table_lookup(lambda s, cc: dict(dim_x=8, dim_y=2, per_block=3))
    try:
        ex = C._build_gemm(spec, dict(smem_optin=227 * 1024, cc="90"))
    finally:
        P.set_table_lookup(None)
    assert ex.source == "table"
    P.set_table_lookup(lambda s, cc: dict(dim_x=8, dim_y=8, per_block=1, _source="table-nearest"))
    try:
        assert C._build_gemm(spec, dict(smem_optin=227 * 1024, cc="90")).source == "table-nearest"
    finally:
        P.set_table_lookup(None)
    assert (ex.params["dim_x"], ex.params["dim_y"], ex.params["per_block"]) == (8, 2, 3)
    assert ex.params["thr_m"] == 4 and ex.params["threads"] == 48


def test_grid_is_capped_and_strided():
    calls = []

    def kern(grid, block, args, shared_mem=0):
        calls.append((grid, block, shared_mem))

    RT.launch(kern, 2 ** 40, 128, (), 4096)
    RT.launch(kern, 0, 128, ())
    assert calls == [((2 ** 31 - 1,), (128,), 4096)]


@pytest.mark.parametrize("dim", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_heuristic_contexts_are_launchable(dim, dtype):
    for p in range(1, 17):
        for nq in (p + 1, p + 2, p + 3):
            ctx = P.action_ctx(dim, p + 1, nq, 1, dtype)
            if ctx is not None:
                assert ctx["threads"] == ctx["tpi"] * ctx["per_block"] <= 1024
                assert ctx["smem_bytes"] <= 227 * 1024
            a = P.assembly_ctx(dim, p + 1, nq, dtype)
            if a is not None:
                assert a["smem_bytes"] <= 227 * 1024
    for n in range(1, 70):
        g = P.layout_ctx("8a", n, n, 1, 1, n, dtype, False, False)
        assert g["threads"] == g["dim_x"] * g["dim_y"] * g["per_block"] <= 1024
        assert g["dim_x"] * g["thr_n"] >= n and g["dim_y"] * g["thr_m"] >= n


@pytest.mark.skipif(gpu_available(), reason="checks the no-GPU description")
def test_backend_registered_without_touching_a_device():
    be = backends.get("cuda")
    assert be.name == "cuda" and be.priority == 10 and be.array_modules == ("cupy",)
    assert not be.available() and "no CUDA device" in be.describe()
    assert "cuda" not in [b.name for b in backends.candidates("cupy")]


def test_line_form_orders_its_constant_bank_per_module(fake_device, monkeypatch):
    """The line form copies B1d into its module's constant bank before each launch. A launch
    on another stream than the module's previous one first waits for that launch (an event),
    across executors of one kernel too; on the same stream nothing waits (stream order)."""
    log = fake_device.launched
    slots = {}

    def get_global(template, entry, ctx, smem, name):
        key = (template, entry, tuple(sorted(ctx.items())), fake_device.dev, name)
        return slots.setdefault(key, [types.SimpleNamespace(ptr=1000), None, None])

    class Event:
        def __init__(self, **_):
            self.recorded_on = None

        def record(self, stream):
            self.recorded_on = stream.ptr
            log.append(("record", stream.ptr))

    class Stream:
        def __init__(self, ptr):
            self.ptr = ptr

        def is_capturing(self):
            return False

        def wait_event(self, event):
            log.append(("wait", self.ptr, event.recorded_on))

    current = [Stream(7)]
    rt = types.SimpleNamespace(getDevice=lambda: fake_device.dev, memcpyDeviceToDevice=3,
                               memcpyAsync=lambda dst, src, n, kind, s: log.append(
                                   ("copy", dst, src, n, s)))
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        runtime=rt, Event=Event, get_current_stream=lambda: current[0]))
    monkeypatch.setattr(C, "cupy_or_none", lambda: fake)
    monkeypatch.setattr(C, "get_global", get_global)
    B = types.SimpleNamespace(data=types.SimpleNamespace(ptr=55), nbytes=8 * 30)
    ctx = P.action_ctx(3, 5, 6, 1, "float64")
    assert ctx["line"] == 1
    spec = ActionSpec(dim=3, nq=6, nd=5, batch=100, dtype="float64")
    a = C._ActionExecutor("stc_line", ctx, "heuristic", spec)
    b = C._ActionExecutor("stc_line", ctx, "heuristic", spec.with_batch(50))
    a.run((B, "D", "V"), "U")                 # stream 7
    a.run((B, "D", "V"), "U")                 # stream 7 again: no wait
    current[0] = Stream(9)
    b.run((B, "D", "V"), "U")                 # another executor, stream 9: waits for 7
    kinds = [e[0] if isinstance(e[0], str) else "launch" for e in log]
    assert kinds == ["copy", "launch", "record", "copy", "launch", "record",
                     "wait", "copy", "launch", "record"]
    assert log[6] == ("wait", 9, 7)
    assert log[0] == ("copy", 1000, 55, 240, 7) and log[7] == ("copy", 1000, 55, 240, 9)
    assert log[1][3][:3] == ("D", "V", "U")     # no B1d argument: it is in the constant bank


def test_prefetch_form_caps_the_grid(fake_device, monkeypatch):
    """The line form's prefetch variant overlaps a group's loads with the previous group's
    steps only if blocks loop over groups: its grid is capped at resident blocks."""
    launched = []
    monkeypatch.setattr(C, "launch", lambda kern, ngroups, threads, args, smem, max_blocks=None:
                        launched.append((ngroups, threads, max_blocks)))
    monkeypatch.setattr(C, "_device", lambda: (0, dict(sms=132, smem_optin=227 * 1024, cc="90")))
    # the driver's occupancy calculator, here: 5 blocks of 243 threads fit on an SM
    monkeypatch.setattr(C, "resident_blocks", lambda kern, threads, smem: 5)
    spec = ActionSpec(dim=3, nq=9, nd=9, batch=100000, dtype="float64")
    ctx = P.action_ctx(3, 9, 9, 1, "float64", params=dict(per_block=3, line=1, prefetch=1))
    ex = C._ActionExecutor("stc_x", ctx, "table", spec)
    assert ex.max_blocks is None                     # set by the backend's build
    before = P.get_table_lookup()
    P.set_table_lookup(lambda s, cc: dict(per_block=3, min_blocks=0, line=1, prefetch=1,
                                          _source="test"))
    try:
        ex = C.CudaBackend().build(spec)
    finally:
        P.set_table_lookup(before)
    assert ex.max_blocks == 132 * 5
    ex._launch(spec.batch, ("D", "V", "U"))
    assert launched[-1] == (math.ceil(100000 / 3), 243, 132 * 5)
