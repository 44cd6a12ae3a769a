#!/usr/bin/env bash
# Builds the plan-file libFuzzer target with clang and runs it.
#
#   bench/fuzz/plan_file_fuzz.sh [seconds]      (default 60)
#
# Needs clang (Debian's clang-14 ships libFuzzer) and libfmt-dev. Works in
# a scratch directory (LOOM_FUZZ_DIR, default /tmp/loom-plan-fuzz): the
# corpus found there is reused by later runs; crashes are written there
# too, and the script exits non-zero if one was found.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SECONDS_TO_RUN="${1:-60}"
WORK="${LOOM_FUZZ_DIR:-/tmp/loom-plan-fuzz}"
CXX="${CXX:-clang++}"
mkdir -p "$WORK/corpus"
SOURCES=(
  "$ROOT/plan/planfile/plan_file.cc" "$ROOT/plan/planfile/plan_file_text.cc"
  "$ROOT/plan/solver/granules.cc" "$ROOT/plan/solver/gap_index.cc"
  "$ROOT/plan/solver/instance.cc"
  "$ROOT/base/status.cc" "$ROOT/base/check.cc" "$ROOT/base/crc32c.cc"
  "$ROOT/base/text.cc"
)
# The seed plans (plan/testing:plan_corpus and what it uses).
SEEDS=(
  "$ROOT/plan/testing/plan_corpus.cc"
  "$ROOT/plan/solver/testing/instances.cc"
)
FLAGS=(-std=c++20 -O1 -g -I"$ROOT")
"$CXX" "${FLAGS[@]}" -DLOOM_FUZZ_SEEDS "$ROOT/bench/fuzz/plan_file_fuzzer.cc" \
  "${SOURCES[@]}" "${SEEDS[@]}" -lfmt -o "$WORK/write_seeds"
"$WORK/write_seeds" "$WORK/corpus"
"$CXX" "${FLAGS[@]}" -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=all "$ROOT/bench/fuzz/plan_file_fuzzer.cc" \
  "${SOURCES[@]}" -lfmt -o "$WORK/plan_file_fuzzer"
cd "$WORK"
exec ./plan_file_fuzzer -max_total_time="$SECONDS_TO_RUN" -max_len=4096 \
  -print_final_stats=1 corpus
