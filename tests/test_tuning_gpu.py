"""The tuner on a real GPU, small and quick (skipped without a CUDA device).

Run these before a search on a new GPU: they take a minute and check the whole
path (NVRTC compile in worker processes, verification, CUDA-event timing, the
table, and the plan picking the table's parameters up).
"""
import numpy as np
import pytest

from smalltc._arrays import gpu_available
from smalltc.spec import ActionSpec, AssemblySpec, GemmSpec

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device")]

SPECS = [GemmSpec(batch=20_000, m=8, n=8, k=8, dtype="float64"),
         ActionSpec(dim=3, nq=5, nd=4, batch=20_000, dtype="float64"),
         AssemblySpec(dim=2, nq=4, nd=3, batch=20_000, dtype="float32")]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    from smalltc.tuning import tables as T
    from smalltc.tuning.measure import GpuDevice
    from smalltc.tuning.search import Search
    work = tmp_path_factory.mktemp("tune")
    out = {}
    for dtype in ("float64", "float32"):
        specs = [s for s in SPECS if s.dtype == dtype]
        dev = GpuDevice(dtype)
        s = Search("mixed", dtype, specs, dev, compiler="cuda", jobs=4, progress=False,
                   checkpoint=str(work / f"{dtype}.json"), confirm_rounds=1)
        assert s.run() == "done"
        t = T.add_results(T.new_table(dev.info(), dtype), s.results, "mixed", 1.0)
        T.save(t, work / T.table_name(dev.info(), dtype))        # this device model's
        out[dtype] = (s, t)
    return work, out


def test_search_on_gpu(tuned):
    _, out = tuned
    for s, t in out.values():
        for key, r in s.results.items():
            assert r["winner"] is not None, key
            assert r["heuristic"]["status"] == "ok"
            assert r["winner"].get("rel_err_full") is not None or r["kept_heuristic"]
            assert 0 < r["fraction_of_pmax"] <= 1.2
            assert r["space"]["compiled"] > 0 and r["space"]["timed"] > 0
            assert all(c["kernel"]["registers"] for c in r["candidates"] if c["status"] == "ok")


def test_plan_uses_the_table(tuned, monkeypatch):
    """A table of this device model in $SMALLTC_TUNING_TABLES answers a new plan: exactly
    for its own size, by the nearest entry for a neighbour; the plan says which table."""
    import cupy as cp
    import smalltc
    from smalltc.tuning import tables as T
    work, out = tuned
    monkeypatch.setenv("SMALLTC_TUNING_TABLES", str(work))
    A = cp.random.random((100, 8, 8))
    B = cp.random.random((100, 8, 8))
    p = smalltc.plan("gemm", A, B)
    assert p.source == "table-exact"
    name = T.table_name(out["float64"][1]["device"], "float64")
    assert p.executor.table == name and name in repr(p)
    entry = out["float64"][1]["entries"]["gemm/nn/m8n8k8"]["params"]
    assert {k: p.params[k] for k in entry} == entry
    np.testing.assert_allclose(cp.asnumpy(p(A, B)), cp.asnumpy(A @ B), rtol=1e-12)
    # a neighbour that no table has exactly (the shipped sm90 tables have every square
    # n and would answer first with their exact entry): this device's table, nearest
    A9, B9 = cp.random.random((100, 9, 8)), cp.random.random((100, 8, 9))
    p9 = smalltc.plan("gemm", A9, B9)
    assert (p9.source, p9.executor.table) == ("table-nearest", name)
