"""The search driver with a mock device and a mock clock (no GPU): checkpoint and resume,
budget stops, wrong and spilling variants never win, the heuristic kept when not beaten."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from smalltc.spec import ActionSpec, AssemblySpec, GemmSpec
from smalltc.tuning.compile import compile_none
from smalltc.tuning.measure import DryRunDevice, forms, sized
from smalltc.tuning.search import Search, load_checkpoint
from smalltc.backends.cuda import family_of
from smalltc.tuning.space import generate


def size_key(spec):
    return spec.size_key

F64 = "float64"
SPECS = [sized(s) for s in (GemmSpec(batch=1, m=4, n=4, k=4, dtype=F64),
                            GemmSpec(batch=1, m=6, n=6, k=6, dtype=F64),
                            AssemblySpec(dim=3, nq=4, nd=3, batch=1, dtype=F64),
                            ActionSpec(dim=2, nq=5, nd=4, batch=1, dtype=F64))]


class Clock:
    """Mock time: advances only when the mock device "runs" something."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class MockDevice(DryRunDevice):
    """Dry-run device that counts calls, advances a mock clock, and can be made wrong."""

    def __init__(self, clock=None, wrong=(), wrong_big=(), flat=False):
        super().__init__(F64)
        self.clock, self.wrong, self.wrong_big, self.flat = clock, set(wrong), set(wrong_big), flat
        self.timed = []

    @staticmethod
    def _label(ex):
        return tuple(sorted((k, ex.params[k]) for k in family_of(ex.spec).params
                             if k in ex.params))

    def verify(self, problem, ex):
        return 1.0 if self._label(ex) in self.wrong else 0.0

    def verify_big(self, problem, ex):
        return float("nan") if self._label(ex) in self.wrong_big else 0.0

    def time(self, problem, ex, form="separate"):
        self.timed.append(self._label(ex))
        if self.clock is not None:
            self.clock.t += 1.0
        if self.flat:
            return [1000] * self.repeats
        return super().time(problem, ex, form)


def _search(dev, specs=SPECS, **kw):
    kw.setdefault("compiler", "none")
    return Search("mixed", F64, specs, dev, jobs=kw.pop("jobs", 1), progress=False,
                  log=lambda m: None, **kw)


def _winners(results):
    return {k: (r["winner"]["params"], r["winner"]["time_s"],
                (r["runner_up"] or {}).get("params")) for k, r in results.items()}


def test_full_run_records_everything():
    s = _search(MockDevice())
    assert s.run() == "done"
    assert list(s.results) == [r for r in s.state["sizes"]]
    for key, r in s.results.items():
        sp = r["space"]
        assert sp["generated"] == sp["candidates"] + sum(
            v for k, v in sp["pruned"].items() if k in ("invalid", "threads", "tile",
                                                        "resident", "duplicate"))
        assert sp["compiled"] == sp["candidates"] and sp["timed"] == sp["candidates"]
        assert sum(sp["pruned"].values()) + sp["timed"] == sp["generated"]
        # the fastest candidate not excluded (slower than the heuristic in some form)
        ok = [c for c in r["candidates"] if c["status"] == "ok" and not c.get("excluded")]
        assert r["winner"]["time_s"] <= min(c["time_s"] for c in ok) * 1.0000001 or \
            r["kept_heuristic"]
        assert r["heuristic"]["status"] == "ok"
        assert r["speedup_vs_heuristic"] >= 1.0
        assert 0 < r["fraction_of_pmax"] <= 1


def test_checkpoint_and_resume_give_the_same_result(tmp_path):
    whole = _search(MockDevice())
    assert whole.run() == "done"
    ck = tmp_path / "ck.json"
    clock = Clock()
    # each timed call costs 1 mock second; stop in the middle of the 3rd size
    n_first_two = sum(len(generate(s).candidates) + 1 + 4 * 3 * len(forms(s)) for s in SPECS[:2])
    dev1 = MockDevice(clock)
    first = _search(dev1, checkpoint=str(ck), budget_s=n_first_two + 5, clock=clock)
    assert first.run() == "budget"
    state = load_checkpoint(ck)
    assert len(state["results"]) == 2 and state["runs"][-1]["status"] == "budget"
    half = state["partial"][state["sizes"][2]]
    assert half["timed"], "the half-done size keeps what it timed"
    done_before = set(half["timed"])
    dev2 = MockDevice(clock)
    second = _search(dev2, checkpoint=str(ck), resume=True, clock=clock)
    assert second.run() == "done"
    assert _winners(second.results) == _winners(whole.results)
    # what the first run timed is not timed again: the second run times the rest of the
    # 3rd size, all of the 4th, and the confirmation rounds (3 best + heuristic, 3 rounds,
    # in the two forms: the timed batch and twice it)
    rest3 = len(generate(SPECS[2]).candidates) - len(done_before) + (half["heuristic"] is None)
    all4 = len(generate(SPECS[3]).candidates) + 1
    assert len(dev2.timed) == rest3 + all4 + 2 * (3 + 1) * 3 * 2
    state = load_checkpoint(ck)
    assert state["partial"] == {} and len(state["runs"]) == 2
    assert [r["status"] for r in state["runs"]] == ["budget", "done"]


def test_resume_of_a_finished_search_times_nothing(tmp_path):
    ck = tmp_path / "ck.json"
    assert _search(MockDevice(), checkpoint=str(ck)).run() == "done"
    dev = MockDevice()
    s = _search(dev, checkpoint=str(ck), resume=True)
    assert s.run() == "done" and dev.timed == []


def test_resume_refuses_another_search(tmp_path):
    ck = tmp_path / "ck.json"
    _search(MockDevice(), specs=SPECS[:1], checkpoint=str(ck)).run()
    with pytest.raises(ValueError, match="dtype"):
        Search("mixed", "float32", SPECS[:1], MockDevice(), checkpoint=str(ck), resume=True)
    other = MockDevice()
    other.cc = "80"
    with pytest.raises(ValueError, match="sm_80"):
        Search("mixed", F64, SPECS[:1], other, checkpoint=str(ck), resume=True)

    class OtherGpu(MockDevice):
        def info(self):
            return dict(super().info(), name="NVIDIA H200")
    with pytest.raises(ValueError, match="do not compare"):
        Search("mixed", F64, SPECS[:1], OtherGpu(), checkpoint=str(ck), resume=True)


def test_budget_zero_stops_before_anything(tmp_path):
    ck = tmp_path / "ck.json"
    clock = Clock()
    s = _search(MockDevice(clock), checkpoint=str(ck), budget_s=0, clock=clock)
    assert s.run() == "budget" and s.results == {}
    assert json.loads(ck.read_text())["runs"][0]["status"] == "budget"


def _model_order(spec):
    dev = DryRunDevice(F64)
    sp = generate(spec)
    return sorted(sp.candidates, key=lambda c: dev.model_seconds(spec, c.params))


def test_a_wrong_candidate_never_wins():
    spec = SPECS[0]
    fastest = _model_order(spec)[:2]
    wrong = {tuple(sorted(c.params.items())) for c in fastest}
    s = _search(MockDevice(wrong=wrong), specs=[spec])
    s.run()
    r = next(iter(s.results.values()))
    assert r["winner"]["params"] not in [c.params for c in fastest]
    statuses = {c["label"]: c["status"] for c in r["candidates"]}
    assert all(statuses[c.label] == "wrong" for c in fastest)
    assert r["space"]["wrong"] == 2
    assert sum(r["space"]["pruned"].values()) + r["space"]["timed"] == r["space"]["generated"]
    assert all("time_s" not in c for c in r["candidates"] if c["status"] == "wrong")


def test_wrong_at_full_size_never_wins():
    spec = SPECS[2]                 # one timing form less to be excluded by than a GEMM
    fastest = _model_order(spec)[0]
    s = _search(MockDevice(wrong_big={tuple(sorted(fastest.params.items()))}), specs=[spec])
    s.run()
    r = next(iter(s.results.values()))
    assert r["winner"]["params"] != fastest.params
    assert r["space"]["wrong"] == 1


def compile_spilling(spec, params, arch=None, smem_optin=None):
    """Mock compiler: every variant with per_block > 8 spills past 256 B; the rest use 64 B."""
    return dict(ok=True, registers=64, local_bytes=320 if params["per_block"] > 8 else 64)


def test_spilling_candidates_are_never_timed():
    spec = SPECS[2]                                   # assembly: per_block 1..512
    dev = MockDevice()
    s = _search(dev, specs=[spec], compiler=compile_spilling)
    s.run()
    r = next(iter(s.results.values()))
    n_spill = sum(1 for c in generate(spec).candidates if c.params["per_block"] > 8)
    assert r["space"]["pruned"]["spills"] == n_spill > 0
    sp = r["space"]
    assert sum(sp["pruned"].values()) + sp["timed"] == sp["generated"]
    assert sp["compiled"] == sp["candidates"] == n_spill + sp["timed"]
    timed_pb = {dict(lab)["per_block"] for lab in dev.timed}
    # only the heuristic's own kernel may be timed with per_block > 8 (it is the baseline)
    heur = r["heuristic"]["params"]["per_block"]
    assert timed_pb - {heur} <= set(range(1, 9))


def compile_failing(spec, params, arch=None, smem_optin=None):
    """Fails exactly one variant: per_block 2 with the flat, unpadded final stage."""
    if params["per_block"] == 2 and not params.get("rows") and not params.get("pad"):
        return dict(ok=False, error="nvrtc: boom")
    return compile_none(spec, params)


def test_failed_compiles_are_counted():
    s = _search(MockDevice(), specs=[SPECS[2]], compiler=compile_failing)
    s.run()
    r = next(iter(s.results.values()))
    assert r["space"]["failed"] == 1 and r["space"]["compiled"] == r["space"]["candidates"] - 1
    assert sum(r["space"]["pruned"].values()) + r["space"]["timed"] == r["space"]["generated"]


def test_heuristic_kept_when_nothing_beats_it():
    s = _search(MockDevice(flat=True), specs=[SPECS[0]])
    s.run()
    r = next(iter(s.results.values()))
    assert r["winner"]["params"] == r["heuristic"]["params"]
    assert r["speedup_vs_heuristic"] == 1.0


def test_process_pool_compile():
    s = _search(MockDevice(), specs=[SPECS[2]], jobs=2)
    assert s.run() == "done"
    r = next(iter(s.results.values()))
    assert r["space"]["compiled"] == r["space"]["candidates"]


def compile_crashing(spec, params, arch=None, smem_optin=None):
    """A compiler process that dies (as ptxas once did, a segfault) on one variant."""
    import os
    if params.get("per_block") == 2:
        os._exit(139)
    return compile_none(spec, params, arch, smem_optin)


_CRASH_SCENARIO = """
import json, sys
sys.path.insert(0, {tests!r})
import test_tuning_search as T
logs = []
s = T.Search("mixed", T.F64, [T.SPECS[2], T.SPECS[3]], T.MockDevice(),
             compiler=T.compile_crashing, jobs=2, progress=False, log=logs.append)
status = s.run()
print(json.dumps(dict(status=status, logs=logs, results={{
    k: dict(per_block=r["winner"]["params"]["per_block"], failed=r["space"]["failed"])
    for k, r in s.results.items()}})))
"""


def test_a_compile_process_that_dies_fails_its_variants_not_the_search():
    """The search runs in a process of its own (as ``smalltc tune`` does): the scenario is
    a compile process dying under it, and whatever that does to its parent shows here as
    the process's exit status and error output. (Run inside a pytest-xdist worker that had
    run other tests, the worker itself was lost now and then, with no trace of why.)"""
    res = subprocess.run([sys.executable, "-c",
                          _CRASH_SCENARIO.format(tests=str(Path(__file__).parent))],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"the search's process exited with {res.returncode}: " \
                                f"{res.stderr[-3000:]}"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["status"] == "done" and len(out["results"]) == 2   # the next size got a new pool
    assert any("a compile process died" in m for m in out["logs"])
    assert all(r["per_block"] != 2 for r in out["results"].values())
    assert out["results"][size_key(SPECS[2])]["failed"] >= 1


def test_sizes_without_a_specialised_kernel_are_skipped():
    big = GemmSpec(batch=100_000, m=200, n=200, k=200, dtype=F64)   # generic kernel only
    dev = MockDevice()
    s = _search(dev, specs=[big, SPECS[0]])
    assert s.run() == "done"
    r = s.results["gemm/nn/m200n200k200"]
    assert r["winner"] is None and r["family"] is None
    n = len(generate(SPECS[0]).candidates)
    assert len(dev.timed) == n + 1 + (min(3, n) + 1) * 3 * len(forms(SPECS[0]))  # only 4x4x4 timed
    assert s.results["gemm/nn/m4n4k4"]["winner"] is not None


# ---------------------------------------------------------------- timing forms (GEMM beta != 0)
BETA = sized(GemmSpec(batch=1, m=4, n=4, k=4, dtype=F64, beta_zero=False))


class InplaceDevice(DryRunDevice):
    """Dry run in which every non-heuristic candidate is 20% slower than the heuristic when
    timed in place (out=C), whatever it does with C apart."""

    def __init__(self, slow_inplace=True):
        super().__init__(F64)
        self.slow_inplace, self.forms_seen = slow_inplace, set()

    def time(self, problem, ex, form="separate"):
        self.forms_seen.add(form)
        ts = super().time(problem, ex, form="separate")
        if form == "inplace" and self.slow_inplace and ex.source != "heuristic":
            h = super().time(problem, self.build(problem.spec, None), form="separate")
            return [int(t * 1.2) for t in h]
        return ts


def test_winner_never_slower_than_heuristic_in_place():
    dev = InplaceDevice()
    s = _search(dev, specs=[BETA])
    assert s.run() == "done"
    assert dev.forms_seen == set(forms(BETA)) == {"separate", "double", "small", "inplace"}
    r = s.results[size_key(BETA)]
    # every candidate lost in place: the heuristic is the entry, and that is recorded
    assert r["kept_heuristic"] and r["winner"]["params"] == r["heuristic"]["params"]
    assert any(c.get("excluded", "").endswith("inplace") for c in r["candidates"])
    w, h = r["winner"]["form_times_s"], r["heuristic"]["form_times_s"]
    assert set(w) == set(forms(BETA)) and w["inplace"] <= h["inplace"] * 1.01


def test_beta_zero_not_timed_in_place():
    dev = InplaceDevice()
    s = _search(dev, specs=[SPECS[0]])
    s.run()
    assert dev.forms_seen == {"separate", "double", "small"}        # 100,000 of 700,000
    w = s.results[size_key(SPECS[0])]["winner"]["form_times_s"]
    assert set(w) == {"separate", "double", "small"}


def test_reconfirm_redecides_from_the_checkpoint(tmp_path):
    ck = str(tmp_path / "ck.json")
    fast = InplaceDevice(slow_inplace=False)        # first pass: the candidates win in place
    s = _search(fast, specs=[BETA, SPECS[0]], checkpoint=ck)
    assert s.run() == "done"
    key = size_key(BETA)
    before = s.results[key]
    assert not before["kept_heuristic"]
    beta0 = json.dumps(s.results[size_key(SPECS[0])], sort_keys=True)
    # a record from before the in-place form: its winner lacks that form's time
    del s.results[key]["winner"]["form_times_s"]["inplace"]
    s.save()
    slow = InplaceDevice()                          # now they lose in place
    s2 = _search(slow, specs=[BETA, SPECS[0]], checkpoint=ck, resume=True)
    assert s2.reconfirm() == "done"
    after = s2.results[key]
    assert after["reconfirmed"] and after["kept_heuristic"]
    assert after["before_reconfirm"]["winner"] == _label_of(before["winner"]["params"])
    assert after["space"]["generated"] == before["space"]["generated"]
    # sizes timed in every form are left alone, and a second pass skips done sizes
    assert json.dumps(s2.results[size_key(SPECS[0])], sort_keys=True) == beta0
    slow.forms_seen.clear()
    s3 = _search(slow, specs=[BETA, SPECS[0]], checkpoint=ck, resume=True)
    assert s3.reconfirm() == "done" and not slow.forms_seen
    # a form added after a re-decision: the size is re-decided again, not skipped
    del s3.results[key]["winner"]["form_times_s"]["double"]
    assert s3.reconfirm() == "done" and "double" in slow.forms_seen
    assert "double" in s3.results[key]["winner"]["form_times_s"]


def _label_of(params):
    return " ".join(f"{k}={v}" for k, v in params.items())
