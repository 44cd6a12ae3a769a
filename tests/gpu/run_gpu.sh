#!/usr/bin/env bash
# The GPU recipe in one script: two device calls of at most 8 minutes each.
#
# Here (with Bazel):
#   tests/gpu/run_gpu.sh pack       builds the GPU tests and tools statically
#                                   (--config=gpu), strips their debug
#                                   sections, copies them into .gpu_pack/
#                                   (git-ignored)
# Then, with the device tool, from the repository root, .gpu_pack carried:
#   call 1 (about 3 minutes):
#     run(command="tests/gpu/run_gpu.sh run $OUT", carry=[".gpu_pack"],
#         timeout_s=480)
#     loom info, the driver's costs, the C++ tests on CUDA (the driver
#     contract suite included), `loom stress --backend cuda` for 60 s (and
#     20 s more with --driver-failures 10) and
#     PyTorch's hand-over to loom (tests/gpu/python/test_torch_handover_gpu.py)
#   call 2 (at most 8.5 minutes):
#     run(command="tests/gpu/run_gpu.sh train $OUT", carry=[".gpu_pack"],
#         timeout_s=560)
#     the four models (llama1b, moe, gpt2_interleaved, llama1b_recompute)
#     under torch, expandable segments, loom (auto mode: records, plans,
#     then serves its plan) and loom-plan (plan mode: the plan `pack` made
#     from another run's recording, .gpu_pack/plans), 5 warm-up and 20
#     timed steps each, within a 480 s budget (bench/gpu/train/compare.py;
#     extra options are passed on and win)
#   step time (issue 21; at most 6 minutes, may share call 2's machine):
#     run(command="tests/gpu/run_gpu.sh steptime $OUT", carry=[".gpu_pack"],
#         timeout_s=420)
#     gpt2_interleaved and llama1b under torch, expandable segments, loom
#     and loom's layout variants (loom-chunk1: 2 MiB handles, loom-chunk10:
#     20 MiB), 3 warm-up, 8 timed and 2 profiled steps each (torch.profiler
#     with CUDA activity): OUT/steptime.md (GPU busy and idle time per
#     step, the kernels whose time changed most against torch, loom's
#     waits, layout and host time), OUT/profiles.tar.xz
#   step-time A/B (issue 21; at most 9 minutes, a call of its own: its 18
#     processes took 440 s on the H200 on 2026-11-27, loom's gpt2_interleaved
#     ones 44 s each as auto mode records and plans):
#     run(command="tests/gpu/run_gpu.sh bundle $OUT ab", carry=[".gpu_pack"],
#         timeout_s=570)
#     moe and gpt2_interleaved under torch, expandable segments and loom,
#     3 rounds of one process each in rotated orders, 5 warm-up and 30
#     timed steps per process: OUT/ab.md (each ratio of median steps with a
#     95% interval over rounds and steps, and the targets' verdicts)
# The device tool brings back at most 8 files from $OUT: `run` and `train`
# write more. Either wrap a step:
#   run(command="tests/gpu/run_gpu.sh bundle $OUT run", ...)  (or train,
#     steptime, ab with their options): the step writes into a scratch
#     folder, then everything it wrote is packed into $OUT/<step>.tar
# or run both call-1 and call-2 steps in one call (about 8 minutes with
# loom-plan; 6.6 before it, 2026-11-27):
#   run(command="tests/gpu/run_gpu.sh both $OUT", carry=[".gpu_pack"],
#       timeout_s=590)  -> $OUT/run.tar, $OUT/train.tar
# Back here:
#   tests/gpu/run_gpu.sh record DIR|TAR...   (a TAR is unpacked first)
#                                   DIR/summary.md ->
#                                   bench/results/gpu_tests.md;
#                                   DIR/steptime.md ->
#                                   bench/results/steptime.md;
#                                   DIR/ab.md (+ its gpu.md) ->
#                                   bench/results/steptime_ab.md, its
#                                   results.jsonl -> steptime_ab.jsonl; every
#                                   other DIR/results.jsonl (+ driver_costs.json) ->
#                                   bench/results/gpu.md (on top, the
#                                   previous report kept below it);
#                                   DIR/traces.tar.xz ->
#                                   bench/data/traces/gpu/
#
# Loud: `run` and `train` exit non-zero and list every failure at the end
# (and in OUT/failures.txt): a test binary that failed, a stress run with a
# fault, corruption or broken invariant, a training run that did not finish,
# and any loom run that trained in fallback (its plan not installed), with
# the reason. The longer Python GPU tests (test_training.py,
# test_train_compare_gpu.py) are not in the two calls: run them in a call
# of their own with `tests/gpu/run_gpu.sh pytest $OUT FILE...`.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
PACK=.gpu_pack

# C++ test binaries that exercise the CUDA backend (they skip without a GPU).
TEST_BINARIES=(
  vmm/driver_test
  vmm/cuda_driver_test
  vmm/queued_data_test
)
TOOLS=(cli/loom_tool bench/gpu/driver_costs)
# Built into .gpu_pack too: libloom.so for the Python GPU tests.
LIBS=(torch_plugin/libloom.so)
# Python GPU tests in `run` (call 1).
RUN_PYTHON_TESTS=(tests/gpu/python/test_torch_handover_gpu.py)
# `train`'s options (call 2), before the caller's.
# loom-plan: loom in plan mode, each model served from its first request by
# the plan `pack` made from that model's recording by another run (PLAN_TRACES).
TRAIN_OPTIONS=(--models llama1b,moe,gpt2_interleaved,llama1b_recompute
               --allocators torch,expandable,loom,loom-plan
               --plans "$PACK/plans"
               --steps 20 --warmup 5 --budget 480 --run-timeout 120 --traces)
# The recordings loom-plan's plans are made from: auto mode's traces of the
# four models from an earlier H200 run (bench/data/traces/gpu/README.md).
PLAN_TRACES=bench/data/traces/gpu/h200_auto_2026-11-26
STRESS_SECONDS=60
FAILURE_STRESS_SECONDS=20
# `steptime`'s options, before the caller's.
STEPTIME_OPTIONS=(--models gpt2_interleaved,llama1b
                  --allocators torch,expandable,loom,loom-chunk1,loom-chunk10
                  --steps 8 --warmup 3 --profile-steps 2 --budget 330
                  --run-timeout 120)
# `ab`'s options, before the caller's.
# (--plans: for a caller's `--allocators ...,loom-plan`.)
AB_OPTIONS=(--models moe,gpt2_interleaved --allocators torch,expandable,loom
            --plans "$PACK/plans"
            --rounds 3 --steps 30 --warmup 5 --budget 490 --run-timeout 90)

pack() {
  local targets=()
  local t
  for t in "${TEST_BINARIES[@]}" "${TOOLS[@]}"; do targets+=("//${t%/*}:${t##*/}"); done
  for t in "${LIBS[@]}"; do targets+=("//${t%/*}:${t##*/}"); done
  bazel build --config=gpu "${targets[@]}" || exit 1
  rm -rf "$PACK" && mkdir -p "$PACK/bin"
  for t in "${TEST_BINARIES[@]}" "${TOOLS[@]}" "${LIBS[@]}"; do
    cp "bazel-bin/$t" "$PACK/bin/${t##*/}" || exit 1
    chmod u+w "$PACK/bin/${t##*/}"
    strip --strip-debug "$PACK/bin/${t##*/}" || exit 1
  done
  if (cd "$PACK/bin" && ldd ./* 2>/dev/null | grep -E "not found|libfmt|libgtest"); then
    echo "pack: binaries still need the libraries above" >&2
    exit 1
  fi
  # loom-plan's plan files, made here (the planner needs no GPU) from
  # another run's recordings, each with its plan check.
  mkdir -p "$PACK/plans"
  local trace model
  for trace in "$PLAN_TRACES"/*.loom.trace.rank0.ltb; do
    model="$(basename "$trace" .loom.trace.rank0.ltb)"
    bazel-bin/cli/loom_tool plan "$trace" -o "$PACK/plans/$model.lplan" \
      > "$PACK/plans/$model.txt" 2>&1 ||
      { cat "$PACK/plans/$model.txt" >&2; echo "pack: cannot plan $trace" >&2; exit 1; }
    grep -E '^(peak|check) ' "$PACK/plans/$model.txt" | sed "s/^/$model: /"
  done
  # The commit the binaries were built from (+dirty when the tree had
  # changes), named in every report the device run writes.
  local rev
  rev="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  git diff --quiet HEAD 2>/dev/null || rev="$rev+dirty"
  echo "$rev" > "$PACK/COMMIT"
  du -sh "$PACK"
}

pack_commit() { cat "$PACK/COMMIT" 2>/dev/null || echo "unknown commit"; }

FAILURES=()
fail() { FAILURES+=("$*"); }

# Ends a recipe step: the failures, loudly, in OUT/failures.txt too.
verdict() {
  local out="$1" what="$2"
  if [[ ${#FAILURES[@]} -eq 0 ]]; then
    echo "$what: passed"
    rm -f "$out/failures.txt"
    return 0
  fi
  printf '%s\n' "${FAILURES[@]}" > "$out/failures.txt"
  {
    echo
    echo "$what: FAILED (${#FAILURES[@]}):"
    printf '  %s\n' "${FAILURES[@]}"
  } >&2
  return 1
}

run() {
  local out="${1:?usage: run OUT}"
  mkdir -p "$out"
  local summary="$out/summary.md" started=$SECONDS
  {
    echo "# GPU test run"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "- machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
    echo "- host: $(uname -srm), $(nproc) cores"
    echo "- command: tests/gpu/run_gpu.sh run \$OUT (binaries from tests/gpu/run_gpu.sh pack at $(pack_commit))"
    echo
    echo "## loom info --backend=cuda"
    echo '```'
  } > "$summary"
  timeout 60 "$PACK/bin/loom_tool" info --backend=cuda >> "$summary" 2>&1 \
    || fail "loom info --backend=cuda failed (no CUDA driver or device?)"
  {
    echo '```'
    echo
    echo "## Driver costs (bench/gpu/driver_costs)"
    echo '```'
  } >> "$summary"
  timeout 90 "$PACK/bin/driver_costs" --rounds 50 --json > "$out/driver_costs.json" 2>&1 \
    || fail "driver_costs failed (see $out/driver_costs.json)"
  timeout 90 "$PACK/bin/driver_costs" --rounds 20 >> "$summary" 2>&1 \
    || fail "driver_costs (table) failed"
  {
    echo '```'
    echo
    echo "## C++ tests"
    echo
    echo "| binary | result | tests | skipped |"
    echo "|---|---|---|---|"
  } >> "$summary"
  local b
  for b in "${TEST_BINARIES[@]}"; do
    local name="${b##*/}"
    timeout 120 "$PACK/bin/$name" --gtest_output="xml:$out/$name.xml" > "$out/$name.log" 2>&1
    local rc=$?
    local tests skipped
    tests=$(grep -oE 'tests="[0-9]+"' "$out/$name.xml" 2>/dev/null | head -1 | grep -oE '[0-9]+')
    skipped=$(grep -c '<skipped' "$out/$name.xml" 2>/dev/null)
    if [[ $rc -eq 0 ]]; then
      echo "| $name | passed | ${tests:-?} | ${skipped:-0} |" >> "$summary"
      [[ "${skipped:-0}" -eq 0 ]] || fail "$name: ${skipped} tests skipped on the GPU (see $out/$name.log)"
    else
      echo "| $name | FAILED (rc $rc) | ${tests:-?} | ${skipped:-0} |" >> "$summary"
      fail "$name failed (rc $rc): $(grep -E '^\[  FAILED  \]' "$out/$name.log" | head -3 | tr '\n' ' ')"
    fi
  done
  {
    echo
    echo "## loom stress --backend cuda (${STRESS_SECONDS} s)"
    echo '```'
  } >> "$summary"
  timeout $((STRESS_SECONDS + 60)) "$PACK/bin/loom_tool" stress --backend cuda \
    --seconds "$STRESS_SECONDS" > "$out/stress_cuda.txt" 2>&1
  local rc=$?
  cat "$out/stress_cuda.txt" >> "$summary"
  echo '```' >> "$summary"
  [[ $rc -eq 0 ]] || fail "loom stress --backend cuda: rc $rc: $(head -2 "$out/stress_cuda.txt" | tail -1)"
  # The same with driver failures (before 10% of allocations one of the
  # next memory calls fails before it reaches CUDA): the allocator's
  # recovery paths (undo, access granted to a mapping kept) on the GPU.
  {
    echo
    echo "## loom stress --backend cuda --driver-failures 10 (${FAILURE_STRESS_SECONDS} s)"
    echo '```'
  } >> "$summary"
  timeout $((FAILURE_STRESS_SECONDS + 60)) "$PACK/bin/loom_tool" stress \
    --backend cuda --seconds "$FAILURE_STRESS_SECONDS" --driver-failures 10 \
    > "$out/stress_cuda_failures.txt" 2>&1
  rc=$?
  grep -v '^loom: undoing' "$out/stress_cuda_failures.txt" >> "$summary"
  echo '```' >> "$summary"
  [[ $rc -eq 0 ]] || fail "loom stress --backend cuda --driver-failures 10: rc $rc: $(grep -v '^loom: undoing' "$out/stress_cuda_failures.txt" | head -2 | tail -1)"
  if [[ ${#RUN_PYTHON_TESTS[@]} -gt 0 ]]; then
    echo >> "$summary"
    echo "## Python GPU tests" >> "$summary"
    LOOM_LIB="$ROOT/$PACK/bin/libloom.so" LOOM_TOOL="$ROOT/$PACK/bin/loom_tool" \
      PYTHONPATH="$ROOT/torch_plugin" timeout 150 python3 -m pytest -q -rs \
      "${RUN_PYTHON_TESTS[@]}" > "$out/pytest.log" 2>&1 \
      || fail "Python GPU tests failed (see $out/pytest.log)"
    if grep -qE '[0-9]+ skipped' "$out/pytest.log"; then
      fail "Python GPU tests skipped: $(grep -E 'SKIPPED' "$out/pytest.log" | head -2 | tr '\n' ' ')"
    fi
    echo '```' >> "$summary"
    tail -5 "$out/pytest.log" >> "$summary"
    echo '```' >> "$summary"
  fi
  {
    echo
    echo "- took $((SECONDS - started)) s"
    if [[ ${#FAILURES[@]} -gt 0 ]]; then
      echo
      echo "## FAILED"
      echo
      printf -- '- %s\n' "${FAILURES[@]}"
    fi
  } >> "$summary"
  cat "$summary"
  verdict "$out" "tests/gpu/run_gpu.sh run"
}

# compare.py run into OUT with the options named by $2 (an array name),
# then the caller's; failures from OUT/failures.txt.
compare_run() {
  local out="$1" options="$2[@]"
  shift 2
  mkdir -p "$out"
  LOOM_LIB="$ROOT/$PACK/bin/libloom.so" LOOM_TOOL="$ROOT/$PACK/bin/loom_tool" \
    PYTHONUNBUFFERED=1 python3 bench/gpu/train/compare.py run --out "$out" \
    "${!options}" "$@" 2>&1 | tee "$out/log.txt"
  local rc=${PIPESTATUS[0]}
  if [[ $rc -ne 0 ]]; then
    if [[ -s "$out/failures.txt" ]]; then
      mapfile -t FAILURES < "$out/failures.txt"
    else
      fail "bench/gpu/train/compare.py run exited $rc (see $out/log.txt)"
    fi
  fi
}

train() {
  local out="${1:?usage: train OUT [options]}"
  shift
  compare_run "$out" TRAIN_OPTIONS "$@"
  verdict "$out" "tests/gpu/run_gpu.sh train"
}

steptime() {
  local out="${1:?usage: steptime OUT [options]}"
  shift
  compare_run "$out" STEPTIME_OPTIONS "$@"
  [[ -s "$out/steptime.md" ]] || fail "no steptime.md (see $out/log.txt)"
  verdict "$out" "tests/gpu/run_gpu.sh steptime"
}

ab() {
  local out="${1:?usage: ab OUT [options]}"
  shift
  compare_run "$out" AB_OPTIONS "$@"
  [[ -s "$out/ab.md" ]] || fail "no ab.md (see $out/log.txt)"
  verdict "$out" "tests/gpu/run_gpu.sh ab"
}

pytest_files() {
  local out="${1:?usage: pytest OUT FILE...}"
  shift
  mkdir -p "$out"
  LOOM_LIB="$ROOT/$PACK/bin/libloom.so" LOOM_TOOL="$ROOT/$PACK/bin/loom_tool" \
    PYTHONPATH="$ROOT/torch_plugin" python3 -m pytest -q -rs "$@" 2>&1 \
    | tee "$out/pytest.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || fail "pytest $* failed (see $out/pytest.log)"
  verdict "$out" "tests/gpu/run_gpu.sh pytest"
}

record() {
  [[ $# -ge 1 ]] || { echo "usage: record DIR..." >&2; return 2; }
  local dir results=() costs=() dirs=() arg
  for arg in "$@"; do
    if [[ -f "$arg" && "$arg" == *.tar ]]; then
      # A bundle: its one top folder holds the step's files.
      local unpacked
      unpacked=$(mktemp -d) || return 1
      tar -C "$unpacked" -xf "$arg" || { echo "record: cannot unpack $arg" >&2; return 1; }
      dirs+=("$unpacked"/*)
    else
      dirs+=("$arg")
    fi
  done
  for dir in "${dirs[@]}"; do
    if [[ -f "$dir/summary.md" ]]; then
      cp "$dir/summary.md" bench/results/gpu_tests.md && echo "recorded bench/results/gpu_tests.md"
    fi
    if [[ -f "$dir/steptime.md" ]]; then
      cp "$dir/steptime.md" bench/results/steptime.md && echo "recorded bench/results/steptime.md"
    fi
    if [[ -f "$dir/ab.md" ]]; then
      # The A/B's processes are its own: their memory table goes beside the
      # ratios (steptime_ab.md), their raw lines to steptime_ab.jsonl, and
      # bench/results/gpu.md (the run/train report) is left as it is.
      {
        cat "$dir/ab.md"
        if [[ -f "$dir/gpu.md" ]]; then
          echo
          echo "## The same processes: memory and speed"
          echo
          sed '1{/^# /d}' "$dir/gpu.md"
        fi
      } > bench/results/steptime_ab.md && echo "recorded bench/results/steptime_ab.md"
      if [[ -f "$dir/results.jsonl" ]]; then
        cp "$dir/results.jsonl" bench/results/steptime_ab.jsonl &&
          echo "recorded bench/results/steptime_ab.jsonl"
      fi
      continue
    fi
    [[ -f "$dir/results.jsonl" ]] && results+=("$dir/results.jsonl")
    [[ -f "$dir/driver_costs.json" ]] && costs=(--driver-costs "$dir/driver_costs.json")
    if [[ -f "$dir/traces.tar.xz" ]]; then
      python3 bench/gpu/train/compare.py unpack-traces "$dir/traces.tar.xz" \
        --into bench/data/traces/gpu || return 1
    fi
  done
  if [[ ${#results[@]} -gt 0 ]]; then
    # The new report on top; the previous one (its hand-written reading
    # included) kept below it, under a rule.
    local report=bench/results/gpu.md
    python3 bench/gpu/train/compare.py table "${results[@]}" "${costs[@]}" \
      --command "tests/gpu/run_gpu.sh run/train \$OUT; record" \
      > "$report.new" || { rm -f "$report.new"; return 1; }
    if [[ -s "$report" ]]; then
      { echo; echo "---"; echo
        sed '1s/^# loom on a GPU: memory, speed and driver costs$/# Earlier/' "$report"
      } >> "$report.new" || { rm -f "$report.new"; return 1; }
    fi
    mv "$report.new" "$report" || return 1
    echo "recorded $report (the previous report kept below it)"
  fi
}

# Runs step $2 (run, train, steptime, ab; options after it) into a scratch
# folder and packs what it wrote into OUT/<step>.tar: one file back.
bundle() {
  local out="${1:?usage: bundle OUT STEP [options]}" step="${2:?usage: bundle OUT STEP [options]}"
  shift 2
  case "$step" in run|train|steptime|ab) ;; *) echo "bundle: unknown step $step" >&2; return 2 ;; esac
  local scratch
  scratch=$(mktemp -d) || return 1
  mkdir -p "$out"
  "$ROOT/tests/gpu/run_gpu.sh" "$step" "$scratch/$step" "$@"
  local rc=$?
  tar -C "$scratch" -cf "$out/$step.tar" "$step" || rc=1
  rm -rf "$scratch"
  return $rc
}

case "${1:-}" in
  pack) pack ;;
  bundle) shift; bundle "$@" ;;
  both) shift
        out="${1:?usage: both OUT}"
        bundle "$out" run; rc_run=$?
        bundle "$out" train; rc_train=$?
        [[ $rc_run -eq 0 && $rc_train -eq 0 ]] ;;
  run) shift; run "$@" ;;
  train) shift; train "$@" ;;
  steptime) shift; steptime "$@" ;;
  ab) shift; ab "$@" ;;
  pytest) shift; pytest_files "$@" ;;
  record) shift; record "$@" ;;
  *) sed -n '2,65p' "$0"; exit 2 ;;
esac
