"""CUDA backend logic that needs no GPU: heuristics, launch geometry, per-device kernels.

The device is faked in :mod:`smalltc.backends.cuda.runtime`, the one place the
families reach it through: ``get_kernel`` and ``launch`` are recorders and the
current device id is a settable number, so these run in CI. Variants are
chosen by passing parameters to ``build``.
"""
import math
import types

import numpy as np
import pytest

from smalltc import backends
from smalltc._arrays import gpu_available
from smalltc.backends.cuda import CudaBackend, choose
from smalltc.backends.cuda import action as A
from smalltc.backends.cuda import runtime as RT
from smalltc.backends.cuda.action import action_ctx
from smalltc.backends.cuda.assembly import assembly_ctx
from smalltc.backends.cuda.layout import layout_ctx
from smalltc.spec import ActionSpec, GemmSpec

DEVICE = dict(name="Fake GPU", cc="90", sms=132, smem_optin=227 * 1024)


class _FakeKernel:
    def __init__(self, dev):
        self.dev = dev
        self.attributes = {"local_size_bytes": 0, "num_regs": 40}


@pytest.fixture
def fake_device(monkeypatch):
    state = types.SimpleNamespace(dev=0, compiled=[], launched=[])

    def get_kernel(template, entry, ctx, smem):
        state.compiled.append((state.dev, template, entry))
        return _FakeKernel(state.dev)

    def launch(kern, ngroups, threads, args, smem, max_blocks=None):
        state.launched.append((kern.dev, ngroups, threads, args, smem))

    monkeypatch.setattr(RT, "current_device_id", lambda: state.dev)
    monkeypatch.setattr(RT, "current_device", lambda: (state.dev, DEVICE))
    monkeypatch.setattr(RT, "get_kernel", get_kernel)
    monkeypatch.setattr(RT, "launch", launch)
    monkeypatch.setattr(RT, "direct_launcher", lambda *a, **k: None)   # RawKernel path
    monkeypatch.setattr(RT, "resident_blocks", lambda kern, threads, smem: 4)
    monkeypatch.setenv("SMALLTC_TUNING", "off")
    return state


def test_kernel_per_device_and_geometry(fake_device):
    # T = 4: the heuristic's shared-memory form (from T = 5 on it is the line form, whose
    # constant-bank copy needs a real device)
    spec = ActionSpec(dim=3, nq=4, nd=3, batch=1001, dtype="float64", ncomp=3, comp_axis=True)
    ctx = action_ctx(3, 3, 4, 3, "float64")
    assert ctx["line"] == 0
    ex = CudaBackend().build(spec)
    assert ex.kernel == "stc_mass_action_3d_f64_nd3nq4c3" and ex.ctx == ctx
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
    ex = CudaBackend().build(spec)
    ex.run(("A", "B", None), "OUT", alpha=2.0, beta=0.0)
    args = fake_device.launched[-1][3]
    assert args[:4] == ("A", "B", "OUT", "OUT")       # C is not read: out stands in
    assert isinstance(args[4], np.float32) and args[4] == 2.0
    assert ex.kernel == "stc_gemm_nn_f32_m4n4k4" and ex.specialized


def test_generic_gemm_for_large_extents(fake_device):
    spec = GemmSpec(batch=3, m=200, n=5, k=7, dtype="float64", shared_b=True,
                    beta_zero=False)
    ex = CudaBackend().build(spec)
    assert not ex.specialized and ex.kernel == "stc_generic8a_f64_beta"
    assert ex.source == "generic"
    ex.run(("A", "B", "C"), "OUT", alpha=1.0, beta=0.5)
    _, ngroups, threads, args, _ = fake_device.launched[-1]
    assert args[6:11] == (200, 7, 1, 1, 5)            # I S J K L of op(A) op(B)
    assert args[11:13] == (200 * 7, 0)                # batch strides; B shared
    assert ngroups == math.ceil(3 * 200 * 5 / threads)


def test_params_override_the_heuristic(fake_device):
    spec = GemmSpec(batch=7, m=8, n=8, k=8, dtype="float64")
    ex = CudaBackend().build(spec, params=dict(dim_x=8, dim_y=2, per_block=3))
    assert ex.source == "params" and ex.table is None
    assert (ex.params["dim_x"], ex.params["dim_y"], ex.params["per_block"]) == (8, 2, 3)
    assert ex.params["thr_m"] == 4 and ex.params["threads"] == 48
    assert CudaBackend().build(spec, params="heuristic").source == "heuristic"
    with pytest.raises(ValueError, match=r"params .* do not fit gemm_nn m=8.*layout family"):
        CudaBackend().build(spec, params=dict(dim_x=64, dim_y=64, per_block=1))


def test_table_answers_before_the_heuristic(fake_device, monkeypatch, tmp_path):
    """A table of this device model answers first, then the architecture's, then the
    heuristic; the executor says which answered."""
    import json
    spec = GemmSpec(batch=7, m=8, n=8, k=8, dtype="float64")

    def table(name, params):
        entry = dict(op="gemm", family="layout", spec=spec.with_batch(100).as_dict(),
                     params=params, time_s=1e-4, fraction_of_pmax=0.9, runner_up=None)
        data = dict(schema=1, arch="sm90", dtype="float64", device=dict(DEVICE, name="x"),
                    versions={}, date="2026-11-23T00:00:00Z", entries={spec.size_key: entry})
        (tmp_path / name).write_text(json.dumps(data))

    monkeypatch.setenv("SMALLTC_TUNING", "on")
    monkeypatch.setenv("SMALLTC_TUNING_TABLES", str(tmp_path))
    monkeypatch.setattr("smalltc.tables.shipped_dir", lambda: tmp_path / "none")
    assert CudaBackend().build(spec).source == "heuristic"
    table("sm90-float64.json", dict(dim_x=8, dim_y=2, per_block=3))
    ex = CudaBackend().build(spec)
    assert (ex.source, ex.table, ex.params["per_block"]) == ("table-exact", "sm90-float64.json", 3)
    table("sm90-fake-gpu-float64.json", dict(dim_x=8, dim_y=4, per_block=2))
    ex = CudaBackend().build(spec)
    assert (ex.table, ex.params["per_block"]) == ("sm90-fake-gpu-float64.json", 2)
    near = CudaBackend().build(GemmSpec(batch=7, m=8, n=8, k=9, dtype="float64"))
    assert near.source == "table-nearest" and near.table == "sm90-fake-gpu-float64.json"
    monkeypatch.setenv("SMALLTC_TUNING", "off")
    assert CudaBackend().build(spec).source == "heuristic"


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
            ctx = action_ctx(dim, p + 1, nq, 1, dtype)
            if ctx is not None:
                assert ctx["threads"] == ctx["tpi"] * ctx["per_block"] <= 1024
                assert ctx["smem_bytes"] <= 227 * 1024
            a = assembly_ctx(dim, p + 1, nq, dtype)
            if a is not None:
                assert a["smem_bytes"] <= 227 * 1024
    for n in range(1, 70):
        g = layout_ctx("8a", n, n, 1, 1, n, dtype, False, False)
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
    monkeypatch.setattr(RT, "cupy_or_none", lambda: fake)     # its ConstantBank
    monkeypatch.setattr(RT, "get_global", get_global)
    B = types.SimpleNamespace(data=types.SimpleNamespace(ptr=55), nbytes=8 * 30)
    spec = ActionSpec(dim=3, nq=6, nd=5, batch=100, dtype="float64")
    params = dict(per_block=1, line=1, prefetch=0)        # no prefetch: no grid cap
    a = CudaBackend().build(spec, params=params)
    b = CudaBackend().build(spec.with_batch(50), params=params)
    assert a.ctx["line"] == 1 and a.kernel == "stc_mass_action_3d_f64_nd5nq6c1_line"
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
    monkeypatch.setattr(RT, "launch", lambda kern, ngroups, threads, args, smem, max_blocks=None:
                        launched.append((ngroups, threads, max_blocks)))
    # the driver's occupancy calculator, here: 5 blocks of 243 threads fit on an SM
    monkeypatch.setattr(RT, "resident_blocks", lambda kern, threads, smem: 5)
    spec = ActionSpec(dim=3, nq=9, nd=9, batch=100000, dtype="float64")
    plain = CudaBackend().build(spec, params=dict(per_block=3, line=1, prefetch=0))
    assert plain.max_blocks is None
    ex = CudaBackend().build(spec, params=dict(per_block=3, min_blocks=0, line=1, prefetch=1))
    assert ex.max_blocks == 132 * 5
    ex._launch(spec.batch, ("D", "V", "U"))
    assert launched[-1] == (math.ceil(100000 / 3), 243, 132 * 5)


def test_choose_needs_no_device():
    """What build would compile, decided from sizes and a device dict alone."""
    spec = ActionSpec(dim=3, nq=4, nd=3, batch=10, dtype="float32")
    c = choose(spec, DEVICE, params="heuristic")
    assert (c.template, c.entry, c.source, c.family.name) == (
        "action.cu.j2", "stc_mass_action_3d_f32_nd3nq4c1", "heuristic", "action")
    assert choose(spec, dict(DEVICE, smem_optin=64), params="heuristic") is None
