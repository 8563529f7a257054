#!/usr/bin/env bash
# scripts/device.sh: one call on the lent GPU machine (the device tool's `run`, which copies
# the repository there, runs the command in its root and brings back what is under $OUT).
#
# It installs smalltc (`pip install --no-deps --no-build-isolation -e .`), writes
# `smalltc info` and `nvidia-smi` to info.txt, then runs the steps asked for below, in this
# order, each one optional and time-boxed with `timeout`. Everything goes to one folder,
# /tmp/$NAME, packed into $OUT/$NAME.tgz again after every step (so a run stopped at its
# limit still returns what finished); a short summary (summary.txt) is printed last.
# Fetch: `tar xzf <files_at>/device.tgz` gives device/ (see its summary.txt first).
#
# Parameters (environment variables; an empty one skips its step):
#
#   TESTS    pytest selection, run as `pytest -q -n $JOBS`: "all" (the tests/ folder), a
#            list of paths, a -k expression, or both:
#              TESTS=all    TESTS="tests/test_plan_calls.py tests/test_errors.py"
#              TESTS="-k gemm or tuning"    TESTS="tests/test_operations.py -k cupy"
#            Log: pytest.log; the pass/fail line goes to the summary.
#   BENCH    `smalltc bench` suites, comma separated (gemm,action,assembly,pairwise) or
#            "all". Each suite is one bench process (bench-<suite>-<dtype>.json); the
#            suites of a dtype are then merged (`--merge`) into bench-<dtype>/bench-<dtype>.json,
#            with its table (table.txt, printed) and plots.
#   DTYPES   dtypes of the bench, comma separated (default float64), e.g. float64,float32.
#   BENCH_ARGS  more `smalltc bench` options for every bench process, e.g. "--p 1-4",
#            "--no-baselines --no-plot", "--device cpu --quick" (a smoke test without a GPU).
#   BEFORE   a second source tree inside the repository (path relative to its root), to
#            bench against the current one: it is installed without -e into a separate
#            folder (`pip install --no-deps --no-build-isolation --target /tmp/before`) and
#            benched with the same options from outside the repository
#            (`PYTHONPATH=/tmp/before python3 -m smalltc bench ...`) into
#            before-<dtype>/, suite by suite alternating with the current tree (after,
#            before; then before, after; ...) so both see the same machine state. Then
#            `smalltc bench --compare before after` is written to compare-<dtype>.txt and
#            printed; the summary gives its geometric means and every case below $SLOW
#            (default 0.97). Make the tree here first, ignored by git, and carry it:
#              mkdir .before && git archive COMMIT pyproject.toml README.md smalltc fem \
#                  tuning templates | tar -x -C .before && echo /.before/ >> .git/info/exclude
#            then run with BEFORE=.before and the device tool's carry=[".before"].
#   TUNE     searches, comma separated, each op:dtype:seconds, e.g.
#            "action:float64:300,assembly:float64:120": `smalltc tune --op OP --dtype DT
#            --budget-seconds S --resume --work build/tune --out build/tune/tables`
#            (build/tune/tables starts as a copy of the shipped tables, and its evidence/
#            as a copy of their evidence, benchmarks/tuning/). build/tune comes
#            back as $OUT/tune.tgz. To go on in a later call: `tar xzf <files_at>/tune.tgz`
#            here in the repository root (restores build/tune, which git ignores), and
#            pass carry=["build/tune"] to that call; `--resume` continues from the
#            checkpoints. A finished table is installed by copying it from
#            build/tune/tables/ to tuning/tables/ and its evidence from
#            build/tune/tables/evidence/ to benchmarks/tuning/.
#   TUNE_SIZES  `--sizes` of the searches (default: the tuner's sizes of the op), e.g.
#            "3:1-8:p+1,p+2" to search the 3D action first.
#   TUNE_ARGS   more options of the searches, e.g. "--arch-table" (the architecture's
#            table, sm90-float64.json: the H100's) or "--repeats 30".
#   NCU      cases to profile with Nsight Compute, space separated, each
#            SUITE[:KEY=VALUE...] with the bench's case filters as keys (sizes, p, dim,
#            dtype; default dtype: the first of DTYPES; a KEY alone is a flag),
#            e.g. "gemm:sizes=21 action:p=8:dim=3 assembly:p=1:dim=3:dtype=float32".
#            Each runs `smalltc bench --suite SUITE --KEY VALUE ... --repeats 1
#            --no-baselines --no-plot` under `ncu --clock-control none` with the sections
#            SpeedOfLight, Occupancy, WarpStateStats, SchedulerStats,
#            MemoryWorkloadAnalysis, LaunchStats, profiling one launch of each smalltc
#            kernel ($NCU_KERNEL_ID, default "::regex:^stc_:3": the third launch of each
#            kernel whose name starts with stc_, after the check and a warm-up call).
#            Output: ncu/<entry>.txt. NCU_SECTIONS adds sections (space separated), e.g.
#            "MemoryWorkloadAnalysis_Tables InstructionStats" (shared-memory wavefronts and
#            bank conflicts, the instruction mix).
#   DEMO=1   `smalltc demo` (its output folder: demo/).
#   MPI=1    the MPI tests on the GPU (tests/test_fem_distributed_mpi.py -k "gpu or share":
#            ranks on the device, two ranks sharing one GPU) and
#            `mpiexec -n 2 smalltc demo --mpi --device gpu` (mpi.log, demo-mpi.log).
#   WHEELS   a folder of wheels (inside the repository, carried) installed first with
#            `pip install --no-index --no-deps`, e.g. WHEELS=.whl for mpi4py and the MPICH
#            wheel, which the device image lacks and cannot download.
#
#   Limits: LIMIT (default 570 s) is the time the whole script may take (the device tool
#   stops a command at 600 s); a step gets at most its own limit and never more than what
#   is left: T_INSTALL (180), T_TESTS (300), T_BENCH (240 per bench process), T_TUNE_SLACK
#   (60 s over the search's own budget), T_NCU (120 per entry), T_DEMO (150). A step with
#   less than 20 s left is skipped and the summary says so.
#   Other: JOBS (pytest workers, default 12: the machine has 16 cores), NAME (default
#   device), OUT (set by the device tool; default /tmp/out).
#
# Examples (the device tool's run, command=...):
#   GPU tests, then the bench of all suites in float64 against the tree in .before
#   (carry=[".before"]):
#     TESTS=all BENCH=all DTYPES=float64 BEFORE=.before bash scripts/device.sh
#   A tuning call that goes on from the last one (carry=["build/tune"]):
#     TUNE=action:float64:480 bash scripts/device.sh
#   Profiles of two cases:
#     NCU="gemm:sizes=21 action:p=8:dim=3" bash scripts/device.sh
# Test here without a GPU: `OUT=/tmp/x bash scripts/device.sh` (installs, writes info.txt,
# packs); with `BENCH=gemm BENCH_ARGS="--device cpu --quick --sizes 2,4"` the bench too.
set -u
NAME=${NAME:-device}
OUT=${OUT:-/tmp/out}
W=/tmp/$NAME
LIMIT=${LIMIT:-570}
JOBS=${JOBS:-12}
DTYPES=${DTYPES:-float64}
SLOW=${SLOW:-0.97}
T0=$(date +%s)
export PYTHONUNBUFFERED=1
ROOT=$(pwd)
FAILED=0

rm -rf "$W"
mkdir -p "$W" "$OUT"
: > "$W/summary.txt"

note() {  # a line of the summary (also printed as it happens)
  echo "$*" | tee -a "$W/summary.txt"
}
left() {
  echo $(( LIMIT - ($(date +%s) - T0) ))
}
box() {  # box SECONDS: the timeout of a step: SECONDS, or what is left less 10 s
  local l=$(( $(left) - 10 ))
  echo $(( $1 < l ? $1 : l ))
}
pack() {  # the work folder into $OUT/$NAME.tgz, replaced only once complete
  tar czf "$OUT/$NAME.tgz.part" -C /tmp "$NAME" && mv -f "$OUT/$NAME.tgz.part" "$OUT/$NAME.tgz"
}
pack_tune() {
  [ -d build/tune ] || return 0
  tar czf "$OUT/tune.tgz.part" build/tune && mv -f "$OUT/tune.tgz.part" "$OUT/tune.tgz"
}
finish() {
  trap - EXIT
  note "total: $(( $(date +%s) - T0 )) s; files: $OUT/$NAME.tgz$([ -f "$OUT/tune.tgz" ] && echo " $OUT/tune.tgz")"
  pack
  echo
  echo "=== summary ($NAME) ==="
  cat "$W/summary.txt"
  exit "$FAILED"
}
trap finish EXIT
trap 'note "stopped by a signal"; FAILED=1; exit' INT TERM

# ---- install, info --------------------------------------------------------------------
t=$(box "${T_INSTALL:-180}")
if [ -n "${WHEELS:-}" ]; then
  if ! timeout -k 10 "$t" python3 -m pip install -q --no-index --no-deps "$WHEELS"/*.whl \
      > "$W/install-wheels.log" 2>&1; then
    cat "$W/install-wheels.log"
    note "wheels: install from $WHEELS FAILED (install-wheels.log)"
    FAILED=1
  else
    note "wheels: $(cd "$WHEELS" && ls *.whl | tr '\n' ' ')"
  fi
fi
if ! timeout -k 10 "$t" python3 -m pip install -q --no-deps --no-build-isolation -e . \
    > "$W/install.log" 2>&1; then
  cat "$W/install.log"
  note "install: FAILED (install.log)"
  FAILED=1
  exit
fi
{
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | grep -q . && echo '(with local changes)')"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  python3 -m smalltc info
  echo
  nvidia-smi 2>&1 || true
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv 2>&1 || true
} > "$W/info.txt" 2>&1
note "install: ok; $(grep -m1 '^GPU 0' "$W/info.txt" || echo 'no GPU listed by smalltc info')"
pack

BEFORE_SITE=/tmp/before
BEFORE_CWD=/tmp/before-cwd
if [ -n "${BEFORE:-}" ]; then
  if [ ! -f "$BEFORE/pyproject.toml" ]; then
    note "before: $BEFORE is not a source tree here (carry it?): no before/after bench"
    FAILED=1
    BEFORE=
  else
    rm -rf "$BEFORE_SITE" "$BEFORE_CWD"
    mkdir -p "$BEFORE_CWD"
    t=$(box "${T_INSTALL:-180}")
    if timeout -k 10 "$t" python3 -m pip install -q --no-deps --no-build-isolation \
        --target "$BEFORE_SITE" "$(cd "$BEFORE" && pwd)" > "$W/install-before.log" 2>&1 \
       && (cd "$BEFORE_CWD" && PYTHONPATH="$BEFORE_SITE${PYTHONPATH:+:$PYTHONPATH}" \
           python3 -c "import smalltc; assert smalltc.__file__.startswith('$BEFORE_SITE'), smalltc.__file__; print('before:', smalltc.__file__)") \
          >> "$W/install-before.log" 2>&1; then
      note "before: $BEFORE installed into $BEFORE_SITE"
    else
      tail -n 20 "$W/install-before.log"
      note "before: install FAILED (install-before.log): no before/after bench"
      FAILED=1
      BEFORE=
    fi
  fi
fi

# ---- GPU tests ------------------------------------------------------------------------
if [ -n "${TESTS:-}" ]; then
  case "$TESTS" in
    -k\ *) paths=""; expr=${TESTS#-k };;
    *" -k "*) paths=${TESTS%% -k *}; expr=${TESTS#* -k };;
    *) paths=$TESTS; expr="";;
  esac
  [ -z "$paths" ] || [ "$paths" = all ] && paths=tests
  t=$(box "${T_TESTS:-300}")
  if [ "$t" -lt 20 ]; then
    note "tests: skipped (no time left)"; FAILED=1
  else
    # shellcheck disable=SC2086  # paths is a list
    timeout -k 10 "$t" python3 -m pytest -q -n "$JOBS" -p no:cacheprovider $paths \
      ${expr:+-k "$expr"} > "$W/pytest.log" 2>&1
    rc=$?
    last=$(grep -E "(passed|failed|error|no tests ran)" "$W/pytest.log" | tail -n 1)
    if [ "$rc" -eq 0 ]; then
      note "tests: PASS: $last"
    else
      FAILED=1
      [ "$rc" -eq 124 ] && last="stopped at the ${t} s limit; $last"
      note "tests: FAIL (rc $rc): $last"
      grep -E "^(FAILED|ERROR) " "$W/pytest.log" | head -n 10 | sed 's/^/  /' | tee -a "$W/summary.txt"
    fi
  fi
  pack
fi

# ---- MPI on the GPU -------------------------------------------------------------------
if [ "${MPI:-}" = 1 ]; then
  t=$(box "${T_MPI:-150}")
  if [ "$t" -lt 20 ]; then
    note "mpi: skipped (no time left)"; FAILED=1
  else
    timeout -k 10 "$t" python3 -m pytest -q -rs -p no:cacheprovider \
      tests/test_fem_distributed_mpi.py -k "gpu or share" > "$W/mpi.log" 2>&1
    rc=$?
    last=$(grep -E "(passed|failed|error|no tests ran)" "$W/mpi.log" | tail -n 1)
    [ "$rc" -eq 0 ] && note "mpi tests: PASS: $last" || { note "mpi tests: FAIL (rc $rc): $last"; FAILED=1; }
    t=$(box "${T_DEMO:-150}")
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      timeout -k 10 "$t" mpiexec -n 2 python3 -m smalltc demo --mpi --device gpu \
      --out "$W/demo-mpi" > "$W/demo-mpi.log" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] && note "demo --mpi (2 ranks, one GPU): ok (demo-mpi.log)" \
      || { note "demo --mpi: rc $rc (demo-mpi.log)"; FAILED=1; }
    pack
  fi
fi

# ---- bench (and the BEFORE tree) ------------------------------------------------------
bench_one() {  # bench_one after|before SUITE DTYPE
  local tree=$1 suite=$2 dt=$3 dir t rc
  dir=$W/bench-$dt
  [ "$tree" = before ] && dir=$W/before-$dt
  mkdir -p "$dir"
  t=$(box "${T_BENCH:-240}")
  if [ "$t" -lt 20 ]; then
    note "bench $tree $suite $dt: skipped (no time left)"; FAILED=1
    return
  fi
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
  if [ "$tree" = after ]; then
    timeout -k 10 "$t" python3 -m smalltc bench --no-progress --suite "$suite" --dtype "$dt" \
      ${BENCH_ARGS:-} --out "$dir" > "$dir/$suite.log" 2>&1
  else
    (cd "$BEFORE_CWD" && PYTHONPATH="$BEFORE_SITE${PYTHONPATH:+:$PYTHONPATH}" timeout -k 10 "$t" \
      python3 -m smalltc bench --no-progress --suite "$suite" --dtype "$dt" \
      ${BENCH_ARGS:-} --out "$dir") > "$dir/$suite.log" 2>&1
  fi
  rc=$?
  case $rc in
    0) note "bench $tree $suite $dt: ok";;
    1) note "bench $tree $suite $dt: done; a case or a baseline failed or errored (${dir##*/}/$suite.log)"; FAILED=1;;
    124) note "bench $tree $suite $dt: stopped at the ${t} s limit"; FAILED=1;;
    *) note "bench $tree $suite $dt: FAILED (rc $rc, ${dir##*/}/$suite.log)"; tail -n 5 "$dir/$suite.log"; FAILED=1;;
  esac
  pack
}
merge_runs() {  # merge_runs after|before DTYPE: bench-<dtype>.json from the suites' files
  local tree=$1 dt=$2 dir plot=""
  dir=$W/bench-$dt
  [ "$tree" = before ] && dir=$W/before-$dt
  local runs=("$dir"/bench-*-"$dt".json)
  [ -e "${runs[0]}" ] || return 1
  case " ${BENCH_ARGS:-} " in *" --no-plot "*) plot=--no-plot;; esac
  if [ "$tree" = after ]; then
    python3 -m smalltc bench --merge "${runs[@]}" --out "$dir" $plot > "$dir/table.txt" 2>&1
  else
    (cd "$BEFORE_CWD" && PYTHONPATH="$BEFORE_SITE${PYTHONPATH:+:$PYTHONPATH}" \
      python3 -m smalltc bench --merge "${runs[@]}" --out "$dir" $plot) > "$dir/table.txt" 2>&1
  fi
}
bench_summary() {  # per suite: cases, median and lowest % of the bound
  python3 - "$1" <<'EOF' 2>&1 | sed 's/^/  /' | tee -a "$W/summary.txt"
import json, statistics, sys
doc = json.load(open(sys.argv[1]))
suites = {}
for c in doc["cases"]:
    impls = c.get("impls", {})
    r = impls.get("smalltc")
    if r is None:      # a suite without a 'smalltc' record (solve: jacobi, chebyshev, pmg)
        ok = all(i.get("status", "ok") == "ok" for i in impls.values() if isinstance(i, dict))
        suites.setdefault(c["suite"], []).append("ok" if ok else None)
    else:
        suites.setdefault(c["suite"], []).append(
            r.get("fraction") if r.get("status") == "ok" else None)
for s, fr in suites.items():
    ok = [f for f in fr if f is not None]
    frac = [f for f in ok if f != "ok"]
    line = f"{s}: {len(fr)} cases"
    if frac:
        line += (f", % of bound median {100 * statistics.median(frac):.0f}, "
                 f"lowest {100 * min(frac):.0f}")
    if len(ok) < len(fr):
        line += f", {len(fr) - len(ok)} not ok"
    print(line)
EOF
}
if [ -n "${BENCH:-}" ]; then
  suites=$BENCH
  [ "$suites" = all ] && suites=gemm,action,assembly,pairwise
  for dt in ${DTYPES//,/ }; do
    i=0
    for suite in ${suites//,/ }; do
      if [ -n "${BEFORE:-}" ] && [ $(( i % 2 )) -eq 1 ]; then
        bench_one before "$suite" "$dt"
        bench_one after "$suite" "$dt"
      else
        bench_one after "$suite" "$dt"
        [ -n "${BEFORE:-}" ] && bench_one before "$suite" "$dt"
      fi
      i=$(( i + 1 ))
    done
    if merge_runs after "$dt"; then
      cat "$W/bench-$dt/table.txt"
      note "bench $dt: bench-$dt/bench-$dt.json"
      [ -f "$W/bench-$dt/bench-$dt.json" ] && bench_summary "$W/bench-$dt/bench-$dt.json"
    fi
    if [ -n "${BEFORE:-}" ] && merge_runs before "$dt" \
       && [ -f "$W/before-$dt/bench-$dt.json" ] && [ -f "$W/bench-$dt/bench-$dt.json" ]; then
      python3 -m smalltc bench --compare "$W/before-$dt/bench-$dt.json" \
        "$W/bench-$dt/bench-$dt.json" > "$W/compare-$dt.txt" 2>&1
      cat "$W/compare-$dt.txt"
      note "compare $dt (B = this tree, A = $BEFORE; compare-$dt.txt):"
      grep "^geometric mean" "$W/compare-$dt.txt" | sed 's/^/  /' | tee -a "$W/summary.txt"
      slow=$(awk -v s="$SLOW" '$(NF-1) ~ /^[0-9.]+$/ && NF > 4 && $(NF-1) + 0 < s' "$W/compare-$dt.txt")
      note "  cases with B/A < $SLOW: $(printf '%s' "$slow" | grep -c .)"
      printf '%s\n' "$slow" | grep . | head -n 20 | sed 's/^/    /' | tee -a "$W/summary.txt"
    fi
    pack
  done
fi

# ---- tuning ---------------------------------------------------------------------------
if [ -n "${TUNE:-}" ]; then
  mkdir -p build/tune/tables/evidence
  for f in tuning/tables/*.json; do
    [ -e "$f" ] && [ ! -e "build/tune/tables/${f##*/}" ] && cp "$f" build/tune/tables/
  done
  for f in benchmarks/tuning/*.json.gz; do
    [ -e "$f" ] && [ ! -e "build/tune/tables/evidence/${f##*/}" ] && cp "$f" build/tune/tables/evidence/
  done
  for job in ${TUNE//,/ }; do
    IFS=: read -r op dt secs <<< "$job"
    secs=${secs:-300}
    t=$(box $(( secs + ${T_TUNE_SLACK:-60} )))
    if [ "$t" -lt 40 ]; then
      note "tune $op $dt: skipped (no time left)"; FAILED=1
      continue
    fi
    budget=$(( t - ${T_TUNE_SLACK:-60} < secs ? t - ${T_TUNE_SLACK:-60} : secs ))
    [ "$budget" -lt 20 ] && budget=$(( t - 20 ))
    echo "=== tune $op $dt, budget ${budget} s ($(date -u +%H:%M:%S))" >> "$W/tune.log"
    timeout -k 10 "$t" python3 -m smalltc tune --op "$op" --dtype "$dt" --budget-seconds "$budget" \
      ${TUNE_SIZES:+--sizes "$TUNE_SIZES"} ${TUNE_ARGS:-} --resume --work build/tune \
      --out build/tune/tables \
      --no-progress --plot >> "$W/tune.log" 2>&1
    rc=$?
    case $rc in
      0) note "tune $op $dt: search done (build/tune/tables)";;
      3) note "tune $op $dt: stopped at its ${budget} s budget (checkpoint in build/tune: resume)";;
      124) note "tune $op $dt: killed at the ${t} s limit (resume from the last checkpoint)"; FAILED=1;;
      *) note "tune $op $dt: FAILED (rc $rc, tune.log)"; tail -n 5 "$W/tune.log"; FAILED=1;;
    esac
    pack_tune
    pack
  done
fi

# ---- ncu ------------------------------------------------------------------------------
if [ -n "${NCU:-}" ]; then
  mkdir -p "$W/ncu"
  for entry in $NCU; do
    IFS=: read -r -a parts <<< "$entry"
    args=(--suite "${parts[0]}")
    dtype=${DTYPES%%,*}
    for kv in "${parts[@]:1}"; do
      case $kv in
        dtype=*) dtype=${kv#*=};;
        *=*) args+=("--${kv%%=*}" "${kv#*=}");;
        *) args+=("--$kv");;           # a flag, e.g. quick
      esac
    done
    name=$(printf '%s' "$entry" | tr -c 'A-Za-z0-9._-' '_')
    t=$(box "${T_NCU:-120}")
    if [ "$t" -lt 20 ]; then
      note "ncu $entry: skipped (no time left)"; FAILED=1
      continue
    fi
    timeout -k 10 "$t" ncu --clock-control none --kernel-id "${NCU_KERNEL_ID:-::regex:^stc_:3}" \
      --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats \
      ${NCU_SECTIONS:+$(printf -- '--section %s ' $NCU_SECTIONS)} \
      python3 -m smalltc bench --no-progress "${args[@]}" --dtype "$dtype" --repeats 1 \
      --no-baselines --no-plot --out "$W/ncu/bench-$name" > "$W/ncu/$name.txt" 2>&1
    rc=$?
    n=$(grep -cE "^ +stc_" "$W/ncu/$name.txt")
    if [ "$rc" -eq 0 ]; then
      note "ncu $entry: $n kernel(s) profiled (ncu/$name.txt)"
    else
      note "ncu $entry: rc $rc, $n kernel(s) profiled (ncu/$name.txt)"
      FAILED=1
    fi
    pack
  done
fi

# ---- demo -----------------------------------------------------------------------------
if [ "${DEMO:-}" = 1 ]; then
  t=$(box "${T_DEMO:-150}")
  if [ "$t" -lt 20 ]; then
    note "demo: skipped (no time left)"; FAILED=1
  else
    timeout -k 10 "$t" python3 -m smalltc demo --out "$W/demo" > "$W/demo.log" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] && note "demo: ok (demo.log, demo/)" || { note "demo: rc $rc (demo.log)"; FAILED=1; }
    pack
  fi
fi
