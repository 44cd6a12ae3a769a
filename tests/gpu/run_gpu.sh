#!/usr/bin/env bash
# The GPU recipe in one script.
#
#   tests/gpu/run_gpu.sh pack      (here, with Bazel) builds the GPU tests and
#                                  tools statically where possible and copies
#                                  them into .gpu_pack/ (git-ignored)
#   tests/gpu/run_gpu.sh run OUT   (on the GPU machine, from the repo root,
#                                  with .gpu_pack carried) runs everything and
#                                  writes logs and summary.md into OUT
#   tests/gpu/run_gpu.sh train OUT [compare.py run options]
#                                  (on the GPU machine) the training
#                                  comparison (bench/gpu/train/compare.py):
#                                  OUT/results.jsonl, gpu.md, traces.tar.xz
#   tests/gpu/run_gpu.sh record DIR... (here) DIR/summary.md ->
#                                  bench/results/gpu_tests.md; every
#                                  DIR/results.jsonl (+ driver_costs.json) ->
#                                  bench/results/gpu.md; DIR/traces.tar.xz ->
#                                  bench/data/traces/gpu/
#
# With the device tool: run `pack` here, then
#   run(command="tests/gpu/run_gpu.sh run $OUT", carry=[".gpu_pack"])
#   run(command="tests/gpu/run_gpu.sh train $OUT --models llama1b,llama1b_recompute
#       --search --fidelity --traces", carry=[".gpu_pack"])   (and the other
#       models in a second call: each call has 10 minutes)
# and `record` on the folders the files come back in.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
PACK=.gpu_pack

# C++ test binaries that exercise the CUDA backend (they skip without a GPU).
TEST_BINARIES=(
  vmm/driver_test
  vmm/cuda_driver_test
)
TOOLS=(cli/loom_tool bench/gpu/driver_costs)
# Built into .gpu_pack too: libloom.so for the Python GPU tests.
LIBS=(torch_plugin/libloom.so)

pack() {
  local targets=()
  local t
  for t in "${TEST_BINARIES[@]}" "${TOOLS[@]}"; do targets+=("//${t%/*}:${t##*/}"); done
  for t in "${LIBS[@]}"; do targets+=("//${t%/*}:${t##*/}"); done
  bazel build --config=gpu "${targets[@]}" || exit 1
  rm -rf "$PACK" && mkdir -p "$PACK/bin"
  for t in "${TEST_BINARIES[@]}" "${TOOLS[@]}"; do
    cp "bazel-bin/$t" "$PACK/bin/${t##*/}" || exit 1
  done
  for t in "${LIBS[@]}"; do cp "bazel-bin/$t" "$PACK/bin/" || exit 1; done
  if (cd "$PACK/bin" && ldd ./* 2>/dev/null | grep -E "not found|libfmt|libgtest"); then
    echo "pack: binaries still need the libraries above" >&2
    exit 1
  fi
  du -sh "$PACK"
}

run() {
  local out="${1:?usage: run OUT}"
  mkdir -p "$out"
  local summary="$out/summary.md"
  {
    echo "# GPU test run"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "- machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
    echo "- host: $(uname -srm), $(nproc) cores"
    echo "- command: tests/gpu/run_gpu.sh run \$OUT (binaries from tests/gpu/run_gpu.sh pack)"
    echo
    echo "## loom info --backend=cuda"
    echo '```'
    "$PACK/bin/loom_tool" info --backend=cuda 2>&1
    echo '```'
    echo
    echo "## Driver costs (bench/gpu/driver_costs)"
    echo '```'
    "$PACK/bin/driver_costs" --rounds 50 2>&1
    "$PACK/bin/driver_costs" --rounds 50 --json > "$out/driver_costs.json" 2>&1
    echo '```'
    echo
    echo "## C++ tests"
    echo
    echo "| binary | result | tests | skipped |"
    echo "|---|---|---|---|"
  } > "$summary"
  local failed=0 b
  for b in "${TEST_BINARIES[@]}"; do
    local name="${b##*/}"
    "$PACK/bin/$name" --gtest_output="xml:$out/$name.xml" > "$out/$name.log" 2>&1
    local rc=$?
    local tests skipped
    tests=$(grep -oE 'tests="[0-9]+"' "$out/$name.xml" 2>/dev/null | head -1 | grep -oE '[0-9]+')
    skipped=$(grep -c '<skipped' "$out/$name.xml" 2>/dev/null)
    if [[ $rc -eq 0 ]]; then
      echo "| $name | passed | ${tests:-?} | ${skipped:-0} |" >> "$summary"
    else
      echo "| $name | FAILED (rc $rc) | ${tests:-?} | ${skipped:-0} |" >> "$summary"
      failed=1
    fi
  done
  if [[ -d tests/gpu/python ]] && ls tests/gpu/python/test_*.py >/dev/null 2>&1; then
    echo >> "$summary"
    echo "## Python GPU tests" >> "$summary"
    LOOM_LIB="$ROOT/$PACK/bin/libloom.so" LOOM_TOOL="$ROOT/$PACK/bin/loom_tool" \
      PYTHONPATH="$ROOT/torch_plugin" python3 -m pytest -q tests/gpu/python \
      > "$out/pytest.log" 2>&1 || failed=1
    echo '```' >> "$summary"
    tail -5 "$out/pytest.log" >> "$summary"
    echo '```' >> "$summary"
  fi
  cat "$summary"
  return $failed
}

train() {
  local out="${1:?usage: train OUT [options]}"
  shift
  mkdir -p "$out"
  LOOM_LIB="$ROOT/$PACK/bin/libloom.so" LOOM_TOOL="$ROOT/$PACK/bin/loom_tool" \
    PYTHONUNBUFFERED=1 python3 bench/gpu/train/compare.py run --out "$out" "$@" \
    2>&1 | tee "$out/log.txt"
  return "${PIPESTATUS[0]}"
}

record() {
  [[ $# -ge 1 ]] || { echo "usage: record DIR..." >&2; return 2; }
  local dir results=() costs=()
  for dir in "$@"; do
    if [[ -f "$dir/summary.md" ]]; then
      cp "$dir/summary.md" bench/results/gpu_tests.md && echo "recorded bench/results/gpu_tests.md"
    fi
    [[ -f "$dir/results.jsonl" ]] && results+=("$dir/results.jsonl")
    [[ -f "$dir/driver_costs.json" ]] && costs=(--driver-costs "$dir/driver_costs.json")
    if [[ -f "$dir/traces.tar.xz" ]]; then
      python3 bench/gpu/train/compare.py unpack-traces "$dir/traces.tar.xz" \
        --into bench/data/traces/gpu || return 1
    fi
  done
  if [[ ${#results[@]} -gt 0 ]]; then
    python3 bench/gpu/train/compare.py table "${results[@]}" "${costs[@]}" \
      --command "tests/gpu/run_gpu.sh run/train \$OUT; record" \
      > bench/results/gpu.md || return 1
    echo "recorded bench/results/gpu.md"
  fi
}

case "${1:-}" in
  pack) pack ;;
  run) shift; run "$@" ;;
  train) shift; train "$@" ;;
  record) shift; record "$@" ;;
  *) sed -n '2,27p' "$0"; exit 2 ;;
esac
