"""Ahead-of-time compilation: ``smalltc.precompile``, ``smalltc precompile``, the cache report.

The main check runs processes: after ``smalltc precompile`` into an empty cache,
a second process's first call writes nothing to the cache (it compiled nothing)
and takes less time than the compile did; a process on another empty cache,
without precompiling, does write (the control). On the GPU the same with CuPy's
kernel cache (``CUPY_CACHE_DIR``).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import smalltc
from smalltc import aot
from smalltc._arrays import gpu_available
from smalltc.app.cli import main

# a first call in a fresh process: the seconds it took and the cache files it wrote
FIRST_CALL = r"""
import json, sys, time
import numpy as np
from smalltc import aot
device = sys.argv[1]
folder = aot.cache_dirs()["cpu" if device == "cpu" else "cuda"]
before = aot._files(folder)
import smalltc
xp = np
if device == "gpu":
    import cupy as xp
B1d, D, V = (xp.asarray(np.random.rand(*s)) for s in ((2, 2), (50, 2, 2), (50, 2, 2)))
t0 = time.perf_counter()
smalltc.batched_contract(B1d, D, V)
if device == "gpu":
    xp.cuda.get_current_stream().synchronize()
seconds = time.perf_counter() - t0
after = aot._files(folder)
print(json.dumps(dict(seconds=seconds, new_files=sum(after.get(f) != before.get(f)
                                                     for f in after))))
"""


def _env(tmp_path, name):
    env = dict(os.environ, SMALLTC_CACHE_DIR=str(tmp_path / name / "smalltc"),
               CUPY_CACHE_DIR=str(tmp_path / name / "cupy"))
    env.pop("CUPY_CACHE_IN_MEMORY", None)
    return env


def _first_call(env, device):
    out = subprocess.run([sys.executable, "-c", FIRST_CALL, device], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not gpu_available(), reason="no CUDA device (cupy device query failed)")])])
def test_second_process_after_precompile_compiles_nothing(tmp_path, device):
    env = _env(tmp_path, "warm")
    records = tmp_path / "records.json"
    subprocess.run([sys.executable, "-m", "smalltc", "precompile", "--ops", "action",
                    "--p", "1", "--nq", "2", "--dims", "2", "--device", device,
                    "--no-progress", "--json", str(records)], env=env, check=True,
                   capture_output=True)
    (rec,) = json.loads(records.read_text())
    assert rec["compiled"] and rec["new_files"] > 0 and not rec["nothing_to_compile"]
    warm = _first_call(env, device)
    assert warm["new_files"] == 0                       # nothing compiled (no timing:
    #                                                     a p=1 CUDA module compiles in
    #                                                     about the time CuPy takes to start)
    cold = _first_call(_env(tmp_path, "cold"), device)  # the control: no precompile
    assert cold["new_files"] > 0


# precompile twice and report, in a process of its own on an empty cache (in this process
# the cache folder is shared with the other test workers, whose compiles would count as
# this call's new files); one compile process: the two actions share a kernel, and with
# two processes either may be the one that compiles it
RECORDS_AND_REPORT = r"""
import json
import smalltc
from smalltc import aot
recs = smalltc.precompile(ops=["action", "assembly"], p=[1], nq=["p+1", 2], dims=[1],
                          ncomp=[1, 2], device="cpu", progress=False, jobs=1)
again = smalltc.precompile(ops=["action"], p=[1], nq=[2], dims=[1], device="cpu",
                           progress=False)
print(json.dumps(dict(recs=recs, again=again, report=aot.cache_report(kernels=True))))
"""


def test_precompile_records_and_cache_report(tmp_path):
    out = subprocess.run([sys.executable, "-c", RECORDS_AND_REPORT],
                         env=_env(tmp_path, "records"), check=True, capture_output=True,
                         text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    recs, again, rep = got["recs"], got["again"], got["report"]
    # nq p+1 == 2 once; ncomp only for the action
    assert [(r["op"], r["ncomp"]) for r in recs] == [("action", 1), ("action", 2),
                                                     ("assembly", 1)]
    assert all(r["backend"] == "cpu" and r["device"] == "cpu" for r in recs)
    assert recs[0]["compiled"] and recs[0]["new_files"] > 0     # an empty cache: it compiled
    assert recs[1]["kernel"] == recs[0]["kernel"] and not recs[1]["compiled"]   # shared
    assert not again[0]["compiled"] and again[0]["new_files"] == 0
    assert rep["cpu"]["compiled"] >= 1 and "stc_mass_action_1d_f64_nd2_nq2" in rep["cpu"]["names"]
    assert set(rep["cuda"]) >= {"dir", "modules", "files", "bytes"}


def test_precompile_fem_operators():
    recs = smalltc.precompile(ops=["mass_apply", "mass_diagonal"], p=[1], nq=[2], dims=[1],
                              deterministic=[False, True], index_dtypes=["int32", "int64"],
                              device="cpu")
    assert len(recs) == 8
    for r in recs:
        assert r["nothing_to_compile"] == (r["backend"] == "reference")


@pytest.mark.parametrize("kw,exc,match", [
    (dict(ops=["gemm"]), ValueError, r"op must be one of \('action', 'assembly', "
                                     r"'mass_apply', 'mass_diagonal', 'vector_update', 'pcg', "
                                     r"'pmg_transfer', 'csr_spmv', 'schwarz_fdm'\), got 'gemm'"),
    (dict(device="tpu"), ValueError, r"device must be 'auto', 'cpu' or 'gpu', got 'tpu'"),
    (dict(dtypes=["float16"]), TypeError, r"dtype float16"),
])
def test_precompile_errors(kw, exc, match):
    args = dict(ops=["action"], p=[1], nq=[2], dims=[1], device="cpu") | kw
    with pytest.raises(exc, match=match):
        smalltc.precompile(**args)


@pytest.mark.skipif(gpu_available(), reason="a GPU answers here")
def test_precompile_gpu_without_one():
    with pytest.raises(RuntimeError, match=r"device='gpu' was requested but no CUDA device"):
        smalltc.precompile(ops=["action"], p=[1], nq=[2], dims=[1], device="gpu")


def test_parse_nq():
    assert [aot.parse_nq(q, 3) for q in ("p", "p+2", "p-1", 7, "5")] == [3, 5, 2, 7, 5]


def test_cli_precompile_and_info(capsys, tmp_path):
    out = tmp_path / "r.json"
    assert main(["precompile", "--ops", "action", "--p", "1", "--nq", "p+1", "--dims", "1",
                 "--device", "cpu", "--no-progress", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 builds on the CPU" in text and "cache:" in text
    assert json.loads(out.read_text())[0]["kernel"] == "stc_mass_action_1d_f64_nd2_nq2"
    assert main(["info", "--kernels"]) == 0
    text = capsys.readouterr().out
    assert "kernel caches (smalltc precompile fills them):" in text
    assert "stc_mass_action_1d_f64_nd2_nq2" in text
    assert main(["info", "--json"]) == 0
    assert "caches" in json.loads(capsys.readouterr().out)


def test_kernels_do_not_depend_on_the_element_count():
    """Why a two-element problem is enough: the plan of a large batch uses the kernel
    the precompile built (the same entry point, no new compile in this process)."""
    rec = smalltc.precompile(ops=["action"], p=[2], nq=[3], dims=[2], device="cpu")[0]
    B1d, D, V = np.random.rand(3, 3), np.random.rand(300, 3, 3), np.random.rand(300, 3, 3)
    p = smalltc.plan("action", B1d, D, V)
    assert p.kernel == rec["kernel"] and p.executor.compile_s == 0.0


# the first call of each kernel of the records in a fresh process: whether Numba loaded
# its machine code from the disk cache (hits) or compiled it (misses), by the dispatchers'
# statistics, and the cache files the process wrote
LOADS = r"""
import json, sys
import numpy as np
import smalltc
from smalltc import aot
from smalltc.backends.cpu import runtime
folder = aot.cache_dirs()["cpu"]
before = aot._files(folder)
for it in json.loads(sys.argv[1]):
    for ops_, kw, call in aot._builds(it, np):
        smalltc.plan(it["op"], *ops_, **kw)(*ops_, **call)
stats = {fn.py_func.__name__: (sum(fn.stats.cache_hits.values()),
                               sum(fn.stats.cache_misses.values()))
         for fn in runtime._KERNELS.values()}
after = aot._files(folder)
print(json.dumps(dict(stats=stats, new_files=sum(after.get(f) != before.get(f)
                                                 for f in after))))
"""


def test_parallel_precompile_loads_in_a_fresh_process(tmp_path):
    """Two compile processes build three kernels into an empty cache; a fresh process's
    first call of each loads it from Numba's disk cache (no miss, no file written)."""
    env = _env(tmp_path, "parallel")
    env.pop("NUMBA_CACHE_DIR", None)          # Numba's files beside the modules: counted
    records = tmp_path / "records.json"
    out = subprocess.run([sys.executable, "-m", "smalltc", "precompile", "--ops",
                          "action,assembly", "--p", "1", "--nq", "2", "--dims", "1,2",
                          "--device", "cpu", "--jobs", "2", "--no-progress", "--json",
                          str(records)], env=env, check=True, capture_output=True,
                         text=True).stdout
    assert "(2 compile processes" in out
    recs = json.loads(records.read_text())
    # the items' order, not the order the workers finished them in
    assert [(r["op"], r["dim"]) for r in recs] == [("action", 1), ("action", 2),
                                                   ("assembly", 1), ("assembly", 2)]
    assert all(r["compiled"] and r["new_files"] > 0 for r in recs)
    items = [{k: r[k] for k in ("op", "dim", "p", "nq", "dtype", "ncomp", "deterministic",
                                "index_dtype")} for r in recs[:3]]
    got = json.loads(subprocess.run([sys.executable, "-c", LOADS, json.dumps(items)], env=env,
                                    check=True, capture_output=True,
                                    text=True).stdout.strip().splitlines()[-1])
    assert set(got["stats"]) == {r["kernel"] for r in recs[:3]}
    assert all(hits >= 1 and misses == 0 for hits, misses in got["stats"].values()), got
    assert got["new_files"] == 0


def test_parallel_precompile_raises_what_one_process_raises():
    """A build a worker cannot do is built here, and its error raised here."""
    with pytest.raises(TypeError, match=r"dtype float16"):
        smalltc.precompile(ops=["action"], p=[1, 2], nq=[2], dims=[1], dtypes=["float16"],
                           device="cpu", jobs=2)


def test_precompile_ops_come_from_the_registries():
    from smalltc.ops import OPS as registry
    from smalltc import solver
    assert aot.OPS == tuple(n for n, e in registry.items() if e.example is not None)
    assert aot.OPS == ("action", "assembly", "mass_apply", "mass_diagonal")
    assert aot.SOLVER_OPS == solver.OPS == tuple(solver.DEPENDS)
    import argparse
    parser = argparse.ArgumentParser()
    aot.add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert all(name in text for name in aot.OPS + aot.SOLVER_OPS)
    with pytest.raises(ValueError, match=r"jobs must be a positive number"):
        smalltc.precompile(ops=["action"], p=[1], nq=[2], dims=[1], device="cpu", jobs=0)
