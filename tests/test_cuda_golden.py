"""Every CUDA kernel choice pinned: template, entry, launch geometry and rendered source.

``tests/data/cuda_golden.json.gz`` records, for a grid of 3,082 specs (GEMM n =
1..40 with transposes, shared operands and beta; rectangular GEMMs; every
pairwise step of p = 1..10; the action for dim 1..3, nd 1..14, ncomp 1 and 3;
the assembly; every shipped table entry's own size; the fused FEM operator and its
diagonal, 1D-3D, p = 1..8) and both float dtypes,
what :meth:`CudaBackend.build` builds with the shipped tables on and with
``SMALLTC_TUNING=off``: per kernel, its template, entry point, threads,
shared-memory bytes, items per block and the sha256 of its rendered source,
then the parameters' source and the grid cap.

A deliberate change of a kernel choice (a new table, another heuristic) is
recorded again with ``SMALLTC_UPDATE_GOLDEN=1 pytest tests/test_cuda_golden.py``;
the diff of the file then shows what changed. No GPU is needed: the device is
an H100's numbers and the compile is faked (``runtime.get_kernel``), so the
real build path runs up to the compile.
"""
import gzip
import hashlib
import json
import os
import pathlib
import types

import pytest

from smalltc.backends.cuda import CudaBackend
from smalltc.backends.cuda import runtime as RT
from smalltc.catalogue import steps
from smalltc import tables
from smalltc.spec import (ActionSpec, AssemblySpec, ContractSpec, GemmSpec, MassApplySpec,
                          MassDiagonalSpec)
from smalltc.tables import shipped_dir

GOLDEN = pathlib.Path(__file__).parent / "data" / "cuda_golden.json.gz"
DEVICE = dict(name="NVIDIA H100 80GB HBM3", cc="90", sms=132, smem_optin=232448)
RESIDENT = 4           # blocks per SM the faked occupancy query answers
ABOUT = ("CUDA kernel choice per spec (batch 1000), from CudaBackend.build with the compile "
         "faked: per kernel built, template, entry, threads, shared-memory bytes, per_block and "
         "sha256[:20] of the rendered source; then the params source and the grid cap. "
         "'tables': the shipped tables on; 'heuristic': SMALLTC_TUNING=off. Device: cc 90, "
         "132 SMs, 232448 B opt-in shared memory, 4 resident blocks per SM (faked). First "
         "recorded before the family-module redesign (commit 1ac4a4d).")


def grid():
    """The specs, in a fixed order, without duplicates."""
    out = []
    for dt in ("float64", "float32"):
        for n in range(1, 41):
            for ta in (False, True):
                for tb in (False, True):
                    if (ta or tb) and n not in (2, 3, 4, 5, 8, 9, 16, 17, 31, 32):
                        continue
                    for sa, sb in ((False, False), (True, False), (False, True)):
                        for bz in (True, False):
                            out.append(GemmSpec(batch=1000, m=n, n=n, k=n, dtype=dt,
                                                trans_a=ta, trans_b=tb, shared_a=sa,
                                                shared_b=sb, beta_zero=bz))
        for m, n, k in ((4, 8, 16), (8, 16, 4), (16, 32, 8), (32, 8, 16), (8, 64, 8), (5, 16, 4),
                        (9, 64, 8), (4, 25, 5), (8, 81, 9), (3, 7, 2), (200, 5, 7), (1, 130, 3),
                        (7, 3, 129), (12, 12, 40)):
            for sa in (False, True):
                for bz in (True, False):
                    out.append(GemmSpec(batch=1000, m=m, n=n, k=k, dtype=dt, shared_a=sa,
                                        beta_zero=bz))
        for op in ("action", "assembly"):
            for dim in (1, 2, 3):
                for p in range(1, 11):
                    for nq in (p + 1, p + 2, p + 3):
                        for st in steps(op, dim):
                            out.append(ContractSpec(kind=st.kernel, batch=1000, dtype=dt,
                                                    shared_x=st.x[0] == "B",
                                                    shared_y=st.y[0] == "B",
                                                    **st.extents(p + 1, nq)))
        for dim in (1, 2, 3):
            for nd in range(1, 15):
                for nq in range(max(1, nd - 1), nd + 4):
                    for c in (1, 3):
                        out.append(ActionSpec(dim=dim, nq=nq, nd=nd, batch=1000, dtype=dt,
                                              ncomp=c, comp_axis=c > 1))
                if nd <= 9:
                    for nq in range(nd, nd + 4):
                        out.append(AssemblySpec(dim=dim, nq=nq, nd=nd, batch=1000, dtype=dt))
        # the fused FEM operator (atomic and deterministic, both index types) and its diagonal
        for dim in (1, 2, 3):
            for p in range(1, 9):
                for nq in (p + 1, p + 2):
                    for c, it, det in ((1, "int32", False), (3, "int64", True)):
                        out.append(MassApplySpec(dim=dim, nq=nq, nd=p + 1, batch=1000,
                                                 dtype=dt, ndofs=5000, ncomp=c,
                                                 comp_axis=c > 1, index_dtype=it,
                                                 deterministic=det))
                    out.append(MassDiagonalSpec(dim=dim, nq=nq, nd=p + 1, batch=1000,
                                                dtype=dt, ndofs=5000))
    for f in sorted(shipped_dir().glob("sm90-float*.json")):
        for e in tables.entries(tables.load(f)).values():
            out.append(e.spec.with_batch(1000))
    return list(dict.fromkeys(out))


def _key(spec):
    d = spec.as_dict()
    return spec.op + " " + ",".join(f"{k}={v}" for k, v in d.items() if k not in ("op", "batch"))


@pytest.fixture
def faked_compile(monkeypatch):
    """The device is DEVICE; compiles are recorded, not done."""
    built = []

    def get_kernel(template, entry, ctx, smem):
        built.append((template, entry, dict(ctx), smem))
        return types.SimpleNamespace(attributes={"local_size_bytes": 0, "num_regs": 0})

    monkeypatch.setattr(RT, "get_kernel", get_kernel)
    monkeypatch.setattr(RT, "current_device", lambda: (0, DEVICE))
    monkeypatch.setattr(RT, "current_device_id", lambda: 0)
    monkeypatch.setattr(RT, "resident_blocks", lambda kern, threads, smem: RESIDENT)
    return built


def _record(built, mode):
    be, out = CudaBackend(), {}
    for spec in grid():
        built.clear()
        ex = be.build(spec)
        kernels = []
        for template, entry, ctx, smem in built:
            src = RT.render(template, dict(ctx, entry=entry))
            kernels.append(" ".join(str(x) for x in (
                template, entry, ctx["threads"], ctx["smem_bytes"], ctx["per_block"],
                hashlib.sha256(src.encode()).hexdigest()[:20])))
        out[f"{mode} {_key(spec)}"] = " ; ".join(
            kernels + [str(ex.source), str(getattr(ex, "max_blocks", None))])
    return out


def test_kernel_choices_match_the_record(faked_compile, monkeypatch):
    monkeypatch.delenv("SMALLTC_TUNING_TABLES", raising=False)
    monkeypatch.setenv("SMALLTC_TUNING", "on")
    now = _record(faked_compile, "tables")
    monkeypatch.setenv("SMALLTC_TUNING", "off")
    now.update(_record(faked_compile, "heuristic"))
    if os.environ.get("SMALLTC_UPDATE_GOLDEN"):
        text = json.dumps(dict(now, _about=ABOUT), indent=0, sort_keys=True)
        with gzip.open(GOLDEN, "wt") as f:
            f.write(text)
        pytest.skip(f"recorded {len(now)} choices in {GOLDEN}")
    with gzip.open(GOLDEN, "rt") as f:
        golden = json.load(f)
    golden.pop("_about")
    assert len(now) == len(golden) == 2 * len(grid())
    missing = sorted(set(golden) - set(now))
    assert not missing, f"{len(missing)} recorded specs not in the grid: {missing[:3]}"
    changed = [k for k in golden if golden[k] != now[k]]
    assert not changed, (f"{len(changed)} of {len(golden)} kernel choices changed, e.g.\n"
                         + "\n".join(f"{k}\n  was {golden[k]}\n  now {now[k]}"
                                     for k in changed[:4]))
