"""The distributed solve's communication path (chosen at run time, forced by
SMALLTC_DIST_COMM), its per-phase timers, and compiling kernels once per node: in one
process (mpi4py's COMM_SELF; the GPU paths through their decision rule, with NCCL and
CUDA-aware MPI simulated present or missing). Runs under mpiexec: test_fem_distributed_mpi.py."""
import logging
import types

import numpy as np
import pytest

from optional_deps import missing

MPI = pytest.importorskip("mpi4py.MPI", reason="mpi4py (pip install 'smalltc[mpi]')")

from smalltc import fem  # noqa: E402  (after the skip)
from smalltc.fem.distributed import comm as dcomm  # noqa: E402
from smalltc.fem.distributed.comm import ENV_COMM, comm_path, decide_path  # noqa: E402
from smalltc.fem.distributed.halo import Halo  # noqa: E402
from smalltc.fem.distributed.poisson import solve_poisson_distributed  # noqa: E402

HAVE, NONE = (True, "found"), (False, "not installed")

# (on_gpu, forced, NCCL, CUDA-aware MPI) -> the path, or (exception, text in its message)
PATHS = [
    (False, None, NONE, NONE, "host"),
    (False, "", HAVE, HAVE, "host"),
    (False, "mpi-device", NONE, NONE, "host"),
    (False, "staged", NONE, NONE, "staged"),
    (False, "nccl", HAVE, HAVE, (RuntimeError, "this solve runs on the CPU")),
    (True, None, HAVE, HAVE, "nccl"),
    (True, None, NONE, HAVE, "mpi-device"),
    (True, None, NONE, NONE, "staged"),
    (True, "NCCL", HAVE, NONE, "nccl"),
    (True, "nccl", NONE, HAVE, (RuntimeError, r"SMALLTC_DIST_COMM=nccl, but NCCL is not "
                                              r"available \(not installed\)")),
    (True, "mpi-device", HAVE, HAVE, "mpi-device"),
    (True, "mpi-device", HAVE, NONE, (RuntimeError, "the MPI library is not CUDA-aware")),
    (True, "staged", HAVE, HAVE, "staged"),
    (True, "gloo", HAVE, HAVE, (ValueError, "must be one of nccl, mpi-device, staged")),
]


@pytest.mark.parametrize("on_gpu,forced,nccl,aware,expect", PATHS)
def test_the_communication_path_rule(on_gpu, forced, nccl, aware, expect):
    asked = []

    def probe(answer, name):
        def ask():
            asked.append(name)
            return answer
        return ask
    args = (on_gpu, forced, probe(nccl, "nccl"), probe(aware, "aware"))
    if isinstance(expect, tuple):
        with pytest.raises(expect[0], match=expect[1]):
            decide_path(*args)
        return
    path, reason = decide_path(*args)
    assert path == expect and reason
    if not on_gpu:
        assert asked == []                        # the CPU asks nothing
    if path == "nccl" or forced in ("staged", "mpi-device"):
        assert "aware" not in asked or forced == "mpi-device"
    if on_gpu and forced is None and path != "nccl":
        assert "NCCL not available (not installed)" in reason     # the fallback says why


def _fresh():
    """A new communicator: comm_path's choice is kept per communicator."""
    return MPI.COMM_SELF.Dup()


@pytest.fixture
def many(monkeypatch):
    """COMM_SELF's copies treated as communicators of several ranks (the one-rank rule off)."""
    monkeypatch.setattr(dcomm, "_alone", lambda comm: False)


def test_one_rank_on_gpus_sends_nothing_and_builds_no_nccl(monkeypatch):
    fake = types.SimpleNamespace(__name__="cupy-standin")
    monkeypatch.setattr(dcomm, "_nccl_probe", lambda: pytest.fail("NCCL probed on one rank"))
    monkeypatch.delenv(ENV_COMM, raising=False)
    path = comm_path(_fresh(), fake)
    assert (path.name, path.nccl) == ("staged", None) and "one rank" in path.reason
    monkeypatch.setattr(dcomm, "_nccl_probe", lambda: (False, "not installed"))
    monkeypatch.setenv(ENV_COMM, "nccl")                   # forced: asked for, so checked
    with pytest.raises(RuntimeError, match="SMALLTC_DIST_COMM=nccl, but NCCL is not"):
        comm_path(_fresh(), fake)


def test_cpu_path_is_plain_mpi_and_forcing_nccl_on_the_cpu_fails(monkeypatch):
    c = _fresh()
    path = comm_path(c, np)
    assert (path.name, path.transport, path.nccl) == ("host", "host", None)
    assert comm_path(c, np) is path                       # chosen once
    monkeypatch.setenv(ENV_COMM, "nccl")
    with pytest.raises(RuntimeError, match="NCCL moves GPU arrays"):
        Halo(_fresh(), {}, {}, np)
    monkeypatch.setenv(ENV_COMM, "staged")
    assert Halo(_fresh(), {}, {}, np).transport == "staged"


def test_gpu_fallback_without_nccl_logs_and_a_forced_nccl_errors(monkeypatch, caplog, many):
    """A stand-in for CuPy (no GPU here): NCCL missing, MPI not CUDA-aware."""
    fake = types.SimpleNamespace(__name__="cupy-standin")
    monkeypatch.setattr(dcomm, "_nccl_probe", lambda: (False, "cupy.cuda.nccl does not import"))
    monkeypatch.setattr(dcomm, "cuda_aware", lambda: (False, "SMALLTC_MPI_CUDA_AWARE=0"))
    monkeypatch.delenv(ENV_COMM, raising=False)
    with caplog.at_level(logging.INFO, logger="smalltc"):
        path = comm_path(_fresh(), fake)
    assert path.name == "staged" and path.transport == "staged"
    assert "NCCL not available (cupy.cuda.nccl does not import)" in caplog.text
    monkeypatch.setenv(ENV_COMM, "nccl")
    with pytest.raises(RuntimeError, match=r"SMALLTC_DIST_COMM=nccl, but NCCL is not available "
                                           r"\(cupy.cuda.nccl does not import\)"):
        comm_path(_fresh(), fake)
    monkeypatch.setattr(dcomm, "cuda_aware", lambda: (True, "asked"))
    monkeypatch.setenv(ENV_COMM, "mpi-device")
    assert comm_path(_fresh(), fake).transport == "device"


def test_ranks_sharing_a_gpu_do_not_take_nccl(monkeypatch, many):
    """NCCL refuses two ranks on one GPU (more ranks than GPUs): the next path is taken and
    says which ranks share; forcing NCCL then is an error naming them."""
    assert dcomm.shared_gpus([("h", "a"), None, ("h", "b"), ("g", "a")]) is None
    assert dcomm.shared_gpus([("h", "a"), ("h", "b"), ("h", "a"), ("h", "b"), ("h", "a")]) \
        == "ranks 0, 2, 4 share GPU a of host h; ranks 1, 3 share GPU b of host h"
    fake = types.SimpleNamespace(__name__="cupy-standin")
    monkeypatch.setattr(dcomm, "_nccl_probe", lambda: (True, "NCCL 2.21"))
    monkeypatch.setattr(dcomm, "cuda_aware", lambda: (False, "asked"))
    monkeypatch.delenv(ENV_COMM, raising=False)
    monkeypatch.setattr(dcomm, "shared_gpus", lambda places: "ranks 0-1 share GPU a of host h")
    path = comm_path(_fresh(), fake)
    assert path.name == "staged" and path.nccl is None
    assert "NCCL not available (it needs a GPU a rank: ranks 0-1 share GPU a" in path.reason
    monkeypatch.setenv(ENV_COMM, "nccl")
    with pytest.raises(RuntimeError, match="SMALLTC_DIST_COMM=nccl, but NCCL is not available "
                                           r"\(it needs a GPU a rank"):
        comm_path(_fresh(), fake)


def test_nccl_module_says_what_is_missing():
    if not missing("cupy"):
        pytest.skip("CuPy is installed: the lead's GPU runs test NCCL itself")
    from smalltc.fem.distributed.nccl import nccl_module
    with pytest.raises(RuntimeError, match="NCCL is not available: cupy.cuda.nccl does not import"):
        nccl_module()


def _u(x):
    return x[0] ** 2 + x[1]


@pytest.mark.parametrize("precond", ["jacobi", pytest.param("pmg", marks=pytest.mark.skipif(
    missing("pyamg"), reason="pyamg (pip install 'smalltc[amg]')"))])
def test_phase_timers_on_one_rank(precond):
    """timings="phases": the operator's and the preconditioner's applications timed, the
    rest of CG the remainder; without it, no such keys (and the same answer)."""
    mesh = fem.box_mesh(2, 4, distortion=0.05)
    kw = dict(dirichlet=_u, exact=_u, precond=precond, device="cpu", comm=MPI.COMM_SELF)
    plain = solve_poisson_distributed(mesh, 2, -2.0, **kw)
    timed = solve_poisson_distributed(mesh, 2, -2.0, timings="phases", **kw)
    t = timed.timings
    assert "apply" not in plain.timings and "cg_other" not in plain.timings
    assert timed.iterations == plain.iterations
    assert np.allclose(timed.u, plain.u, rtol=0, atol=1e-12)
    assert 0 < t["apply"] < t["solve"] and t["cg_other"] >= 0
    assert abs(t["apply"] + t["precond_apply"] + t["cg_other"] - t["solve"]) < 1e-9
    if precond == "pmg":
        assert 0 < t["coarse"] < t["precond_apply"]
        assert type(timed.problem.precond.coarse).__name__ == "GatheredAMG"   # put back
    else:
        assert t["precond_apply"] == 0.0            # Jacobi is in the fused CG's updates
    for k in ("setup", "space", "bc", "operator", "load", "preconditioner", "error", "halo",
              "halo_wait", "allreduce"):
        assert k in t and t[k] >= 0, k
    d = timed.distribution
    assert (d["comm_path"], d["comm_path_reason"]) == ("host", "NumPy vectors: plain MPI")
    with pytest.raises(ValueError, match="timings must be None or 'phases'"):
        solve_poisson_distributed(mesh, 2, -2.0, timings="all", **kw)


def test_projection_phase_timers_on_one_rank():
    res = fem.l2_project(fem.box_mesh(2, 3), 2, _u, device="cpu", comm=MPI.COMM_SELF,
                         timings="phases")
    t = res.timings
    assert 0 < t["apply"] < t["solve"] and t["cg_other"] >= 0
    assert res.distribution["comm_path"] == "host"


def test_node_first_alone_runs_nothing():
    """One rank: nothing to spare the others, fn is not run (the solve builds its own)."""
    ran = []
    dcomm.node_first(MPI.COMM_SELF, ("alone", 1), lambda: ran.append(1))
    assert ran == []
