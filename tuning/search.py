"""The search: compile every variant, time the survivors, keep the best (notes/tuning.md section 1).

For each size, in order:

1. generate the space (:mod:`.space`), pruned before compiling;
2. compile the variants in parallel (a process pool over the host's cores),
   drop those that spill or cannot launch (:func:`.space.prune_compiled`);
3. build each survivor as the runtime would, verify it on a check problem
   against the float64 reference (a wrong variant is never timed), time it
   (warm-up, median of >= 20 CUDA-event timings on >= 256 MB);
4. time the heuristic's own kernel the same way;
5. re-time the best few and the heuristic, interleaved (the median of all
   their timings decides), verify the winner again on the full-size output;
6. record winner, runner-up, heuristic, the bound and the counts, and write
   the checkpoint.

The checkpoint (JSON) is written after every size and every few candidates,
and when the time budget runs out; ``resume=True`` picks up where it stopped
(done sizes are skipped, compiled and timed candidates of a half-done size
kept). A search is thereby split into runs of under 10 minutes each.
"""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from smalltc.backends.cuda import family_of

from .compile import COMPILERS
from .measure import TOL, now_iso
from .measure import forms as gpu_forms
from .space import MAX_LOCAL_BYTES, generate, prune_compiled

__all__ = ["Search", "OutOfBudget", "CHECKPOINT_KIND", "load_checkpoint"]

CHECKPOINT_KIND = "smalltc-tune-checkpoint"
_SAVE_EVERY = 25           # timed candidates between checkpoint writes


class OutOfBudget(Exception):
    """The time budget ran out; the state is in the checkpoint."""


def _log(msg):
    print(msg, file=sys.stderr, flush=True)


class _Bar:
    """tqdm when installed; else a line at 0, 25, 50, 75 and 100 percent."""

    def __init__(self, total, desc, enabled=True, log=_log):
        self._bar, self.n, self.total, self.desc, self.log = None, 0, total, desc, log
        self.enabled = enabled and total > 0
        self._shown = -1
        if self.enabled:
            try:         # here: a bar only when asked for, and none without tqdm
                from tqdm.auto import tqdm
                self._bar = tqdm(total=total, desc=desc, leave=False, file=sys.stderr)
            except ImportError:
                self._show()

    def _show(self):
        q = 4 * self.n // self.total
        if q != self._shown:
            self._shown = q
            self.log(f"  {self.desc}: {self.n}/{self.total}")

    def update(self, k=1):
        self.n += k
        if self._bar is not None:
            self._bar.update(k)
        elif self.enabled:
            self._show()

    def close(self):
        if self._bar is not None:
            self._bar.close()


def load_checkpoint(path):
    with open(path, encoding="utf-8") as f:
        state = json.load(f)
    if state.get("kind") != CHECKPOINT_KIND:
        raise ValueError(f"{path} is not a smalltc tuning checkpoint")
    return state


def _save_json(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def _spec_dict(spec):
    return spec.as_dict()


class Search:
    """Tune ``specs`` (already sized) on ``device``; see the module docstring.

    Parameters
    ----------
    op, dtype : what is tuned (recorded in the checkpoint)
    specs : list of specs with their timed batch counts
    device : :class:`.measure.GpuDevice`, :class:`.measure.DryRunDevice` or a stand-in
    compiler : "cuda", "nvcc", "none", or a picklable function ``(spec, params, arch,
        smem_optin) -> dict``
    jobs : worker processes for compiling (<= 1: in this process)
    budget_s : stop cleanly after this many seconds (None: no limit)
    checkpoint : path of the checkpoint JSON (None: none)
    resume : continue from ``checkpoint`` when it exists
    confirm_top, confirm_rounds : re-timing of the best few
    max_local_bytes : variants with more local memory per thread are not timed
    clock : a ``time.monotonic`` stand-in (tests)
    """

    def __init__(self, op, dtype, specs, device, *, compiler="cuda", jobs=None, budget_s=None,
                 checkpoint=None, resume=False, confirm_top=3, confirm_rounds=3,
                 progress=True, clock=time.monotonic, log=_log,
                 max_local_bytes=MAX_LOCAL_BYTES):
        self.op, self.dtype, self.specs, self.device = op, dtype, list(specs), device
        self.compile_fn = COMPILERS[compiler] if isinstance(compiler, str) else compiler
        self.jobs = os.cpu_count() if jobs is None else jobs
        self.budget_s, self.checkpoint, self.clock = budget_s, checkpoint, clock
        self.confirm_top, self.confirm_rounds = confirm_top, confirm_rounds
        self.progress, self.log = progress, log
        self.max_local_bytes = max_local_bytes
        self.info = device.info()
        self.arch = f"sm_{self.info['cc']}"
        # the device's backend (CUDA by default; the CPU device brings the CPU's)
        self.family_of = getattr(device, "family_of", family_of)
        self.forms = getattr(device, "forms", gpu_forms)
        self._pool = None
        self._t0 = None
        self.state = self._fresh_state()
        if resume and checkpoint and os.path.exists(checkpoint):
            self._resume(load_checkpoint(checkpoint))

    # -- state ---------------------------------------------------------------
    def _fresh_state(self):
        return dict(kind=CHECKPOINT_KIND, schema=1, op=self.op, dtype=self.dtype,
                    device=self.info, dry_run=bool(getattr(self.device, "dry_run", False)),
                    sizes=[s.size_key for s in self.specs], results={}, partial={},
                    runs=[])

    def _resume(self, old):
        for field, want in (("op", self.op), ("dtype", self.dtype)):
            if old.get(field) != want:
                raise ValueError(f"checkpoint {self.checkpoint} is for {field}="
                                 f"{old.get(field)!r}, this search for {want!r}")
        if bool(old.get("dry_run")) != self.state["dry_run"]:
            raise ValueError(f"checkpoint {self.checkpoint} is from a "
                             f"{'dry run' if old.get('dry_run') else 'GPU run'}; this search "
                             f"is {'a dry run' if self.state['dry_run'] else 'on a GPU'}")
        if old["device"].get("name") != self.info["name"] and old["device"].get("cc") == \
                self.info["cc"]:
            raise ValueError(f"checkpoint {self.checkpoint} was written on "
                             f"{old['device'].get('name')}, this device is {self.info['name']}: "
                             f"times of two devices do not compare (start over in another "
                             f"--work folder)")
        if old["device"].get("arch") != self.info.get("arch"):     # CPU: the ISA
            raise ValueError(f"checkpoint {self.checkpoint} was written for "
                             f"{old['device'].get('arch')}, this device is "
                             f"{self.info.get('arch')}")
        if old["device"].get("cc") != self.info["cc"]:
            raise ValueError(f"checkpoint {self.checkpoint} was written on sm_"
                             f"{old['device'].get('cc')}, this device is {self.arch}")
        self.state["results"] = old.get("results", {})
        self.state["partial"] = old.get("partial", {})
        self.state["runs"] = old.get("runs", [])

    def save(self):
        if self.checkpoint:
            _save_json(self.checkpoint, self.state)

    @property
    def results(self):
        return self.state["results"]

    def _elapsed(self):
        return self.clock() - self._t0

    def _check_budget(self):
        if self.budget_s is not None and self._elapsed() >= self.budget_s:
            raise OutOfBudget

    # -- the run ---------------------------------------------------------------
    def run(self) -> str:
        """Tune every size not done yet. Returns "done" or "budget" (state saved either way)."""
        todo = [(spec, spec.size_key) for spec in self.specs]
        return self._sweep(((s, k) for s, k in todo if k not in self.results), self._tune_size,
                           lambda: f"{len(self.results)} of {len(self.specs)} sizes done "
                                   f"(run again with --resume)")

    def reconfirm(self, keep=None) -> str:
        """Re-decide finished sizes from their recorded first-pass timings.

        For each finished size that ``keep(spec, result)`` accepts (default: the sizes
        whose winner was not timed in every form of :func:`.measure.forms`: results that
        predate a form, including ones re-decided before a form was added), the best few
        candidates and the heuristic are re-timed in every form and the winner chosen
        again as :meth:`run` chooses it now (never one slower than the heuristic in some
        form); nothing is recompiled and the rest of the space is not re-timed. Budget
        and checkpoint as for :meth:`run`; a resumed reconfirm skips the sizes it has done
        (they now hold every form). Returns "done" or "budget".
        """
        keep = keep or (lambda spec, result: not set(self.forms(spec)) <= set(
            (result["winner"].get("form_times_s") or {})))

        def todo():
            for spec in self.specs:
                key = spec.size_key
                old = self.results.get(key)
                if old and old.get("winner") and keep(spec, old):
                    yield spec, key
        return self._sweep(todo(), lambda spec, key: self._reconfirm_size(
            spec, key, self.results[key]), lambda: "run again with --reconfirm",
            reconfirm=True)

    def _sweep(self, todo, do_one, hint, **run_fields):
        """``do_one(spec, key)`` for each of ``todo`` within the budget, saving after each;
        the run is recorded in the checkpoint's ``runs``."""
        self._t0 = self.clock()
        run = dict(started=now_iso(), seconds=0.0, sizes_done=[], **run_fields)
        self.state["runs"].append(run)
        status = "done"
        try:
            for spec, key in todo:
                self._check_budget()
                do_one(spec, key)
                run["sizes_done"].append(key)
                run["seconds"] = round(self._elapsed(), 3)
                self.save()
        except OutOfBudget:
            status = "budget"
            self.log(f"budget of {self.budget_s} s reached after {self._elapsed():.0f} s; "
                     f"{hint()}")
        finally:
            run["seconds"] = round(self._elapsed(), 3)
            run["status"] = status
            self.save()
            if self._pool is not None:
                self._pool.shutdown(wait=status == "done", cancel_futures=True)
                self._pool = None
        return status

    def _reconfirm_size(self, spec, key, old):
        def first_pass(r):
            r = {k: v for k, v in r.items() if k not in ("excluded", "form_times_s")}
            if "first_time_s" in r:
                r["time_s"] = r.pop("first_time_s")
            return r
        timed = {r["label"]: first_pass(r) for r in old["candidates"]}
        heur = first_pass(old["heuristic"])
        pruned = Counter(old["space"].get("pruned", {}))
        for r in timed.values():            # _decide counts these again
            if r["status"] != "ok":
                pruned[r["status"]] -= 1
        pruned = +pruned
        space = generate(spec, self.info, self.family_of)
        part = dict(timed=timed, heuristic=heur, compiled=defaultdict(dict))
        problem = self.device.prepare(spec)
        try:
            result = self._decide(spec, key, space, {}, part, problem, pruned)
        finally:
            self.device.release(problem)
        # the space was not compiled again: its counts are the first pass's, plus any
        # candidate found wrong at full size now
        result["space"] = dict(old["space"], pruned=result["space"]["pruned"],
                               wrong=result["space"]["wrong"])
        for k in ("compile_s", "measure_s", "seconds"):
            if k in old:
                result[k] = old[k]
        result["reconfirmed"] = now_iso()
        result["before_reconfirm"] = dict(winner=_label(old["winner"]["params"]),
                                          time_s=old["winner"]["time_s"],
                                          kept_heuristic=old.get("kept_heuristic", False))
        self.results[key] = result
        w, h = result["winner"], result["heuristic"]
        ft, fh = w.get("form_times_s") or {}, h.get("form_times_s") or {}
        vs = ", ".join(f"{f} {fh[f] / ft[f]:.3f}x" for f in ft if f in fh and ft[f])
        was = result["before_reconfirm"]["winner"]
        self.log(f"{key}: {'kept ' if was == w['label'] else f'{was} -> '}{w['label']}"
                 f"{' (the heuristic)' if result['kept_heuristic'] else ''}; vs heuristic: {vs}")

    def _partial(self, key):
        return self.state["partial"].setdefault(
            key, dict(compiled={}, timed={}, heuristic=None, seconds=0.0))

    def _tune_size(self, spec, key):
        t_start = self.clock()
        part = self._partial(key)
        try:
            self._tune_size_inner(spec, key, part)
        finally:
            part["seconds"] = round(part["seconds"] + self.clock() - t_start, 3)
            if key in self.results:
                self.results[key]["seconds"] = part["seconds"]
                del self.state["partial"][key]

    def _tune_size_inner(self, spec, key, part):
        space = generate(spec, self.info, self.family_of)
        if space.family is None or not space.candidates:
            self.log(f"{key}: only the generic kernel runs this size; nothing to tune")
            self.results[key] = dict(key=key, spec=_spec_dict(spec), family=None,
                                     space=dict(generated=0), winner=None)
            return
        by_label = {c.label: c for c in space.candidates}
        # 2. compile (in parallel), prune by resources
        todo = [c for c in space.candidates if c.label not in part["compiled"]]
        t0 = self.clock()
        try:
            self._compile(spec, key, todo, part)
        finally:
            part["compile_s"] = round(part.get("compile_s", 0.0) + self.clock() - t0, 3)
        pruned = Counter(space.pruned)
        survivors = []
        for c in space.candidates:
            res = part["compiled"][c.label]
            why = "failed" if not res.get("ok") else prune_compiled(
                res, c.ctx.get("threads", 1), self.max_local_bytes)
            if why:
                pruned[why] += 1
            else:
                survivors.append(c)
        # 3./4. build, verify, time
        problem = self.device.prepare(spec)
        try:
            t0 = self.clock()
            try:
                self._time_all(spec, key, survivors, part, problem)
            finally:
                part["measure_s"] = round(part.get("measure_s", 0.0) + self.clock() - t0, 3)
            result = self._decide(spec, key, space, by_label, part, problem, pruned)
            result["compile_s"], result["measure_s"] = part["compile_s"], part["measure_s"]
        finally:
            self.device.release(problem)
        self.results[key] = result
        w = result["winner"]
        if w:
            sp_h = result["speedup_vs_heuristic"]
            self.log(f"{key}: {w['label']} {w['time_s'] * 1e3:.4f} ms "
                     f"({100 * result['fraction_of_pmax']:.1f}% of Pmax, "
                     + (f"{sp_h:.3f}x the heuristic" if sp_h else "the heuristic failed")
                     + f"; compile {part['compile_s']:.0f} s, measure {part['measure_s']:.0f} s)")

    def _compile(self, spec, key, todo, part):
        if not todo:
            return
        bar = _Bar(len(todo), f"compile {key}", self.progress, self.log)
        args = (self.arch, self.info["smem_optin"])
        try:
            if self.jobs <= 1:
                for c in todo:
                    self._check_budget()
                    part["compiled"][c.label] = self.compile_fn(spec, c.params, *args)
                    bar.update()
                return
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"))
            futs = {self._pool.submit(self.compile_fn, spec, c.params, *args): c for c in todo}
            pending = set(futs)
            broken = 0
            try:
                while pending:
                    done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                    for f in done:
                        try:
                            part["compiled"][futs[f].label] = f.result()
                        except Exception as err:   # a worker that died: a failed compile
                            part["compiled"][futs[f].label] = dict(ok=False, error=repr(err))
                            broken += isinstance(err, BrokenProcessPool)
                        bar.update()
                    self._check_budget()
            finally:
                for f in pending:
                    f.cancel()
                if broken:      # a compiler crashed (a segfault in ptxas): a new pool next time
                    self.log(f"{key}: a compile process died; {broken} variants counted as "
                             "failed compiles, the next size gets a new pool")
                    self._pool.shutdown(wait=False, cancel_futures=True)
                    self._pool = None
        finally:
            bar.close()

    def _measure(self, spec, problem, params):
        """Build, verify, time one variant (``params`` None: the heuristic)."""
        try:
            ex = self.device.build(spec, params)
        except ValueError as err:                 # the family rejects these parameters
            return dict(params=params, kernel={}, status="rejected", error=str(err))
        rec = dict(params=params, kernel={k: ex.params.get(k) for k in (
            "threads", "smem_bytes", "registers", "local_bytes")})
        if params is None:
            rec["params"] = {k: ex.params[k] for k in self.family_of(spec).params
                             if k in ex.params}
        if params is not None and (ex.params.get("local_bytes") or 0) > self.max_local_bytes:
            return dict(rec, status="spills")
        err = self.device.verify(problem, ex)
        rec["rel_err"] = err if math.isfinite(err) else None      # None: NaN/inf in the output
        if not err <= TOL[spec.dtype]:
            return dict(rec, status="wrong")
        times = self.device.time(problem, ex)
        return dict(rec, status="ok", time_s=statistics.median(times) * 1e-9,
                    min_s=min(times) * 1e-9, repeats=len(times))

    def _time_all(self, spec, key, survivors, part, problem):
        todo = [c for c in survivors if c.label not in part["timed"]]
        bar = _Bar(len(todo) + (part["heuristic"] is None), f"time {key}", self.progress,
                   self.log)
        try:
            if part["heuristic"] is None:
                part["heuristic"] = self._measure(spec, problem, None)
                bar.update()
            for n, c in enumerate(todo, 1):
                self._check_budget()
                rec = dict(self._measure(spec, problem, c.params), label=c.label)
                res = part["compiled"].get(c.label, {})
                for k in ("registers", "local_bytes", "spill_stores"):    # from the compiler
                    if rec["kernel"].get(k) is None and res.get(k) is not None:
                        rec["kernel"][k] = res[k]
                part["timed"][c.label] = rec
                bar.update()
                if n % _SAVE_EVERY == 0:
                    self.save()
        finally:
            bar.close()

    def _time_form(self, problem, ex, form):
        if form == "separate":
            return self.device.time(problem, ex)
        return self.device.time(problem, ex, form=form)

    def _confirm(self, spec, problem, entries):
        """Re-time ``entries`` (records with params) interleaved, in every form of
        :func:`.measure.forms`; ``time_s`` is the median over all rounds of the
        separate form, ``form_times_s`` the median of each form."""
        exs = [self.device.build(spec, e["params"] if e.get("label") != "heuristic" else None)
               for e in entries]
        fs = self.forms(spec)
        times = [{f: [] for f in fs} for _ in entries]
        for _ in range(self.confirm_rounds):
            for f in fs:
                for i, ex in enumerate(exs):
                    times[i][f].extend(self._time_form(problem, ex, f))
        for e, t in zip(entries, times):
            e.setdefault("first_time_s", e["time_s"])
            e["time_s"] = statistics.median(t["separate"]) * 1e-9
            e["form_times_s"] = {f: statistics.median(v) * 1e-9 for f, v in t.items()}
            e["repeats"] = e.get("repeats", 0) + sum(len(v) for v in t.values())
        return exs

    def _decide(self, spec, key, space, by_label, part, problem, pruned):
        recs = [dict(r) for r in part["timed"].values()]
        for r in recs:
            if r["status"] != "ok":
                pruned[r["status"]] += 1
        ok = sorted((r for r in recs if r["status"] == "ok"), key=lambda r: r["time_s"])
        heur = dict(part["heuristic"], label="heuristic")
        top = ok[:self.confirm_top]
        confirmed = top + ([heur] if heur.get("status") == "ok" else [])
        winner = runner_up = None
        if confirmed and self.confirm_rounds:
            exs = self._confirm(spec, problem, confirmed)
            order = sorted(range(len(top)), key=lambda i: top[i]["time_s"])
            for rank, i in enumerate(order):
                slower = _slower_forms(top[i], heur)
                if slower:                # never a table entry that loses in some form
                    top[i]["excluded"] = "slower than the heuristic " + ", ".join(slower)
                    continue
                err = self.device.verify_big(problem, exs[i])
                top[i]["rel_err_full"] = err
                if not err <= TOL[spec.dtype]:
                    top[i]["status"] = "wrong"
                    pruned["wrong"] += 1
                    continue
                if winner is None:
                    winner = top[i]
                elif runner_up is None:
                    runner_up = top[i]
        else:
            winner = top[0] if top else None
            runner_up = top[1] if len(top) > 1 else None
        if runner_up is None:     # from the first pass
            runner_up = next((r for r in ok if r is not winner and r not in top), None)
        b = self.device.bound(spec)
        kept_heuristic = False
        if winner is None and heur.get("status") == "ok" and top:   # all lost in some form
            winner, kept_heuristic = dict(heur, label=_label(heur["params"])), True
        elif winner is not None and heur.get("status") == "ok":
            if heur["time_s"] <= winner["time_s"] * 1.01:    # not measurably better: keep it
                kept_heuristic = winner["params"] != heur["params"]
                if kept_heuristic:
                    runner_up, winner = winner, dict(heur, label=_label(heur["params"]))
        speedup = (heur["time_s"] / winner["time_s"]
                   if winner is not None and heur.get("status") == "ok" else None)
        n_ok = len(ok)
        timed = sum(1 for r in recs if r["status"] in ("ok",))
        return dict(
            key=key, spec=_spec_dict(spec), family=space.family.name,
            # generated = sum(pruned) + timed; candidates = compiled + failed;
            # compiled = spills + registers + rejected + wrong + timed
            space=dict(generated=space.generated, candidates=len(space.candidates),
                       pruned=dict(pruned), pruned_before_compile=space.n_pruned,
                       compiled=sum(1 for c in space.candidates
                                    if part["compiled"][c.label].get("ok")),
                       failed=pruned.get("failed", 0), timed=timed, wrong=pruned.get("wrong", 0)),
            candidates=sorted(recs, key=lambda r: (r["status"] != "ok",
                                                   r.get("time_s") or math.inf)),
            heuristic=heur, heuristic_space_label=_label(space.heuristic)
            if space.heuristic else None,
            winner=winner, runner_up=runner_up, kept_heuristic=kept_heuristic,
            speedup_vs_heuristic=speedup,
            bound=dict(tmin=b.tmin, pmax=b.pmax, bytes=b.bytes, flops=b.flops,
                       bandwidth=b.bandwidth, peak=b.peak, limited_by=b.limited_by),
            fraction_of_pmax=(b.tmin / winner["time_s"]) if winner else None,
            n_ok=n_ok)


def _slower_forms(rec, heur, tol=1.01):
    """Forms (other than the separate one, which decides the order) in which ``rec`` is
    slower than the heuristic ``heur`` by more than ``tol``."""
    ft, fh = rec.get("form_times_s") or {}, heur.get("form_times_s") or {}
    return [f for f in ft if f != "separate" and f in fh and ft[f] > fh[f] * tol]


def _label(params):
    return " ".join(f"{k}={v}" for k, v in params.items())

