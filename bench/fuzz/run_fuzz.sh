#!/usr/bin/env bash
# Builds the trace reader fuzz targets with clang++ (libFuzzer + ASan + UBSan)
# straight from the sources, seeds a corpus with valid traces and runs each
# target for the given number of seconds (default 60).
#
#   bench/fuzz/run_fuzz.sh [seconds] [jobs]
#
# Output (binaries, corpora, logs, crash files) goes to $LOOM_FUZZ_DIR
# (default /tmp/loom_fuzz). A crash leaves crash-* files there and makes this
# script exit non-zero; keep such inputs as regression cases in
# plan/trace_fuzz_regressions_test.cc.
set -euo pipefail

SECONDS_EACH="${1:-60}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${LOOM_FUZZ_DIR:-/tmp/loom_fuzz}"
CXX="${CXX_FUZZ:-clang++}"
mkdir -p "$OUT/seeds/text" "$OUT/seeds/binary" "$OUT/corpus/text" \
  "$OUT/corpus/binary"

SOURCES=(
  base/check.cc base/status.cc base/crc32c.cc base/text.cc plan/trace/trace.cc
  base/byte_stream.cc
  plan/trace/trace_checker.cc plan/trace/trace_io.cc plan/trace/trace_text.cc
  plan/trace/trace_binary.cc
)
COMMON=(-std=c++20 -g -DFMT_HEADER_ONLY -I"$ROOT" -Wall -Wno-sign-compare)
FUZZ=(-O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)

cd "$ROOT"
echo "run_fuzz: building with $("$CXX" --version | head -1)" >&2
# Rebuilds a binary only when a source or header is newer than it.
stale() {
  [[ ! -x "$1" ]] && return 0
  [[ -n "$(find base plan bench/fuzz -name '*.h' -newer "$1" -o -name '*.cc' -newer "$1" | head -1)" ]]
}
if stale "$OUT/make_seeds"; then
  "$CXX" "${COMMON[@]}" -O1 bench/fuzz/make_seeds.cc plan/trace/synthetic_trace.cc \
    plan/testing/trace_corpus.cc \
    "${SOURCES[@]}" -o "$OUT/make_seeds" &
fi
for target in trace_text_fuzzer trace_binary_fuzzer; do
  if stale "$OUT/$target"; then
    "$CXX" "${COMMON[@]}" "${FUZZ[@]}" "bench/fuzz/$target.cc" "${SOURCES[@]}" \
      -o "$OUT/$target" &
  fi
done
wait
"$OUT/make_seeds" "$OUT/seeds/text" "$OUT/seeds/binary"

status=0
for form in text binary; do
  target="trace_${form}_fuzzer"
  echo "run_fuzz: $target for ${SECONDS_EACH}s" >&2
  (cd "$OUT" && "./$target" -max_total_time="$SECONDS_EACH" \
      -print_final_stats=1 -max_len=16384 -rss_limit_mb=2048 \
      -artifact_prefix="$OUT/$form-" \
      "corpus/$form" "seeds/$form") >"$OUT/$target.log" 2>&1 || status=1
  grep -E "^(stat::|Done|#[0-9]+ *DONE)|ERROR|SUMMARY" "$OUT/$target.log" >&2 || true
done
exit "$status"
