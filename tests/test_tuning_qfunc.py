"""Tuning the operator family's other instances: diffusion, collocated diffusion
and helmholtz, element-level (``action``) and fused (``mass_apply``), on the GPU and the CPU.

The sizes' FORM field, the run-time lookup of their entries (never one instance's entry for
another's spec), the tuner end to end (dry run, no GPU), tuned parameters against the
float64 einsum reference, ``smalltc info`` by instance.
"""
import argparse
import json

import numpy as np
import pytest

from smalltc import tables
from smalltc._arrays import gpu_available
from smalltc.backends.cuda import choose
from smalltc.spec import ActionSpec, MassApplySpec
from smalltc.tuning import cli
from smalltc.tuning import tables as T
from smalltc.tuning.measure import TOL, box_map, box_spec, check_spec
from smalltc.tuning.sizes import parse

F64 = "float64"
H100 = dict(name="NVIDIA H100 80GB HBM3", cc="90", sms=132, smem_optin=227 * 1024)

# (op, token, size keys)
SIZES = [
    ("action", "3:1-2:p+2:diffusion", ["diffusion/action/3d/nd2nq3c1",
                                       "diffusion/action/3d/nd3nq4c1"]),
    ("action", "3:3:p+1:diffusion+co", ["diffusion/action/3d/nd4nq4c1+co"]),
    ("action", "2:2:p+2:helmholtz", ["helmholtz/action/2d/nd3nq4c1"]),
    ("action", "3:2:p+2:c3:diffusion", ["diffusion/action/3d/nd3nq4c3"]),
    ("action", "3:2:p+2:mass", ["action/3d/nd3nq4c1"]),
    ("action", "3:2:p+2:diffusion+q32", ["diffusion/action/3d/nd3nq4c1+q32"]),
    ("action", "3:2:p+1:diffusion+co+q32", ["diffusion/action/3d/nd3nq3c1+co+q32"]),
    ("mass_apply", "3:4:p+2:diffusion", ["diffusion/mass_apply/3d/nd5nq6c1"]),
    ("mass_apply", "3:4:p+1:diffusion+co", ["diffusion/mass_apply/3d/nd5nq5c1+co"]),
    ("mass_apply", "3:1:p+2", ["mass_apply/3d/nd2nq3c1"]),
    ("assembly", "3:2:p+2:diffusion", ["diffusion/assembly/3d/nd3nq4"]),
]

# (op, token, what the error names)
BAD_SIZES = [
    ("action", "3:2:p+2:diffusin", "FORM 'diffusin'"),
    ("action", "3:2:p+2:diffusion+xx", "FORM 'diffusion\\+xx'"),
    ("assembly", "3:2:p+2:diffusion+q32", "FORM 'diffusion\\+q32'"),
    ("action", "3:2:p+2:diffusion+co", "collocated"),
    ("action", "3:2:p+2:diffusion:c3", "cNCOMP before FORM"),
    ("mass_apply", "3:2:p+2:c3:diffusion:x", "expected DIM:P:NQ"),
]


@pytest.mark.parametrize("op,token,keys", SIZES)
def test_sizes_form_field(op, token, keys):
    assert [s.size_key for s in parse(op, [token], F64)] == keys


@pytest.mark.parametrize("op,token,match", BAD_SIZES)
def test_sizes_form_field_errors(op, token, match):
    with pytest.raises(ValueError, match=match):
        parse(op, [token], F64)


@pytest.mark.parametrize("dim,p,n", [(1, 3, 4), (2, 2, 3), (3, 1, 3), (3, 4, 2)])
def test_box_map_is_a_conforming_mesh(dim, p, n):
    s = box_spec(MassApplySpec(dim=dim, nq=p + 2, nd=p + 1, batch=1, ndofs=1, dtype=F64), n)
    m = box_map(s)
    assert m.shape == (n ** dim,) + (p + 1,) * dim and m.dtype == np.int32
    assert m.min() == 0 and m.max() == s.ndofs - 1 and len(np.unique(m)) == s.ndofs
    twice = box_map(s.with_batch(2 * s.batch))         # the 'double' timing form
    assert (twice[s.batch:] == m).all()
    c = check_spec(s)
    assert c.batch >= 100 and len(np.unique(box_map(c))) == c.ndofs


# ----------------------------------------------------------------------------
# the run-time lookup (GPU: decided without compiling)

def _entry(spec, params, family):
    return dict(op=spec.op, family=family, spec=spec.as_dict(), params=params, time_s=1e-4,
                fraction_of_pmax=0.5, runner_up=None)


def _gpu_table(entries, dtype=F64):
    return dict(schema=1, arch="sm90", dtype=dtype, device=dict(H100), versions={},
                date="2026-11-25", entries={s.size_key: _entry(s, p, f) for s, f, p in entries})


def _act(nd, nq, qfunc="mass", co=False, ncomp=1):
    return ActionSpec(dim=3, nq=nq, nd=nd, batch=1, dtype=F64, qfunc=qfunc, collocated=co,
                      ncomp=ncomp, comp_axis=ncomp > 1)


def _apply(nd, nq, qfunc="mass", co=False):
    return box_spec(MassApplySpec(dim=3, nq=nq, nd=nd, batch=1, ndofs=1, dtype=F64,
                                  qfunc=qfunc, collocated=co), 4)


DIFF_P = dict(per_block=2, min_blocks=0, rb=1, line=1, prefetch=0, stages=0, qmode="regs")
MASS_P = dict(per_block=3, min_blocks=0, rb=1, line=1, prefetch=1, stages=0)
FUSED_P = dict(per_block=1, min_blocks=0, line=1, prefetch=0, qmode="global")


@pytest.fixture
def gpu_tables(tmp_path, monkeypatch):
    """An H100 architecture table read first: a diffusion and a mass action entry (3D
    p = 4, nq = 6) and a fused diffusion entry, each off its heuristic."""
    entries = [(_act(5, 6, "diffusion"), "action", DIFF_P), (_act(5, 6), "action", MASS_P),
               (_apply(5, 6, "diffusion"), "mass_apply", FUSED_P)]
    for s, _, p in entries:                      # the test means something: not the heuristic
        assert choose(s, H100, "heuristic").ctx["per_block"] != p["per_block"]
    (tmp_path / "sm90-float64.json").write_text(json.dumps(_gpu_table(entries)))
    monkeypatch.setenv("SMALLTC_TUNING_TABLES", str(tmp_path))
    monkeypatch.delenv("SMALLTC_TUNING", raising=False)
    return tmp_path


# (spec, source, per_block, qmode or None: a mass kernel); (5, 6): the entries' size
LOOKUPS = [
    (_act(5, 6, "diffusion"), "table-exact", 2, "regs"),
    (_act(5, 6), "table-exact", 3, None),
    (_act(4, 5, "diffusion"), "table-nearest", 3, "regs"),    # T 6 -> 5: about 2 x 42 threads
    (_act(5, 6, "diffusion", ncomp=3), "table-nearest", 2, "regs"),
    (_act(5, 6, "helmholtz"), "heuristic", None, None),       # another instance: no entry
    (_act(5, 5, "diffusion", co=True), "heuristic", None, None),
    (_apply(5, 6, "diffusion"), "table-exact", 1, "global"),  # the fused operator's own
    (_apply(5, 6), "heuristic", None, None),                  # not the action's mass entry
    (_apply(5, 5, "diffusion", co=True), "heuristic", None, None),
]


@pytest.mark.parametrize("spec,source,per_block,qmode", LOOKUPS, ids=lambda v: str(v))
def test_lookup_keeps_to_one_instance(gpu_tables, spec, source, per_block, qmode):
    c = choose(spec, H100)
    assert c.source == source, (spec.size_key, c.source)
    if source == "heuristic":
        assert c.ctx == choose(spec, H100, "heuristic").ctx
        return
    assert c.table == "sm90-float64.json"
    assert c.ctx["per_block"] == per_block and c.ctx.get("qmode") == qmode
    assert bool(c.ctx.get("qfunc")) == (spec.qfunc != "mass")


def test_a_diffusion_entry_never_answers_for_mass(tmp_path, monkeypatch):
    """Only a diffusion entry in the table: the mass action at that very size and its
    neighbours keep their heuristic (and the diffusion spec takes the entry)."""
    t = _gpu_table([(_act(5, 6, "diffusion"), "action", DIFF_P)])
    (tmp_path / "sm90-float64.json").write_text(json.dumps(t))
    monkeypatch.setenv("SMALLTC_TUNING_TABLES", str(tmp_path))
    monkeypatch.delenv("SMALLTC_TUNING", raising=False)
    for s in (_act(5, 6), _act(4, 5), _act(5, 7)):
        assert choose(s, H100).source == "heuristic"
    assert choose(_act(5, 6, "diffusion"), H100).source == "table-exact"


def test_a_smem_entry_carried_to_components_reads_q_globally(gpu_tables):
    t = _gpu_table([(_act(5, 6, "diffusion"), "action", dict(DIFF_P, qmode="smem"))])
    (gpu_tables / "sm90-float64.json").write_text(json.dumps(t))
    c = choose(_act(5, 6, "diffusion", ncomp=3), H100)
    assert c.source == "table-nearest" and c.ctx["qmode"] == "global"


# ----------------------------------------------------------------------------
# the tuner end to end, without a GPU (dry run: made-up times, real spaces and keys)

def _tune(argv, capsys=None):
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    return cli.run(p.parse_args(argv))


@pytest.mark.parametrize("op,sizes,keys", [
    (op, sizes, [k.format(op=op) for k in keys]) for op in ("action", "mass_apply")
    for sizes, keys in (
        (["3:2:p+2:diffusion", "3:2:p+1:diffusion+co"],
         ["diffusion/{op}/3d/nd3nq4c1", "diffusion/{op}/3d/nd3nq3c1+co"]),
        (["3:2:p+2:diffusion+vx"], ["diffusion/{op}/3d/nd3nq4c1+vx"]),
        # the corner force (its own family: one missing from the lookup never reads its entries)
        (["3:2:2p:force", "2:3:2p:force_t"],
         ["force/{op}/3d/nd3nq4c3", "force_t/{op}/2d/nd4nq6c2"]))])
def test_dry_run_tables_are_found_by_the_runtime(tmp_path, monkeypatch, op, sizes, keys):
    """``smalltc tune --op OP --sizes ... --dry-run`` (the diffusion instance, its vertex
    geometry, the corner force): a table whose entries validate against the families
    (``qmode`` among the parameters) and, once its dry-run mark is taken off, answer the
    run-time lookup exactly."""
    work = tmp_path / "w"
    rc = _tune(["--op", op, "--sizes", *sizes, "--dry-run", "--compiler", "none", "--work",
                str(work), "--no-progress", "--jobs", "1"])
    assert rc == 0
    table = T.load(work / "sm90-float64.json")
    assert sorted(table["entries"]) == sorted(keys)
    for k, e in table["entries"].items():
        assert e["space"]["timed"] > 10
        if e["params"].get("line"):
            assert e["params"]["qmode"] in ("global", "regs", "smem")
    table.pop("dry_run")
    table["device"] = dict(H100)
    (tmp_path / "sm90-float64.json").write_text(json.dumps(table))
    monkeypatch.setenv("SMALLTC_TUNING_TABLES", str(tmp_path))
    monkeypatch.delenv("SMALLTC_TUNING", raising=False)
    for k, e in table["entries"].items():
        from smalltc.spec import spec_from_dict
        spec = spec_from_dict(e["spec"])
        c = choose(spec.with_batch(7), H100)
        assert c.source == "table-exact" and c.table == "sm90-float64.json"
        assert all(c.ctx[p] == v for p, v in e["params"].items()
                   if p in c.ctx and p != "rb"), (k, e["params"])


# ----------------------------------------------------------------------------
# the CPU: tuned parameters run correctly, and keep to their instance

def _cpu_table(tmp_path, monkeypatch, entries):
    from smalltc.backends.cpu.target import host
    t = host()
    data = dict(schema=1, arch=t.arch, dtype=F64, device=dict(name="test CPU", isa=t.isa,
                                                               vector_bits=t.vector_bits),
                versions={}, date="2026-11-25",
                entries={s.size_key: _entry(s, p, f) for s, f, p in entries})
    path = tmp_path / f"{t.arch}-float64.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("SMALLTC_TUNING_TABLES", str(tmp_path))
    monkeypatch.delenv("SMALLTC_TUNING", raising=False)
    return path


def _cpu_params():
    from smalltc.backends.cpu.target import host
    t = host()
    vbits = 256 if t.isa == "avx512" else 0
    lanes = 2 * t.lanes(F64) if not vbits else 8
    return dict(lanes=lanes, rb=2, tr=0, vbits=vbits)    # the heuristic: one vector, rb 1, tr 1


def _run_cpu(spec, seed=3):
    """The CPU backend's result for ``spec`` on random inputs (output poisoned first) and
    the float64 einsum reference's; and the executor."""
    from smalltc.backends import get
    from smalltc.tuning.measure import _random_host, _reference
    ops = _random_host(spec, None, seed)
    ex = get("cpu").build(spec)
    out = np.full(spec.out_shape, np.nan)
    ex.run(tuple(ops), out)
    return out, _reference(spec, ops), ex


# (spec): 2D keeps the compiles short
CPU_CASES = [
    ActionSpec(dim=2, nq=4, nd=3, batch=37, dtype=F64, qfunc="diffusion"),
    box_spec(MassApplySpec(dim=2, nq=3, nd=3, batch=1, ndofs=1, dtype=F64, qfunc="diffusion",
                           collocated=True), 5),
]


@pytest.mark.parametrize("spec", CPU_CASES, ids=lambda s: s.size_key)
def test_cpu_tuned_diffusion_params_are_correct(tmp_path, monkeypatch, spec):
    from smalltc.backends.cpu import choose as cpu_choose
    params = _cpu_params()
    fam = "action" if spec.op == "action" else "mass_apply"
    mass = ActionSpec(dim=2, nq=4, nd=3, batch=1, dtype=F64) if spec.op == "action" else \
        MassApplySpec(dim=2, nq=3, nd=3, batch=1, ndofs=9, dtype=F64)
    path = _cpu_table(tmp_path, monkeypatch, [(spec.with_batch(1), fam, params)])
    out, ref, ex = _run_cpu(spec)
    assert ex.source == "table-exact" and ex.table == path.name
    assert {k: ex.params[k] for k in params} == params
    assert np.linalg.norm(out - ref) <= TOL[F64] * np.linalg.norm(ref) * 100
    # the same size's mass instance does not take the diffusion entry
    assert cpu_choose(mass).source == "heuristic"


def test_cpu_a_mass_entry_is_not_used_for_diffusion(tmp_path, monkeypatch):
    from smalltc.backends.cpu import choose as cpu_choose
    mass = ActionSpec(dim=3, nq=6, nd=5, batch=1, dtype=F64)
    _cpu_table(tmp_path, monkeypatch, [(mass, "action", _cpu_params())])
    assert cpu_choose(mass).source == "table-exact"
    for s in (ActionSpec(dim=3, nq=6, nd=5, batch=1, dtype=F64, qfunc="diffusion"),
              ActionSpec(dim=3, nq=5, nd=5, batch=1, dtype=F64, qfunc="diffusion",
                         collocated=True)):
        assert cpu_choose(s).source == "heuristic"


def test_cpu_device_checks_the_fused_operator(tmp_path):
    """The CPU tuner's device on a fused diffusion size: the check problem on a box mesh
    and the whole timed vector against the float64 reference."""
    from smalltc.tuning.cpu import CpuDevice
    from smalltc.tuning.measure import sized
    spec = sized(MassApplySpec(dim=2, nq=3, nd=3, batch=1, ndofs=9, dtype=F64,
                               qfunc="diffusion", collocated=True), 4 * 2 ** 20)
    dev = CpuDevice(F64, repeats=3, footprint=4 * 2 ** 20)
    problem = dev.prepare(spec)
    built = dev.build(spec, None)
    assert dev.verify(problem, built) < TOL[F64]
    assert dev.verify_big(problem, built) < TOL[F64]
    assert len(dev.time(problem, built, "double")) == 3


def test_info_counts_entries_by_instance(tmp_path, monkeypatch, capsys):
    from smalltc.info import run
    s = ActionSpec(dim=3, nq=5, nd=5, batch=1, dtype=F64, qfunc="diffusion", collocated=True)
    path = _cpu_table(tmp_path, monkeypatch, [
        (s, "action", _cpu_params()), (ActionSpec(dim=3, nq=6, nd=5, batch=1, dtype=F64),
                                       "action", _cpu_params())])
    tables._load_table.cache_clear()
    run(type("A", (), {"json": False})())
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if path.name in ln)
    assert "action 1" in line and "diffusion/action+co 1" in line


# ----------------------------------------------------------------------------
# the GPU (skipped without one)

@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device")
@pytest.mark.parametrize("qmode", ["global", "regs", "smem"])
def test_gpu_tuned_diffusion_params_are_correct(tmp_path, monkeypatch, qmode):
    import cupy as cp
    from smalltc.backends import get
    from smalltc.backends.cuda.runtime import current_device
    from smalltc.tuning.measure import _random_host, _reference
    _, dev = current_device()
    spec = ActionSpec(dim=3, nq=5, nd=4, batch=301, dtype=F64, qfunc="diffusion")
    params = dict(DIFF_P, qmode=qmode)
    t = _gpu_table([(spec.with_batch(1), "action", params)])
    t["arch"], t["device"] = f"sm{dev['cc']}", dict(dev)
    (tmp_path / f"sm{dev['cc']}-float64.json").write_text(json.dumps(t))
    monkeypatch.setenv("SMALLTC_TUNING_TABLES", str(tmp_path))
    monkeypatch.delenv("SMALLTC_TUNING", raising=False)
    ex = get("cuda").build(spec)
    assert ex.source == "table-exact" and ex.params["qmode"] == qmode
    ops = _random_host(spec, None, 5)
    out = cp.full(spec.out_shape, cp.nan)
    ex.run(tuple(cp.asarray(a) for a in ops), out)
    ref = _reference(spec, ops)
    assert np.linalg.norm(cp.asnumpy(out) - ref) <= 1e-12 * np.linalg.norm(ref)


def test_sizes_force_forms():
    """The corner force's instances: DIM components, NQ 2p, no assembly and no flags."""
    from tuning.sizes import parse
    specs = parse("action", ["3:1-2:2p:force", "2:3:2p:force_t"], "float64")
    assert [s.size_key for s in specs] == ["force/action/3d/nd2nq2c3",
                                           "force/action/3d/nd3nq4c3",
                                           "force_t/action/2d/nd4nq6c2"]
    assert all(s.comp_axis and s.ncomp == s.dim for s in specs)
    for bad in (("assembly", "3:2:2p:force"), ("action", "3:2:2p:force+co")):
        with pytest.raises(ValueError, match="corner force"):
            parse(bad[0], [bad[1]], "float64")


def test_force_space_names_every_parameter():
    """Every candidate of the force family's space carries all its parameters (a table
    entry must, to be loaded)."""
    from smalltc.backends.cuda.force import FORCE
    from tuning.sizes import parse
    (spec,) = parse("action", ["3:2:2p:force"], "float64")
    for params, _ in FORCE.space(spec):
        assert set(params) == set(FORCE.params)
